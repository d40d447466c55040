"""The public endpoint (nginx -> vllm-router -> instances), with TLS off and on, beside direct access to one
instance, in one run.

Two backends:
- fake: two fast fake OpenAI servers (benchmarks.fake_openai) behind kiln's own front and router, so the figures
  are the cost of the path itself;
- vllm: `kiln up` with the tiny model on vLLM's CPU backend, with one instance (the path's cost on a real
  engine) and with two, where the public endpoint also spreads the load over both. On a small machine the client,
  nginx and the router share the cores with the engines: read the two-instance row with that in mind.
The load is vLLM's own benchmark client (vllm.benchmarks.serve), streaming completions with random prompts.

    python -m benchmarks.endpoint_overhead [--backend fake|vllm|both] [--num-prompts 300] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.stacks import REPO, Endpoints, bench, fake_stack, vllm_stack
from kiln.tinymodel import make_tiny_model
from kiln.wiring import Kiln

METRICS = ("request_throughput", "output_throughput", "p50_ttft_ms", "p99_ttft_ms", "p50_e2el_ms", "p99_e2el_ms")


def workload(args: argparse.Namespace, prompts: int) -> list[str]:
    return ["--dataset-name", "random", "--random-input-len", str(args.input_len), "--random-output-len",
            str(args.output_len), "--num-prompts", str(prompts), "--max-concurrency", str(args.concurrency)]


def compare(name: str, stack: Callable[[bool], contextlib.AbstractContextManager[Endpoints]], tokenizer: Path,
            args: argparse.Namespace) -> list[str]:
    """Direct beside the public endpoint with TLS off and on; one stack per TLS setting, each measured in
    alternating order so neither side gets a warmer machine."""
    runs: dict[str, list[dict[str, Any]]] = {"direct": [], "public, TLS off": [], "public, TLS on": []}
    for tls in (False, True):
        public = f"public, TLS {'on' if tls else 'off'}"
        with stack(tls) as ends:
            bench(ends.direct, ends.key, tokenizer, workload(args, args.concurrency))  # warm-up
            bench(ends.public, ends.key, tokenizer, workload(args, args.concurrency))
            for target in ("direct", public, public, "direct"):
                runs[target].append(bench(ends.direct if target == "direct" else ends.public, ends.key, tokenizer,
                                          workload(args, args.num_prompts)))
    mean = {t: {m: sum(r[m] for r in rs) / len(rs) for m in METRICS} for t, rs in runs.items()}
    rows = [f"| {name} | {t} | " + " | ".join(f"{mean[t][m]:,.1f}" for m in METRICS) + " |" for t in mean]
    for t in ("public, TLS off", "public, TLS on"):
        rows.append(f"| {name} | {t} / direct | " + " | ".join(
            f"{mean[t][m] / mean['direct'][m]:.3f}x" if mean["direct"][m] else "-" for m in METRICS) + " |")
    for m in ("p50_ttft_ms", "p50_e2el_ms"):
        rows.append(f"| {name} | TLS on - direct, {m.removesuffix('_ms')} | "
                    f"{mean['public, TLS on'][m] - mean['direct'][m]:+.2f} ms |" + " |" * (len(METRICS) - 1))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["fake", "vllm", "both"], default="both")
    parser.add_argument("--num-prompts", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--instances", type=int, nargs="+", default=[1, 2], help="vLLM rows: instances per stack")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        root = Path(tmp)
        tokenizer = make_tiny_model(Kiln.create(REPO / "profiles").catalog().get("tiny-cpu"), root / "tokenizer")
        rows: list[str] = []
        if args.backend in ("fake", "both"):
            (root / "fake").mkdir()
            rows += compare("fake backend", lambda tls: fake_stack(root / f"fake-tls-{tls}", tls), tokenizer, args)
        if args.backend in ("vllm", "both"):
            for n in args.instances:
                rows += compare(f"vLLM CPU, {n} instance(s)",
                                lambda tls, n=n: vllm_stack(root / f"vllm{n}-tls-{tls}", instances=n, tls=tls),
                                tokenizer, args)
    print(f"\n{args.num_prompts} streaming completions, {args.input_len} in / {args.output_len} out tokens, "
          f"concurrency {args.concurrency}; direct = one instance, public = nginx (TLS off or on) -> vllm-router "
          "-> all instances\n")
    print("| backend | target | req/s | out tok/s | TTFT p50 ms | TTFT p99 ms | E2E p50 ms | E2E p99 ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
