"""A vLLM instance's start-up as phases, read from vLLM's own log lines. Pure: lines in, phases out.

The lines are those vLLM 0.32 logs (each cited by the file that logs it); a phase a line does not appear for (a CPU
build captures no CUDA graphs, a cached model downloads nothing) is simply absent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

# `(EngineCore pid=1) INFO 11-23 06:27:26 [core.py:133] message`: vLLM's own prefix (vllm/logger.py).
_PREFIX = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)? \[[^\]]+\] (.*)$")
# One start per "non-default args" line (entrypoints' api_utils.py); a log appended across restarts keeps the last.
_START = "non-default args:"
_DOWNLOAD = re.compile(r"Time spent downloading weights for .*: ([\d.]+) seconds")  # model_loader/weight_utils.py
# Older releases' wordings too ("takes", "GiB and", "seconds"): a log from another vLLM still reads.
_MODEL_LOADING = re.compile(r"Model loading took ([\d.]+) GiB (?:memory )?and ([\d.]+) seconds")  # gpu_model_runner.py
_WEIGHTS = re.compile(r"Loading weights took ([\d.]+) seconds")  # model_loader/default_loader.py
_INIT_MODEL = re.compile(r"Initializing model took ([\d.]+) seconds")  # model_loader/base_loader.py (dummy weights)
_COMPILE = re.compile(r"torch\.compile (?:took|takes) ([\d.]+) s in total")  # compilation/monitor.py
_WARMUP_START = "Warming up model for the compilation"  # v1/worker/cpu_model_runner.py
_WARMUP_DONE = "Warming up done."
_GRAPHS = re.compile(r"Graph capturing finished in ([\d.]+) secs, took ([\d.-]+) GiB")  # gpu_model_runner.py
_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")  # v1/engine/core.py
_CACHE_HIT = ("Directly load AOT compilation", "Directly load the compiled graph", "loaded from cache")
_CACHE_MISS = ("saved AOT compiled function", "Compiling a graph for", "Compiling model again due to a load failure")
_READY = re.compile(r"Starting vLLM (?:API )?server on|Application startup complete")


@dataclass
class Phase:
    name: str
    seconds: float
    gib: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"phase": self.name, "seconds": round(self.seconds, 2),
                **({"gib": round(self.gib, 2)} if self.gib is not None else {})}


@dataclass
class Timeline:
    phases: list[Phase] = field(default_factory=list)
    ready_s: float | None = None  # from the first line of this start to the server listening
    compile_cache: str | None = None  # "warm" (artifacts loaded) or "cold" (compiled and saved)

    def as_dict(self) -> dict[str, Any]:
        return {"phases": [p.as_dict() for p in self.phases], "ready_s": _round(self.ready_s),
                "compile_cache": self.compile_cache}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def _stamp(text: str) -> datetime:
    return datetime.strptime(f"2000-{text}", "%Y-%m-%d %H:%M:%S")


def _entries(lines: list[str]) -> list[tuple[datetime, str]]:
    found: list[tuple[datetime, str]] = []
    for line in lines:
        match = _PREFIX.search(line)
        if match:
            found.append((_stamp(match.group(1)), match.group(2)))
    starts = [i for i, (_, msg) in enumerate(found) if _START in msg]
    return found[starts[-1]:] if starts else found


def _elapsed(start: datetime, at: datetime) -> float:
    delta = at - start
    return (delta + timedelta(days=366) if delta.total_seconds() < 0 else delta).total_seconds()  # over New Year


def parse_startup(lines: list[str]) -> Timeline:
    """The phases of the last start in these log lines, with the seconds vLLM reports for each (or, where it
    reports none, the time between the lines that open and close it)."""
    entries = _entries(lines)
    timeline = Timeline()
    if not entries:
        return timeline
    first = entries[0][0]
    warmup_from: datetime | None = None
    weights: Phase | None = None
    for at, msg in entries:
        if m := _DOWNLOAD.search(msg):
            timeline.phases.append(Phase("download", float(m.group(1))))
        elif m := _MODEL_LOADING.search(msg):
            weights = Phase("weights loaded", float(m.group(2)), float(m.group(1)))
        elif (m := _WEIGHTS.search(msg) or _INIT_MODEL.search(msg)) and weights is None:
            weights = Phase("weights loaded", float(m.group(1)))
        elif m := _COMPILE.search(msg):
            timeline.phases.append(Phase("torch.compile", float(m.group(1))))
        elif _WARMUP_START in msg:
            warmup_from = at
        elif _WARMUP_DONE in msg and warmup_from is not None:
            timeline.phases.append(Phase("compile and warm-up", _elapsed(warmup_from, at)))
        elif m := _GRAPHS.search(msg):
            timeline.phases.append(Phase("CUDA graphs", float(m.group(1)), float(m.group(2))))
        elif m := _ENGINE.search(msg):
            timeline.phases.append(Phase("engine ready (profile, KV cache, warm-up)", float(m.group(1))))
        elif _READY.search(msg) and timeline.ready_s is None:
            timeline.ready_s = _elapsed(first, at)
        if any(s in msg for s in _CACHE_HIT):
            timeline.compile_cache = "warm"
        elif any(s in msg for s in _CACHE_MISS) and timeline.compile_cache is None:
            timeline.compile_cache = "cold"
    if weights is not None:
        after_downloads = next((i for i, p in enumerate(timeline.phases) if p.name != "download"),
                               len(timeline.phases))
        timeline.phases.insert(after_downloads, weights)
    return timeline


@dataclass
class AgentSteps:
    """The agent's own share of a start: each boot step and its seconds, timed by the caller's clock."""

    steps: list[tuple[str, float]] = field(default_factory=list)
    waiting: tuple[str, ...] = ("ask the Hub", "download")  # steps that wait on the network, not on the agent

    def add(self, name: str, seconds: float) -> None:
        self.steps.append((name, seconds))

    def as_dict(self) -> dict[str, Any]:
        total = sum(s for _, s in self.steps)
        own = sum(s for n, s in self.steps if n not in self.waiting)
        return {"steps": [{"step": n, "seconds": round(s, 3)} for n, s in self.steps],
                "total_s": round(total, 3), "own_s": round(own, 3)}
