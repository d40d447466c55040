"""This machine as a node of a cluster, at boot and while serving: find the cluster, open the firewall to the VPC,
and keep the engine in step with the other nodes (the head's roster; a worker's reports to the head)."""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import requests

from kiln.choice.schema import ClusterSetting
from kiln.cluster.discovery import (
    DO_API_URL,
    DigitalOceanDroplets,
    DiscoveryError,
    address_towards,
    droplet_identity,
    interface_of,
)
from kiln.cluster.firewall import cluster_rules
from kiln.cluster.membership import Membership, NotYet, explicit, from_droplets
from kiln.cluster.peer import PEER_PORT, PeerServer, send_report
from kiln.cluster.roster import LOST_AFTER_S, REPORT_EVERY_S, NodeReport, Roster, worker_step
from kiln.serve.processes.supervisor import Member, Supervisor
from kiln.serve.reports.state import AgentState

log = logging.getLogger("kiln.cluster")
DISCOVERY_RETRY_S = 10.0
JOIN_WARNING_S = 600.0  # a node not in the engine this long after it started is reported by name
HEAD_LOST_REPORTS = 5
WARN_EVERY_S = 30.0


@dataclass(frozen=True)
class ClusterOptions:
    do_api_url: str = DO_API_URL
    metadata_get: Callable[[], tuple[int, str | None]] = droplet_identity
    peer_port: int = PEER_PORT
    firewall: bool = False  # open the VPC's range with ufw (the image)
    retry_s: float = DISCOVERY_RETRY_S  # between two readings of the tagged droplets
    lost_after_s: float = LOST_AFTER_S  # a worker silent this long is lost


def find_membership(setting: ClusterSetting, token: str | None, options: ClusterOptions,
                    stopping: threading.Event, waiting: Callable[[NotYet], None]) -> Membership | NotYet:
    """This node's place in the cluster: at once when given, else from the tagged droplets, waiting for them."""
    if setting.explicit:
        assert setting.head is not None
        address = setting.address or address_towards(setting.head)
        return explicit(setting, address, interface_of(address)[0])
    if token is None:
        return NotYet(f"cluster {setting.name} gives no head, and no do_token to find its nodes by the tag "
                      f"{setting.tag}", "add do_token (a read-only DigitalOcean token) to user-data, or give "
                      "cluster.head and cluster.rank", final=True)
    api = DigitalOceanDroplets(token, options.do_api_url)
    while True:
        try:
            own_id, own_address = options.metadata_get()
            interface = interface_of(own_address)[0] if own_address else None
            found = from_droplets(setting, own_id, api.tagged(setting.tag), interface)
        except DiscoveryError as exc:
            found = NotYet(exc.what, exc.fix)
        if isinstance(found, Membership) or found.final:
            return found
        waiting(found)
        if stopping.wait(options.retry_s):
            return found


def open_firewall(member: Membership, ports: tuple[int, ...]) -> str | None:
    """ufw rules for the cluster's traffic from the VPC's range; why not, when they could not be made."""
    _, vpc = interface_of(member.address)
    if vpc is None:
        return f"the VPC's range is unknown: no interface holds {member.address}"
    if shutil.which("ufw") is None:
        return "ufw is not installed"
    for argv in cluster_rules(vpc, ports):
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
        if done.returncode != 0:
            return f"`{' '.join(argv)}` failed: {(done.stderr or done.stdout).strip()[:200]}"
    log.info("firewall: the cluster's ports are open to %s only", vpc)
    return None


@dataclass
class NodeWatch:
    """Keeps this node's engine in step with the cluster; the head's roster or a worker's reports."""

    member: Membership
    supervisor: Supervisor
    engine: Member
    state: AgentState
    gpus: tuple[dict[str, Any], ...]
    options: ClusterOptions = field(default_factory=ClusterOptions)
    clock: Callable[[], float] = time.monotonic
    interval_s: float = 1.0  # the head's steps
    report_every_s: float = REPORT_EVERY_S  # a worker's reports

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._server: PeerServer | None = None
        self._thread: threading.Thread | None = None
        self.generation = 0  # a worker's: the head's generation its engine runs
        self._misses = 0
        self._warned_at = 0.0
        own = self._report()
        self.roster = Roster(self.member.nodes, own, self.member.names, self.options.lost_after_s,
                             since=self.clock())

    def start(self) -> None:
        if self.member.is_head:
            self._server = PeerServer(self.member.address, self.options.peer_port, self._on_report, self.view)
            self._server.start()
        self.state.cluster = self.view()
        self._thread = threading.Thread(target=self._loop, name="kiln-cluster", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        if self._server:
            self._server.stop()

    def _loop(self) -> None:
        every = self.interval_s if self.member.is_head else self.report_every_s
        while not self._stop.wait(every):
            try:
                self.step()
            except Exception:  # the watch must outlive any one bad step
                log.exception("cluster step failed")

    def step(self) -> None:
        if self.member.is_head:
            self._head_step()
        else:
            self._worker_step()
        self.state.cluster = self.view()

    # -- the head ----------------------------------------------------------------------------------------------
    def _on_report(self, report: NodeReport) -> dict[str, Any]:
        with self._lock:
            self.roster.record(report, self.clock())
            return {"cluster": self.member.name, "generation": self._live_generation()}

    def _live_generation(self) -> int:
        """The generation the head's engine runs now; 0 while it is held or not yet started for the current one,
        so that no worker restarts for a generation that is over."""
        running = self.engine.running is not None and not self.engine.held  # read before launches (see _launch)
        live = running and self.roster.engine_on and self.engine.launches == self.roster.generation
        return self.roster.generation if live else 0

    def _head_step(self) -> None:
        now = self.clock()
        with self._lock:
            self.roster.head = self._report()
            action = self.roster.step(now, self.engine.launches)
            lost, waiting = list(self.roster.lost), self.roster.waiting_for(now)
            since, complete = self.roster.since, self.roster.complete(now)
        if action == "start":
            log.info("cluster %s: every node answers; starting the engine on all %d", self.member.name,
                     self.member.nodes)
            self.supervisor.release(self.engine)
        elif action == "stop":
            what = f"cluster {self.member.name}: node lost: {'; '.join(lost)}"
            fix = ("vLLM cannot serve without every node: the engine restarts on all nodes once the node answers "
                   "again; on that node see `journalctl -u kiln-agent -u 'kiln-vllm@*'`")
            log.error("%s (fix: %s)", what, fix)
            self.state.fail(what, fix)
            self.supervisor.hold(self.engine, "a node was lost")
        elif waiting and now - since > WARN_EVERY_S and now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            what = f"cluster {self.member.name}: waiting for {'; '.join(waiting)}"
            fix = (f"start the node with the same cluster settings; it must reach {self.member.head_address}:"
                   f"{self.options.peer_port} over the private network (journalctl -u kiln-agent on it)")
            log.warning("%s (fix: %s)", what, fix)
            self.state.fail(what, fix)
        elif (not complete and self.engine.launches and now - since > JOIN_WARNING_S
              and now - self._warned_at >= WARN_EVERY_S):
            self._warned_at = now
            self.state.fail(f"cluster {self.member.name}: not every node has joined the engine "
                            f"{now - since:.0f} s after it started", "see each node's `kiln status` and journal")

    # -- a worker ----------------------------------------------------------------------------------------------
    def _worker_step(self) -> None:
        report = self._report()
        try:
            answer = send_report(self.member.head_address, report, port=self.options.peer_port)
        except (requests.RequestException, ValueError) as exc:
            self._misses += 1
            if self._misses == HEAD_LOST_REPORTS:
                what = (f"cluster {self.member.name}: the head {self.member.head_address}:{self.options.peer_port} "
                        f"does not answer ({type(exc).__name__})")
                fix = "check that kiln-agent runs on the head and that this node reaches it over the private network"
                log.error("%s (fix: %s)", what, fix)
                self.state.fail(what, fix)
            return
        self._misses = 0
        target = worker_step(int(answer.get("generation") or 0), self.generation)
        if target is None:
            return
        log.info("cluster %s: the head started generation %d; (re)starting this node's engine for it",
                 self.member.name, target)
        if self.engine.running is not None:
            self.supervisor.hold(self.engine, f"the head started generation {target}")
        self.generation = target
        self.supervisor.release(self.engine)

    # -- reports -----------------------------------------------------------------------------------------------
    def _report(self) -> NodeReport:
        running = self.engine.running is not None and not self.engine.held
        generation = self.engine.launches if self.member.is_head else self.generation
        return NodeReport(self.member.rank, socket.gethostname(), self.member.address, running, generation,
                          self.engine.launches, self.gpus, self.engine.last_error if not running else None)

    def view(self) -> dict[str, Any]:
        base = {**self.member.as_dict(), "peer_port": self.options.peer_port}
        if self.member.is_head:
            with self._lock:
                return {**base, "generation": self.roster.generation, "complete": self.roster.complete(self.clock()),
                        "members": self.roster.view(self.clock())}
        return {**base, "generation": self.generation, "head_answers": self._misses < HEAD_LOST_REPORTS,
                "members": [self._report().as_dict()]}
