"""A sweep on disk: results.json for programs, report.md for people, and PNG plots in the seeds' style
(throughput against concurrency; latency against throughput)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Levels = Sequence[Mapping[str, Any]]


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown_table(levels: Levels) -> str:
    head = ("| concurrency | out tok/s | req/s | goodput req/s | TTFT p50/p90/p99 ms | TPOT p50/p90/p99 ms "
            "| ITL p50/p99 ms | E2E p50/p99 ms | $/M out tokens |")
    rows = [head, "|" + " --- |" * 9]
    for lv in levels:
        t, p, i, e = lv["ttft_ms"], lv["tpot_ms"], lv["itl_ms"], lv["e2e_ms"]
        rows.append(
            f"| {lv['concurrency']} | {_num(lv['output_tokens_per_s'])} | {_num(lv['requests_per_s'], 2)} "
            f"| {_num(lv['goodput_requests_per_s'], 2)} | {_num(t['p50'])} / {_num(t['p90'])} / {_num(t['p99'])} "
            f"| {_num(p['p50'])} / {_num(p['p90'])} / {_num(p['p99'])} | {_num(i['p50'])} / {_num(i['p99'])} "
            f"| {_num(e['p50'])} / {_num(e['p99'])} | {_num(lv['usd_per_million_output_tokens'], 4)} |")
    return "\n".join(rows)


def plot(series: Mapping[str, Levels], out: Path, title: str) -> list[Path]:
    """Two PNGs: output tokens/s against concurrency, and TTFT/TPOT p50 against output tokens/s."""
    # Imported here: matplotlib costs every `kiln` command (the boot agent's too) a second and a cache folder.
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt  # noqa: PLC0415  (after the backend is chosen)
    from matplotlib.ticker import ScalarFormatter  # noqa: PLC0415

    paths = [out / "throughput_vs_concurrency.png", out / "latency_vs_throughput.png"]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for name, levels in series.items():
        ax.plot([lv["concurrency"] for lv in levels], [lv["output_tokens_per_s"] for lv in levels], marker="o",
                label=name)
    ax.set(xscale="log", xlabel="concurrent requests", ylabel="output tokens/s", title=f"{title}: throughput")
    ax.set_xticks([lv["concurrency"] for lv in next(iter(series.values()))])
    ax.get_xaxis().set_major_formatter(ScalarFormatter())
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths[0])
    plt.close(fig)

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=120)
    for name, levels in series.items():
        tps = [lv["output_tokens_per_s"] for lv in levels]
        left.plot(tps, [lv["ttft_ms"]["p50"] for lv in levels], marker="o", label=name)
        right.plot(tps, [lv["tpot_ms"]["p50"] for lv in levels], marker="o", label=name)
    left.set(xlabel="output tokens/s", ylabel="TTFT p50 (ms)", title="time to first token")
    right.set(xlabel="output tokens/s", ylabel="TPOT p50 (ms)", title="time per output token")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{title}: latency against throughput")
    fig.tight_layout()
    fig.savefig(paths[1])
    plt.close(fig)
    return paths


def write_sweep(out: Path, levels: Levels, setup: Mapping[str, Any]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    results = [{**setup, **lv} for lv in levels]
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    price = setup.get("usd_per_hour")
    lines = [f"# kiln bench: {setup.get('model')} at {setup.get('url')}", "",
             f"{setup.get('dataset')} prompts, {setup.get('input_len')} tokens in, {setup.get('output_len')} out; "
             f"price {'$' + format(price, '.2f') + '/h' if price is not None else 'not given'} "
             f"({setup.get('price_source', '-')}); goodput SLO: {setup.get('slo')}.", "", markdown_table(levels), "",
             "![throughput](throughput_vs_concurrency.png)", "", "![latency](latency_vs_throughput.png)", ""]
    (out / "report.md").write_text("\n".join(lines))
    plots = plot({str(setup.get("label", "kiln")): levels}, out, str(setup.get("model")))
    return [out / "results.json", out / "report.md", *plots]
