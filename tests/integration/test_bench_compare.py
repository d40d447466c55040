"""`kiln bench compare`: kiln's plan and vanilla vLLM, each started on this machine in turn, side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

KILN = str(Path(sys.executable).parent / "kiln")


def test_compare_runs_kilns_plan_and_vanilla_vllm_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "compare"
    done = subprocess.run([KILN, "bench", "compare", "--concurrency", "1,8", "--input-len", "32", "--output-len",
                           "16", "--num-prompts", "16", "--machine", "l40s", "--out", str(out)],
                          capture_output=True, text=True, timeout=1200, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    print(done.stdout)
    result = json.loads((out / "compare.json").read_text())
    assert result["usd_per_hour"] == 1.57 and "gpu-l40sx1-48gb" in result["price_source"]
    assert [r["concurrency"] for r in result["ratios"]] == [1, 8]
    for side in ("kiln", "vanilla"):
        assert all(level["completed"] == 16 and level["failed"] == 0 for level in result[side])
    first = result["ratios"][0]
    assert first["output_tokens_per_s"] == pytest.approx(
        result["kiln"][0]["output_tokens_per_s"] / result["vanilla"][0]["output_tokens_per_s"], rel=1e-2)
    assert "--tensor-parallel-size" not in result["vanilla_argv"]  # one CPU instance, vLLM's defaults
    assert "Output tok/s: kiln vs vanilla" in done.stdout and "x)" in done.stdout
    assert (out / "throughput_vs_concurrency.png").exists() and (out / "compare.md").exists()
