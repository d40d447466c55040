"""What the agent knows and reports: phase, choice, plan, instances, the last error with its fix, serving rate."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kiln.pricing import usd_per_million_tokens
from kiln.serve.processes.supervisor import HELD, READY, STARTING, Supervisor
from kiln.serve.reports.meter import TokenMeter

DETECTING, PLANNING, DOWNLOADING, STARTING_PHASE, READY_PHASE, DEGRADED, FAILED = (
    "detecting", "planning", "downloading", "starting", "ready", "degraded", "failed")
JOINING = "joining"  # a cluster's node: waiting for the other nodes before its engine starts


@dataclass(frozen=True)
class Fault:
    what: str
    fix: str
    at: str
    origin: str = ""  # what reported it ("reload"), so that the same part can say it is over

    def as_dict(self) -> dict[str, str]:
        return {"error": self.what, "fix": self.fix, "at": self.at}


def _now_text() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class AgentState:
    endpoint: str
    health: str
    keys_file: str
    state_dir: str = ""  # the agent's folder: how `kiln keys`, `kiln bench` and the rest find its files
    phase: str = DETECTING
    choice: dict[str, Any] = field(default_factory=dict)  # values, origins, problems; never the key
    plan: dict[str, Any] | None = None
    last_error: Fault | None = None
    usd_per_hour: float | None = None
    supervisor: Supervisor | None = None
    meter: TokenMeter = field(default_factory=TokenMeter)
    telemetry: Callable[[], list[dict[str, Any]]] = list
    self_check: dict[str, Any] | None = None
    doctor: dict[str, Any] | None = None  # the pre-flight report (`kiln doctor`)
    download: dict[str, Any] | None = None  # the model download: repo, bytes done and total, rate, ETA
    cache: dict[str, Any] | None = None  # the cache disk: where, how much room, and why
    startup: dict[str, Any] = field(default_factory=dict)  # the agent's steps, and each instance's vLLM phases
    tls: dict[str, Any] | None = None  # the certificate's mode, fingerprint, names and expiry; never the key
    keys: list[dict[str, Any]] = field(default_factory=list)  # each key's name and rate limit; never the key
    reload: dict[str, Any] | None = None  # the last `kiln reload`: when, and what it changed
    cluster: dict[str, Any] | None = None  # this node's part: rank, head, and on the head every node
    started_at: str = field(default_factory=_now_text)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def set_phase(self, phase: str) -> None:
        with self._lock:
            self.phase = phase

    def fail(self, what: str, fix: str, *, fatal: bool = False, origin: str = "") -> None:
        with self._lock:
            self.last_error = Fault(what, fix, _now_text(), origin)
            if fatal:
                self.phase = FAILED

    def recovered(self, origin: str) -> None:
        """The fault `origin` reported is over (a later reload applied cleanly): /status stops showing it."""
        with self._lock:
            if self.last_error is not None and self.last_error.origin == origin:
                self.last_error = None

    def current_phase(self) -> str:
        """Before serving, the phase set by the boot loop; after, what the instances say."""
        if self.phase in (DETECTING, PLANNING, DOWNLOADING, FAILED, JOINING) or self.supervisor is None:
            return self.phase
        states = [m.state for m in self.supervisor.instances]
        if states and all(s == HELD for s in states):
            return JOINING
        if states and all(s == READY for s in states):
            unrouted = len(self.supervisor.ready_instances()) < len(states)  # the router marks one unhealthy
            return DEGRADED if unrouted or (self.self_check or {}).get("degraded") else READY_PHASE
        if any(s == READY for s in states):
            return DEGRADED
        if all(s == STARTING for s in states) and not any(m.restarts for m in self.supervisor.instances):
            return STARTING_PHASE
        return DEGRADED

    def readiness(self) -> tuple[bool, str]:
        phase = self.current_phase()
        if self.supervisor and self.supervisor.ready_instances():
            router = self.supervisor.router
            if router is None or router.state == READY:
                return True, phase
            return False, "the router is not serving"
        if phase == FAILED and self.last_error:
            return False, f"failed: {self.last_error.what}"
        return False, f"no instance is serving yet (phase {phase})"

    def serving(self) -> dict[str, Any]:
        rate = self.meter.tokens_per_s()
        cost = usd_per_million_tokens(self.usd_per_hour, rate) if self.usd_per_hour is not None else None
        return {"output_tokens_per_s": round(rate, 2), "usd_per_hour": self.usd_per_hour,
                "usd_per_million_output_tokens": round(cost, 4) if cost is not None else None}

    def status(self, *, with_telemetry: bool = True) -> dict[str, Any]:
        members = self.supervisor.snapshot() if self.supervisor else []
        names = {m.name for m in self.supervisor.instances} if self.supervisor else set()
        return {
            "phase": self.current_phase(),
            "endpoint": self.endpoint,
            "health": self.health,
            "state_dir": self.state_dir,
            "keys_file": self.keys_file,
            "keys": self.keys,
            "tls": self.tls,
            "reload": self.reload,
            "started_at": self.started_at,
            "choice": self.choice,
            "plan": self.plan,
            "explanation": (self.plan or {}).get("explanation"),
            "instances": [m for m in members if m["name"] in names],
            "services": [m for m in members if m["name"] not in names],
            "last_error": self.last_error.as_dict() if self.last_error else None,
            "serving": self.serving(),
            "self_check": self.self_check,
            "doctor": self.doctor,
            "download": self.download,
            "cache": self.cache,
            # The boot's measured timeline beside the plan's predicted cold start (kiln/perf/coldstart.py).
            "startup": {**self.startup, "predicted": (self.plan or {}).get("cold_start")},
            "cluster": self.cluster,
            "gpus": self.telemetry() if with_telemetry else [],
        }
