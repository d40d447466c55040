"""What the fault table's rows share: `kiln up` with clients streaming throughout, the stack's own reports, and a
row measured from the fault until the endpoint is whole again."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from kiln.bench.setups import Running

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
    config: Path  # the settings file `kiln up --config` reads at every reload; absent until a row writes it

    @property
    def key(self) -> str:
        return self.running.api_key or ""

    @property
    def public_port(self) -> int:
        return int(self.running.url.rsplit(":", 1)[1])

    def call(self, method: str, path: str, key: str | None = None, timeout: float = 60,
             **kwargs: Any) -> requests.Response:
        """One request to the public endpoint with the stack's key, or `key` ("" for none)."""
        key = self.key if key is None else key
        headers = {**({"Authorization": f"Bearer {key}"} if key else {}), **kwargs.pop("headers", {})}
        return requests.request(method, f"{self.running.url}{path}", headers=headers, timeout=timeout,
                                verify=self.running.certificate or True, **kwargs)

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
        error = (status.get("last_error") or {}).get("error")
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


def fill(folder: Path) -> Path:
    filler = folder / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as out:
        while True:
            out.write(b"\0" * 2**20)
    return filler


def last_line(done: subprocess.CompletedProcess[str]) -> str:
    """What a command said last (its first line names the agent it acted on)."""
    text = [line for line in (done.stderr or done.stdout).strip().splitlines() if line.strip()]
    return (text[-1] if text else "")[:140]
