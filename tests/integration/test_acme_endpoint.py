"""The agent's endpoint with `tls: {domain: ...}`: it serves its self-signed certificate at once, gets one from
Pebble (Let's Encrypt's test ACME server) over HTTP-01 through its own nginx on the plain-HTTP port, swaps it in
without a restart, and renews it on `kiln reload --renew-certificate` while a stream is in flight, which
finishes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.verification import PolicyBuilder, Store
from tests.pebble import Pebble, available, free_port, pebble_server

from kiln.serve.front.tls import inspect

pytestmark = pytest.mark.skipif(available() is not None, reason=available() or "")
KILN = str(Path(sys.executable).parent / "kiln")
DOMAIN = "kiln.test"
KEY = "kiln-acme-test-key-0123456789"
TOKENS = 1500


def user_data(directory: str) -> str:
    return ("#cloud-config\nwrite_files:\n  - path: /etc/kiln/kiln.yaml\n    content: |\n      profile: tiny-cpu\n"
            f"      instances: 1\n      api_key: {KEY}\n      tls:\n        domain: {DOMAIN}\n"
            f"        email: ops@{DOMAIN}\n        directory: {directory}\n")


def served(port: int) -> x509.Certificate:
    return x509.load_pem_x509_certificate(ssl.get_server_certificate(("127.0.0.1", port), timeout=10).encode())


def verify(leaf: x509.Certificate, pebble: Pebble) -> None:
    """The served certificate chains to Pebble's root and names the domain."""
    roots = x509.load_pem_x509_certificates(pebble.issuing_roots_pem().encode())
    verifier = PolicyBuilder().store(Store([roots[0]])).build_server_verifier(x509.DNSName(DOMAIN))
    verifier.verify(leaf, roots[1:])


@contextlib.contextmanager
def agent(tmp_path: Path, state: Path, ports: dict[str, int], ca_bundle: Path) -> Iterator[subprocess.Popen[bytes]]:
    log = tmp_path / "agent.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [KILN, "agent", "run", "--root", str(tmp_path / "root"), "--state-dir", str(state), "--launcher",
             "process", "--public-host", "127.0.0.1", "--port", str(ports["https"]), "--http-port",
             str(ports["http"]), "--health-port", str(ports["health"]), "--router-port", str(ports["router"]),
             "--router-metrics-port", str(ports["metrics"]), "--motd", str(tmp_path / "motd")],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "REQUESTS_CA_BUNDLE": str(ca_bundle)})
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_acme_issuance_then_renewal_with_a_stream_in_flight(tmp_path: Path, traversable_tmp: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    ports = {name: free_port() for name in ("https", "http", "health", "router", "metrics")}
    seed = tmp_path / "root" / "var" / "lib" / "cloud" / "instance"
    seed.mkdir(parents=True)
    health = f"http://127.0.0.1:{ports['health']}"
    state = traversable_tmp / "state"  # nginx's workers (nobody, under a root master) read the ACME webroot

    def status() -> dict[str, Any]:
        return dict(requests.get(f"{health}/status", timeout=5).json())

    def wait(what: str, check: Any, timeout_s: float, proc: subprocess.Popen[bytes]) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            assert proc.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
            with contextlib.suppress(requests.RequestException, OSError):
                if check():
                    return time.monotonic() - start
            time.sleep(0.5)
        pytest.fail(f"{what} not within {timeout_s} s:\n{(tmp_path / 'agent.log').read_text()[-3000:]}")

    with pebble_server(tmp_path / "pebble", ports["http"]) as pebble:
        (seed / "user-data.txt").write_text(user_data(pebble.directory_url))
        with agent(tmp_path, state, ports, pebble.ca_bundle) as proc:
            wait("the ACME certificate", lambda: (status().get("tls") or {}).get("mode") == "acme", 480, proc)
            first = served(ports["https"])
            verify(first, pebble)
            tls = status()["tls"]
            assert tls["names"] == [DOMAIN] and not tls["self_signed"]
            assert inspect(first.public_bytes(serialization.Encoding.PEM).decode()).sha256 == tls["sha256"]
            wait("serving", lambda: status()["phase"] == "ready", 480, proc)
            nginx_pid = next(s["pid"] for s in status()["services"] if s["name"] == "proxy")

            chunks: list[bytes] = []
            opened = threading.Event()

            def stream() -> None:
                with requests.post(f"https://127.0.0.1:{ports['https']}/v1/completions", verify=False, stream=True,
                                   timeout=120, headers={"Authorization": f"Bearer {KEY}"},
                                   json={"model": "tiny-cpu", "prompt": "kiln", "max_tokens": TOKENS,
                                         "ignore_eos": True, "stream": True,
                                         "stream_options": {"include_usage": True}}) as r:
                    assert r.status_code == 200
                    opened.set()
                    chunks.extend(line for line in r.iter_lines() if line)

            # The engine is paused before the request is sent: its response is open through nginx and none of its
            # tokens can arrive until the engine resumes, after the renewal (a running engine can finish a whole
            # stream before a reader that has seen its first tokens gets to pause it).
            engines = [p for p in psutil.Process(proc.pid).children(recursive=True)
                       if p.name().startswith("VLLM::")]
            assert engines
            for engine in engines:
                engine.suspend()
            reader = threading.Thread(target=stream)
            try:
                reader.start()
                assert opened.wait(60)
                started = time.monotonic()
                subprocess.run([KILN, "reload", "--renew-certificate", "--state-dir", str(state), "--health",
                                health], check=True, capture_output=True, timeout=60)
                renewed = wait("the renewal", lambda: served(ports["https"]).serial_number != first.serial_number,
                               120, proc)
                stream_open, paused_at = reader.is_alive(), len(chunks)
            finally:
                for engine in engines:
                    engine.resume()
            reader.join(timeout=120)
            second = served(ports["https"])
            verify(second, pebble)
            with capsys.disabled():
                print(f"\n  measured: ACME renewal served {time.monotonic() - started:.1f} s after `kiln reload` "
                      f"({renewed:.1f} s of waiting); the stream begun before it "
                      f"{'was still open then, ' if stream_open else ''}had {paused_at} events then and ended with "
                  f"{len(chunks)}")
            assert chunks and chunks[-1] == b"data: [DONE]"  # the stream in flight finished whole
            usage = json.loads(chunks[-2].removeprefix(b"data: "))["usage"]
            assert usage["completion_tokens"] == TOKENS
            assert stream_open and paused_at == 0
            assert next(s["pid"] for s in status()["services"] if s["name"] == "proxy") == nginx_pid
            assert psutil.pid_exists(nginx_pid)
            assert json.loads((state / "keys.json").read_text())["keys"][0]["key"] == KEY
