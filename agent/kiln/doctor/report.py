"""The doctor's verdicts: one line per check, each problem with its fix; text for people, a dict for programs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
MARKS = {PASS: "ok  ", WARN: "WARN", FAIL: "FAIL", SKIP: "skip"}


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""
    transient: bool = False  # may clear by itself within a minute (a fabric still being trained)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"check": self.name, "status": self.status, "detail": self.detail}
        if self.fix:
            out["fix"] = self.fix
        return out


@dataclass(frozen=True)
class Report:
    machine: str
    checks: tuple[Check, ...]

    @property
    def blocking(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status == FAIL)

    @property
    def warnings(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status == WARN)

    @property
    def verdict(self) -> str:
        if self.blocking:
            return "blocked"
        return "warnings" if self.warnings else "healthy"

    def only_transient_failures(self) -> bool:
        return bool(self.blocking) and all(c.transient for c in self.blocking)

    def summary(self) -> str:
        if self.blocking:
            first = self.blocking[0]
            more = f" (and {len(self.blocking) - 1} more)" if len(self.blocking) > 1 else ""
            return f"{first.name}: {first.detail}{more}"
        if self.warnings:
            return f"{len(self.warnings)} warning(s): " + "; ".join(c.name for c in self.warnings)
        return "every check passed"

    def as_dict(self) -> dict[str, Any]:
        return {"machine": self.machine, "verdict": self.verdict, "summary": self.summary(),
                "checks": [c.as_dict() for c in self.checks]}

    def text(self) -> str:
        width = max((len(c.name) for c in self.checks), default=0)
        lines = [f"kiln doctor: {self.machine}"]
        for c in self.checks:
            lines.append(f"  {MARKS[c.status]}  {c.name.ljust(width)}  {c.detail}")
            if c.fix and c.status in (FAIL, WARN):
                lines.append(f"  {'':4}  {'':{width}}  fix: {c.fix}")
        counts = {s: sum(c.status == s for c in self.checks) for s in (PASS, WARN, FAIL, SKIP)}
        lines.append(f"{self.verdict}: {counts[PASS]} passed, {counts[WARN]} warning(s), {counts[FAIL]} blocking, "
                     f"{counts[SKIP]} skipped")
        return "\n".join(lines)
