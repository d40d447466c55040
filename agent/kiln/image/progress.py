"""Progress of a long image build or boot, for a person (one live line on a terminal, a line per
milestone otherwise) and in the build log."""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

# Lines worth showing while a step runs: mmdebstrap's stages, Ansible's plays and tasks, Packer's steps.
MILESTONE = re.compile(r"^(I: |PLAY \[|TASK \[|RUNNING HANDLER \[|==> |    [a-z0-9.-]+: (TASK|PLAY) \[)")


@dataclass
class Progress:
    steps: int
    out: TextIO = sys.stderr
    live: bool = False
    started: float = field(default_factory=time.monotonic)
    step_started: float = 0.0
    current: int = 0
    name: str = ""
    _last_width: int = 0

    @classmethod
    def for_stream(cls, steps: int, out: TextIO = sys.stderr) -> Progress:
        return cls(steps=steps, out=out, live=out.isatty())

    def step(self, name: str) -> None:
        self._end_live()
        self.current += 1
        self.name = name
        self.step_started = time.monotonic()
        self._print(f"[{self.current}/{self.steps}] {name}")

    def line(self, text: str) -> None:
        """A line of the running step's output; milestones are shown, the rest only logged."""
        text = text.rstrip()
        if not MILESTONE.match(text):
            return
        shown = f"    {_clock(time.monotonic() - self.step_started)}  {text.strip()[:100]}"
        if self.live:
            pad = max(0, self._last_width - len(shown))
            self.out.write("\r" + shown + " " * pad)
            self.out.flush()
            self._last_width = len(shown)
        else:
            self._print(shown)

    def note(self, text: str) -> None:
        self._end_live()
        self._print(f"    {text}")

    def done(self, text: str) -> None:
        self._end_live()
        self._print(f"{text} ({_clock(time.monotonic() - self.started)} in all)")

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def _end_live(self) -> None:
        if self.live and self._last_width:
            self.out.write("\n")
            self._last_width = 0

    def _print(self, text: str) -> None:
        print(text, file=self.out, flush=True)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"
