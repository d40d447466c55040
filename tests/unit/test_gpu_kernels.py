"""The GPU kernel timings and the engine beside them: benchmarks/gpu_kernels.py runs its own shapes scaled down on
the CPU (a GPU is lent only sometimes), and benchmarks.engine_vs_gpu prices every shape of the H100 and H200
recordings."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks import engine_vs_gpu
from tests.conftest import REPO


def test_the_timing_script_writes_every_section(tmp_path: Path) -> None:
    """vLLM's own MoE kernel runs in Triton's interpreter, launched as gpu_kernels.py launches it on a GPU, and
    gives what the same experts give in plain PyTorch."""
    found = importlib.util.find_spec("vllm")
    assert found and found.submodule_search_locations
    fused_moe = Path(found.submodule_search_locations[0]) / "model_executor" / "layers" / "fused_moe" / "fused_moe.py"
    out = tmp_path / "kernels.json"
    subprocess.run([sys.executable, "-m", "benchmarks.gpu_kernels", "--smoke", "--out", str(out), "--vllm-moe",
                    str(fused_moe)], check=True, capture_output=True, timeout=300, cwd=REPO,
                   env={**os.environ, "TRITON_INTERPRET": "1"})
    data = json.loads(out.read_text())
    assert {"device", "memory", "dense", "experts", "vllm_moe", "attention", "stacks"} <= set(data)
    moe = data["vllm_moe"]
    assert [r["tokens"] for r in moe] == [5, 40] and moe[0]["max_error"] < 1e-2
    assert [s["name"] for s in data["stacks"]] == ["tiny", "tiny-moe"]
    rows = [r for s in data["stacks"] for r in s["decode"] + s["prefill"]]
    assert rows and all(r["eager_s"] > 0 for r in rows)


@pytest.mark.parametrize(("recording", "gpu", "bandwidth"), [("h100-kernels.json", "NVIDIA H100 80GB HBM3", "3,350"),
                                                             ("h200-kernels.json", "NVIDIA H200", "4,800")])
def test_every_recorded_timing_has_the_engines_figure_beside_it(capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch, recording: str,
                                                                gpu: str, bandwidth: str) -> None:
    path = engine_vs_gpu.MEASURED.parent / recording
    data = json.loads(path.read_text())
    assert data["device"]["gpu"] == gpu
    monkeypatch.setattr(sys, "argv", ["engine_vs_gpu", str(path)])
    assert engine_vs_gpu.main() == 0
    printed = capsys.readouterr().out
    steps = [r for s in data["stacks"] for r in s["decode"] + s["prefill"] if "error" not in r]
    priced = [line for line in printed.splitlines() if (": decode " in line or ": prefill " in line)
              and "out of memory" not in line]
    assert len(priced) == len(steps)
    assert all(float(line.split()[-1]) > 0 for line in priced)
    assert f"of the {bandwidth} GB/s datasheet" in printed


def test_a_file_that_is_not_a_recording_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty.json").write_text("{}")
    (tmp_path / "text.json").write_text("not json")
    for path in (tmp_path / "missing.json", tmp_path / "empty.json", tmp_path / "text.json"):
        monkeypatch.setattr(sys, "argv", ["engine_vs_gpu", str(path)])
        assert engine_vs_gpu.main() == 2
        err = capsys.readouterr().err
        assert err.startswith("cannot read the timings: ") and "Traceback" not in err and err.count("\n") == 1
    bad = subprocess.run([sys.executable, "-m", "benchmarks.gpu_kernels", "--smoke", "--out", str(tmp_path / "o"),
                          "--vllm-moe", str(REPO / "README.md")], check=False, capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert bad.returncode == 2 and "--vllm-moe" in bad.stderr and "Traceback" not in bad.stderr
