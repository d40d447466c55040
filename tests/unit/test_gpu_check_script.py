"""The image build's GPU stack check (roles/vllm/files/kiln-gpu-check.py), run here on a CPU build of torch: every
step it can reach fails with the reason the build would show. `nvidia-smi` is a stand-in script answering as the
real one does for `--query-gpu=driver_version --format=csv,noheader`: no GPU driver can exist here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.conftest import REPO, load_script

SCRIPT = REPO / "roles" / "vllm" / "files" / "kiln-gpu-check.py"


def load() -> ModuleType:
    return load_script("kiln_gpu_check", SCRIPT)


def run(tmp_path: Path, driver: str | None) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if driver:
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\nprintf '{driver}\\n'\n")
        smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run([sys.executable, str(SCRIPT), "--cuda", "13.0", "--minimum-driver", "580.65.06"],
                          capture_output=True, text=True, timeout=120, check=False, env=env)


def test_without_a_driver_the_build_fails_with_the_reason(tmp_path: Path) -> None:
    result = run(tmp_path, None)
    assert result.returncode == 1
    assert "ok   no NVSwitch: no fabric manager needed" in result.stdout
    assert "FAIL nvidia-smi is not installed: the NVIDIA driver is missing" in result.stderr


def test_an_old_driver_fails_the_build(tmp_path: Path) -> None:
    result = run(tmp_path, "570.133.20")
    assert result.returncode == 1
    assert "FAIL driver 570.133.20 is older than 580.65.06, which torch's CUDA needs" in result.stderr


def test_a_torch_without_cuda_fails_with_torchs_own_words(tmp_path: Path) -> None:
    result = run(tmp_path, "580.173.02")
    assert result.returncode == 1
    assert "ok   driver 580.173.02 >= 580.65.06" in result.stdout
    assert "FAIL torch.cuda.is_available() is False: Torch not compiled with CUDA enabled" in result.stderr


def test_nvswitches_are_counted_from_sysfs(tmp_path: Path) -> None:
    check = load()
    for name, vendor, cls in [("a", "0x10de", "0x068000"), ("b", "0x10de", "0x068000"), ("c", "0x10de", "0x030200")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "vendor").write_text(vendor)
        (tmp_path / name / "class").write_text(cls)
    assert check.nvswitches(tmp_path) == 2
    assert check.version_key("580.65.06") > check.version_key("580.9.99")
