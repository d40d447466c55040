"""One setup's capacity three ways, in one run, on `kiln up --profile tiny-cpu` on this machine:

1. kiln's engine: the served plan's capacity within the budget, with its band (what `kiln plan` prints);
2. vLLM's own client at the streams the engine found (`vllm bench serve --goodput`, the check: does the budget
   hold there, and for what share of the requests);
3. `kiln bench --capacity --predict tiny-cpu`: the search on the running endpoint, beside the prediction.

Heavy (a few minutes of both cores): run it alone,

    flock /tmp/kiln-cpu.lock python -m benchmarks.capacity_three_ways [--input-len 128 --output-len 64]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import requests

from kiln.bench.capacity import probe_args
from kiln.bench.client import VllmBench, discover
from kiln.bench.predicted import predict_capacity
from kiln.bench.setups import Ports, kiln_up
from kiln.bench.sweep import summarize
from kiln.cli.bench import local_endpoint
from kiln.cli.output import table
from kiln.perf.capacity import streams_load
from kiln.perf.workload import DEFAULT_TPOT_MS, DEFAULT_TTFT_MS, Workload
from kiln.render.vllm import find_vllm_python
from kiln.setup.types import Refusal
from kiln.wiring import Kiln

PORTS = Ports(public=18700, health=18790, router=18701, router_metrics=18702)
KILN = str(Path(sys.executable).parent / "kiln")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--ttft-ms", type=float, default=DEFAULT_TTFT_MS)
    parser.add_argument("--tpot-ms", type=float, default=DEFAULT_TPOT_MS)
    args = parser.parse_args()
    workload = Workload(args.input_len, args.output_len, ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms)
    kiln = Kiln.create()
    with tempfile.TemporaryDirectory(prefix="kiln-capacity-") as tmp:
        state = Path(tmp) / "state"
        with kiln_up(state, "tiny-cpu", PORTS, tls=True) as up:
            instances = len(requests.get(f"{up.health}/status", timeout=10).json()["instances"])
            predicted = predict_capacity(kiln.machine(None), kiln.profile("tiny-cpu", None), instances, workload,
                                         kiln.constants)
            if isinstance(predicted, Refusal):
                sys.exit(f"no prediction: {predicted.reason}")
            engine = predicted.report
            print(f"1/3 kiln's engine: {engine['streams']} streams on {instances} instance(s)", file=sys.stderr)

            _, tokenizer = local_endpoint(up.url, state)
            target = discover(up.url, up.api_key, up.certificate, tokenizer)
            client = VllmBench(find_vllm_python(), Path(tmp) / "vllm-bench.log")
            raw = client.run(target, probe_args(streams_load(workload, max(engine["streams"], 1))))
            check = summarize(max(engine["streams"], 1), raw, None)
            good, rate = raw.get("request_goodput"), check["requests_per_s"]
            check["share_within_budget"] = round(good / rate, 3) if good is not None and rate else None
            print(f"2/3 vLLM's client at {check['concurrency']} streams", file=sys.stderr)

            print("3/3 kiln bench --capacity", file=sys.stderr)
            out = Path(tmp) / "bench"
            done = subprocess.run([KILN, "bench", "--url", up.url, "--api-key", up.api_key or "", "--state-dir",
                                   str(state), "--capacity", "--input-len", str(args.input_len), "--output-len",
                                   str(args.output_len), "--slo-ttft-ms", f"{args.ttft_ms:g}", "--slo-tpot-ms",
                                   f"{args.tpot_ms:g}", "--predict", "tiny-cpu", "--predict-instances",
                                   str(instances), "--out", str(out), "--json"],
                                  capture_output=True, text=True, check=False, timeout=3600)
            if done.returncode != 0:
                sys.exit(f"kiln bench --capacity failed: {done.stderr[-2000:]}")
            measured: dict[str, Any] = json.loads(done.stdout)["measured"]
    print(f"\ntiny-cpu on {instances} instance(s) of `kiln up` on this machine; {workload.shape()}; "
          f"{workload.budget()}\n")
    print(table(["", "streams", "requests/s", "output tok/s", "TTFT p90 ms", "TPOT p90 ms",
                 "requests within both"], [
        ["kiln's engine", engine["streams"], _f(engine["requests_per_s"], 2), _f(engine["output_tokens_per_s"]),
         _f(engine["ttft_ms_p90"]), _f(engine["tpot_ms_p90"], 2), "-"],
        [f"vLLM's client at {check['concurrency']} streams", check["concurrency"], _f(check["requests_per_s"], 2),
         _f(check["output_tokens_per_s"]), _f(check["ttft_ms"]["p90"]), _f(check["tpot_ms"]["p90"], 2),
         _share(check["share_within_budget"])],
        ["kiln bench --capacity", measured["streams"], _f(measured["requests_per_s"], 2),
         _f(measured["output_tokens_per_s"]), _f(measured["ttft_ms_p90"]), _f(measured["tpot_ms_p90"], 2),
         _share(measured["share_within_budget"])]]))
    band = (engine.get("band") or {}).get("output_tokens_per_s")
    print(f"\nthe engine's band of output tok/s: {band or 'none (a CPU plan has no band)'}; the engine's requests/s "
          "are Poisson arrivals, the two measured ones a closed loop of those streams")
    print("kiln bench --capacity probes: " + ", ".join(
        f"{p['concurrency']} ({'within' if p['meets_budget'] else 'over'})" for p in measured["probes"]))


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _share(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.0f}%"


if __name__ == "__main__":
    main()
