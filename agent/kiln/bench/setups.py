"""The setups a comparison runs, one after the other on this machine: kiln's plan (`kiln up`) and vanilla vLLM
(one instance over all the GPUs with vLLM's default flags, the seeds' baseline)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import requests

from kiln.errors import KilnError
from kiln.processes import LocalProcesses, ProcessSpec, interrupt
from kiln.render.vllm import OFFLINE_ENV


@dataclass(frozen=True)
class Ports:
    public: int = 19000
    router: int = 19001
    router_metrics: int = 19002
    health: int = 19090
    vanilla: int = 19100


@dataclass(frozen=True)
class Running:
    url: str  # what clients call
    direct: str  # the first vLLM instance itself
    api_key: str | None
    health: str | None = None
    certificate: str | None = None  # the self-signed certificate a client pins, when the endpoint serves TLS


def _wait(check: Callable[[], bool], what: str, log: Path, timeout_s: float,
          proc: subprocess.Popen[bytes] | None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException):
            if check():
                return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(2)
    raise KilnError(f"{what} did not become ready", fix=f"see {log}")


@contextlib.contextmanager
def kiln_up(state: Path, profile: str, ports: Ports = Ports(), instances: int | None = None,
            policy: str | None = None, timeout_s: float = 900, tls: bool = False,
            config: Path | None = None) -> Iterator[Running]:
    """kiln's plan for this machine, served by `kiln up` behind its public endpoint (plain HTTP unless `tls`: the
    comparisons with vanilla vLLM leave TLS out, and benchmarks.endpoint_overhead measures it). `config`: a settings
    file it reads at start and at every `kiln reload`, which need not exist yet."""
    argv = [str(Path(sys.executable).parent / "kiln"), "up", "--profile", profile, "--state-dir", str(state),
            "--port", str(ports.public), "--health-port", str(ports.health), "--router-port", str(ports.router),
            "--router-metrics-port", str(ports.router_metrics), "--no-self-check",  # nothing else may load it
            "--tls", "self-signed" if tls else "off"]
    argv += ["--instances", str(instances)] if instances else []
    argv += ["--router-policy", policy] if policy else []
    argv += ["--config", str(config)] if config else []
    log = state / "kiln-up.log"
    state.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    health = f"http://127.0.0.1:{ports.health}"
    try:
        _wait(lambda: requests.get(f"{health}/status", timeout=2).json()["phase"] == "ready", "kiln up", log,
              timeout_s, proc)
        status = requests.get(f"{health}/status", timeout=5).json()
        keys = json.loads((state / "keys.json").read_text(encoding="utf-8"))["keys"]
        yield Running(f"http{'s' if tls else ''}://127.0.0.1:{ports.public}",
                      f"http://127.0.0.1:{status['instances'][0]['port']}", keys[0]["key"], health,
                      str(state / "tls" / "self-signed.crt") if tls else None)
    finally:
        interrupt(proc)


def vanilla_argv(model: str, served_name: str, port: int, gpu_count: int, needs: Sequence[str],
                 launcher: Sequence[str]) -> tuple[str, ...]:
    """vLLM with its defaults: only what loading the model needs (`needs`), and TP over every GPU."""
    argv = [*launcher, "--model", model, "--served-model-name", served_name, "--host", "127.0.0.1",
            "--port", str(port), *needs]
    if gpu_count > 1:
        argv += ["--tensor-parallel-size", str(gpu_count)]
    return tuple(argv)


@contextlib.contextmanager
def vanilla(state: Path, argv: Sequence[str], local_model: bool, env: dict[str, str] | None = None,
            timeout_s: float = 900) -> Iterator[Running]:
    state.mkdir(parents=True, exist_ok=True)
    port = argv[list(argv).index("--port") + 1]
    log = state / "vanilla-vllm.log"
    env = {**(env or {}), **(OFFLINE_ENV if local_model else {})}
    running = LocalProcesses().start(ProcessSpec("vanilla", tuple(argv), env, log))
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: requests.get(f"{url}/health", timeout=2).status_code == 200, "vanilla vLLM", log, timeout_s,
              running.popen)
        yield Running(url, url, None)
    finally:
        running.stop(60)
