"""A cluster formed at boot, for real: a kiln agent (`kiln up`) in each of two network namespaces joined by a veth
pair, both given only `cluster: {name: pair, nodes: 2}` and `do_token`. Each finds its rank and the head from the
droplets tagged kiln-cluster:pair, through its own metadata service (169.254.169.254 in its namespace) and
DigitalOcean's API (tests/do_api.py, on the private network). The head plans the tiny model as a pipeline over
the two nodes, runs the router and the front, and starts the engine once the worker reports; the worker runs its
stage headless. A kill -9 of the worker's engine is seen by the head, which restarts the engine on both."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from tests.do_api import TOKEN
from tests.netns import ADDRESSES, NAMESPACES, can_make_namespaces, in_namespace, ip, namespaces_left, two_namespaces

from kiln.processes import interrupt

pytestmark = pytest.mark.skipif(not can_make_namespaces(), reason="network namespaces need root and iproute2")

KILN = str(Path(sys.executable).parent / "kiln")
REPO = Path(__file__).resolve().parents[2]
PORT, HEALTH, API_PORT = 8000, 8090, 8088
METADATA = "169.254.169.254"
STARTUP_TIMEOUT_S = 900  # two engines compiling on two shared cores
COMPLETION = {"model": "tiny-cpu", "prompt": "hello world", "max_tokens": 8}
TAG = "kiln-cluster:pair"


@dataclass
class Node:
    ns: int  # which namespace
    droplet_id: int
    state: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return f"pair-{self.ns}"

    @property
    def droplet(self) -> dict[str, Any]:
        """As GET /v2/droplets lists it."""
        return {"id": self.droplet_id, "name": self.name, "status": "active", "tags": [TAG],
                "gpu_info": {"count": 8, "model": "nvidia_h100"}, "networks": {"v4": [
                    {"ip_address": ADDRESSES[self.ns], "netmask": "255.255.255.0", "type": "private"}]}}

    def run(self, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(in_namespace(NAMESPACES[self.ns], argv), stdout=out, stderr=subprocess.STDOUT,
                                    cwd=REPO, env={**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                                                   "DIGITALOCEAN_API_URL": f"http://{ADDRESSES[0]}:{API_PORT}"})

    def start(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        (self.state / "kiln.yaml").write_text(f"cluster: {{name: pair, nodes: 2}}\ndo_token: {TOKEN}\n")
        self.proc = self.run([KILN, "up", "--state-dir", str(self.state), "--host", "0.0.0.0", "--port", str(PORT),
                              "--tls", "off", "--no-self-check", "--config", str(self.state / "kiln.yaml")],
                             self.state / "agent.log")

    def curl(self, url: str, data: dict[str, Any] | None = None, headers: tuple[str, ...] = (),
             timeout_s: int = 10) -> tuple[int, str]:
        argv = ["curl", "-s", "-m", str(timeout_s), "-w", "\n%{http_code}", url]
        for h in headers:
            argv += ["-H", h]
        if data is not None:
            argv += ["-H", "Content-Type: application/json", "-d", json.dumps(data)]
        out = subprocess.run(in_namespace(NAMESPACES[self.ns], argv), capture_output=True, text=True,
                             check=False).stdout
        body, _, code = out.rpartition("\n")
        return int(code or 0), body

    def status(self) -> dict[str, Any]:
        code, body = self.curl(f"http://127.0.0.1:{HEALTH}/status")
        return json.loads(body) if code == 200 else {}

    def status_text(self) -> str:
        argv = [KILN, "status", "--health", f"http://127.0.0.1:{HEALTH}"]
        return subprocess.run(in_namespace(NAMESPACES[self.ns], argv), capture_output=True, text=True,
                              check=False).stdout

    def complete(self) -> tuple[int, str]:
        key = json.loads((self.state / "keys.json").read_text())["keys"][0]["key"]
        return self.curl(f"http://127.0.0.1:{PORT}/v1/completions", COMPLETION,
                         (f"Authorization: Bearer {key}",), timeout_s=60)

    def stop(self) -> None:
        if self.proc:
            interrupt(self.proc)

    def tail(self) -> str:
        log = self.state / "agent.log"
        return f"--- {self.name}\n" + (log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)")


@contextmanager
def two_droplets(root: Path) -> Iterator[tuple[Node, Node]]:
    """Two tagged droplets, each with its metadata service, and DigitalOcean's API on the private network. The
    droplet in the second namespace is the older (the lower ID), so it must lead."""
    head, worker = Node(1, 500000001, root / "head"), Node(0, 500000002, root / "worker")
    with two_namespaces():
        helpers = []
        try:
            (root / "droplets.json").write_text(json.dumps([worker.droplet, head.droplet]))
            helpers.append(worker.run([sys.executable, "-m", "tests.do_api", "--bind", f"{ADDRESSES[0]}:{API_PORT}",
                                       "--droplets", str(root / "droplets.json")], root / "api.log"))
            for node in (head, worker):
                ip("-n", NAMESPACES[node.ns], "addr", "add", f"{METADATA}/32", "dev", "lo")
                helpers.append(node.run([sys.executable, "-m", "tests.do_metadata", "--bind", f"{METADATA}:80",
                                         "--droplet-id", str(node.droplet_id), "--hostname", node.name,
                                         "--private-ip", ADDRESSES[node.ns], "--tag", TAG], root / "metadata.log"))
            yield head, worker
        finally:
            for node in (head, worker):
                node.stop()
            for helper in helpers:
                helper.kill()
                helper.wait()


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, nodes: tuple[Node, ...]) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        for node in nodes:
            assert node.proc is not None and node.proc.poll() is None, f"{node.name} exited\n{node.tail()}"
        if check():
            return time.monotonic() - began
        time.sleep(2)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s\n" + "\n".join(n.tail() for n in nodes))


def serving(head: Node) -> bool:
    status = head.status()
    return status.get("phase") == "ready" and bool((status.get("cluster") or {}).get("complete"))


def last_error(node: Node) -> str:
    return str((node.status().get("last_error") or {}).get("error"))


def test_two_agents_find_each_other_by_tag_serve_and_restart_the_cluster_when_the_worker_engine_dies(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with two_droplets(tmp_path) as (head, worker):
        head.start()
        wait_for("the head to name the node it waits for", lambda: "waiting for pair-0 (rank 1)" in last_error(head),
                 120, (head,))
        assert head.status()["phase"] == "joining" and head.status()["cluster"]["found_by"] == f"tag {TAG}"
        waiting = head.status()["last_error"]
        assert f"reach {ADDRESSES[1]}:8091 over the private network" in waiting["fix"], waiting
        worker.start()
        ready = wait_for("the cluster serving", lambda: serving(head), STARTUP_TIMEOUT_S, (head, worker))
        code, body = head.complete()
        assert code == 200 and '"text"' in body, body
        cluster = head.status()["cluster"]
        assert (cluster["role"], cluster["rank"], cluster["head"], cluster["generation"]) == (
            "head", 0, ADDRESSES[1], 1)
        rows = {m["rank"]: m for m in cluster["members"]}
        assert rows[1]["address"] == ADDRESSES[0] and rows[1]["up"] and rows[1]["joined"]
        assert rows[1]["gpus"] == [] and rows[0]["gpus"] == []  # the CPU machine: no GPU to list
        argv = head.status()["plan"]["instances"][0]["argv"]
        assert argv[argv.index("--pipeline-parallel-size") + 1] == "2" and "--headless" not in argv
        assert argv[argv.index("--master-addr") + 1] == ADDRESSES[1]
        assert worker.status()["cluster"]["role"] == "worker"
        assert "--headless" in worker.status()["plan"]["instances"][0]["argv"]
        assert f"endpoint  on the head, {ADDRESSES[1]}" in worker.status_text()
        shown = head.status_text()
        assert "cluster   pair: head, rank 0 of 2" in shown and "TP1 x PP2 x 1" in shown, shown
        assert any(line.split()[:3] == ["1", "pair-0", ADDRESSES[0]] for line in shown.splitlines()), shown

        # kill -9 the worker's engine, all of its processes.
        engine = worker.status()["instances"][0]
        victims = [psutil.Process(engine["pid"]), *psutil.Process(engine["pid"]).children(recursive=True)]
        for p in victims:
            p.send_signal(signal.SIGKILL)
        lost = wait_for("the head to report the lost node", lambda: "node lost" in last_error(head), 120,
                        (head, worker))
        error = head.status()["last_error"]
        assert "pair-0 (rank 1, 10.231.0.1)" in error["error"] and error["fix"], error
        back = wait_for("the cluster serving again", lambda: serving(head) and head.status()["cluster"][
            "generation"] >= 2, STARTUP_TIMEOUT_S, (head, worker))
        code, again = head.complete()
        assert code == 200 and '"text"' in again, again
        generation = head.status()["cluster"]["generation"]
    with capsys.disabled():
        print(f"\n  measured: two kiln agents found each other by the tag {TAG} and served after {ready:.0f} s; "
              f"the worker's engine killed, the head reported the node lost after {lost:.0f} s and served again "
              f"{back:.0f} s later (the engine's generation {generation} on both nodes)\n{shown}")
    assert not namespaces_left()
    leftovers = [p.pid for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert not leftovers
