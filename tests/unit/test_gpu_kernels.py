"""The GPU kernel timings and the engine beside them: benchmarks/gpu_kernels.py runs its own shapes scaled down on
the CPU (a GPU is lent only sometimes), and benchmarks.engine_vs_gpu prices every shape of a real H200 recording."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks import engine_vs_gpu
from tests.conftest import REPO


def test_the_timing_script_writes_every_section(tmp_path: Path) -> None:
    out = tmp_path / "kernels.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_kernels.py"), "--smoke", "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    data = json.loads(out.read_text())
    assert {"device", "memory", "dense", "experts", "attention", "stacks"} <= set(data)
    assert [s["name"] for s in data["stacks"]] == ["tiny", "tiny-moe"]
    rows = [r for s in data["stacks"] for r in s["decode"] + s["prefill"]]
    assert rows and all(r["eager_s"] > 0 for r in rows)


def test_every_recorded_h200_timing_has_the_engines_figure_beside_it(capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    data = json.loads(engine_vs_gpu.MEASURED.read_text())
    assert data["device"]["gpu"] == "NVIDIA H200"
    monkeypatch.setattr(sys, "argv", ["engine_vs_gpu"])
    assert engine_vs_gpu.main() == 0
    printed = capsys.readouterr().out
    steps = [r for s in data["stacks"] for r in s["decode"] + s["prefill"]]
    priced = [line for line in printed.splitlines() if ": decode " in line or ": prefill " in line]
    assert len(priced) == len(steps)
    assert all(float(line.split()[-1]) > 0 for line in priced)
    assert "of the 4,800 GB/s datasheet" in printed
