"""vLLM's two multi-node executors side by side: its multiprocessing backend (what kiln renders today) against Ray,
for the same tiny model, pipeline-parallel 2 over two "nodes" on this machine.

Run (from the repository root; the lock keeps it off other heavy vLLM runs on a small machine):
    flock /tmp/kiln-cpu.lock timeout 1800 .venv/bin/python -m benchmarks.executor_backends
        [--backends mp,ray,ray-legacy,mp] [--requests 8] [--batch 4] [--max-tokens 32] [--ray-path /tmp/ray-target]
Ray itself, outside the virtualenv (vLLM's CI tests ray==2.48.0; msgpack is the one dependency it lacks here):
    .venv/bin/python -m pip install --target /tmp/ray-target --no-deps ray==2.48.0 'msgpack>=1,<2'

The two nodes are two network namespaces (kiln-bench0, kiln-bench1) joined by a veth pair (10.232.0.1/24 and
10.232.0.2/24), made here and removed at the end with every process left in them, whatever happens.
- mp: kiln's own command lines (kiln.render.cluster): `--nnodes 2 --node-rank R --master-addr 10.232.0.1`, the
  worker node `--headless`, vLLM's CPU backend, the tiny model with dummy weights.
- ray: `ray start --head` on node 0 and `ray start --address 10.232.0.1:6379` on node 1 (Ray imported from
  --ray-path, outside the virtualenv: vLLM does not depend on Ray), then one `vllm serve ...
  --distributed-executor-backend ray` on node 0, the same flags otherwise; ray-legacy the same with
  VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0 (RayDistributedExecutor rather than vLLM 0.32's default RayExecutorV2).
A backend named twice runs twice: the spread between two runs of one backend is the noise floor of this machine.
For each: seconds from the first launch to the head's /health answering 200 (for Ray, the cluster's own formation
too), one warm-up completion, N sequential completions (latency, output tok/s), a concurrent batch (output tok/s),
the resident memory of every process in both namespaces once serving, and the seconds to stop on SIGTERM. The
client runs inside node 0's namespace (this module's `client` mode), so no process start is timed. A backend that
does not come up gets its failure reason, the error lines vLLM or Ray printed, instead of figures. Each backend
starts with empty compile caches, so neither gets the other's compiled graphs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
from tests.netns import Pair, in_namespace, namespace_pids, two_namespaces

import kiln
from kiln.choice.schema import Choice
from kiln.cli.output import table
from kiln.planner.search import make_plan
from kiln.render.cluster import Node, node_argv, node_env
from kiln.render.vllm import Runtime, vllm_args
from kiln.setup.types import Plan
from kiln.tinymodel import make_tiny_model
from kiln.wiring import Kiln

REPO = Path(__file__).resolve().parent.parent
SHIM = Path(kiln.__file__).parent / "data" / "vllm" / "kiln_vllm_serve.py"
BENCH = Pair(("kiln-bench0", "kiln-bench1"), ("kiln-b0", "kiln-b1"), ("10.232.0.1", "10.232.0.2"))
NAMESPACES, LINKS, ADDRESSES = BENCH.namespaces, BENCH.links, BENCH.addresses
RAY_PORT = 6379
# ray: vLLM's default Ray executor (RayExecutorV2); ray-legacy: VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0, the older one.
BACKENDS = ("mp", "ray", "ray-legacy")
PROMPT = "The quick brown fox jumps over the lazy dog and"
# Generic last lines of a failed start; the root cause is printed before them.
WRAPPER_ERRORS = ("Engine core initialization failed", "Worker failed", "Failed core proc", "died unexpectedly")
ERROR_LINE = re.compile(r"(?:^|\] )((?:[A-Z]\w*)?(?:Error|Exception|Exit): .+)|\b(PANIC .+)")


def in_node(rank: int, argv: Sequence[str]) -> list[str]:
    return in_namespace(NAMESPACES[rank], argv)


def curl(port: int, path: str, timeout_s: int = 5) -> str:
    """The HTTP status of a GET on node 0's loopback, or '' when nothing answered."""
    argv = ["curl", "-s", "-o", "/dev/null", "-m", str(timeout_s), "-w", "%{http_code}", f"http://127.0.0.1:{port}{path}"]
    try:
        return subprocess.run(in_node(0, argv), capture_output=True, text=True, check=False,
                              timeout=timeout_s + 10).stdout.strip()
    except subprocess.TimeoutExpired:
        return ""


def rss_mib() -> tuple[float, int]:
    """Resident memory of every process in both namespaces (shared pages counted in each), and how many."""
    total, count = 0, 0
    for ns in NAMESPACES:
        for pid in namespace_pids(ns):
            with contextlib.suppress(psutil.Error):
                total += psutil.Process(pid).memory_info().rss
                count += 1
    return total / 2**20, count


def process_name(pid: int) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join(psutil.Process(pid).cmdline())[:80] or psutil.Process(pid).name()
    return str(pid)


# --- the client, run inside node 0's namespace ------------------------------------------------------------------

def _complete(url: str, model: str, max_tokens: int) -> tuple[float, int]:
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    began = time.perf_counter()
    with opener.open(request, timeout=300) as reply:
        answer = json.loads(reply.read())
    return time.perf_counter() - began, int(answer["usage"]["completion_tokens"])


def client(args: argparse.Namespace) -> int:
    """One warm-up, N sequential completions, then a concurrent batch; JSON on stdout."""
    url = f"http://127.0.0.1:{args.port}"
    out: dict[str, Any] = {}
    try:
        out["warmup_s"] = _complete(url, args.model, args.max_tokens)[0]
        out["sequential"] = [_complete(url, args.model, args.max_tokens) for _ in range(args.requests)]
        began = time.perf_counter()
        with ThreadPoolExecutor(args.batch) as pool:
            out["batch"] = list(pool.map(lambda _: _complete(url, args.model, args.max_tokens), range(args.batch)))
        out["batch_wall_s"] = time.perf_counter() - began
    except Exception as e:  # reported, not raised: the parent prints it as the failure
        out["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))
    return 0


# --- one backend ------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Result:
    backend: str
    healthy_s: float | None = None
    ray_cluster_s: float | None = None  # `ray start` on both nodes until both are alive in the cluster
    ray_daemons_mib: float | None = None  # the Ray cluster's own processes, before vLLM starts
    ray_daemons: int = 0
    warmup_s: float | None = None
    latencies_s: list[float] = dataclasses.field(default_factory=list)
    sequential_tok_s: float | None = None
    batch_tok_s: float | None = None
    batch_wall_s: float | None = None
    rss_mib: float | None = None
    processes: int = 0
    stop_s: float | None = None
    killed_after_sigterm: list[str] = dataclasses.field(default_factory=list)  # still there 30 s after SIGTERM
    failure: str = ""
    errors: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Bench:
    plan: Plan
    runtime: Runtime
    logs: Path
    ray_path: str
    args: argparse.Namespace
    name: str  # the backend, naming its logs
    scratch: Path  # this run's temporary folder: Ray's session files go there, not to /tmp/ray
    procs: list[subprocess.Popen[bytes]] = dataclasses.field(default_factory=list)

    @property
    def port(self) -> int:
        return self.plan.instances[0].port

    def node(self, rank: int) -> Node:
        return Node(rank, 2, ADDRESSES[0], address=ADDRESSES[rank], interface=LINKS[rank])

    def env(self, rank: int, ray: bool) -> dict[str, str]:
        env = {**os.environ, **node_env(self.plan, self.node(rank), self.runtime, local_model=True),
               # Both "nodes" share this machine's cores: neither may pin them.
               "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
        if ray:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (self.ray_path, env.get("PYTHONPATH")) if p)
            env["RAY_USAGE_STATS_ENABLED"] = "0"
        return env

    def launch(self, rank: int, argv: Sequence[str], env: dict[str, str], log_name: str) -> subprocess.Popen[bytes]:
        with (self.logs / log_name).open("ab") as log:  # the child keeps its own copy
            proc = subprocess.Popen(in_node(rank, argv), env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=REPO)
        self.procs.append(proc)
        return proc

    def wait_healthy(self, head: subprocess.Popen[bytes], began: float, result: Result, logs: Sequence[str]) -> bool:
        deadline = began + self.args.startup_timeout
        while time.monotonic() < deadline:
            if curl(self.port, "/health") == "200":
                result.healthy_s = time.monotonic() - began
                return True
            if head.poll() is not None:
                result.errors = error_lines(self.logs, logs)
                result.failure = (f"the head exited ({head.returncode}) {time.monotonic() - began:.0f} s after launch,"
                                  " before /health said 200")
                return False
            time.sleep(2)
        result.errors = error_lines(self.logs, logs)
        result.failure = f"/health not 200 within {self.args.startup_timeout:.0f} s"
        return False

    def measure(self, result: Result) -> None:
        result.rss_mib, result.processes = rss_mib()
        argv = [sys.executable, "-m", "benchmarks.executor_backends", "client", "--port", str(self.port),
                "--model", self.plan.engine.served_model_names[0], "--requests", str(self.args.requests),
                "--batch", str(self.args.batch), "--max-tokens", str(self.args.max_tokens)]
        reply = subprocess.run(in_node(0, argv), capture_output=True, text=True, check=False, cwd=REPO,
                               timeout=60 + 300 * (self.args.requests + self.args.batch + 1))
        try:
            out = json.loads(reply.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            result.failure = f"the client printed no result: {reply.stderr[-500:]}"
            return
        result.warmup_s = out.get("warmup_s")
        if out.get("sequential"):
            result.latencies_s = [lat for lat, _ in out["sequential"]]
            result.sequential_tok_s = sum(tok for _, tok in out["sequential"]) / sum(result.latencies_s)
        if out.get("batch"):
            result.batch_wall_s = out["batch_wall_s"]
            result.batch_tok_s = sum(tok for _, tok in out["batch"]) / out["batch_wall_s"]
        if out.get("error"):
            result.failure = f"a request failed: {out['error']}"

    def stop(self, result: Result, ray: bool = False) -> None:
        """SIGTERM, in turn, to each group of the processes in both namespaces; SIGKILL to what is left of a group
        after 30 s. mp: all at once. Ray: vLLM first, then in `ray stop`'s order (ray/scripts/scripts.py): the
        raylets, the other daemons, the GCS last (`ray stop` itself is per machine: here it would reach both nodes)."""
        launched = {proc.pid for proc in self.procs}
        groups: list[Callable[[psutil.Process], bool]] = [lambda p: True]
        if ray:
            groups = [lambda p: os.getpgid(p.pid) in launched, lambda p: "raylet" in " ".join(p.cmdline()[:1]),
                      lambda p: "gcs_server" not in " ".join(p.cmdline()[:1]), lambda p: True]
        began = time.monotonic()
        for group in groups:
            targets = []
            for pid in {pid for ns in NAMESPACES for pid in namespace_pids(ns)}:
                with contextlib.suppress(psutil.Error, ProcessLookupError):
                    process = psutil.Process(pid)
                    if group(process):
                        process.terminate()
                        targets.append(process)
            _, alive = psutil.wait_procs(targets, timeout=30)
            for process in alive:
                result.killed_after_sigterm.append(process_name(process.pid))
                with contextlib.suppress(psutil.Error):
                    process.kill()
        result.stop_s = time.monotonic() - began
        for pid in [pid for ns in NAMESPACES for pid in namespace_pids(ns)]:  # started since, by a dying process
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
        self.procs.clear()

    # -- the backends --

    def run_mp(self) -> Result:
        result = Result(self.name)
        began = time.monotonic()
        for rank in (1, 0):  # the worker node first, as kiln's agents may start them in any order
            self.launch(rank, node_argv(self.plan, self.node(rank), self.runtime, local_model=True),
                        self.env(rank, ray=False), f"{self.name}-node{rank}.log")
        head = self.procs[-1]
        if self.wait_healthy(head, began, result, [f"{self.name}-node0.log", f"{self.name}-node1.log"]):
            self.measure(result)
        self.stop(result)
        return result

    def ray_cli(self, rank: int, *args: str) -> subprocess.CompletedProcess[str]:
        log = self.logs / f"{self.name}-cli-node{rank}.log"
        with log.open("a") as out:  # a file, not a pipe: `ray start` leaves daemons holding its stdout
            proc = subprocess.run(in_node(rank, [sys.executable, "-m", "ray.scripts.scripts", *args]),
                                  env=self.env(rank, ray=True), stdout=out, stderr=subprocess.STDOUT, text=True,
                                  check=False, timeout=300, cwd=REPO)
        return proc

    def ray_nodes_alive(self) -> int:
        code = ("import ray; ray.init(address='auto', logging_level='ERROR'); "
                "print(sum(1 for n in ray.nodes() if n['Alive']))")
        try:
            reply = subprocess.run(in_node(0, [sys.executable, "-c", code]), env={
                **self.env(0, ray=True), "RAY_ADDRESS": f"{ADDRESSES[0]}:{RAY_PORT}"}, capture_output=True,
                text=True, check=False, timeout=120, cwd=REPO)
        except subprocess.TimeoutExpired:
            return 0
        lines = reply.stdout.strip().splitlines()
        return int(lines[-1]) if lines and lines[-1].isdigit() else 0

    def run_ray(self, legacy: bool = False) -> Result:
        result = Result(self.name)
        if not (Path(self.ray_path) / "ray" / "__init__.py").exists():
            result.failure = f"Ray is not at {self.ray_path} (pip install --target {self.ray_path} ray==2.48.0)"
            return result
        began = time.monotonic()
        common = ["--num-cpus", "2", "--num-gpus", "0", "--disable-usage-stats"]
        head = self.ray_cli(0, "start", "--head", "--node-ip-address", ADDRESSES[0], "--port", str(RAY_PORT),
                            "--include-dashboard", "false", "--temp-dir", str(self.scratch / "r"),
                            *common)
        joined = head.returncode == 0 and self.ray_cli(
            1, "start", "--address", f"{ADDRESSES[0]}:{RAY_PORT}", "--node-ip-address", ADDRESSES[1],
            *common).returncode == 0
        logs = [f"{self.name}-cli-node0.log", f"{self.name}-cli-node1.log"]
        if not joined:
            result.errors = error_lines(self.logs, logs)
            result.failure = "`ray start` failed"
            self.stop(result, ray=True)
            return result
        while time.monotonic() - began < 300 and self.ray_nodes_alive() < 2:
            time.sleep(2)
        result.ray_cluster_s = time.monotonic() - began
        result.ray_daemons_mib, result.ray_daemons = rss_mib()
        if self.ray_nodes_alive() < 2:
            result.failure = "the Ray cluster did not reach 2 alive nodes within 300 s"
            self.stop(result, ray=True)
            return result
        argv = [*self.runtime.serve_command(),
                *vllm_args(self.plan, self.plan.instances[0], self.runtime, local_model=True),
                "--distributed-executor-backend", "ray"]
        env = {**self.env(0, ray=True), "RAY_ADDRESS": f"{ADDRESSES[0]}:{RAY_PORT}",
               # vLLM 0.32's default Ray executor is RayExecutorV2; 0 picks the older RayDistributedExecutor.
               "VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "0" if legacy else "1"}
        vllm = self.launch(0, argv, env, f"{self.name}-head.log")
        if self.wait_healthy(vllm, began, result, [f"{self.name}-head.log", *logs]):
            self.measure(result)
        self.stop(result, ray=True)
        return result


def error_lines(folder: Path, logs: Sequence[str], most: int = 6) -> list[str]:
    """The distinct error lines of the logs, the root cause first and the generic wrappers last."""
    found: list[str] = []
    for name in logs:
        path = folder / name
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            match = ERROR_LINE.search(line)
            error = match and (match.group(1) or match.group(2))
            if error and error not in found:
                found.append(error)
    found.sort(key=lambda e: any(w in e for w in WRAPPER_ERRORS))
    return [e[:400] for e in found[:most]]


# --- the table --------------------------------------------------------------------------------------------------

def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return fmt.format(x) if x is not None else "-"


def _ratio(x: float | None, base: float | None) -> str:
    return f"{x / base:.2f}x" if x is not None and base else "-"


def report(results: Sequence[Result], args: argparse.Namespace) -> str:
    base = next((r for r in results if r.backend == "mp"), Result("none"))
    base_mean = statistics.mean(base.latencies_s) * 1000 if base.latencies_s else None
    rows = []
    for r in results:
        mean = statistics.mean(r.latencies_s) * 1000 if r.latencies_s else None
        p50 = statistics.median(r.latencies_s) * 1000 if r.latencies_s else None
        rows.append([r.backend, _f(r.healthy_s), _ratio(r.healthy_s, base.healthy_s),
                     _f(mean), _f(p50), _ratio(mean, base_mean), _f(r.sequential_tok_s),
                     _ratio(r.sequential_tok_s, base.sequential_tok_s), _f(r.batch_tok_s),
                     _ratio(r.batch_tok_s, base.batch_tok_s), _f(r.rss_mib, "{:.0f}"),
                     _f(r.stop_s) + (f" ({len(r.killed_after_sigterm)} killed)" if r.killed_after_sigterm else ""),
                     r.failure[:70]])
    lines = [f"tiny-cpu, PP=2 over two network namespaces (veth), vLLM's CPU backend; {args.requests} sequential "
             f"completions and a batch of {args.batch}, {args.max_tokens} output tokens each (ignore_eos)",
             table(["backend", "healthy s", "vs mp", "mean ms", "p50 ms", "vs mp", "seq tok/s", "vs mp",
                    f"batch{args.batch} tok/s", "vs mp", "RSS MiB", "stop s", "failure"], rows)]
    for r in results:
        extra = []
        if r.rss_mib is not None:
            extra.append(f"{r.processes} processes serving")
        if r.warmup_s is not None:
            extra.append(f"first (warm-up) completion {r.warmup_s * 1000:.0f} ms")
        if r.latencies_s:
            extra.append("sequential latencies ms " + " ".join(f"{x * 1000:.0f}" for x in r.latencies_s))
        if r.batch_wall_s is not None:
            extra.append(f"batch of {args.batch} in {r.batch_wall_s * 1000:.0f} ms")
        if r.ray_cluster_s is not None:
            extra.append(f"Ray cluster (2 nodes alive) {r.ray_cluster_s:.1f} s after `ray start --head`, its daemons"
                         f" {r.ray_daemons} processes, {_f(r.ray_daemons_mib, '{:.0f}')} MiB RSS, before vLLM started")
        if extra:
            lines.append(f"{r.backend}: " + "; ".join(extra))
        if len(r.failure) > 70:
            lines.append(f"{r.backend} failure: {r.failure}")
        if r.killed_after_sigterm:
            lines.append(f"{r.backend}: still running 30 s after SIGTERM, killed: {', '.join(r.killed_after_sigterm)}")
        for e in r.errors:
            lines.append(f"{r.backend} error: {e}")
    return "\n".join(lines)


# --- main -------------------------------------------------------------------------------------------------------

def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.executor_backends", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode")
    c = sub.add_parser("client", help="(internal) the requests, run inside node 0's namespace")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--model", required=True)
    for p in (parser, c):
        p.add_argument("--requests", type=int, default=8, help="sequential completions (default 8)")
        p.add_argument("--batch", type=int, default=4, help="concurrent completions in the batch (default 4)")
        p.add_argument("--max-tokens", type=int, default=32, help="output tokens per completion (default 32)")
    parser.add_argument("--backends", default="mp,ray",
                        help=f"comma-separated, from {', '.join(BACKENDS)}; one may repeat, for the spread "
                             "(default mp,ray)")
    parser.add_argument("--ray-path", default="/tmp/ray-target", help="a folder Ray is pip-installed into (--target)")
    parser.add_argument("--startup-timeout", type=float, default=900, help="seconds to /health 200 (default 900)")
    parser.add_argument("--logs", help="keep the processes' logs in this folder (default: a temporary one)")
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    if args.mode == "client":
        return client(args)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if unknown := set(backends) - set(BACKENDS):
        print(f"unknown backends: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("curl") is None:
        print("needs root, iproute2 and curl (network namespaces)", file=sys.stderr)
        return 2
    k = Kiln.create()
    profile = k.catalog().get("tiny-cpu")
    one = make_plan(k.machine(None), profile, Choice(instances=1), k.constants)
    assert isinstance(one, Plan)
    plan = dataclasses.replace(one, engine=dataclasses.replace(one.engine, pipeline_parallel_size=2))
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="kiln-executors-") as tmp:
        logs = Path(args.logs) if args.logs else Path(tmp) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        models = Path(tmp) / "models"
        make_tiny_model(profile, models / plan.engine.model)
        for i, backend in enumerate(backends):
            name = backend if backend not in backends[:i] else f"{backend}-{backends[:i].count(backend) + 1}"
            print(f"{backend}: starting ...", file=sys.stderr, flush=True)
            # Empty compile caches for each backend: neither starts with the other's compiled graphs.
            runtime = Runtime(vllm_command=(sys.executable, str(SHIM)), models_dir=str(models),
                              cache_root=str(Path(tmp) / f"cache-{name}"),
                              extra_env=(("HF_HOME", str(Path(tmp) / "hf")), ("HOME", str(Path(tmp) / "home"))))
            bench = Bench(plan, runtime, logs, args.ray_path, args, name, Path(tmp))
            run: Callable[[], Result] = (bench.run_mp if backend == "mp" else
                                         functools.partial(bench.run_ray, legacy=backend == "ray-legacy"))
            with two_namespaces(BENCH):
                try:
                    results.append(run())
                finally:
                    for proc in bench.procs:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(proc.pid, signal.SIGKILL)
            print(f"{backend}: done{': ' + results[-1].failure if results and results[-1].failure else ''}",
                  file=sys.stderr, flush=True)
    print(report(results, args))
    return 0 if all(not r.failure for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
