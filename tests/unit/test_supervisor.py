"""The supervisor against real processes: Python's http.server, whose /health is a file in the folder it serves.

The router is the one stand-in: a list of the worker URLs it was told to add and remove."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from kiln.processes import LocalProcesses, ProcessSpec, Running, interrupt
from kiln.serve.processes.probes import http_probe
from kiln.serve.processes.supervisor import (
    READY,
    RESTARTING,
    STARTING,
    UNRESPONSIVE,
    Member,
    Supervisor,
    SupervisorSettings,
)


class RecordedRouting:
    def __init__(self) -> None:
        self.workers: list[str] = []
        self.calls: list[tuple[str, str]] = []
        self.unhealthy: set[str] = set()

    def add(self, url: str) -> None:
        self.calls.append(("add", url))
        self.workers.append(url)

    def remove(self, url: str) -> None:
        self.calls.append(("remove", url))
        self.workers.remove(url)

    def health(self) -> dict[str, bool]:
        return {url: url not in self.unhealthy for url in self.workers}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server(tmp_path: Path, name: str) -> Member:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "health").write_text("ok")
    port = free_port()
    spec = ProcessSpec(name, (sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                              "--directory", str(folder)), log_file=tmp_path / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    return Member(spec, probe_url=f"{url}/health", route_url=url, port=port)


FAST = SupervisorSettings(tick_s=0.1, probe_interval_s=0.2, failures_to_leave=2, hang_timeout_s=60,
                          backoff_first_s=0.2, stop_grace_s=5)


def wait_until(check: Callable[[], bool], timeout_s: float = 15) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if check():
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[tuple[Supervisor, RecordedRouting]]:
    routing = RecordedRouting()
    sup = Supervisor(launcher=LocalProcesses(), routing=routing, probe=lambda url: http_probe(url, 0.5),
                     settings=FAST, instances=[server(tmp_path, "a"), server(tmp_path, "b")])
    sup.start()
    yield sup, routing
    sup.stop()


def test_instances_join_routing_once_they_serve(supervised: tuple[Supervisor, RecordedRouting]) -> None:
    sup, routing = supervised
    wait_until(lambda: len(routing.workers) == 2 and all(m.routed for m in sup.instances))
    assert all(m.state == READY for m in sup.instances)


def test_a_killed_instance_leaves_routing_and_comes_back(supervised: tuple[Supervisor, RecordedRouting]) -> None:
    sup, routing = supervised
    wait_until(lambda: len(routing.workers) == 2)
    victim = sup.instances[1]
    assert victim.running is not None
    os.kill(victim.running.pid, signal.SIGKILL)
    left = wait_until(lambda: victim.route_url not in routing.workers)
    assert left < 1.0
    wait_until(lambda: victim.route_url in routing.workers)
    assert victim.restarts == 1 and victim.last_exit == -signal.SIGKILL
    assert [c for c in routing.calls if c[1] == victim.route_url] == [
        ("add", victim.route_url), ("remove", victim.route_url), ("add", victim.route_url)]


def test_a_hung_instance_leaves_routing_then_returns(supervised: tuple[Supervisor, RecordedRouting]) -> None:
    sup, routing = supervised
    wait_until(lambda: len(routing.workers) == 2)
    victim = sup.instances[0]
    assert victim.running is not None
    victim.running.signal_group(signal.SIGSTOP)
    try:
        wait_until(lambda: victim.state == UNRESPONSIVE)
        assert victim.route_url not in routing.workers
    finally:
        victim.running.signal_group(signal.SIGCONT)
    wait_until(lambda: victim.state == READY and victim.route_url in routing.workers)
    assert victim.restarts == 0


def test_an_instance_hung_past_the_timeout_is_killed_and_restarted(tmp_path: Path) -> None:
    routing = RecordedRouting()
    member = server(tmp_path, "a")
    settings = SupervisorSettings(tick_s=0.1, probe_interval_s=0.2, hang_timeout_s=1.0, backoff_first_s=0.2,
                                  stop_grace_s=5)
    sup = Supervisor(launcher=LocalProcesses(), routing=routing, probe=lambda url: http_probe(url, 0.3),
                     settings=settings, instances=[member])
    sup.start()
    try:
        wait_until(lambda: member.state == READY)
        assert member.running is not None
        first = member.running.pid
        member.running.signal_group(signal.SIGSTOP)
        wait_until(lambda: member.restarts == 1 and member.state == READY)
        assert member.running.pid != first and not psutil.pid_exists(first)
        assert "unresponsive" in (member.last_error or "")
    finally:
        sup.stop()


def test_a_command_that_cannot_start_backs_off_and_says_why(tmp_path: Path) -> None:
    routing = RecordedRouting()
    broken = Member(ProcessSpec("broken", (str(tmp_path / "no-such-server"),)), probe_url="http://127.0.0.1:9/")
    sup = Supervisor(launcher=LocalProcesses(), routing=routing, probe=http_probe, settings=FAST, instances=[broken])
    sup.start()
    try:
        wait_until(lambda: broken.failures_in_a_row >= 3)
        assert broken.state == RESTARTING and "could not start" in (broken.last_error or "")
        # Exponential backoff, read from the delays the supervisor announces rather than from the wall clock,
        # which a loaded machine stretches.
        delays = [float(e.what.rsplit("restarting in ", 1)[1].split()[0]) for e in sup.recent_events()
                  if "restarting in" in e.what]
        assert delays[0] < delays[1] < delays[2], delays
    finally:
        sup.stop()


def test_a_crash_loop_backs_off_and_is_reported(tmp_path: Path) -> None:
    crashing = Member(ProcessSpec("crashing", ("sh", "-c", "echo out of memory; exit 3"),
                                  log_file=tmp_path / "crashing.log"), probe_url="http://127.0.0.1:9/")
    sup = Supervisor(launcher=LocalProcesses(), routing=RecordedRouting(), probe=http_probe, settings=FAST,
                     instances=[crashing])
    sup.start()
    try:
        wait_until(lambda: crashing.restarts >= 3)
        assert crashing.last_exit == 3 and "exited with code 3" in (crashing.last_error or "")
        delays = [float(e.what.rsplit("restarting in ", 1)[1].split()[0]) for e in sup.recent_events()
                  if "restarting in" in e.what]
        assert delays[:3] == sorted(delays[:3]) and crashing.failures_in_a_row >= 3
        starts = [e.at for e in sup.recent_events() if e.what.startswith("started")]
        assert starts[3] - starts[2] > starts[1] - starts[0]  # the supervisor alone restarts it, slower each time
    finally:
        sup.stop()


def test_stop_leaves_no_process_behind(tmp_path: Path) -> None:
    routing = RecordedRouting()
    members = [server(tmp_path, "a"), server(tmp_path, "b")]
    sup = Supervisor(launcher=LocalProcesses(), routing=routing, probe=http_probe, settings=FAST, instances=members)
    sup.start()
    wait_until(lambda: len(routing.workers) == 2)
    pids = [m.running.pid for m in members if m.running]
    assert members[0].running is not None
    members[0].running.signal_group(signal.SIGSTOP)  # a stopped one too
    sup.stop()
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
    assert all(m.state == "stopped" for m in members)


def test_a_rolling_change_keeps_one_instance_routed_throughout(
        supervised: tuple[Supervisor, RecordedRouting], tmp_path: Path) -> None:
    """Each old instance leaves routing and is drained before it stops; its successor is routed before the next
    old one leaves. A watcher samples the routed workers all along: never none. The new instances outlive the
    thread that asked for them."""
    sup, routing = supervised
    wait_until(lambda: len(routing.workers) == 2)
    old = list(sup.instances)
    new = [server(tmp_path, "a2"), server(tmp_path, "b2")]
    drained: list[tuple[str, bool, list[str]]] = []
    routed_counts: list[int] = []

    def drain(member: Member) -> None:
        drained.append((member.name, member.routed, list(routing.workers)))

    stop = False

    def watch() -> None:
        while not stop:
            routed_counts.append(len(routing.workers))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    result: list[str | None] = []
    rollout = threading.Thread(target=lambda: result.append(sup.roll(new, drain, ready_timeout_s=15)))
    try:
        rollout.start()  # from a thread that then ends, as the agent's rollout does
        rollout.join(timeout=30)
    finally:
        stop = True
        watcher.join()
    assert result == [None]
    pids = [m.running.pid for m in sup.instances if m.running]
    time.sleep(1)  # a child tied to the ended thread (PR_SET_PDEATHSIG) would have been killed and restarted
    assert [m.running.pid for m in sup.instances if m.running] == pids and len(pids) == 2
    assert [m.restarts for m in sup.instances] == [0, 0]
    assert [m.name for m in sup.instances] == ["a2", "b2"]
    assert all(m.state == READY and m.routed for m in sup.instances)
    assert sorted(routing.workers) == sorted(m.route_url for m in new)
    assert [(name, routed) for name, routed, _ in drained] == [("a", False), ("b", False)]
    assert drained[1][2] == [new[0].route_url]  # b drains once out of routing, with a2 serving already
    assert min(routed_counts) >= 1
    assert all(m.running is None and m.retiring for m in old)


def test_a_held_instance_stays_stopped_until_released_and_counts_its_launches(tmp_path: Path) -> None:
    routing = RecordedRouting()
    engine = server(tmp_path, "engine")
    engine.held = True
    sup = Supervisor(launcher=LocalProcesses(), routing=routing, probe=lambda url: http_probe(url, 0.5),
                     settings=FAST, instances=[engine])
    sup.start()
    try:
        time.sleep(0.5)
        assert engine.state == "held" and engine.running is None and engine.launches == 0
        sup.release(engine)
        wait_until(lambda: engine.state == READY and engine.routed)
        assert engine.launches == 1
        pid = engine.running.pid if engine.running else 0
        sup.hold(engine, "a node was lost")
        assert engine.state == "held" and not routing.workers and not psutil.pid_exists(pid)
        time.sleep(0.5)  # not restarted while held
        assert engine.running is None and engine.launches == 1
        sup.release(engine)
        wait_until(lambda: engine.state == READY and engine.routed)
        assert engine.launches == 2 and engine.restarts == 0
    finally:
        sup.stop()


class RefusingRouting(RecordedRouting):
    refusing = False

    def add(self, url: str) -> None:
        if self.refusing:
            raise ConnectionError("router restarting")
        super().add(url)


def test_a_router_refusal_does_not_let_one_late_check_kill_a_long_serving_instance() -> None:
    now = [0.0]
    member = Member(ProcessSpec("a", ("sleep", "60")), probe_url="http://127.0.0.1:9/health",
                    route_url="http://127.0.0.1:9")
    answers = [True, False]
    routing = RefusingRouting()
    sup = Supervisor(launcher=LocalProcesses(), routing=routing, probe=lambda url: answers.pop(0),
                     settings=SupervisorSettings(start_timeout_s=600), clock=lambda: now[0], instances=[member])
    member.running = LocalProcesses().start(member.spec)
    try:
        sup._set(member, STARTING, now[0], "started")
        now[0] = 30.0
        sup.tick()
        assert member.state == READY and member.routed
        now[0], member.routed, routing.refusing = 1800.0, False, True  # half an hour on, the router restarted
        sup._reroute_all(sup.router)  # ... and refuses it: it waits to join again at its next check
        assert member.state == STARTING and not member.routed
        now[0] = 1805.0
        sup.tick()  # one check comes late
        assert member.state == STARTING and member.running is not None and member.restarts == 0
    finally:
        if member.running:
            member.running.stop(0)


class RecordingLauncher(LocalProcesses):
    def __init__(self) -> None:
        self.started: list[Running] = []

    def start(self, spec: ProcessSpec) -> Running:
        running = super().start(spec)
        self.started.append(running)
        return running


def test_hold_release_and_kills_from_other_threads_leave_no_process_behind(tmp_path: Path) -> None:
    """The loop, a cluster's hold and release, and crashes, all at once: whatever interleaves, a held member has
    no process, and no process is left that the supervisor does not know."""
    launcher = RecordingLauncher()
    member = server(tmp_path, "a")
    settings = SupervisorSettings(tick_s=0.01, probe_interval_s=0.05, failures_to_leave=2, hang_timeout_s=60,
                                  backoff_first_s=0.01, backoff_max_s=0.05, stop_grace_s=2)
    sup = Supervisor(launcher=launcher, routing=RecordedRouting(), probe=lambda url: http_probe(url, 0.5),
                     settings=settings, instances=[member])
    sup.start()
    stop = threading.Event()
    errors: list[BaseException] = []

    def guarded(work: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                while not stop.is_set():
                    work()
            except BaseException as exc:  # reported by the test
                errors.append(exc)
        return run

    def hold_and_release() -> None:
        sup.hold(member, "hammer")
        assert member.running is None
        time.sleep(0.02)
        sup.release(member)
        time.sleep(0.05)

    def crash() -> None:
        running = member.running
        if running is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(running.pid, signal.SIGKILL)
        time.sleep(0.03)

    def read() -> None:
        sup.snapshot()
        sup.ready_instances()

    threads = [threading.Thread(target=guarded(w)) for w in (hold_and_release, crash, read)]
    for t in threads:
        t.start()
    try:
        time.sleep(2)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        sup.hold(member, "the end")
        alive = [r.pid for r in launcher.started if r.exit_code() is None]
        sup.stop()
    assert not errors, errors
    assert len(launcher.started) > 5 and alive == []


@pytest.mark.parametrize(("before", "after"), [([(0,), (1,), (2,), (3,)], [(0, 1), (2, 3)]),
                                                ([(0, 1), (2, 3)], [(0,), (1,), (2,), (3,)])],
                         ids=["4xTP1 to 2xTP2", "2xTP2 to 4xTP1"])
def test_a_rolling_change_to_another_gpu_layout_frees_each_gpu_before_reusing_it(
        tmp_path: Path, before: list[tuple[int, ...]], after: list[tuple[int, ...]]) -> None:
    """A successor starts only once every old instance on any of its GPUs (or of its name) is stopped, and what it
    starts from is written just before it starts, never for the old instances still serving."""
    routing = RecordedRouting()
    old = [dataclasses.replace(server(tmp_path, f"old{i}"), gpus=gpus) for i, gpus in enumerate(before)]
    new = [dataclasses.replace(server(tmp_path, f"new{i}"), gpus=gpus) for i, gpus in enumerate(after)]
    sup = Supervisor(launcher=LocalProcesses(), routing=routing, probe=lambda url: http_probe(url, 0.5),
                     settings=FAST, instances=list(old))
    events: list[tuple[str, str, tuple[int, ...]]] = []  # (what, name, the GPUs held by running instances then)

    def held() -> tuple[int, ...]:
        return tuple(sorted(g for m in sup.instances if m.running and not m.retiring for g in m.gpus))

    sup.start()
    try:
        wait_until(lambda: len(routing.workers) == len(old))
        assert sup.roll(new, lambda m: events.append(("retire", m.name, held())), ready_timeout_s=15,
                        before_start=lambda m: events.append(("start", m.name, held()))) is None
    finally:
        sup.stop()
    for what, name, gpus in events:
        if what == "start":
            successor = next(m for m in new if m.name == name)
            assert not set(successor.gpus) & set(gpus), f"{name} started on GPUs still held: {events}"
    assert [m.name for m in sup.instances] == [m.name for m in new]
    assert sorted(e[1] for e in events if e[0] == "retire") == sorted(m.name for m in old)


def test_serving_is_what_the_router_itself_routes_to(tmp_path: Path) -> None:
    """An instance the router marks unhealthy is not counted as serving (so /ready, /health and /status say so),
    and one the router no longer lists joins again."""
    routing = RecordedRouting()
    a, b = server(tmp_path, "a"), server(tmp_path, "b")
    router = server(tmp_path, "router")
    router.route_url = None
    sup = Supervisor(launcher=LocalProcesses(), routing=routing, probe=lambda url: http_probe(url, 0.5),
                     settings=FAST, router=router, instances=[a, b])
    sup.start()
    try:
        wait_until(lambda: len(sup.ready_instances()) == 2 and all(m.router_healthy for m in (a, b)))
        routing.unhealthy.add(str(a.route_url))
        wait_until(lambda: sup.ready_instances() == [b])
        assert next(m for m in sup.snapshot() if m["name"] == "a")["router_healthy"] is False
        routing.unhealthy.clear()
        routing.workers.remove(str(b.route_url))  # the router forgot it (restarted, or removed it itself)
        wait_until(lambda: routing.calls.count(("add", str(b.route_url))) == 2 and len(sup.ready_instances()) == 2)
        assert any(e.member == "b" and "no longer lists it" in e.what for e in sup.recent_events())
    finally:
        sup.stop()


def test_interrupt_is_ctrl_c_then_a_kill_after_the_grace() -> None:
    handled = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                                "signal.signal(signal.SIGINT, lambda *_: sys.exit(3))\nprint(flush=True)\n"
                                "time.sleep(30)"], stdout=subprocess.PIPE)
    ignored = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                                "signal.signal(signal.SIGINT, signal.SIG_IGN)\nprint(flush=True)\ntime.sleep(30)"],
                               stdout=subprocess.PIPE)
    for proc in (handled, ignored):
        assert proc.stdout is not None and proc.stdout.readline()  # its handler is in place
    assert interrupt(handled, 10) == 3
    started = time.monotonic()
    assert interrupt(ignored, 0.5) == -signal.SIGKILL and time.monotonic() - started < 5
    assert interrupt(handled) == 3  # already ended: its exit code
