"""The planner's search time at boot: every catalog profile on an 8-GPU machine under each workload preset, this
checkout beside another (`--baseline DIR`, a checkout of an earlier commit), one after the other in one run, each in
its own process. Run it on an idle machine: the times are wall-clock.

Run: .venv/bin/python -m benchmarks.search_time [--baseline DIR] [--machines h100x8] [--presets serve,chat,...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GOAL_S = 3.0


def worker(machines: list[str], presets: list[str]) -> None:
    """One process's timings, a JSON line each (imports here: the checkout is chosen by PYTHONPATH)."""
    from kiln.choice.schema import Choice  # noqa: PLC0415
    from kiln.perf.workload import PRESETS  # noqa: PLC0415
    from kiln.planner.search import make_plan  # noqa: PLC0415
    from kiln.wiring import Kiln  # noqa: PLC0415

    kiln = Kiln.create()
    catalog = kiln.catalog()
    for name in machines:
        machine = kiln.machine(name)
        for preset in presets:
            for profile_name in catalog.names():
                profile = catalog.get(profile_name)
                if profile.cpu_only:
                    continue
                started = time.perf_counter()
                make_plan(machine, profile, Choice(), kiln.constants, workload=PRESETS[preset].workload)
                print(json.dumps({"machine": name, "preset": preset, "profile": profile_name,
                                  "seconds": time.perf_counter() - started}), flush=True)


def timings(agent: Path, machine: str, presets: list[str]) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": f"{agent}{os.pathsep}{Path(__file__).parent.parent}"}
    done = subprocess.run([sys.executable, "-m", "benchmarks.search_time", "--worker", "--machines", machine,
                           "--presets", ",".join(presets)], capture_output=True, text=True, env=env, check=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="another kiln checkout to time beside this one")
    parser.add_argument("--machines", default="h100x8")
    parser.add_argument("--presets", default="serve,chat,rag,agent,batch")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    machines, presets = args.machines.split(","), args.presets.split(",")
    if args.worker:
        worker(machines, presets)
        return 0
    here = Path(__file__).resolve().parent.parent / "agent"
    runs: dict[str, list[dict[str, Any]]] = {"this": [], "baseline": []}
    for machine in machines:
        runs["this"] += timings(here, machine, presets)
        if args.baseline:
            runs["baseline"] += timings(args.baseline.resolve() / "agent", machine, presets)
    print(f"search time of the default plan per preset, every catalog profile (goal: none over {GOAL_S:g} s)\n")
    print("| machine | preset | " + ("baseline: median / max (s) | " if args.baseline else "")
          + "this: median / max (s) | slowest now | over the goal now |")
    print("|---|---|" + ("---|" if args.baseline else "") + "---|---|---|")
    for machine in machines:
        for preset in presets:
            cells = []
            for which in (["baseline"] if args.baseline else []) + ["this"]:
                times = [r["seconds"] for r in runs[which] if r["machine"] == machine and r["preset"] == preset]
                cells.append(f"{statistics.median(times):.2f} / {max(times):.2f}")
            now = [r for r in runs["this"] if r["machine"] == machine and r["preset"] == preset]
            slowest = max(now, key=lambda r: r["seconds"])
            over = [r["profile"] for r in now if r["seconds"] > GOAL_S]
            print(f"| {machine} | {preset} | " + " | ".join(cells)
                  + f" | {slowest['profile']} {slowest['seconds']:.2f} s | {', '.join(over) or 'none'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
