"""Keeps the serving processes alive and the router's worker list true.

Each member is a process with an optional readiness probe. An instance joins the router once its probe passes,
leaves it the moment its process exits or its probe fails three times in a row, and is restarted with exponential
backoff; one that stays unresponsive past the hang timeout is killed and restarted. The clock and the HTTP probe
are passed in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from kiln.processes import ProcessSpec

log = logging.getLogger("kiln.supervisor")

STARTING, READY, UNRESPONSIVE, RESTARTING, STOPPED = "starting", "ready", "unresponsive", "restarting", "stopped"
PENDING = "pending"  # added by a rolling change; the loop's own thread starts it
HELD = "held"  # stopped on purpose until released: a cluster's engine while a node is missing


class Process(Protocol):
    """A started server: a local process group (processes.Running) or a systemd unit (systemd_units.Unit)."""

    @property
    def pid(self) -> int: ...
    def exit_code(self) -> int | None: ...
    def signal_group(self, sig: int) -> None: ...
    def reload(self) -> None: ...
    def terminate(self) -> None: ...
    def finish(self, deadline: float) -> int: ...
    def stop(self, grace_s: float = ...) -> int: ...
    def log_lines(self) -> list[str]: ...


class Launcher(Protocol):
    def start(self, spec: ProcessSpec) -> Process: ...


class Routing(Protocol):
    def add(self, url: str) -> None: ...
    def remove(self, url: str) -> None: ...
    def health(self) -> dict[str, bool]: ...  # the router's own view: each worker it lists, and whether it routes


Probe = Callable[[str], bool]


@dataclass(frozen=True)
class SupervisorSettings:
    tick_s: float = 0.5
    probe_interval_s: float = 1.0
    failures_to_leave: int = 3
    start_timeout_s: float = 1800.0
    hang_timeout_s: float = 120.0
    backoff_first_s: float = 1.0
    backoff_max_s: float = 60.0
    healthy_resets_backoff_s: float = 300.0
    stop_grace_s: float = 30.0


@dataclass
class Member:
    spec: ProcessSpec
    probe_url: str | None = None  # readiness: 200 from this URL
    route_url: str | None = None  # an instance: the URL the router sends requests to
    port: int | None = None
    state: str = STOPPED
    running: Process | None = None
    restarts: int = 0
    failures_in_a_row: int = 0
    probe_failures: int = 0
    next_start: float = 0.0
    next_probe: float = 0.0
    state_since: float = 0.0
    routed: bool = False
    router_healthy: bool | None = None  # the router's own view of a routed instance; None: not asked or not routed
    last_exit: int | None = None
    last_error: str | None = None
    retiring: bool = False  # being replaced by a rolling change: no restart, no probe, no route
    held: bool = False  # kept stopped until release(); set before start() to start it later
    launches: int = 0  # how many times it has been started
    gpus: tuple[int, ...] = ()  # the GPUs it holds while it runs
    via: RouterLink | None = None  # the router of its model, when it is not the supervisor's own (several models)

    @property
    def name(self) -> str:
        return self.spec.name

    def as_dict(self, now: float) -> dict[str, object]:
        return {"name": self.name, "port": self.port, "state": self.state,
                "pid": self.running.pid if self.running else None,
                "restarts": self.restarts, "routed": self.routed, "router_healthy": self.router_healthy,
                "url": self.route_url,
                "state_for_s": round(now - self.state_since, 1), "last_exit_code": self.last_exit,
                "last_error": self.last_error, "log_file": str(self.spec.log_file) if self.spec.log_file else None}


@dataclass(frozen=True)
class RouterLink:
    """A router of its own for some instances: with several models, one router per model."""

    member: Member
    routing: Routing


@dataclass(frozen=True)
class Event:
    at: float  # monotonic seconds
    member: str
    what: str


@dataclass
class Supervisor:
    launcher: Launcher
    routing: Routing
    probe: Probe
    settings: SupervisorSettings = field(default_factory=SupervisorSettings)
    clock: Callable[[], float] = time.monotonic
    router: Member | None = None
    others: list[Member] = field(default_factory=list)  # started first, supervised without a probe or a route
    instances: list[Member] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    more_routers: list[RouterLink] = field(default_factory=list)  # the other models' routers (Member.via)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()  # the members' fields that /status reads
        # Held by each tick and by every change from another thread (hold, release, a rolling change's steps):
        # a tick never interleaves with them. Slow work (stopping a process, draining) runs outside it, on a member
        # the tick already leaves alone (held or retiring).
        self._tick_lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kiln-probe")
        self._next_view = 0.0

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def members(self) -> list[Member]:
        return [*self.others, *self.routers(), *self.instances]

    def routers(self) -> list[Member]:
        return [*([self.router] if self.router else []), *(link.member for link in self.more_routers)]

    def _is_router(self, member: Member) -> bool:
        return any(member is router for router in self.routers())

    def _router_of(self, member: Member) -> Member | None:
        return member.via.member if member.via else self.router

    def _routing_of(self, member: Member) -> Routing:
        return member.via.routing if member.via else self.routing

    def _instances_of(self, router: Member) -> list[Member]:
        return [m for m in self.instances if self._router_of(m) is router]

    def start(self) -> None:
        now = self.clock()
        for member in self.members():
            if member.held:
                self._set(member, HELD, now, "held until released")
            else:
                self._launch(member, now)
        self._thread = threading.Thread(target=self._loop, name="kiln-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop supervising, then every process at once: SIGTERM, and SIGKILL to what is left after the grace."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        running = [m for m in self.members() if m.running]
        for member in running:
            assert member.running is not None
            member.running.terminate()
        deadline = time.monotonic() + self.settings.stop_grace_s
        for member in running:
            assert member.running is not None
            self._note(member, f"stopped (exit {member.running.finish(deadline)})")
        for member in self.members():
            member.state, member.routed, member.running = STOPPED, False, None
        self._pool.shutdown(wait=False, cancel_futures=True)

    def snapshot(self) -> list[dict[str, object]]:
        now = self.clock()
        with self._lock:
            return [m.as_dict(now) for m in self.members()]

    def recent_events(self, limit: int = 50) -> list[Event]:
        with self._lock:
            return self.events[-limit:]

    def ready_instances(self) -> list[Member]:
        """Serving, and not marked unhealthy by the router, which is what decides where requests go."""
        with self._lock:
            return [m for m in self.instances if m.state == READY and m.router_healthy is not False]

    # -- holding an engine -------------------------------------------------------------------------------------
    def hold(self, member: Member, why: str) -> None:
        """Out of routing and stopped, and not restarted until release()."""
        with self._tick_lock:
            with self._lock:
                member.held = True
            self._unroute(member)
            running = member.running
        if running:
            member.last_exit = running.stop(self.settings.stop_grace_s)
        with self._tick_lock:
            with self._lock:
                member.running = None
            self._set(member, HELD, self.clock(), f"held: {why}")

    def release(self, member: Member) -> None:
        """Start a held member again, from the loop's own thread (see roll())."""
        with self._tick_lock, self._lock:
            member.held, member.state, member.next_start = False, PENDING, self.clock()
            member.failures_in_a_row = 0
        self._note(member, "released")

    # -- models added and removed --------------------------------------------------------------------------------
    def add(self, members: list[Member], router: RouterLink | None = None) -> None:
        """Start a new model's router and instances from the loop's own thread (see roll())."""
        with self._tick_lock, self._lock:
            if router is not None:
                router.member.state, router.member.next_start = PENDING, self.clock()
                self.more_routers.append(router)
            for member in members:
                member.state, member.next_start = (HELD, 0.0) if member.held else (PENDING, self.clock())
                self.instances.append(member)

    def remove(self, members: list[Member], drain: Callable[[Member], None], router: RouterLink | None = None) -> None:
        """A model no longer served: its instances out of routing, drained and stopped, then its router."""
        for member in members:
            self._retire(member, drain)
        if router is None:
            return
        with self._tick_lock:
            with self._lock:
                router.member.retiring = True
                self.more_routers = [link for link in self.more_routers if link is not router]
            running = router.member.running
        if running:
            self._note(router.member, f"stopped: its model is no longer served (exit "
                                      f"{running.stop(self.settings.stop_grace_s)})")
        with self._lock:
            router.member.state, router.member.running = STOPPED, None

    # -- a rolling change ---------------------------------------------------------------------------------------
    def roll(self, new: list[Member], drain: Callable[[Member], None], ready_timeout_s: float,
             before_start: Callable[[Member], None] | None = None, old: list[Member] | None = None) -> str | None:
        """Replace the instances (or `old`, one model's) one at a time (see RollingChange), waiting on each successor
        to serve. None when done; else why it stopped (the instances not yet replaced serve)."""
        change = RollingChange(self, new, drain, before_start, old)
        waited_on: Member | None = None
        deadline = 0.0
        while (waiting := change.advance()) is not None:
            if waiting is not waited_on:
                waited_on, deadline = waiting, time.monotonic() + ready_timeout_s
            if self._stop.is_set():
                return "stopping"
            if time.monotonic() > deadline:
                return f"{waiting.name} was not serving {ready_timeout_s:.0f} s after it started"
            time.sleep(self.settings.tick_s)
        return None

    def begin_roll(self, new: list[Member], drain: Callable[[Member], None],
                   before_start: Callable[[Member], None] | None = None) -> RollingChange:
        """A rolling change advanced by its caller, step by step (roll() is the one that waits)."""
        return RollingChange(self, new, drain, before_start)

    @staticmethod
    def _in_the_way(old: list[Member], successor: Member | None) -> list[Member]:
        """The old instances to stop before `successor` starts: those on its GPUs or of its name; where it holds
        no GPU (the CPU), the next one, as one for one."""
        if successor is None or not successor.gpus:
            return old[:1]
        return [m for m in old if set(m.gpus) & set(successor.gpus) or m.name == successor.name]

    def _retire(self, member: Member, drain: Callable[[Member], None]) -> None:
        with self._tick_lock:
            with self._lock:
                member.retiring = True
            self._unroute(member)
        self._note(member, "out of routing for a rolling change; draining")
        drain(member)
        if member.running:
            self._note(member, f"stopped for a rolling change (exit {member.running.stop(self.settings.stop_grace_s)})")
        with self._tick_lock, self._lock:
            member.state, member.running = STOPPED, None
            self.instances.remove(member)

    # -- the loop ----------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.settings.tick_s):
            try:
                with self._tick_lock:
                    self.tick()
            except Exception:  # the loop must outlive any one bad tick
                log.exception("supervisor tick failed")

    def tick(self) -> None:
        now = self.clock()
        for member in self.members():
            if member.retiring or member.held:
                continue
            self._check_exit(member, now)
            if member.state in (RESTARTING, PENDING) and now >= member.next_start and not self._stop.is_set():
                self._launch(member, now)
        due = [m for m in self.members() if m.probe_url and m.running and m.state != RESTARTING
               and now >= m.next_probe and not m.retiring and not m.held]
        results = list(self._pool.map(lambda m: self.probe(m.probe_url or ""), due))
        now = self.clock()
        for member, ok in zip(due, results, strict=True):
            member.next_probe = now + self.settings.probe_interval_s
            self._after_probe(member, ok, now)
        if now >= self._next_view:
            self._next_view = now + self.settings.probe_interval_s
            for router in self.routers():
                if router.state == READY:
                    self._read_router_view(router)

    def _read_router_view(self, router: Member) -> None:
        """What the router itself routes to: an instance it marks unhealthy is not counted as serving, and one it
        no longer lists joins again."""
        instances = self._instances_of(router)
        if not instances:
            return
        try:
            view = self._routing_of(instances[0]).health()
        except Exception as exc:  # the router's next probe decides whether it is down
            log.debug("could not read the router's workers: %s", exc)
            return
        lost = []
        with self._lock:
            for member in instances:
                routed = member.routed and member.route_url is not None
                member.router_healthy = view.get(member.route_url or "") if routed else None
                if routed and member.route_url not in view:
                    member.routed = False
                    lost.append(member)
        for member in lost:
            self._note(member, "the router no longer lists it; joining again")
            self._route(member)

    def _check_exit(self, member: Member, now: float) -> None:
        if not member.running or (code := member.running.exit_code()) is None:
            return
        member.running.stop(0)  # reap what is left of its group
        member.running, member.last_exit = None, code
        member.last_error = f"exited with code {code}" + (f"; see {member.spec.log_file}" if member.spec.log_file
                                                          else "")
        self._unroute(member)
        self._schedule_restart(member, now, f"exited with code {code}")

    def _schedule_restart(self, member: Member, now: float, why: str) -> None:
        if now - member.state_since >= self.settings.healthy_resets_backoff_s and member.state == READY:
            member.failures_in_a_row = 0
        delay = min(self.settings.backoff_first_s * 2 ** member.failures_in_a_row, self.settings.backoff_max_s)
        member.failures_in_a_row += 1
        member.next_start = now + delay
        self._set(member, RESTARTING, now, f"{why}; restarting in {delay:.3g} s")

    def _after_probe(self, member: Member, ok: bool, now: float) -> None:
        if ok:
            member.probe_failures = 0
            if member.state in (STARTING, UNRESPONSIVE):
                self._set(member, READY, now, "serving")
                if self._is_router(member):
                    self._reroute_all(member)
                else:
                    self._route(member)
            return
        member.probe_failures += 1
        if member.state == STARTING:
            if now - member.state_since > self.settings.start_timeout_s:
                self._kill(member, now, f"not ready after {self.settings.start_timeout_s:.0f} s")
            return
        if member.state == READY and member.probe_failures >= self.settings.failures_to_leave:
            self._unroute(member)
            self._set(member, UNRESPONSIVE, now, f"{member.probe_failures} health checks failed; out of routing")
        elif member.state == UNRESPONSIVE and now - member.state_since > self.settings.hang_timeout_s:
            self._kill(member, now, f"unresponsive for {self.settings.hang_timeout_s:.0f} s")

    # -- actions -----------------------------------------------------------------------------------------------
    def _launch(self, member: Member, now: float) -> None:
        try:
            started = self.launcher.start(member.spec)
        except OSError as exc:
            member.last_error = f"could not start {member.spec.argv[0]}: {exc}"
            self._schedule_restart(member, now, member.last_error)
            return
        # Counted before it is seen running: a reader that sees `running` (read first) sees this launch's count.
        member.launches += 1
        member.running = started
        if member.state == RESTARTING:
            member.restarts += 1
        member.probe_failures, member.next_probe = 0, now
        self._set(member, STARTING if member.probe_url else READY, now, f"started, pid {member.running.pid}")

    def _kill(self, member: Member, now: float, why: str) -> None:
        self._unroute(member)
        member.last_error = why
        if member.running:
            member.running.stop(0)
            member.last_exit = member.running.exit_code()
            member.running = None
        self._schedule_restart(member, now, why)

    def _route(self, member: Member) -> None:
        if member.route_url is None or member.routed or member.retiring or not self._router_ready(member):
            return
        try:
            self._routing_of(member).add(member.route_url)
            member.routed = True
            self._note(member, "joined routing")
        except Exception as exc:  # the router may be restarting: the next probe retries
            member.last_error = f"router refused the worker: {exc}"
            # Starting from now: the start timeout counts from the refusal, not from when it last started.
            self._set(member, STARTING, self.clock(), f"{member.last_error}; joining at the next check")

    def _unroute(self, member: Member) -> None:
        if self._is_router(member):
            for inst in self._instances_of(member):
                inst.routed = False
            return
        if not member.routed or member.route_url is None:
            return
        member.routed, member.router_healthy = False, None
        self._note(member, "left routing")
        if self._router_ready(member):
            try:
                self._routing_of(member).remove(member.route_url)
            except Exception as exc:  # the router's own health check takes it out too
                log.warning("could not remove %s from the router: %s", member.route_url, exc)

    def _reroute_all(self, router: Member) -> None:
        for inst in self._instances_of(router):
            if inst.state == READY:
                self._route(inst)

    def _router_ready(self, member: Member) -> bool:
        router = self._router_of(member)
        return router is None or router.state == READY

    def _set(self, member: Member, state: str, now: float, what: str) -> None:
        with self._lock:
            member.state, member.state_since = state, now
        self._note(member, what)

    def _note(self, member: Member, what: str) -> None:
        log.info("%s: %s", member.name, what)
        with self._lock:
            self.events.append(Event(self.clock(), member.name, what))
            del self.events[:-500]


@dataclass
class RollingChange:
    """A rolling change as a state machine: the instances replaced one at a time, each out of routing, drained and
    stopped, its successor started and back in routing before the next. A successor starts only once every old
    instance on any of its GPUs, or of its name, is stopped (8 x TP1 to 4 x TP2 retires two for each), so a GPU is
    retired before it is reused; `before_start` then writes what its unit starts from, so an old instance that
    restarts meanwhile keeps its own settings. The supervisor's loop starts, probes and restarts every member as
    always; advance() takes the steps that need no waiting."""

    supervisor: Supervisor
    new: list[Member]
    drain: Callable[[Member], None]
    before_start: Callable[[Member], None] | None = None
    replaced: list[Member] | None = None  # the instances replaced; None: every one
    old: list[Member] = field(init=False)
    steps: int = field(init=False)
    step: int = 0
    successor: Member | None = None  # started, and not yet serving

    def __post_init__(self) -> None:
        self.old = list(self.supervisor.instances if self.replaced is None else self.replaced)
        self.steps = max(len(self.old), len(self.new))

    def advance(self) -> Member | None:
        """Every step that can be taken now; the successor the change waits on to serve, or None once done."""
        sup = self.supervisor
        while True:
            if self.successor is not None:
                member = self.successor
                if not (member.state == READY and (member.routed or member.route_url is None)):
                    return member
                self.successor, self.step = None, self.step + 1
            if self.step >= self.steps:
                for member in list(self.old):
                    sup._retire(member, self.drain)
                    self.old.remove(member)
                return None
            successor = self.new[self.step] if self.step < len(self.new) else None
            for member in sup._in_the_way(self.old, successor):
                sup._retire(member, self.drain)
                self.old.remove(member)
            if successor is None:
                self.step += 1
                continue
            if self.before_start is not None:
                self.before_start(successor)
            # Started by the loop's thread, never this one: a child's parent-death signal (PR_SET_PDEATHSIG)
            # follows the thread that forked it, and this one ends with the change.
            with sup._tick_lock, sup._lock:
                successor.state, successor.next_start = PENDING, sup.clock()
                sup.instances.insert(min(self.step, len(sup.instances)), successor)
            self.successor = successor
