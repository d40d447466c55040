"""The rolling change as a model: every interleaving of the supervisor's ticks, the change's steps, instances
becoming ready and crashing, over small layouts (hypothesis' stateful testing). Processes are data here, started
the way a systemd unit starts: from the runtime entry of their name, which the change rewrites."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kiln.processes import ProcessSpec
from kiln.serve.processes.supervisor import (
    PENDING,
    READY,
    Member,
    RollingChange,
    Supervisor,
    SupervisorSettings,
)

SETTINGS = SupervisorSettings(tick_s=1.0, probe_interval_s=1.0, backoff_first_s=1.0, backoff_max_s=8.0,
                              start_timeout_s=600.0, hang_timeout_s=600.0, stop_grace_s=0.0)
# (before, after): each instance's GPUs; () is the CPU
LAYOUTS = {"4 x TP1 to 2 x TP2": ([(0,), (1,), (2,), (3,)], [(0, 1), (2, 3)]),
           "2 x TP2 to 4 x TP1": ([(0, 1), (2, 3)], [(0,), (1,), (2,), (3,)]),
           "2 x TP1 to 1 x TP2": ([(0,), (1,)], [(0, 1)]),
           "2 on the CPU to 2": ([(), ()], [(), ()]),
           "1 on the CPU to 2": ([()], [(), ()])}
_pids = itertools.count(1000)


@dataclass
class DataProcess:
    """A process as data: it runs until it crashes or is stopped, and serves once it is ready."""

    spec: ProcessSpec
    pid: int = field(default_factory=lambda: next(_pids))
    code: int | None = None
    ready: bool = False

    def exit_code(self) -> int | None:
        return self.code

    def signal_group(self, sig: int) -> None:
        pass

    def reload(self) -> None:
        pass

    def terminate(self) -> None:
        self.code = -15 if self.code is None else self.code

    def finish(self, deadline: float) -> int:
        self.terminate()
        return self.code or 0

    def stop(self, grace_s: float = 0.0) -> int:
        return self.finish(0.0)

    def log_lines(self) -> list[str]:
        return []


@dataclass
class UnitLauncher:
    """Starts a name's process from its runtime entry, as systemd starts kiln-vllm@NAME from runtime.json."""

    runtime: dict[str, ProcessSpec]
    started: list[tuple[ProcessSpec, DataProcess]] = field(default_factory=list)

    def start(self, spec: ProcessSpec) -> DataProcess:
        process = DataProcess(self.runtime[spec.name])
        self.started.append((spec, process))
        return process


@dataclass
class Routing:
    workers: set[str] = field(default_factory=set)

    def add(self, url: str) -> None:
        self.workers.add(url)

    def remove(self, url: str) -> None:
        self.workers.discard(url)

    def health(self) -> dict[str, bool]:
        return dict.fromkeys(self.workers, True)


def member(generation: str, index: int, gpus: tuple[int, ...]) -> Member:
    # Names and ports follow the instance's place, as render_instances gives them: a successor takes its
    # predecessor's name, and the runtime entry of that name.
    name, url = f"vllm-{index}", f"http://127.0.0.1:{8100 + index}"
    spec = ProcessSpec(name, ("vllm", "serve", f"--generation={generation}", f"--gpus={gpus}"))
    return Member(spec, probe_url=f"{url}/health", route_url=url, port=8100 + index, gpus=gpus)


class RollingChangeModel(RuleBasedStateMachine):
    @initialize(layout=st.sampled_from(sorted(LAYOUTS)))
    def begin(self, layout: str) -> None:
        before, after = LAYOUTS[layout]
        self.now = 0.0
        self.old = [member("old", i, gpus) for i, gpus in enumerate(before)]
        self.new = [member("new", i, gpus) for i, gpus in enumerate(after)]
        self.runtime = {m.name: m.spec for m in self.old}
        self.launcher = UnitLauncher(self.runtime)
        self.routing = Routing()
        self.sup = Supervisor(launcher=self.launcher, routing=self.routing, probe=self.probe, settings=SETTINGS,
                              clock=lambda: self.now, instances=list(self.old))
        for m in self.old:  # started by the first tick, serving from the second
            m.state = PENDING
        self.tick()
        for process in self.alive():
            process.ready = True
        self.tick()
        assert all(m.state == READY and m.routed for m in self.old)
        self.change: RollingChange = self.sup.begin_roll(self.new, drain=lambda m: None,
                                                         before_start=self.write_entry)
        self.done = False
        self.committed = False

    def write_entry(self, successor: Member) -> None:
        self.runtime[successor.name] = successor.spec

    def alive(self) -> list[DataProcess]:
        return [p for _, p in self.launcher.started if p.code is None]

    def probe(self, url: str) -> bool:
        serving = [p for p in self.alive() if f"http://127.0.0.1:{8100 + int(p.spec.name[5:])}/health" == url]
        return any(p.ready for p in serving)

    # -- what happens --------------------------------------------------------------------------------------------
    @rule()
    def tick(self) -> None:
        self.now += SETTINGS.tick_s
        self.sup.tick()

    @rule()
    def wait_out_a_backoff(self) -> None:
        self.now += SETTINGS.backoff_max_s
        self.sup.tick()

    @precondition(lambda self: not self.done)
    @rule()
    def advance(self) -> None:
        if self.change.advance() is None:
            self.done = True
            self.runtime.update({m.name: m.spec for m in self.new})  # the commit: runtime.json rewritten whole
            self.committed = True

    @rule(data=st.data())
    def becomes_ready(self, data: st.DataObject) -> None:
        waiting = [p for p in self.alive() if not p.ready]
        if waiting:
            data.draw(st.sampled_from(waiting)).ready = True

    @rule(data=st.data())
    def crashes(self, data: st.DataObject) -> None:
        alive = self.alive()
        if alive:
            data.draw(st.sampled_from(alive)).code = 1

    # -- what always holds ---------------------------------------------------------------------------------------
    @invariant()
    def no_gpu_is_held_twice(self) -> None:
        held = [g for p in self.alive() for g in _gpus_of(p.spec)]
        assert len(held) == len(set(held)), f"a GPU held by two processes: {[p.spec.argv for p in self.alive()]}"

    @invariant()
    def every_process_started_from_its_own_generation(self) -> None:
        for spec, process in self.launcher.started:
            assert process.spec == spec, f"{spec.name} of one generation started with the other's {process.spec}"

    @invariant()
    def the_runtime_entry_of_each_member_is_its_own(self) -> None:
        for m in self.sup.instances:
            if not m.retiring:
                assert self.runtime[m.name] == m.spec, f"{m.name}'s entry is another generation's"

    @invariant()
    def one_instance_per_name(self) -> None:
        names = [m.name for m in self.sup.instances]
        assert len(names) == len(set(names)), names

    def teardown(self) -> None:
        """Whatever happened, the change completes once processes serve, and the new generation serves alone."""
        try:
            for _ in range(100):
                if self.done:
                    break
                for process in self.alive():
                    process.ready = True
                self.wait_out_a_backoff()
                self.advance()
            assert self.done, "the change never completed"
            for _ in range(3):
                for process in self.alive():
                    process.ready = True
                self.wait_out_a_backoff()
            assert [m.name for m in self.sup.instances] == [m.name for m in self.new]
            assert all(m.state == READY and m.routed for m in self.sup.instances)
            assert sorted(p.spec.argv for p in self.alive()) == sorted(m.spec.argv for m in self.new)
            assert self.routing.workers == {m.route_url for m in self.new}
        finally:
            self.sup.stop()


def _gpus_of(spec: ProcessSpec) -> tuple[int, ...]:
    gpus = next(a for a in spec.argv if a.startswith("--gpus="))
    return tuple(int(g) for g in gpus.removeprefix("--gpus=").strip("(),").split(",") if g.strip())


RollingChangeModel.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_a_rolling_change_under_any_interleaving = RollingChangeModel.TestCase
