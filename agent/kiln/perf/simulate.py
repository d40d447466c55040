"""Continuous batching as vLLM's scheduler runs it, step by step, on one instance. Pure: no clock, no I/O.

Each step (vllm/v1/core/sched/scheduler.py): running requests first, in order (every decoding sequence one
token, or k+1 when drafts are verified; a prompt being prefilled its next chunk), then waiting requests in
arrival order while `max_num_seqs`, the `max_num_batched_tokens` budget and free KV blocks allow. A request
whose prompt starts with an already cached prefix skips those tokens (prefix caching). When decoding outgrows
the KV cache, the newest request is preempted and later recomputed, as vLLM's default preemption does. Requests
generate `output_len` tokens each, or each its own length where the load lists them (a dataset's spread).

Decoding sequences all advance together, so their progress is one shared counter and each step costs
O(log n) work; long stretches with nothing to schedule are taken in one jump.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from kiln.perf.lockstep import Peers
from kiln.perf.steps import Step, StepModel

EPS = 1e-9


@dataclass(frozen=True)
class Limits:
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_tokens: int  # the instance's KV cache, in tokens
    prefix_caching: bool = True


@dataclass(frozen=True)
class Drafting:
    """Speculative decoding: k drafted tokens verified per step, `emitted` tokens kept per step on average."""

    tokens: int
    emitted: float


@dataclass(frozen=True)
class Load:
    """What one instance is sent: closed loop (`concurrency`) or the arrival times of an open loop."""

    input_len: int
    output_len: int
    num_prompts: int
    concurrency: int | None = None
    arrivals: tuple[float, ...] = ()
    prefix_len: int = 0
    output_lens: tuple[int, ...] = ()  # each request's output, in the order they are sent; empty: all output_len
    warmup: int = 0  # the first requests sent, served but left out of the latencies (a closed loop's first wave)

    def output_of(self, index: int) -> int:
        return self.output_lens[index % len(self.output_lens)] if self.output_lens else self.output_len


@dataclass
class Outcome:
    duration_s: float
    completed: int
    input_tokens: int
    output_tokens: float
    ttft_s: list[float]
    tpot_s: list[float]
    itl: list[tuple[float, float]]  # (seconds between tokens, how many token gaps had it)
    steps: int
    preemptions: int
    peak_running: int

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0


@dataclass
class _Request:
    arrival: float
    prompt: int  # tokens to prefill: the prompt, or prompt and output so far when recomputed after preemption
    own: int  # KV tokens it holds alone (a cached shared prefix is held once for all)
    output: int  # tokens it generates in all
    done: int = 0  # prompt tokens in the KV cache (computed, or found in the prefix cache)
    computed: int = 0  # of those, computed by this request
    first_token: float | None = None
    generated: float = 0.0  # output tokens before it (re)entered decoding
    start: float = 0.0  # the shared decode counter when it started decoding
    base: float = 0.0  # its share of the decoding context sum, less the shared counter
    alive: bool = True
    counted: bool = True  # its latencies count (not part of the warm-up)


@dataclass
class Engine:
    """One scheduler's state: its requests, its KV cache and its clock."""

    model: StepModel
    limits: Limits
    load: Load
    drafting: Drafting | None
    peers: Peers | None = None  # the data-parallel ranks it steps together with, if any
    t: float = 0.0
    counter: float = 0.0  # tokens every decoding sequence has emitted since the start
    context_base: float = 0.0
    kv_prefill: int = 0
    prefix_cached: bool = False
    future: deque[_Request] = field(default_factory=deque)  # sent later (open loop)
    waiting: deque[_Request] = field(default_factory=deque)
    prefilling: list[_Request] = field(default_factory=list)
    decoding: list[tuple[float, int, _Request]] = field(default_factory=list)  # heap by finishing counter
    decoding_n: int = 0
    sent: int = 0
    seq: int = 0
    first_wave: int = 0  # requests sent at the start, at once
    out: Outcome = field(default_factory=lambda: Outcome(0.0, 0, 0, 0.0, [], [], [], 0, 0, 0))

    @property
    def per_step(self) -> float:
        return self.drafting.emitted if self.drafting else 1.0

    @property
    def tokens_per_seq(self) -> int:
        return self.drafting.tokens + 1 if self.drafting else 1

    @property
    def shared_prefix(self) -> int:
        return self.load.prefix_len if self.limits.prefix_caching and self.prefix_cached else 0

    def start(self) -> None:
        """Send the first requests: a closed loop's whole first wave, or every arrival of an open loop."""
        if self.load.concurrency is not None:
            for _ in range(min(self.load.concurrency, self.load.num_prompts)):
                self.send(0.0)
        else:
            for at in sorted(self.load.arrivals)[:self.load.num_prompts]:
                self.send(at)
        self.first_wave = len(self.waiting)

    def seconds(self, step: Step) -> float:
        """How long `step` takes: alone, or together with the other data-parallel ranks."""
        return self.model.seconds(step) if self.peers is None else self.peers.seconds(self.model, step)

    def ran(self, step: Step, repeat: int = 1) -> None:
        """`step` ran `repeat` times: the other ranks are seen through it once the first wave, which reaches
        every rank at once, is served."""
        if self.peers is not None and self.seq >= self.first_wave:
            self.peers.record(step, repeat)

    def kv_used(self) -> float:
        return self.context_base + self.decoding_n * self.counter + self.kv_prefill + self.shared_prefix

    def send(self, at: float) -> None:
        if self.sent >= self.load.num_prompts:
            return
        output = self.load.output_of(self.sent)
        counted = self.sent >= self.load.warmup
        self.sent += 1
        self.out.input_tokens += self.load.input_len
        queue = self.waiting if at <= self.t + EPS else self.future
        queue.append(_Request(at, self.load.input_len, self.load.input_len, output, counted=counted))

    def arrive(self) -> None:
        while self.future and self.future[0].arrival <= self.t + EPS:
            self.waiting.append(self.future.popleft())

    def admit(self, budget: int, chunks: list[tuple[_Request, int]]) -> None:
        """Waiting requests in order, while a sequence slot, tokens of the step's budget and KV room for their
        whole prompt are left (vLLM would preempt a partly prefilled prompt it cannot finish; this admits only
        what it can)."""
        reserved = self.decoding_n * self.tokens_per_seq + sum(r.prompt - r.done for r in self.prefilling)
        while self.waiting and budget > 0:
            if self.decoding_n + len(self.prefilling) >= self.limits.max_num_seqs:
                break
            r = self.waiting[0]
            if r.done == 0 and (found := self._found_cached(r)):
                r.done, r.own = found, r.prompt - found
            if not self._fits(r, reserved) and (self.decoding_n or self.prefilling):
                break
            chunk = min(r.prompt - r.done, budget)
            self.waiting.popleft()
            self.prefilling.append(r)
            chunks.append((r, chunk))
            budget -= chunk
            reserved += r.prompt - r.done

    def _found_cached(self, r: _Request) -> int:
        """Prompt tokens `r` has in the KV cache when admitted: its own so far, or else the cached shared prefix
        (vLLM always computes the last prompt token)."""
        return r.done or (min(self.load.prefix_len, r.prompt - 1) if self.shared_prefix else 0)

    def _fits(self, r: _Request, reserved: float) -> bool:
        """Whether the KV cache holds `r`'s whole prompt beside what is in it and `reserved` for this step."""
        return self.kv_used() + reserved + (r.prompt - self._found_cached(r)) <= self.limits.kv_tokens

    def preempt_for(self, growth: float) -> None:
        """Free KV for this step's growth by sending the newest decoding requests back to wait."""
        while self.decoding_n > 1 and self.kv_used() + growth > self.limits.kv_tokens:
            newest = max((e[2] for e in self.decoding if e[2].alive), key=lambda r: r.start)
            self._stop_decoding(newest)
            newest.alive = False
            generated = newest.generated + (self.counter - newest.start)
            prompt = self.load.input_len + math.floor(generated)
            self.waiting.appendleft(_Request(newest.arrival, prompt, prompt, newest.output,
                                             first_token=newest.first_token, generated=generated))
            self.out.preemptions += 1
            growth -= self.tokens_per_seq

    def _stop_decoding(self, r: _Request) -> None:
        self.context_base -= r.base
        self.decoding_n -= 1

    def prepare(self) -> tuple[Step, list[tuple[_Request, int]]] | None:
        """Schedule the next step as vLLM's scheduler does: the step and its prompt chunks, or None where nothing
        is ready to run."""
        self.arrive()
        budget = self.limits.max_num_batched_tokens - self.decoding_n * self.tokens_per_seq
        chunks: list[tuple[_Request, int]] = []
        for r in self.prefilling:
            if budget <= 0:
                break
            chunk = min(r.prompt - r.done, budget)
            chunks.append((r, chunk))
            budget -= chunk
        self.admit(budget, chunks)
        self.preempt_for(self.decoding_n * self.tokens_per_seq)
        if not chunks and not self.decoding_n:
            return None
        step = Step(self.decoding_n, self.context_base + self.decoding_n * self.counter, sum(c for _, c in chunks),
                    sum(c * (r.done + c / 2) for r, c in chunks), self.tokens_per_seq if self.decoding_n else 1,
                    prefill_seqs=len(chunks))
        return step, chunks

    def advance(self, dt: float, chunks: list[tuple[_Request, int]]) -> None:
        """Run the prepared step, which took `dt` seconds."""
        self.t += dt
        self.out.steps += 1
        if self.decoding_n:
            self.out.itl.append((dt, self.decoding_n))
            self.counter += self.per_step
            self.out.output_tokens += self.decoding_n * self.per_step
        for r, c in chunks:
            r.done += c
            r.computed += c
            self.kv_prefill += c
            if r.done >= r.prompt:
                self.prefilling.remove(r)
                self.kv_prefill -= r.computed
                if self.load.prefix_len and self.limits.prefix_caching and not self.prefix_cached:
                    self.prefix_cached = True
                    r.own -= self.load.prefix_len
                self.start_decoding(r)
        self.finish()
        self.out.peak_running = max(self.out.peak_running, self.decoding_n + len(self.prefilling))

    def step(self) -> None:
        planned = self.prepare()
        if planned is None:
            if self.future:
                self.t = max(self.t, self.future[0].arrival)
            return
        step, chunks = planned
        dt = self.seconds(step)
        self.ran(step)
        self.advance(dt, chunks)

    def start_decoding(self, r: _Request) -> None:
        """The step that computes a prompt's last token samples one output token (the first, after a queue)."""
        if r.first_token is None:
            r.first_token = self.t
        r.generated += 1.0
        self.out.output_tokens += 1
        r.start = self.counter
        r.base = r.own + 1 - self.counter
        self.context_base += r.base
        self.decoding_n += 1
        self.seq += 1
        heapq.heappush(self.decoding, (self.counter + max(r.output - r.generated, 0.0), self.seq, r))

    def finish(self) -> None:
        while self.decoding and self.decoding[0][0] <= self.counter + EPS:
            _, _, r = heapq.heappop(self.decoding)
            if not r.alive:
                continue
            self._stop_decoding(r)
            self.out.completed += 1
            first = r.first_token if r.first_token is not None else self.t
            if r.counted:
                self.out.ttft_s.append(first - r.arrival)
                if r.output > 1:
                    self.out.tpot_s.append((self.t - first) / (r.output - 1))
            if self.load.concurrency is not None:
                self.send(self.t)

    def jump(self) -> None:
        """Run pure decode steps up to just before the next event in one go, timed at their midpoint."""
        planned = self._jump_plan()
        if planned is None:
            return
        steps, mid = planned
        dt = self.seconds(mid)
        if self.future:
            steps = min(steps, math.floor((self.future[0].arrival - self.t) / dt))
            if steps < 2:
                return
        self.ran(mid, steps)
        self.t += dt * steps
        self.counter += self.per_step * steps
        self.out.steps += steps
        self.out.output_tokens += self.decoding_n * self.per_step * steps
        self.out.itl.append((dt, self.decoding_n * steps))

    def _jump_plan(self) -> tuple[int, Step] | None:
        """How many pure decode steps can run before the next event (a finish, a full KV cache), and their
        midpoint step; None where the next step is not pure decoding or fewer than two would run."""
        if self.prefilling or not self.decoding_n or self._can_admit():
            return None
        while self.decoding and not self.decoding[0][2].alive:
            heapq.heappop(self.decoding)
        if not self.decoding:
            return None
        steps = math.floor((self.decoding[0][0] - self.counter) / self.per_step) - 1
        free = self.limits.kv_tokens - self.kv_used()
        steps = min(steps, math.floor(free / (self.decoding_n * self.tokens_per_seq)) - 1)
        if steps < 2:
            return None
        return steps, Step(self.decoding_n,
                           self.context_base + self.decoding_n * (self.counter + self.per_step * steps / 2),
                           tokens_per_seq=self.tokens_per_seq)

    def _can_admit(self) -> bool:
        """Whether the next step would admit the first waiting request, by `admit`'s own rules while only decoding
        runs: until a request finishes, decoding only fills the KV cache, so a prompt refused now stays refused."""
        if not self.waiting or self.decoding_n + len(self.prefilling) >= self.limits.max_num_seqs:
            return False
        reserved = self.decoding_n * self.tokens_per_seq
        return reserved < self.limits.max_num_batched_tokens and self._fits(self.waiting[0], reserved)


def simulate(model: StepModel, limits: Limits, load: Load, drafting: Drafting | None = None,
             ranks: int = 1, max_steps: int = 5_000_000) -> Outcome:
    """Serve `load` on one scheduler and report what `vllm bench serve` would measure; with `ranks` > 1, on one
    of that many data-parallel ranks stepping together, each sent alike (kiln.perf.lockstep)."""
    engine = Engine(model, limits, load, drafting, Peers(ranks - 1) if ranks > 1 else None)
    engine.start()
    while engine.out.completed < engine.sent and engine.out.steps < max_steps:
        engine.jump()
        engine.step()
    engine.out.duration_s = engine.t
    return engine.out


def poisson_arrivals(rate: float, count: int, seed: int = 0) -> tuple[float, ...]:
    """Arrival times of a Poisson process, as `vllm bench serve --request-rate` sends (burstiness 1)."""
    if math.isinf(rate):
        return tuple(0.0 for _ in range(count))
    import random  # noqa: PLC0415 - seeded locally, so the result is a pure function of its inputs

    rng, t, times = random.Random(seed), 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate)
        times.append(t)
    return tuple(times)


def percentile(values: Sequence[float], q: float, weights: Sequence[float] | None = None) -> float:
    """The q-th percentile (0-100), linear between ranks as numpy's default; weighted by counts if given."""
    if not values:
        return 0.0
    if weights is None:
        ordered = sorted(values)
        pos = (len(ordered) - 1) * q / 100
        lo = math.floor(pos)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
    pairs = sorted(zip(values, weights, strict=True))
    total = sum(w for _, w in pairs)
    target, seen = total * q / 100, 0.0
    for value, w in pairs:
        seen += w
        if seen >= target:
            return value
    return pairs[-1][0]
