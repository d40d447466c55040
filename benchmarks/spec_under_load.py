"""Speculative decoding at high load: public pairs of one setup served with drafts and without (tests/data/
spec_pairs.yaml), the gain each measured beside the gain kiln's engine predicts for it, in one run.

Run: .venv/bin/python -m benchmarks.spec_under_load [--json]
Each half is predicted as the public cases are (benchmarks.public_cases): the setup rebuilt, the load simulated at
its concurrency, drafts kept at the source's acceptance length where it states one and at kiln's per-method
acceptance otherwise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.public_cases import REPO, evaluate, model_profile
from kiln.cli.output import table
from kiln.validation import parse_yaml
from kiln.wiring import Kiln

PAIRS = REPO / "tests" / "data" / "spec_pairs.yaml"


@dataclass(frozen=True)
class Judged:
    id: str
    setup: str
    load: str
    concurrency: int
    measured_gain: float
    kiln_gain: float | None
    measured_off: float | None  # the half without drafts, where the source gives it (its metric)
    kiln_off: float | None
    moe: bool
    problem: str | None = None

    @property
    def ratio(self) -> float | None:
        """kiln's gain over the measured one: above 1, kiln expects more of the drafts than they gave."""
        return self.kiln_gain / self.measured_gain if self.kiln_gain else None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "setup": self.setup, "load": self.load, "measured_gain": round(self.measured_gain, 3),
                "kiln_gain": round(self.kiln_gain, 3) if self.kiln_gain else None,
                "kiln_over_measured": round(self.ratio, 3) if self.ratio else None,
                "measured_off": self.measured_off, "kiln_off": round(self.kiln_off, 1) if self.kiln_off else None,
                "problem": self.problem}


def load_pairs(path: Path = PAIRS) -> list[dict[str, Any]]:
    pairs: list[dict[str, Any]] = parse_yaml(path.read_text())["pairs"]
    return pairs


def halves(pair: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pair as two public cases (perf_cases.yaml's schema): without drafts, and with them."""
    m = pair["measured"]
    metric = "total_tokens_per_s" if m.get("metric") == "total" else "output_tokens_per_s"
    base = {"dp": 1, "ep": False, "pp": 1, "instances": 1, **pair["base"], "source": pair["source"]}
    off = {**base, "id": f"{pair['id']}-off", "speculative": None, "measured": {metric: m.get("plain")}}
    on = {**base, "id": f"{pair['id']}-on", "speculative": pair["speculative"], "measured": {metric: m.get("drafting")}}
    return off, on


def judge(kiln: Kiln, pair: dict[str, Any]) -> Judged:
    off_case, on_case = halves(pair)
    off, on = evaluate(kiln, off_case), evaluate(kiln, on_case)
    m = pair["measured"]
    measured = float(m["gain"]) if "gain" in m else float(m["drafting"]) / float(m["plain"])
    spec, w = pair["speculative"], pair["base"]["workload"]
    setup = (f"{pair['base']['model']} {pair['base']['gpus']}x{pair['base']['gpu']} TP{pair['base']['tp']} "
             f"{pair['base']['precision']}, {spec['method']} k={spec['num_speculative_tokens']}")
    load = f"{w['input_len']}/{w['output_len']} at {w['concurrency']}"
    problem = off.problem or on.problem
    gain = on.kiln / off.kiln if on.kiln and off.kiln and not problem else None
    profile = model_profile(kiln, pair["base"]["model"], pair["base"]["precision"])
    moe = not isinstance(profile, str) and profile.architecture.moe is not None
    return Judged(pair["id"], setup, load, int(w["concurrency"]), measured, gain, m.get("plain"), off.kiln, moe,
                  problem)


def report(judged: list[Judged]) -> str:
    rows = [[j.id, j.setup, j.load, f"{j.measured_gain:.2f}x", f"{j.kiln_gain:.2f}x" if j.kiln_gain else "-",
             f"{j.ratio:.2f}" if j.ratio else (j.problem or "-"),
             f"{j.kiln_off / j.measured_off:.2f}" if j.kiln_off and j.measured_off else "-"] for j in judged]
    lines = [table(["pair", "setup", "in/out at concurrency", "measured gain", "kiln's gain", "kiln ÷ measured",
                    "without drafts: kiln ÷ measured"], rows)]
    for label, moe in (("dense", False), ("MoE", True)):
        ratios = [j.ratio for j in judged if j.ratio and j.moe == moe]
        if ratios:
            lines.append(f"{label}: kiln's gain over the measured one, median {statistics.median(ratios):.2f} "
                         f"(from {min(ratios):.2f} to {max(ratios):.2f}) over {len(ratios)} pairs")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    kiln = Kiln.create()
    judged = [judge(kiln, pair) for pair in load_pairs()]
    print(json.dumps([j.as_dict() for j in judged], indent=1) if args.json else report(judged))
    return 0


if __name__ == "__main__":
    sys.exit(main())
