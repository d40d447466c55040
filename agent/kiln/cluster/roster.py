"""What the head knows of its cluster, and when the engine must stop or start on every node. Pure: the clock is
passed in.

vLLM cannot lose a rank: once one node's engine is gone, the others wait on it for ever (the head's /health still
answers 200). So the head stops its own engine as soon as a node that had joined is lost, and starts it again
once every node answers; each start of the head's engine is a new generation, and every worker restarts its
engine for the head's current generation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Action = Literal["start", "stop"]
REPORT_EVERY_S = 2.0
LOST_AFTER_S = 10.0  # five reports missed


@dataclass(frozen=True)
class NodeReport:
    """What a worker tells the head, every REPORT_EVERY_S."""

    rank: int
    name: str
    address: str
    engine_running: bool
    generation: int  # the head's generation its engine was started for; 0 before the first
    launches: int  # how many times this node has started its engine
    gpus: tuple[dict[str, Any], ...] = ()
    problem: str | None = None

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> NodeReport:
        return cls(rank=int(body["rank"]), name=str(body["name"])[:64], address=str(body["address"])[:64],
                   engine_running=bool(body["engine_running"]), generation=int(body["generation"]),
                   launches=int(body["launches"]), gpus=tuple(dict(g) for g in body.get("gpus") or ())[:16],
                   problem=None if body.get("problem") is None else str(body["problem"])[:300])

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "name": self.name, "address": self.address,
                "engine_running": self.engine_running, "generation": self.generation, "launches": self.launches,
                "gpus": list(self.gpus), "problem": self.problem}


@dataclass
class _Seen:
    report: NodeReport
    at: float
    joined_at_launch: int | None = None  # the worker's launches when it joined this generation


@dataclass
class Roster:
    nodes: int
    head: NodeReport  # the head's own line
    names: tuple[str, ...] = ()  # the nodes' names by rank, where discovery gave them
    lost_after_s: float = LOST_AFTER_S
    seen: dict[int, _Seen] = field(default_factory=dict)
    generation: int = 0  # how many times the head's engine has started
    engine_on: bool = False
    lost: list[str] = field(default_factory=list)  # why the engine was last stopped, node by node
    since: float = 0.0  # when the head began waiting for the nodes, or last started

    def record(self, report: NodeReport, now: float) -> None:
        if 0 < report.rank < self.nodes:
            old = self.seen.get(report.rank)
            self.seen[report.rank] = _Seen(report, now, old.joined_at_launch if old else None)

    def _up(self, rank: int, now: float) -> bool:
        s = self.seen.get(rank)
        return s is not None and now - s.at <= self.lost_after_s

    def _joined(self, rank: int, now: float) -> bool:
        s = self.seen.get(rank)
        return (self._up(rank, now) and s is not None and s.report.engine_running
                and s.report.generation == self.generation > 0)

    def waiting_for(self, now: float) -> list[str]:
        """The workers that do not answer, by name, with how long."""
        out = []
        for rank in range(1, self.nodes):
            s = self.seen.get(rank)
            if s is None:
                out.append(f"{self._name(rank)}: no report in {now - self.since:.0f} s")
            elif not self._up(rank, now):
                out.append(f"{self._who(rank, s.report)}: no report in {now - s.at:.0f} s")
        return out

    def _name(self, rank: int) -> str:
        return f"{self.names[rank]} (rank {rank})" if rank < len(self.names) else f"rank {rank}"

    def _known(self, rank: int, reported: str | None) -> str | None:
        """The droplet's name where discovery gave it, else the host name the node reports."""
        return self.names[rank] if rank < len(self.names) else reported

    def _who(self, rank: int, report: NodeReport) -> str:
        return f"{self._known(rank, report.name)} (rank {rank}, {report.address})"

    def _lost(self, now: float) -> list[str]:
        out = []
        for rank, s in sorted(self.seen.items()):
            if s.joined_at_launch is None:
                continue
            who = self._who(rank, s.report)
            if not self._up(rank, now):
                out.append(f"{who} stopped answering {now - s.at:.0f} s ago")
            elif not s.report.engine_running:
                out.append(f"{who}: its engine stopped" + (f" ({s.report.problem})" if s.report.problem else ""))
            elif s.report.launches != s.joined_at_launch:
                out.append(f"{who}: its engine restarted, so it left the running engine")
        return out

    def step(self, now: float, head_launches: int) -> Action | None:
        """What the head's engine must do now, given how many times it has been started."""
        if head_launches != self.generation:  # a start, by this or by the supervisor after an exit
            self.generation = head_launches
            self.since = now
            self._forget_joined()
        if not self.engine_on:
            if not self.waiting_for(now):
                self.engine_on, self.since = True, now
                return "start"
            return None
        for rank, s in self.seen.items():
            if s.joined_at_launch is None and self._joined(rank, now):
                s.joined_at_launch = s.report.launches
        lost = self._lost(now)
        if lost:
            self.engine_on, self.lost, self.since = False, lost, now
            # Until the head's next launch is counted, nobody has joined: a node still reporting the old engine is
            # not lost a second time.
            self._forget_joined()
            return "stop"
        return None

    def _forget_joined(self) -> None:
        """Whoever joined has left with the engine's generation."""
        for s in self.seen.values():
            s.joined_at_launch = None

    def complete(self, now: float) -> bool:
        return self.engine_on and all(self._joined(r, now) for r in range(1, self.nodes))

    def view(self, now: float) -> list[dict[str, Any]]:
        """Every node: up, joined, its GPUs; the head first."""
        rows = [{**self.head.as_dict(), "name": self._known(0, self.head.name), "up": True, "joined": self.engine_on,
                 "last_report_s": 0.0}]
        for rank in range(1, self.nodes):
            s = self.seen.get(rank)
            if s is None:
                rows.append({"rank": rank, "name": self._known(rank, None),
                             "address": None, "up": False, "joined": False,
                             "last_report_s": None})
                continue
            rows.append({**s.report.as_dict(), "name": self._known(rank, s.report.name), "up": self._up(rank, now),
                         "joined": self._joined(rank, now),
                         "last_report_s": round(now - s.at, 1)})
        return rows


def worker_step(head_generation: int, engine_generation: int) -> int | None:
    """The generation a worker must (re)start its engine for, or None to leave it be."""
    return head_generation if head_generation > 0 and head_generation != engine_generation else None
