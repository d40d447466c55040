"""`kiln doctor` reads a failed start's log and names the setting to lower for where it ran out of GPU memory."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.conftest import DATA

from kiln.cli.main import main
from kiln.doctor.report import FAIL, PASS, SKIP
from kiln.doctor.startup_oom import check_start_oom

CAPTURE = [line for line in (DATA / "doctor" / "oom-capture.log").read_text().splitlines()
           if not line.startswith("#")]
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB."


def test_an_oom_during_capture_names_the_capture_size_first() -> None:
    check = check_start_oom(CAPTURE)
    assert check.status == FAIL and "capturing CUDA graphs" in check.detail
    assert check.fix.startswith("lower --max-cudagraph-capture-size (now 512)")
    assert "gpu_memory_utilization (now 0.98)" in check.fix and "max_num_seqs (now 256)" in check.fix


@pytest.mark.parametrize(("lines", "words"), [
    (["INFO [gpu_model_runner.py:4820] Model loading took 14.99 GiB memory and 9.8 seconds", OOM],
     "lower max_num_batched_tokens"),
    (["INFO [gpu_model_runner.py:4735] Starting to load model x...",
      "Loading safetensors checkpoint shards:  25% Completed | 1/4", OOM], "larger tensor_parallel_size"),
    (["INFO [core.py:133] Initializing a V1 LLM engine", OOM], "stop the other process"),
])
def test_each_stage_names_its_own_setting(lines: list[str], words: str) -> None:
    check = check_start_oom(lines)
    assert check.status == FAIL and words in check.fix, check


def test_a_clean_or_missing_log_is_no_failure() -> None:
    assert check_start_oom([line for line in CAPTURE if "OutOfMemory" not in line]).status == PASS
    assert check_start_oom([]).status == SKIP


def test_kiln_doctor_reads_the_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "--machine", "h100x1", "--startup-log", str(DATA / "doctor" / "oom-capture.log"),
                 "--state-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 2 and "start memory" in out and "fix: lower --max-cudagraph-capture-size (now 512)" in out
