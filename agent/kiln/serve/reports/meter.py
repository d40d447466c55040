"""Live output tokens per second, from vLLM's counters. Pure."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class TokenMeter:
    """Output tokens per second over a sliding window, from vLLM's generation-token counters.

    An instance's first reading is its baseline; a counter that goes down belongs to a restarted instance, whose
    new value counts as fresh tokens."""

    window_s: float = 60.0
    _last: dict[str, float] = field(default_factory=dict)
    _samples: deque[tuple[float, float]] = field(default_factory=deque)  # (time, tokens since start)
    _total: float = 0.0

    def observe(self, now: float, counters: Mapping[str, float]) -> None:
        for name, value in counters.items():
            before = self._last.get(name)
            if before is not None:
                self._total += value if value < before else value - before
            self._last[name] = value
        self._samples.append((now, self._total))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_s:
            self._samples.popleft()

    def tokens_per_s(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0
