"""The public endpoint (nginx -> vllm-router -> instances) beside direct access to one instance, in one run.

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
from pathlib import Path
from typing import Any

from benchmarks.stacks import REPO, bench, fake_stack, vllm_stack
from kiln.tinymodel import make_tiny_model
from kiln.wiring import Kiln

METRICS = ("request_throughput", "output_throughput", "p50_ttft_ms", "p99_ttft_ms", "p50_e2el_ms", "p99_e2el_ms")


def workload(args: argparse.Namespace, prompts: int) -> list[str]:
    return ["--dataset-name", "random", "--random-input-len", str(args.input_len), "--random-output-len",
            str(args.output_len), "--num-prompts", str(prompts), "--max-concurrency", str(args.concurrency)]


def compare(name: str, stack: contextlib.AbstractContextManager[tuple[str, str, str]], tokenizer: Path,
            args: argparse.Namespace) -> list[str]:
    with stack as (public, direct, key):
        bench(direct, key, tokenizer, workload(args, args.concurrency))  # warm-up
        # Alternate the order so neither side gets a warmer machine.
        runs: dict[str, list[dict[str, Any]]] = {"direct": [], "public": []}
        for target in ("direct", "public", "public", "direct"):
            runs[target].append(bench(direct if target == "direct" else public, key, tokenizer,
                                      workload(args, args.num_prompts)))
    mean = {t: {m: sum(r[m] for r in rs) / len(rs) for m in METRICS} for t, rs in runs.items()}
    rows = [f"| {name} | {t} | " + " | ".join(f"{mean[t][m]:,.1f}" for m in METRICS) + " |" for t in mean]
    rows.append(f"| {name} | public/direct | " + " | ".join(
        f"{mean['public'][m] / mean['direct'][m]:.2f}x" if mean["direct"][m] else "-" for m in METRICS) + " |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["fake", "vllm", "both"], default="both")
    parser.add_argument("--num-prompts", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        root = Path(tmp)
        tokenizer = make_tiny_model(Kiln.create(REPO / "profiles").catalog().get("tiny-cpu"), root / "tokenizer")
        rows: list[str] = []
        if args.backend in ("fake", "both"):
            (root / "fake").mkdir()
            rows += compare("fake backend", fake_stack(root / "fake"), tokenizer, args)
        if args.backend in ("vllm", "both"):
            for n in (1, 2):
                (root / f"vllm{n}").mkdir()
                rows += compare(f"vLLM CPU, {n} instance(s)", vllm_stack(root / f"vllm{n}", instances=n), tokenizer,
                                args)
    print(f"\n{args.num_prompts} streaming completions, {args.input_len} in / {args.output_len} out tokens, "
          f"concurrency {args.concurrency}; direct = one instance, public = nginx -> vllm-router -> all instances\n")
    print("| backend | target | req/s | out tok/s | TTFT p50 ms | TTFT p99 ms | E2E p50 ms | E2E p99 ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
