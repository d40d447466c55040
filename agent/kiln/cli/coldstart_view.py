"""The predicted cold start as a table: each part, weights baked into the image and downloaded at boot."""

from __future__ import annotations

from typing import Any

from kiln.cli.output import table
from kiln.setup.startup import ColdStart, ColdStarts


def _seconds(start: ColdStart) -> dict[str, float]:
    return {p.name: p.seconds for p in start.parts}


def _verdict(start: ColdStart) -> str:
    if start.meets_goal is None:
        return f"{start.total_s:.0f} s"
    return f"{start.total_s:.0f} s ({'within' if start.meets_goal else 'over'} {start.goal_s:.0f} s)"


def cold_start_table(starts: ColdStarts) -> str:
    baked, download = _seconds(starts.baked), _seconds(starts.download)
    names = list(dict.fromkeys([*download, *baked]))
    rows: list[list[Any]] = [[n, f"{baked[n]:.1f}" if n in baked else "-",
                              f"{download[n]:.1f}" if n in download else "-"] for n in names]
    rows.append(["agent start -> serving", _verdict(starts.baked), _verdict(starts.download)])
    return (table(["Cold start (s)", "weights baked", "downloaded"], rows)
            + "\n  baked: weights and their torch.compile cache on the image; downloaded: from the Hub, compiled cold."
            + "\n  Not included: the machine's own boot before kiln-agent starts.")
