"""Data-parallel ranks of a MoE model stepping together, as vLLM runs them. Pure: no clock, no I/O.

Every rank runs each forward pass with the others, a rank with nothing scheduled running a dummy batch, because
their MoE layers exchange tokens (vllm/v1/engine/core.py, DPEngineCoreProc; "Non-MoE DP ranks are completely
independent"). So a step lasts as long as the slowest rank's: one rank's prompt chunk holds up every rank's
decoding, and each rank's experts see every rank's tokens.

The ranks are sent alike loads, so a scheduler simulates one of them and prices each of its steps against the
others as its own recent steps show them: each other rank's prompt chunk is a draw from this rank's last
`WINDOW` steps, and a step takes the expected time of the slowest of them. The first wave of a load reaches every
rank at once, so its prompts hold no rank up: the ranks are priced alike until it is served.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field

from kiln.perf.steps import Step, StepModel

WINDOW = 64  # steps of this rank that stand for the other ranks now: a few prompts even at light load
POINTS = 4  # quantiles of the other ranks' largest chunk, where larger than this rank's, that a step is priced at


@dataclass
class Peers:
    """The other data-parallel ranks one scheduler steps together with."""

    count: int
    _recent: deque[tuple[int, float, int, int]] = field(default_factory=deque)  # (tokens, context, seqs, steps)
    _chunks: list[tuple[int, float, int]] = field(default_factory=list)  # the recent prompt chunks, by size
    _steps: int = 0  # steps in the window
    _chunk_tokens: int = 0  # their prompt tokens together

    def record(self, step: Step, repeat: int = 1) -> None:
        """This rank ran `step` (`repeat` times over): it joins the window, the oldest steps leave it."""
        if step.prefill_tokens:
            chunk = (step.prefill_tokens, step.prefill_context, step.prefill_seqs)
            bisect.insort(self._chunks, chunk)
            self._recent.append((*chunk, 1))
            self._chunk_tokens += step.prefill_tokens
            self._steps += 1
        else:
            self._recent.append((0, 0.0, 0, repeat))
            self._steps += repeat
        while self._steps > WINDOW:
            tokens, context, seqs, steps = self._recent.popleft()
            if tokens:
                self._chunks.pop(bisect.bisect_left(self._chunks, (tokens, context, seqs)))
                self._chunk_tokens -= tokens
            elif steps > self._steps - WINDOW:
                self._recent.appendleft((0, 0.0, 0, steps - (self._steps - WINDOW)))
                self._steps = WINDOW
                break
            self._steps -= steps

    def seconds(self, model: StepModel, step: Step) -> float:
        """`step` run together with the other ranks: as it is where none of them has a larger prompt chunk (the
        chance that the largest of theirs is no larger), else the mean over quantiles of that largest chunk."""
        together = round(step.tokens + self.count * self._mean_tokens(step))
        alone = model.seconds(_with(step, step.prefill_tokens, step.prefill_context, step.prefill_seqs, together))
        if not self._chunks:
            return alone
        # The largest of `count` draws is below a draw's quantile q with probability q ** count.
        below = (self._steps - len(self._chunks) + bisect.bisect_right(self._chunks, (step.prefill_tokens, math.inf)))
        held = 1 - (below / self._steps) ** self.count
        if held <= 0:
            return alone
        # Where held up, the step is priced at the mean of quantiles of the largest chunk: past its own chunk a step
        # is bound by tensor cores, its time close to linear in the chunk.
        plain = len(self._chunks) - self._steps
        tokens = context = seqs = 0.0
        for k in range(POINTS):
            at = int((1 - held * (1 - (k + 0.5) / POINTS)) ** (1 / self.count) * self._steps) + plain
            chunk = self._chunks[max(at, 0)]
            tokens, context, seqs = tokens + chunk[0], context + chunk[1], seqs + chunk[2]
        larger = _with(step, round(tokens / POINTS), context / POINTS, round(seqs / POINTS), together)
        return (1 - held) * alone + held * model.seconds(larger)

    def _mean_tokens(self, step: Step) -> float:
        """Tokens another rank runs in a step: this one's decoding and its recent prompt tokens per step."""
        recent = self._chunk_tokens / self._steps if self._steps else step.prefill_tokens
        return step.decode_seqs * step.tokens_per_seq + recent


def _with(step: Step, tokens: int, context: float, seqs: int, together: int) -> Step:
    """`step`'s decoding with a prompt chunk of `tokens`, in a step of `together` tokens across the ranks."""
    return Step(step.decode_seqs, step.decode_context, tokens, context, step.tokens_per_seq, seqs, together)
