"""Predicted cold start (kiln-agent start -> vLLM serving) per catalog model and droplet size, weights baked into
the image and downloaded at boot; with --validate DIR, the model against vLLM start-up logs it was not fitted on.

Run: .venv/bin/python -m benchmarks.cold_start [--validate DIR]
The table is the image README's (image/README.md). DIR holds llm-d-planner's vLLM 0.19.0 H100 logs
(accuracy/results/v0.19.0/logs of github.com/llm-d-incubation/llm-d-planner, commit d3121e05); each log's measured
time from its first line to "Starting vLLM server" is set beside the prediction for its shape (weights present,
torch.compile cold), the two logs the constants were fitted on marked.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from datetime import datetime
from pathlib import Path

from kiln.choice.schema import Choice
from kiln.perf.coldstart import GIB, predict_cold_start
from kiln.planner.search import make_plan
from kiln.setup.startup import StartShape
from kiln.setup.types import Plan
from kiln.wiring import Kiln

DROPLETS = ["h100x1", "h100x8", "h200x1", "h200x8", "l40s", "rtx6000ada", "rtx4000ada", "b300x8"]
FITTED = ("llama-3-1-8b--h100-80gb--tp1pp1dp1--16384", "qwen-qwen2-5-72b-instruc--h100-80gb--tp2pp1dp1--8192")


def table(kiln: Kiln) -> list[str]:
    rows = ["| model | droplet | plan | baked (s) | downloaded (s) | goal (s) |", "|---|---|---|---|---|---|"]
    catalog = kiln.catalog()
    for name in catalog.names():
        profile = catalog.get(name)
        if profile.cpu_only:
            continue
        for droplet in DROPLETS:
            plan = make_plan(kiln.machine(droplet), profile, Choice(), kiln.constants, [])
            if not isinstance(plan, Plan) or plan.cold_start is None:
                continue
            baked, download = plan.cold_start.baked, plan.cold_start.download
            shape = f"{plan.layout()} {plan.quantization}"
            rows.append(f"| {name} | {droplet} | {shape} | {baked.total_s:.0f} | {download.total_s:.0f} | "
                        f"{baked.goal_s:.0f} |")
    return rows


_STAMP = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d)")
_LAYERS = {"llama-3-1-8b": 32, "llama-3-3-70b": 80, "qwen-qwen2-5-7b": 28, "qwen-qwen2-5-72b": 80, "qwen3-8b": 36,
           "phi-4": 40, "granite-3-1-8b": 40, "mistral-small": 40, "w8a8-mistral-small-24b": 40, "kimi-dev-72b": 80}


def _seconds(text: str) -> datetime:
    return datetime.strptime(f"2026-{text}", "%Y-%m-%d %H:%M:%S")


def measured(log: Path) -> tuple[int, float, float] | None:
    """(tensor parallel size, GiB per GPU, seconds from the first line to the server listening), or None."""
    lines = log.read_text(errors="replace").splitlines()
    stamps = [m.group(1) for line in lines if (m := _STAMP.search(line))]
    ready = next((line for line in lines if "Starting vLLM server" in line), None)
    loaded = next((m for line in lines if (m := re.search(r"Model loading took ([\d.]+) GiB", line))), None)
    tp = re.search(r"--tp(\d+)", log.name)
    if not stamps or ready is None or loaded is None or tp is None or "downloading weights" in log.read_text():
        return None
    start, end = _seconds(stamps[0]), _seconds(_STAMP.search(ready).group(1))  # type: ignore[union-attr]
    return int(tp.group(1)), float(loaded.group(1)), (end - start).total_seconds()


def validate(kiln: Kiln, folder: Path) -> list[str]:
    data = kiln.constants.get("cold_start")
    rows, errors = ["log | TP | GiB/GPU | layers | measured s | predicted s | error"], []
    for log in sorted(folder.glob("*.log")):
        layers = next((n for key, n in _LAYERS.items() if log.name.startswith(key) or key in log.name), None)
        found = measured(log)
        if layers is None or found is None or "FAILED" in log.name:
            continue
        tp, gib, seconds = found
        shape = StartShape("cuda", 0, int(gib * GIB), layers, tp, cuda_graphs=102, params_b=0)
        start = predict_cold_start(shape, data, baked=False)
        predicted = start.total_s - data["agent_s"] - sum(p.seconds for p in start.parts if p.name == "download")
        error = (predicted - seconds) / seconds
        fitted = any(log.name.startswith(f) for f in FITTED)
        if not fitted:
            errors.append(abs(error))
        rows.append(f"{log.name[:52]}{' (fitted)' if fitted else ''} | {tp} | {gib:.1f} | {layers} | {seconds:.0f} "
                    f"| {predicted:.0f} | {error:+.0%}")
    if errors:
        rows.append(f"held out: {len(errors)} logs, median |error| {statistics.median(errors):.0%}, "
                    f"max {max(errors):.0%}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validate", type=Path, help="a folder of vLLM start-up logs to judge the model on")
    args = parser.parse_args(argv)
    kiln = Kiln.create()
    print("\n".join(validate(kiln, args.validate) if args.validate else table(kiln)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
