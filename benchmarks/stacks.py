"""Serving stacks and vLLM's benchmark client, shared by the benchmark scripts."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from vllm.benchmarks.serve import add_cli_args
from vllm.benchmarks.serve import main as run_vllm_bench
from vllm.utils.argparse_utils import FlexibleArgumentParser

from kiln.bench.setups import Ports, kiln_up
from kiln.processes import LocalProcesses, ProcessSpec
from kiln.serve.agent import http_probe
from kiln.serve.front.front import Front
from kiln.serve.front.proxy import ProxySettings, find_nginx, nginx_argv
from kiln.serve.layout import ServeLayout
from kiln.serve.processes.router import RouterClient, RouterSettings, find_router, router_argv
from kiln.serve.processes.supervisor import Member, Supervisor, SupervisorSettings

REPO = Path(__file__).resolve().parents[1]
PORTS = Ports()
LAYOUT_PORTS = {"public_port": PORTS.public, "router_port": PORTS.router, "router_metrics_port": PORTS.router_metrics,
                "health_port": PORTS.health}
FAKE_PORTS = (19100, 19101)


def wait_http(url: str, timeout_s: float, headers: dict[str, str] | None = None,
              certificate: str | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException):
            if requests.get(url, headers=headers, timeout=2, verify=certificate or True).status_code == 200:
                return
        time.sleep(0.5)
    raise SystemExit(f"{url} did not answer within {timeout_s:.0f} s")


@dataclass(frozen=True)
class Endpoints:
    public: str
    direct: str
    key: str
    certificate: str | None = None  # pinned by the client when the public endpoint serves TLS


@contextlib.contextmanager
def fake_stack(state: Path, tls: bool = False) -> Iterator[Endpoints]:
    """Two fake backends behind kiln's front and router."""
    layout = ServeLayout(state_dir=state, public_host="127.0.0.1", http_port=None, **LAYOUT_PORTS)
    nginx, router = find_nginx(), find_router()
    if not nginx or not router:
        raise SystemExit("needs nginx and vllm-router: run ci/setup.sh")
    front = Front(layout, ProxySettings(max_in_flight=4096))
    key = front.load_keys(None, None).keys[0].secret
    files = front.choose_tls("self-signed" if tls else "off", ["127.0.0.1"]).files
    front.write_config()
    backends = [Member(ProcessSpec(f"fake-{port}", (sys.executable, "-m", "benchmarks.fake_openai", "--port",
                                                     str(port), "--model", "tiny-cpu"), {"PYTHONPATH": str(REPO)},
                                   state / f"fake-{port}.log"),
                       probe_url=f"http://127.0.0.1:{port}/health", route_url=f"http://127.0.0.1:{port}", port=port)
                for port in FAKE_PORTS]
    proxy = Member(ProcessSpec("proxy", nginx_argv(nginx, layout), log_file=state / "proxy.log"))
    router_member = Member(ProcessSpec("router", router_argv(router, layout, RouterSettings()),
                                       log_file=state / "router.log"), probe_url=f"{layout.router_url}/health")
    supervisor = Supervisor(LocalProcesses(), RouterClient(layout.router_url), http_probe,
                            SupervisorSettings(stop_grace_s=5), router=router_member, others=[proxy],
                            instances=backends)
    supervisor.start()
    try:
        deadline = time.monotonic() + 60
        while len(supervisor.ready_instances()) < len(backends) or not all(b.routed for b in backends):
            if time.monotonic() > deadline:
                raise SystemExit(f"the fake stack did not come up; logs in {state}")
            time.sleep(0.2)
        public = layout.endpoint_url("127.0.0.1", tls)
        certificate = str(files.certificate) if files else None
        wait_http(f"{public}/v1/models", 30, {"Authorization": f"Bearer {key}"}, certificate)
        yield Endpoints(public, backends[0].route_url or "", key, certificate)
    finally:
        supervisor.stop()


@contextlib.contextmanager
def vllm_stack(state: Path, policy: str = RouterSettings.policy, instances: int = 2,
               tls: bool = False) -> Iterator[Endpoints]:
    """`kiln up` with tiny CPU instances; direct is the first instance."""
    print(f"starting kiln up ({instances} vLLM CPU instance(s), about 80 s)...", flush=True)
    with kiln_up(state, "tiny-cpu", PORTS, instances, policy, tls=tls) as running:
        yield Endpoints(running.url, running.direct, running.api_key or "", running.certificate)


def bench(base_url: str, key: str, tokenizer: Path, workload: list[str]) -> dict[str, Any]:
    """One run of vLLM's benchmark client (streaming completions); its console report is kept out of ours. Against
    a TLS endpoint it does not check the self-signed certificate (--insecure): the handshake and the encryption,
    which are the cost measured, are the same."""
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    bench_args = parser.parse_args([
        "--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions", "--model", "tiny-cpu",
        "--tokenizer", str(tokenizer), "--ignore-eos", "--disable-tqdm", "--percentile-metrics", "ttft,tpot,e2el",
        "--metric-percentiles", "50,99", "--ready-check-timeout-sec", "0", *workload,
        *(["--insecure"] if base_url.startswith("https://") else [])])
    os.environ["OPENAI_API_KEY"] = key
    with contextlib.redirect_stdout(io.StringIO()):
        result: dict[str, Any] = run_vllm_bench(bench_args)
    return result
