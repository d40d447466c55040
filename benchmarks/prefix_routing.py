"""Does prefix-affinity routing (vllm-router's cache_aware) earn its cost over round_robin? One run, side by side.

`kiln up` serves the tiny model on two CPU vLLM instances behind each policy in turn; vLLM's benchmark client
sends prompts that share a few long prefixes (its prefix_repetition dataset), and the instances' own counters
give the prefix-cache hit rate.

    python -m benchmarks.prefix_routing [--num-prompts 240] [--prefixes 8] [--prefix-len 1536]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.stacks import PORTS, REPO, bench, vllm_stack
from kiln.tinymodel import make_tiny_model
from kiln.wiring import Kiln

POLICIES = ("round_robin", "cache_aware")


def prefix_cache_counters(health_url: str) -> tuple[float, float]:
    """(hits, queries) in tokens, summed over the instances, from kiln's merged /metrics."""
    text = requests.get(f"{health_url}/metrics", timeout=10).text
    totals = {"vllm:prefix_cache_hits_total": 0.0, "vllm:prefix_cache_queries_total": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals["vllm:prefix_cache_hits_total"], totals["vllm:prefix_cache_queries_total"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=320)
    parser.add_argument("--prefixes", type=int, default=32)
    # Random token ids re-encode longer than asked (about 1.4x with the tiny tokenizer): stay inside its 2,048.
    parser.add_argument("--prefix-len", type=int, default=1024)
    parser.add_argument("--suffix-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    workload = ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", str(args.prefix_len),
                "--prefix-repetition-suffix-len", str(args.suffix_len), "--prefix-repetition-num-prefixes",
                str(args.prefixes), "--prefix-repetition-output-len", str(args.output_len),
                "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.concurrency)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-prefix-") as tmp:
        root = Path(tmp)
        tokenizer = make_tiny_model(Kiln.create(REPO / "profiles").catalog().get("tiny-cpu"), root / "tokenizer")
        for policy in POLICIES:
            (root / policy).mkdir()
            with vllm_stack(root / policy, policy) as stack:
                public, key = stack.public, stack.key
                health = f"http://127.0.0.1:{PORTS.health}"
                hits0, queries0 = prefix_cache_counters(health)
                result = bench(public, key, tokenizer, workload)
                hits1, queries1 = prefix_cache_counters(health)
            hit_rate = (hits1 - hits0) / max(queries1 - queries0, 1)
            rows.append((policy, result, hit_rate))
    print(f"\n{args.num_prompts} prompts over {args.prefixes} shared {args.prefix_len}-token prefixes "
          f"(+{args.suffix_len} unique, {args.output_len} out), concurrency {args.concurrency}, 2 instances\n")
    print("| policy | completed | failed | prefix-cache hit rate | req/s | TTFT p50 ms | TTFT p99 ms | E2E p50 ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for policy, r, rate in rows:
        print(f"| {policy} | {r['completed']} | {r.get('failed', 0)} | {rate:.1%} | {r['request_throughput']:.2f} | "
              f"{r['p50_ttft_ms']:.1f} | {r['p99_ttft_ms']:.1f} | {r['p50_e2el_ms']:.1f} |")
    (_, base, base_rate), (_, aware, aware_rate) = rows
    print(f"\ncache_aware / round_robin: hit rate {aware_rate:.1%} vs {base_rate:.1%}, "
          f"TTFT p50 {aware['p50_ttft_ms'] / base['p50_ttft_ms']:.2f}x, "
          f"req/s {aware['request_throughput'] / base['request_throughput']:.2f}x")


if __name__ == "__main__":
    main()
