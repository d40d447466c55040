"""kiln's performance model beside public measurements of vLLM, case by case, and each engine's accuracy.

Run: .venv/bin/python -m benchmarks.perf_model_vs_public [--json] [--no-aiconfigurator]
The cases (tests/data/perf_cases.yaml) are published `vllm bench serve` runs, each with its source and quote.
For every usable case it prints the measured output tokens/s beside:
- kiln: the continuous-batching simulator with kiln's calibrated step times (what `kiln predict` answers);
- aic: AIConfigurator alone (its static-batch estimate at the case's batch), where it has the GPU and model;
Then, per engine, the share of cases within ±25% and the median absolute error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.band_coverage import GOAL, MIN_JUDGED, Coverage, HeldCase, fit_bands
from benchmarks.perf_fit import Errors, best_point, combos, error_matrix, family, out_of_sample_from
from benchmarks.public_cases import (
    OLDEST_RELEASE,
    WITHIN,
    Row,
    case_class,
    evaluate,
    held_out,
    lengths,
    load_cases,
    split_groups,
    summary,
)
from kiln.perf.predict import kiln_steps
from kiln.planner.bands import MIN_CASES, class_keys, model_family
from kiln.wiring import Kiln


def _fmt(v: float | None, ref: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f} ({v / ref:.2f}x)" if ref else f"{v:,.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-aiconfigurator", action="store_true", help="skip AIConfigurator's column")
    parser.add_argument("--out-of-sample", action="store_true",
                        help="refit the constants without each source and each model family, predict the held-out "
                             "cases, and print the bands (data/planner.yaml `bands`) their errors give, judged on "
                             "cases they were not fitted on")
    parser.add_argument("--held", type=Path, metavar="FILE",
                        help="with --out-of-sample: also write each case's out-of-sample ratios to FILE (JSON); "
                             "with --bands-from: read them from FILE instead of refitting")
    parser.add_argument("--bands-from", action="store_true", help="judge the bands from --held FILE alone")
    args = parser.parse_args(argv)
    if args.bands_from:
        if args.held is None:
            parser.error("--bands-from needs --held FILE")
        print_bands([HeldCase(**{**c, "keys": tuple(c["keys"])}) for c in json.loads(args.held.read_text())])
        return 0
    if args.out_of_sample:
        return out_of_sample_report(args.held)
    kiln = Kiln.create()
    cases, catalog = load_cases(), kiln.catalog()
    rows = [evaluate(kiln, c, catalog) for c in cases]
    if not args.no_aiconfigurator:
        from benchmarks.aic_alone import fill_aic  # noqa: PLC0415 - only when AIConfigurator is asked for
        fill_aic(kiln, cases, rows)
    engines = [summary(rows, e) for e in ("kiln", "aic")]
    covered = [r for r in rows if r.aic is not None]
    both = [summary(covered, e) for e in ("kiln", "aic")]
    timings = planner_timings(kiln)
    splits = split_groups([{**c, "workload": lengths(c)} for c in cases], rows)
    if args.json:
        print(json.dumps({"rows": [r.__dict__ for r in rows], "summary": engines, "where_aic_covers": both,
                          "best_split": [{"group": g.key, "measured": g.measured, "predicted": g.predicted,
                                          "measured_best_tp": g.best_measured, "predicted_best_tp": g.best_predicted}
                                         for g in splits],
                          "planner_s": timings}, indent=2))
        return 0
    header = f"{'case':9} {'gpu':6} {'model':24} {'setup':22} {'workload':26} {'measured':>13}  " \
             f"{'kiln':>16} {'aic':>16}"
    print(header)
    print("-" * len(header))
    _print_rows(rows)
    older = [evaluate(kiln, c, catalog) for c in load_cases(older=True)]
    if older:
        print(f"\nmeasured on vLLM releases before {'.'.join(map(str, OLDEST_RELEASE))}, printed but not scored "
              "(benchmarks.public_cases.OLDEST_RELEASE):")
        _print_rows(older)
    print()
    by_gpu = Counter(r.gpu for r in rows if not r.problem)
    print("cases per GPU: " + ", ".join(f"{g} {n}" for g, n in sorted(by_gpu.items())))
    for s in engines:
        if s["cases"]:
            print(f"{s['engine']:9} {s['cases']:3} cases: {s['within_25']:.0%} within ±25%, "
                  f"median |error| {s['median_abs_error']:.0%}")
        else:
            print(f"{s['engine']:9}   0 cases")
    if covered:
        print("on the cases AIConfigurator covers: " + "; ".join(
            f"{s['engine']} {s['within_25']:.0%} within ±25%, median |error| {s['median_abs_error']:.0%}"
            for s in both if s["cases"]))
    right = sum(g.best_measured == g.best_predicted for g in splits)
    print(f"\nthe best split per GPU, measured and predicted: {right} of {len(splits)} groups agree")
    for g in splits:
        per_gpu = ", ".join(f"TP{tp} {g.measured[tp]:,.0f} / {g.predicted[tp]:,.0f}" for tp in g.measured)
        print(f"  {'same' if g.best_measured == g.best_predicted else 'DIFFERS'}: {g.key}: per GPU measured / "
              f"predicted {per_gpu}")
    print()
    for what, seconds in timings.items():
        print(f"planner search, {what}: {seconds:.2f} s")
    return 0


def _print_rows(rows: list[Row]) -> None:
    for r in rows:
        if r.problem:
            print(f"{r.id:9} {r.gpu:6} {r.model[:24]:24} not modeled: {r.problem}")
            continue
        print(f"{r.id:9} {r.gpu:6} {r.model[:24]:24} {r.setup[:22]:22} {r.workload[:26]:26} "
              f"{r.metric[:3]} {r.measured or 0:>9,.0f}  {_fmt(r.kiln, r.measured):>16} {_fmt(r.aic, r.measured):>16}")


def planner_timings(kiln: Kiln) -> dict[str, float]:
    """How long the boot's search takes on an 8-GPU machine, per workload preset (kiln's engine)."""
    from kiln.choice.schema import Choice  # noqa: PLC0415
    from kiln.perf.workload import PRESETS  # noqa: PLC0415
    from kiln.planner.search import choose  # noqa: PLC0415

    machine, profile = kiln.machine("h100x8"), kiln.catalog().get("llama-3.3-70b-instruct")
    out = {}
    for name, preset in PRESETS.items():
        started = time.perf_counter()
        choose(machine, profile, Choice(), preset.workload, kiln.constants,
               lambda p: kiln_steps(p, machine, profile, kiln.constants))
        out[f"llama-3.3-70b-instruct on h100x8, {name}"] = time.perf_counter() - started
    return out


def out_of_sample_report(held_file: Path | None) -> int:
    kiln = Kiln.create()
    cases = [{**c, "workload": lengths(c)} for c in load_cases()]
    grid = combos()
    matrix = error_matrix(kiln, cases, grid)
    results = out_of_sample_from(matrix, cases)
    print(f"{len(cases)} public cases; grid of {len(grid)} constant sets (benchmarks.perf_fit.GRID); the best on "
          f"all cases: {grid[best_point(matrix)]}")
    catalog = kiln.catalog()
    rows = [evaluate(kiln, c, catalog) for c in cases]
    for name, (errors, (within, median, n)) in results.items():
        groups = split_groups(cases, held_out(rows, errors))
        right = sum(g.best_measured == g.best_predicted for g in groups)
        print(f"{name:22} {n:3} cases: {within:.0%} within ±25%, median |error| {median:.0%}; the measured best "
              f"split per GPU predicted best in {right} of {len(groups)} groups")
    print_breakdown(cases, {name: errors for name, (errors, _) in results.items()})
    classes = [case_class(kiln, c, catalog) for c in cases]
    by_source, by_family = results["leave-one-source-out"][0], results["leave-one-family-out"][0]
    held = [HeldCase(tuple(class_keys(*cls)), str(c.get("source_group") or c["source"]), family(c["model"]),
                     1 / (1 + e), None if f is None else 1 / (1 + f))
            for c, cls, e, f in zip(cases, classes, by_source, by_family, strict=True)
            if cls is not None and e is not None]
    if held_file is not None:
        held_file.write_text(json.dumps([dataclasses.asdict(h) for h in held], indent=1))
    print_bands(held)
    return 0


def print_bands(held: list[HeldCase]) -> None:
    """Each class's band before (10th-90th percentile) and after widening to the goal, with how often each held
    for the cases left out, and the lines for data/planner.yaml."""
    sets = {"source": "classes", "family": "new_family"}
    yaml_lines = [f"  families: [{', '.join(sorted({model_family(h.family) for h in held}))}]"]
    for kind, table in sets.items():
        fitted = fit_bands(held, MIN_CASES, kind)
        judged = [b for b in fitted if b.after.judged >= MIN_JUDGED]
        print(f"\nbands judged leaving out each {kind} ({len(held)} cases; a case's band fitted without its {kind}; "
              f"goal: {GOAL:.0%} held)")
        print(f"{'class':20} {'cases':>5}  {'held':>16}  {'width (high/low)':>17}")
        for b in fitted:
            print(f"{b.key:20} {b.cases:5}  {_share(b.before):>7} -> {_share(b.after):>6}  "
                  f"{b.widths[0]:7.2f} -> {b.widths[1]:5.2f}"
                  f"{'' if b.meets else '  (below the goal at the widest rung)'}"
                  f"{'' if b.after.judged >= MIN_JUDGED else '  (too few left-out cases to judge: not in the table)'}")
        for when, index in (("before", 0), ("after", 1)):
            covered = [(b.before, b.after)[index] for b in judged]
            hits, total = sum(c.held for c in covered), sum(c.judged for c in covered)
            print(f"  {when}: held for {hits}/{total} ({hits / total:.0%}) of the cases left out; median width "
                  f"{statistics.median(b.widths[index] for b in judged):.2f}x")
        yaml_lines.append(f"  {table}:")
        yaml_lines += [f"    \"{b.key}\": {{low: {b.low:.2f}, high: {b.high:.2f}, cases: {b.cases}, "
                       f"held: {b.after.held}, judged: {b.after.judged}}}" for b in judged]
    print("\ndata/planner.yaml `bands:`")
    print("\n".join(yaml_lines))


def _share(c: Coverage) -> str:
    return f"{c.held}/{c.judged}" if c.judged else "-"


def print_breakdown(cases: list[dict[str, Any]], errors: dict[str, Errors]) -> None:
    """Cases by GPU, model family and vLLM release: how many, and per fit the share within ±25% and the median
    |error|."""
    keys = {"GPU": lambda c: str(c["gpu"]), "family": lambda c: family(c["model"]),
            "vLLM": lambda c: str(c.get("vllm_release") or "unnamed")}
    names = list(errors)
    print(f"\n{'within ±25% / cases, median |error|':36}" + "  ".join(f"{n:>22}" for n in names))
    for title, key in keys.items():
        for value in sorted({key(c) for c in cases}):
            picked = [i for i, c in enumerate(cases) if key(c) == value]
            cells = []
            for n in names:
                found = [abs(e) for e in (errors[n][i] for i in picked) if e is not None]
                cells.append(f"{sum(e <= WITHIN for e in found):>3}/{len(found):<3} {statistics.median(found):>5.0%}"
                             if found else "-")
            print(f"{title + ' ' + value:28.28} {len(picked):>5} cases  " + "  ".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    sys.exit(main())
