"""The fault and abuse table: `kiln up` (the tiny CPU model, 2 vLLM instances, TLS) broken on purpose while
clients stream, one row per fault: what was done, the streams in flight at that moment, the requests that failed
before their answer's headers and after them (a stream cut short), the seconds until the endpoint served again
with every instance back in routing, and what /status said.

The state folder is a small tmpfs, so that "disk full" is real (run as root). Heavy: run it alone,

    flock /tmp/kiln-cpu.lock python -m benchmarks.fault_table
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from benchmarks.fault_harness import PAUSE_AFTER_FAILURE_S, STREAMS, THINK_S, Row, Stack, fill, last_line, measured
from benchmarks.fault_trust import rows as trust_rows
from kiln.bench.setups import Ports, kiln_up
from kiln.choice.schema import TlsAcme
from kiln.serve.endpoint import Endpoint
from kiln.serve.front.acme import Issued
from kiln.serve.front.front import Front
from kiln.serve.front.proxy import ProxySettings
from kiln.serve.front.tls import inspect, make_self_signed
from kiln.serve.layout import ServeLayout
from kiln.serve.reports.state import AgentState

PORTS = Ports(public=18600, health=18690, router=18601, router_metrics=18602)


def acme_row() -> Row:
    """An ACME order that succeeds, then a certificate that cannot be written, in the agent's own loop (every
    0.2 s) for 5 s; the CA is a stand-in answering what Let's Encrypt answers: a certificate for the domain."""
    with tempfile.TemporaryDirectory() as tmp:
        front = Front(ServeLayout(state_dir=Path(tmp)), ProxySettings(max_in_flight=8))
        front.load_keys("kiln-default-key-0123456789", None)
        front.choose_tls(TlsAcme(domain="llm.example.com"), ["127.0.0.1"])
        orders: list[str] = []

        def issue(directory: str, domain: str, *args: object, **kwargs: object) -> Issued:
            orders.append(domain)
            cert, key = make_self_signed([domain], dt.datetime.now(dt.timezone.utc), days=90)
            return Issued(cert, key, inspect(cert).not_after)

        (front.layout.tls_dir / "acme-llm.example.com.crt").mkdir(parents=True)
        state = AgentState(endpoint="", health="", keys_file="")
        endpoint = Endpoint(front, state, "127.0.0.1", (), motd=lambda text: None, reload_proxy=lambda: None,
                            issue=issue)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            endpoint.renew()
            time.sleep(0.2)
        said = state.last_error.what[:110] if state.last_error else "no error"
    return Row("ACME: issued, then the certificate cannot be written (5 s of the loop)", 0, 0, 0, None,
               f"last_error: {said}", f"{len(orders)} order(s) in 5 s")


def rows(stack: Stack) -> list[Row]:
    out: list[Row] = []
    out.append(measured(stack, "kill -9 of instance vllm-0", lambda: _kill(stack.pid("vllm-0"), signal.SIGKILL)))
    out.append(measured(stack, "kill -9 of the router", lambda: _kill(stack.pid("router"), signal.SIGKILL)))
    out.append(measured(stack, "kill -9 of nginx's master", lambda: _kill(stack.pid("proxy"), signal.SIGKILL)))

    frozen: list[int] = []

    def freeze() -> str:
        frozen.append(stack.pid("vllm-1"))
        os.killpg(frozen[0], signal.SIGSTOP)
        started = time.monotonic()
        while time.monotonic() - started < 60:
            if not next(i for i in stack.status()["instances"] if i["name"] == "vllm-1")["routed"]:
                return f"out of routing {time.monotonic() - started:.1f} s after SIGSTOP"
            time.sleep(0.2)
        return "still routed after 60 s"

    out.append(measured(stack, "SIGSTOP of instance vllm-1 (SIGCONT once out of routing)", freeze,
                        undo=lambda: os.killpg(frozen[0], signal.SIGCONT)))

    fillers: list[Path] = []

    def disk_full() -> str:
        fillers.append(fill(stack.state))
        added = stack.kiln("keys", "add", "during-full-disk")
        os.kill(stack.pid("vllm-0"), signal.SIGKILL)
        return (f"state/cache tmpfs full; `kiln keys add` exit {added.returncode}: {last_line(added)}; "
                "then kill -9 vllm-0")

    out.append(measured(stack, "disk full (state and cache tmpfs), a key added, an instance killed", disk_full,
                        undo=lambda: fillers[0].unlink(missing_ok=False), wait_s=10))

    keys = stack.state / "keys.json"
    kept = keys.read_bytes()

    def corrupt_keys() -> str:
        keys.write_text('{"keys": [{"name": "default", "key": "kiln-')
        listed = stack.kiln("keys", "list")
        reloaded = stack.kiln("reload")
        still = stack.serves()
        return (f"`kiln keys list` exit {listed.returncode}, `kiln reload` exit {reloaded.returncode}: "
                f"{last_line(reloaded)}; old key serves: {still}; file kept: {keys.read_bytes() != kept}")

    out.append(measured(stack, "corrupt keys.json, then kiln reload", corrupt_keys,
                        undo=lambda: keys.write_bytes(kept)))

    runtime, plan = stack.state / "runtime.json", stack.state / "plan.json"
    saved = runtime.read_bytes(), plan.read_bytes()

    def corrupt_files() -> str:
        runtime.write_text("{not json")
        plan.write_text("{not json")
        reloaded = stack.kiln("reload")
        os.kill(stack.pid("vllm-0"), signal.SIGKILL)
        return f"`kiln reload` exit {reloaded.returncode}; then kill -9 vllm-0"

    def restore_files() -> None:
        runtime.write_bytes(saved[0])
        plan.write_bytes(saved[1])

    out.append(measured(stack, "corrupt runtime.json and plan.json, reload, an instance killed", corrupt_files,
                        undo=restore_files))

    def clash() -> str:
        swapped = stack.key.swapcase()
        added = stack.kiln("keys", "add", "clash", "--key", swapped)
        time.sleep(1)
        codes: dict[str, int] = {}
        for name, key in (("own", stack.key), ("swapped", swapped), ("upper", swapped.upper())):
            codes[name] = requests.get(f"{stack.running.url}/v1/models", verify=stack.running.certificate or True,
                                       headers={"Authorization": f"Bearer {key}"}, timeout=10).status_code
        revoked = stack.kiln("keys", "revoke", "clash")
        time.sleep(1)
        after = requests.get(f"{stack.running.url}/v1/models", verify=stack.running.certificate or True,
                             headers={"Authorization": f"Bearer {swapped}"}, timeout=10).status_code
        return (f"add exit {added.returncode}; own {codes['own']}, case-swapped {codes['swapped']} (its own key), "
                f"upper-cased {codes['upper']}; revoke exit {revoked.returncode}, then swapped {after}")

    out.append(measured(stack, "a key clashing in letters' case with the default one", clash))

    def huge_n() -> str:
        started = time.monotonic()
        reply = requests.post(f"{stack.running.url}/v1/completions", verify=stack.running.certificate or True,
                              headers={"Authorization": f"Bearer {stack.key}"}, timeout=120,
                              json={"model": "tiny-cpu", "prompt": "x", "max_tokens": 16, "n": 10000})
        took = time.monotonic() - started
        probe = time.monotonic()
        stack.serves()
        return (f"{reply.status_code} {reply.json().get('error', {}).get('code')} in {took:.2f} s; another "
                f"client's request then took {time.monotonic() - probe:.2f} s")

    out.append(measured(stack, "one request with n: 10000", huge_n))
    out.append(acme_row())
    return out


def _kill(pid: int, sig: int) -> str:
    os.kill(pid, sig)
    return f"pid {pid}"


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("run as root: the state folder is a small tmpfs, to fill it")
    state = Path(tempfile.mkdtemp(prefix="kiln-faults-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400m,mode=0755", "tmpfs", str(state)], check=True)
    try:
        config = state / "kiln.yaml"
        with kiln_up(state, "tiny-cpu", PORTS, instances=2, tls=True, config=config) as running:
            stack = Stack(running, state, config)
            table = [*rows(stack), *trust_rows(stack)]
    finally:
        with contextlib.suppress(OSError):  # the agent's log, kept beside the table
            kept = Path(tempfile.gettempdir()) / "kiln-fault-table-agent.log"
            kept.write_bytes((state / "kiln-up.log").read_bytes())
        subprocess.run(["umount", "-l", str(state)], check=False)
    print(f"\n{STREAMS} streaming clients throughout, each waiting {THINK_S:g} s after a request and "
          f"{PAUSE_AFTER_FAILURE_S:g} s after a failed one; "
          "'back' = seconds from the fault until a request succeeds with every instance ready and routed\n")
    print("| fault | in flight | failed before headers | failed after headers | back (s) | /status said | note |")
    print("|---|---|---|---|---|---|---|")
    for r in table:
        back = f"{r.back_s:.1f}" if r.back_s is not None else "-"
        print(f"| {r.fault} | {r.in_flight} | {r.failed_before} | {r.failed_after} | {back} | {r.said} | {r.note} |")
    print(json.dumps([r.__dict__ for r in table]), file=sys.stderr)


if __name__ == "__main__":
    main()
