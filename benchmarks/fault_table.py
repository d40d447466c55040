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
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from kiln.bench.setups import Ports, Running, kiln_up
from kiln.choice.schema import TlsAcme
from kiln.serve.endpoint import Endpoint
from kiln.serve.front.acme import Issued
from kiln.serve.front.front import Front
from kiln.serve.front.proxy import ProxySettings
from kiln.serve.front.tls import inspect, make_self_signed
from kiln.serve.layout import ServeLayout
from kiln.serve.reports.state import AgentState

PORTS = Ports(public=18600, health=18690, router=18601, router_metrics=18602)
STREAMS = 8
KILN = str(Path(sys.executable).parent / "kiln")
RECOVERY_TIMEOUT_S = 240.0
SEEN_WITHIN_S = 3.0  # how long a fault may take to show on /status or in a failed request
PAUSE_AFTER_FAILURE_S = 1.0  # a client whose request failed waits this long before the next
# ... and one whose request succeeded this long: the clients share the stack's two cores, and back to back they
# starved a restarting instance (its Python imports alone took 5 minutes instead of 10 s).
THINK_S = 0.5


@dataclass
class Load:
    """STREAMS clients, each streaming short completions one after another."""

    running: Running
    failed_before: int = 0
    reasons: Counter[str] = field(default_factory=Counter)  # what the requests failed with: a status, an exception
    failed_after: int = 0
    done: int = 0
    in_flight: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def counts(self) -> tuple[int, int, int]:
        with self.lock:
            return self.failed_before, self.failed_after, self.in_flight

    def _client(self) -> None:
        session = requests.Session()
        session.verify = self.running.certificate or True
        session.trust_env = False  # REQUESTS_CA_BUNDLE, where set, would override the pinned certificate
        while not self.stop.is_set():
            with self.lock:
                self.in_flight += 1
            try:
                self._one(session)
            finally:
                with self.lock:
                    self.in_flight -= 1

    def _one(self, session: requests.Session) -> None:
        try:
            reply = session.post(f"{self.running.url}/v1/completions", timeout=60, stream=True,
                                 headers={"Authorization": f"Bearer {self.running.api_key}"},
                                 json={"model": "tiny-cpu", "prompt": "kiln", "max_tokens": 24, "ignore_eos": True,
                                       "stream": True})
        except requests.RequestException as exc:
            with self.lock:
                self.failed_before += 1
                self.reasons[exc.__class__.__name__] += 1
            time.sleep(PAUSE_AFTER_FAILURE_S)
            return
        with reply:
            if reply.status_code != 200:
                with self.lock:
                    self.failed_before += 1
                    self.reasons[str(reply.status_code)] += 1
                time.sleep(PAUSE_AFTER_FAILURE_S)
                return
            try:
                lines = [line for line in reply.iter_lines() if line]
                complete = bool(lines) and lines[-1] == b"data: [DONE]"
            except requests.RequestException:
                complete = False
        with self.lock:
            if complete:
                self.done += 1
            else:
                self.failed_after += 1
        time.sleep(THINK_S)

    @contextlib.contextmanager
    def running_clients(self) -> Iterator[Load]:
        threads = [threading.Thread(target=self._client, daemon=True) for _ in range(STREAMS)]
        for t in threads:
            t.start()
        try:
            yield self
        finally:
            self.stop.set()
            for t in threads:
                t.join(timeout=90)


@dataclass
class Stack:
    running: Running
    state: Path

    @property
    def key(self) -> str:
        return self.running.api_key or ""

    @property
    def health(self) -> str:
        return self.running.health or ""

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = requests.get(f"{self.health}/status", timeout=10).json()
        return data

    def pid(self, name: str) -> int:
        """An instance's or a service's (router, proxy) process, as /status lists it."""
        status = self.status()
        return int(next(m for m in (*status["instances"], *status["services"]) if m["name"] == name)["pid"])

    def serves(self) -> bool:
        try:
            reply = requests.post(f"{self.running.url}/v1/completions", verify=self.running.certificate or True,
                                  headers={"Authorization": f"Bearer {self.key}"}, timeout=10,
                                  json={"model": "tiny-cpu", "prompt": "x", "max_tokens": 1})
        except requests.RequestException:
            return False
        return reply.status_code == 200

    def whole(self) -> bool:
        try:
            status = self.status()
        except (requests.RequestException, ValueError):
            return False
        instances = [i for i in status["instances"] if i["url"]]
        return all(i["state"] == "ready" and i["routed"] for i in instances) and self.serves()

    def whole_again_after(self, seconds: float) -> bool:
        time.sleep(seconds)
        return self.whole()

    def said(self) -> str:
        try:
            status = self.status()
        except (requests.RequestException, ValueError) as exc:
            return f"/status unreadable: {exc.__class__.__name__}"
        states = ",".join(f"{i['name']}={i['state']}" for i in (*status["instances"], *status["services"]))
        error = (status.get("last_error") or {}).get("what")
        return f"{status['phase']}; {states}" + (f"; last_error: {error[:110]}" if error else "")

    def kiln(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([KILN, *args, "--state-dir", str(self.state), "--health", self.health],
                              capture_output=True, text=True, check=False, timeout=120)


@dataclass
class Row:
    fault: str
    in_flight: int
    failed_before: int
    failed_after: int
    back_s: float | None
    said: str
    note: str = ""


def measured(stack: Stack, fault: str, act: Callable[[], str], undo: Callable[[], object] | None = None,
             wait_s: float = 0.0) -> Row:
    """The fault under load; the failures counted from the fault until the endpoint is whole again. A fault the
    script itself cannot make is a row that says why."""
    try:
        return _measured(stack, fault, act, undo, wait_s)
    except Exception as exc:  # one row's failure leaves the others
        return Row(fault, 0, 0, 0, None, stack.said(), f"not measured: {exc.__class__.__name__}: {exc}")


def _measured(stack: Stack, fault: str, act: Callable[[], str], undo: Callable[[], object] | None,
              wait_s: float) -> Row:
    load = Load(stack.running)
    with load.running_clients():
        time.sleep(3)
        before = load.counts()
        started = time.monotonic()
        note = act()
        time.sleep(wait_s)
        said = stack.said()
        if undo:
            undo()
        # Until the fault shows (the supervisor sees an exit within a tick or two), the endpoint may look whole.
        while time.monotonic() - started < SEEN_WITHIN_S and stack.whole():
            time.sleep(0.2)
        back: float | None = None
        while time.monotonic() - started < RECOVERY_TIMEOUT_S:
            seen = time.monotonic() - started
            if stack.whole() and stack.whole_again_after(1.0):  # whole, and still a second later
                back = seen
                break
            time.sleep(0.2)
        time.sleep(1)
        after = load.counts()
        reasons = ", ".join(f"{n} x {why}" for why, n in load.reasons.most_common(3))
    return Row(fault, before[2], after[0] - before[0], after[1] - before[1], back, said,
               note + (f" (failures: {reasons})" if reasons else ""))


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


def fill(folder: Path) -> Path:
    filler = folder / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as out:
        while True:
            out.write(b"\0" * 2**20)
    return filler


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
        return f"state/cache tmpfs full; `kiln keys add` exit {added.returncode}: {_last(added)}; then kill -9 vllm-0"

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
                f"{_last(reloaded)}; old key serves: {still}; file kept: {keys.read_bytes() != kept}")

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


def _last(done: subprocess.CompletedProcess[str]) -> str:
    text = (done.stderr or done.stdout).strip().splitlines()
    return (text[0] if text else "")[:100]


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("run as root: the state folder is a small tmpfs, to fill it")
    state = Path(tempfile.mkdtemp(prefix="kiln-faults-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400m,mode=0755", "tmpfs", str(state)], check=True)
    try:
        with kiln_up(state, "tiny-cpu", PORTS, instances=2, tls=True) as running:
            table = rows(Stack(running, state))
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
