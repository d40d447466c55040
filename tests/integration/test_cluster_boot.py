"""A cluster formed at boot, for real: a kiln agent (`kiln up`) in each of two network namespaces joined by a veth
pair, both given `cluster: {name, nodes: 2, head, rank}`. The head plans the tiny model as a pipeline over the
two nodes, runs the router and the front, and starts the engine once the worker reports; the worker runs its
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from tests.netns import ADDRESSES, NAMESPACES, in_namespace, namespaces_left, two_namespaces

pytestmark = pytest.mark.integration

KILN = str(Path(sys.executable).parent / "kiln")
PORT, HEALTH = 8000, 8090
STARTUP_TIMEOUT_S = 900  # two engines compiling on two shared cores
COMPLETION = {"model": "tiny-cpu", "prompt": "hello world", "max_tokens": 8}


@dataclass
class Node:
    rank: int
    state: Path
    proc: subprocess.Popen[bytes] | None = None
    logs: list[Path] = field(default_factory=list)

    def start(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        (self.state / "kiln.yaml").write_text(
            f"cluster: {{name: pair, nodes: 2, head: {ADDRESSES[0]}, rank: {self.rank}}}\n")
        log = self.state / "agent.log"
        argv = [KILN, "up", "--state-dir", str(self.state), "--host", "0.0.0.0", "--port", str(PORT), "--tls", "off",
                "--no-self-check", "--config", str(self.state / "kiln.yaml")]
        env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "nobind"}  # both "nodes" share this machine's cores
        with log.open("ab") as out:
            self.proc = subprocess.Popen(in_namespace(NAMESPACES[self.rank], argv), stdout=out,
                                         stderr=subprocess.STDOUT, env=env)

    def curl(self, url: str, data: dict[str, Any] | None = None, headers: tuple[str, ...] = (),
             timeout_s: int = 10) -> tuple[int, str]:
        argv = ["curl", "-s", "-m", str(timeout_s), "-w", "\n%{http_code}", url]
        for h in headers:
            argv += ["-H", h]
        if data is not None:
            argv += ["-H", "Content-Type: application/json", "-d", json.dumps(data)]
        out = subprocess.run(in_namespace(NAMESPACES[self.rank], argv), capture_output=True, text=True,
                             check=False).stdout
        body, _, code = out.rpartition("\n")
        return int(code or 0), body

    def status(self) -> dict[str, Any]:
        code, body = self.curl(f"http://127.0.0.1:{HEALTH}/status")
        return json.loads(body) if code == 200 else {}

    def complete(self) -> tuple[int, str]:
        key = json.loads((self.state / "keys.json").read_text())["keys"][0]["key"]
        return self.curl(f"http://127.0.0.1:{PORT}/v1/completions", COMPLETION,
                         (f"Authorization: Bearer {key}",), timeout_s=60)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def tail(self) -> str:
        return f"--- node {self.rank}\n" + (self.state / "agent.log").read_text(errors="replace")[-3000:]


@contextmanager
def two_agents(root: Path) -> Iterator[tuple[Node, Node]]:
    nodes = (Node(0, root / "node0"), Node(1, root / "node1"))
    with two_namespaces():
        try:
            nodes[1].start()
            nodes[0].start()
            yield nodes
        finally:
            for node in nodes:
                node.stop()


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, nodes: tuple[Node, Node]) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        for node in nodes:
            assert node.proc is not None and node.proc.poll() is None, f"node {node.rank} exited\n{node.tail()}"
        if check():
            return time.monotonic() - began
        time.sleep(2)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s\n{nodes[0].tail()}\n{nodes[1].tail()}")


def serving(head: Node) -> bool:
    status = head.status()
    return status.get("phase") == "ready" and bool((status.get("cluster") or {}).get("complete"))


def test_two_agents_form_a_cluster_serve_and_restart_it_when_the_worker_engine_dies(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with two_agents(tmp_path) as (head, worker):
        ready = wait_for("the cluster serving", lambda: serving(head), STARTUP_TIMEOUT_S, (head, worker))
        code, body = head.complete()
        assert code == 200 and '"text"' in body, body
        cluster = head.status()["cluster"]
        assert cluster["role"] == "head" and cluster["generation"] == 1
        rows = {m["rank"]: m for m in cluster["members"]}
        assert rows[1]["address"] == ADDRESSES[1] and rows[1]["up"] and rows[1]["joined"]
        assert rows[1]["gpus"] == [] and rows[0]["gpus"] == []  # the CPU machine: no GPU to list
        argv = head.status()["plan"]["instances"][0]["argv"]
        assert argv[argv.index("--pipeline-parallel-size") + 1] == "2" and "--headless" not in argv
        assert worker.status()["cluster"]["role"] == "worker"

        # kill -9 the worker's engine, all of its processes.
        engine = worker.status()["instances"][0]
        victims = [psutil.Process(engine["pid"]), *psutil.Process(engine["pid"]).children(recursive=True)]
        for p in victims:
            p.send_signal(signal.SIGKILL)
        lost = wait_for("the head to report the lost node", lambda: "node lost" in str(
            (head.status().get("last_error") or {}).get("error")), 120, (head, worker))
        error = head.status()["last_error"]
        assert ADDRESSES[1] in error["error"] and error["fix"], error
        back = wait_for("the cluster serving again", lambda: serving(head) and head.status()["cluster"][
            "generation"] >= 2, STARTUP_TIMEOUT_S, (head, worker))
        code, again = head.complete()
        assert code == 200 and '"text"' in again, again
        generation = head.status()["cluster"]["generation"]
    with capsys.disabled():
        print(f"\n  measured: two kiln agents formed the cluster and served after {ready:.0f} s; the worker's engine "
              f"killed, the head reported the node lost after {lost:.0f} s and served again {back:.0f} s later "
              f"(the engine's generation {generation} on both nodes)")
    assert not namespaces_left()
    leftovers = [p.pid for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert not leftovers
