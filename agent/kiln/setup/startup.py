"""A start-up's shape and its predicted parts, as values (kiln.perf.coldstart predicts them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StartShape:
    """What decides a start's length: the checkpoint, its share per GPU, the layers, the group and the graphs."""

    device: str  # cuda | cpu
    checkpoint_bytes: int  # what a download fetches
    weight_bytes_per_gpu: int  # what each GPU loads
    num_layers: int
    tensor_parallel_size: int
    cuda_graphs: int  # graphs captured (FULL and PIECEWISE counted apart); 0 on the CPU
    params_b: float  # billions of parameters, for the goal


@dataclass(frozen=True)
class StartPart:
    name: str
    seconds: float
    source: str  # the data/coldstart.yaml key its constants come from

    def as_dict(self) -> dict[str, Any]:
        return {"part": self.name, "seconds": round(self.seconds, 1), "source": self.source}


@dataclass(frozen=True)
class ColdStart:
    weights: str  # "baked" (on the image) or "download"
    parts: tuple[StartPart, ...]
    goal_s: float | None

    @property
    def total_s(self) -> float:
        return sum(p.seconds for p in self.parts)

    @property
    def meets_goal(self) -> bool | None:
        return None if self.goal_s is None else self.total_s <= self.goal_s

    def as_dict(self) -> dict[str, Any]:
        return {"weights": self.weights, "total_s": round(self.total_s, 1), "goal_s": self.goal_s,
                "meets_goal": self.meets_goal, "parts": [p.as_dict() for p in self.parts]}

    def line(self) -> str:
        goal = "" if self.goal_s is None else (
            f" ({'within' if self.meets_goal else 'over'} the {self.goal_s:.0f} s goal)")
        parts = ", ".join(f"{p.name} {p.seconds:.0f}" for p in self.parts)
        return f"{self.total_s:.0f} s{goal}: {parts}"


@dataclass(frozen=True)
class ColdStarts:
    """Both starts of one plan: weights baked into the image, and downloaded at boot."""

    baked: ColdStart
    download: ColdStart

    def as_dict(self) -> dict[str, Any]:
        return {"baked": self.baked.as_dict(), "download": self.download.as_dict(),
                "not_included": "the machine's own boot before kiln-agent starts"}
