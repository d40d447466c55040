"""One model on two nodes through vLLM's own multi-node paths: two network namespaces joined by a veth pair, each
running the command line kiln renders for its rank, with vLLM's CPU backend and the tiny model. Both layouts kiln
plans across nodes: a pipeline stage per node (`--nnodes 2 --node-rank R --master-addr HEAD`) and a data-parallel
rank per node (`--data-parallel-size-local 1 --data-parallel-address HEAD`), `--headless` on rank 1."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from tests.netns import ADDRESSES, LINKS, NAMESPACES, can_make_namespaces, in_namespace, namespaces_left, two_namespaces

import kiln
from kiln.choice.schema import Choice
from kiln.planner.search import make_plan
from kiln.render.cluster import DP_RPC_PORT, Node, node_argv, node_env
from kiln.render.vllm import Runtime
from kiln.setup.types import Plan
from kiln.tinymodel import make_tiny_model
from kiln.wiring import Kiln

pytestmark = pytest.mark.skipif(not can_make_namespaces(), reason="network namespaces need root and iproute2")

SHIM = Path(kiln.__file__).parent / "data" / "vllm" / "kiln_vllm_serve.py"
STARTUP_TIMEOUT_S = 900  # two engines compiling on two shared cores


@dataclasses.dataclass
class Cluster:
    plan: Plan
    runtime: Runtime
    logs: Path
    procs: dict[int, subprocess.Popen[bytes]] = dataclasses.field(default_factory=dict)

    def start(self, rank: int) -> None:
        node = Node(rank, 2, ADDRESSES[0], address=ADDRESSES[rank], interface=LINKS[rank])
        env = {**os.environ, **node_env(self.plan, node, self.runtime, local_model=True),
               # Both "nodes" share this machine's two cores: neither may pin them.
               "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
        log = (self.logs / f"node{rank}.log").open("ab")
        self.procs[rank] = subprocess.Popen(
            in_namespace(NAMESPACES[rank], list(node_argv(self.plan, node, self.runtime, local_model=True))),
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self, rank: int) -> None:
        proc = self.procs.pop(rank)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def curl(self, path: str, data: str | None = None, timeout_s: int = 120) -> subprocess.CompletedProcess[str]:
        port = self.plan.instances[0].port
        argv = ["curl", "-s", "-m", str(timeout_s), "-w", "\n%{http_code}", f"http://127.0.0.1:{port}{path}"]
        if data:
            argv += ["-H", "Content-Type: application/json", "-d", data]
        return subprocess.run(in_namespace(NAMESPACES[0], argv), capture_output=True, text=True, check=False)

    def healthy(self) -> bool:
        return self.curl("/health", timeout_s=5).stdout.endswith("200")

    def tail(self) -> str:
        return "\n".join((self.logs / f"node{r}.log").read_text(errors="replace")[-2500:] for r in (0, 1))


def wait_for(what: str, check: Callable[[], bool], timeout_s: float, cluster: Cluster) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if check():
            return time.monotonic() - began
        time.sleep(2)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s\n{cluster.tail()}")


COMPLETION = '{"model": "tiny-cpu", "prompt": "hello world", "max_tokens": 8}'


def complete(cluster: Cluster) -> str:
    reply = cluster.curl("/v1/completions", COMPLETION)
    body, _, code = reply.stdout.rpartition("\n")
    assert code == "200", reply.stdout + reply.stderr
    return body


def two_node_cluster(kiln: Kiln, tmp_path: Path, **engine: int) -> Cluster:
    """The tiny model over the two nodes, laid out by `engine` (pipeline_parallel_size or data_parallel_size)."""
    profile = kiln.catalog().get("tiny-cpu")
    one = make_plan(kiln.machine(None), profile, Choice(instances=1), kiln.constants)
    assert isinstance(one, Plan)
    plan = dataclasses.replace(one, engine=dataclasses.replace(one.engine, **engine))
    models = tmp_path / "models"
    make_tiny_model(profile, models / plan.engine.model)
    return Cluster(plan, Runtime(vllm_command=(sys.executable, str(SHIM)), models_dir=str(models),
                                 extra_env=(("HF_HOME", str(tmp_path / "hf")),)), tmp_path)


def test_two_nodes_serve_one_model_and_recover_from_a_killed_worker_node(kiln: Kiln, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    cluster = two_node_cluster(kiln, tmp_path, pipeline_parallel_size=2)
    with two_namespaces():
        try:
            cluster.start(1)
            cluster.start(0)
            ready = wait_for("two nodes serving", cluster.healthy, STARTUP_TIMEOUT_S, cluster)
            first = complete(cluster)
            # vLLM cannot lose a rank: once the worker node's engine dies the head serves nothing more, though its
            # /health goes on answering 200 until a request reaches the lost stage ...
            cluster.kill(1)
            still = cluster.healthy()
            lost = wait_for("the head to fail a request", lambda: cluster.procs[0].poll() is not None or not
                            cluster.curl("/v1/completions", COMPLETION, timeout_s=20).stdout.endswith("200"),
                            180, cluster)
            # ... and serves again once the engine is restarted on both nodes.
            if cluster.procs[0].poll() is None:
                cluster.kill(0)
            else:
                cluster.procs.pop(0)
            cluster.start(1)
            cluster.start(0)
            back = wait_for("two nodes serving again", cluster.healthy, STARTUP_TIMEOUT_S, cluster)
            again = complete(cluster)
        finally:
            for rank in list(cluster.procs):
                cluster.kill(rank)
    with capsys.disabled():
        print(f"\n  measured: two nodes (PP2 over a veth pair) serving after {ready:.0f} s; after the worker node's "
              f"kill -9 the head's /health said {'200' if still else 'not 200'} and a request failed within "
              f"{lost:.0f} s; serving again {back:.0f} s after both restarted")
    assert '"text"' in first and '"text"' in again
    assert_nothing_left()


def test_two_nodes_serve_one_model_as_two_data_parallel_ranks(kiln: Kiln, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's other multi-node path: a data-parallel rank per node, the head's API server and coordinator at
    --data-parallel-address, the worker headless from --data-parallel-start-rank 1."""
    cluster = two_node_cluster(kiln, tmp_path, data_parallel_size=2)
    with two_namespaces():
        try:
            cluster.start(1)
            cluster.start(0)
            ready = wait_for("two data-parallel ranks serving", cluster.healthy, STARTUP_TIMEOUT_S, cluster)
            answers = [complete(cluster) for _ in range(4)]
        finally:
            for rank in list(cluster.procs):
                cluster.kill(rank)
    worker = (tmp_path / "node1.log").read_text(errors="replace")
    # The head's API server answers only once every rank's engine has reported in, the remote one included.
    assert f"head node address tcp://{ADDRESSES[0]}:{DP_RPC_PORT}" in worker and "EngineCore_DP1" in worker
    assert all('"text"' in a for a in answers)
    with capsys.disabled():
        print(f"\n  measured: two nodes as data-parallel ranks 0 and 1 (DP2 over a veth pair) serving after "
              f"{ready:.0f} s")
    assert_nothing_left()


def assert_nothing_left() -> None:
    """Namespaces and processes."""
    assert not namespaces_left()
    leftovers = [p.pid for p in psutil.process_iter(["cmdline"]) if str(SHIM) in " ".join(p.info["cmdline"] or [])]
    assert not leftovers
