"""The GPU stack's pins (agent/kiln/data/gpu_stack.yaml): they agree, the roles take them, and a disagreement is
named. PyPI's real metadata is followed in tests/integration/test_gpu_stack_pins.py."""

from __future__ import annotations

import yaml
from tests.conftest import REPO

from kiln.doctor.stack import GpuStack, at_least, cuda_of_torch, pin_problems, pinned_version, version_key
from kiln.wiring import Kiln

# Requires-Dist lines as the wheels' METADATA spells them (torch 2.13.0 and 2.7.0 Linux wheels, vllm 0.32.0).
TORCH_2_13 = [
    "filelock", "typing-extensions>=4.10.0",
    'cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3; '
    'platform_system == "Linux"',
    'nvidia-nccl-cu13==2.29.7; platform_system == "Linux"',
    'triton==3.7.1; platform_system == "Linux" and python_version < "3.15"',
    'opt-einsum>=3.3; extra == "opt-einsum"',
]
TORCH_2_7 = [
    'nvidia-cuda-runtime-cu12==12.6.77; platform_system == "Linux" and platform_machine == "x86_64"',
    'nvidia-nccl-cu12==2.26.2; platform_system == "Linux" and platform_machine == "x86_64"',
]
VLLM_0_32 = ["torch==2.13.0", "torchaudio==2.11.0", "flashinfer-python==0.7.0.post1",
             'zentorch==2.13.0.1; extra == "zen"']


def defaults(role: str) -> dict[str, object]:
    data = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text())
    assert isinstance(data, dict)
    return data


def test_versions_compare_as_numbers() -> None:
    assert version_key("580.65.06") == (580, 65, 6)
    assert at_least("580.126.16", "580.82.07") and not at_least("575.57.08", "580.65.06")


def test_the_cuda_of_a_torch_wheel_comes_from_its_pinned_runtime() -> None:
    assert cuda_of_torch(TORCH_2_13) == "13.0"
    assert cuda_of_torch(TORCH_2_7) == "12.6"
    assert cuda_of_torch(["filelock", "sympy>=1.13.3"]) is None  # a CPU build pins no CUDA
    assert pinned_version(VLLM_0_32, "torch") == "2.13.0"
    assert pinned_version(VLLM_0_32, "zentorch") is None  # only with the "zen" extra


def test_the_shipped_stack_agrees_with_itself(kiln: Kiln) -> None:
    assert pin_problems(kiln.stack, vllm_requires=VLLM_0_32, torch_requires=TORCH_2_13) == []
    assert kiln.stack.required_driver() == "580.82.07"  # B300 needs more than CUDA 13.0's 580.65.06


def test_the_old_pins_are_refused(kiln: Kiln) -> None:
    problems = pin_problems(kiln.stack, vllm_requires=VLLM_0_32, torch_requires=TORCH_2_13,
                            driver_branch="570", driver_version="", cuda_toolkit="12.8")
    assert any("driver branch 570 cannot run the pinned stack: CUDA 13.0" in p for p in problems), problems
    assert any("12.8 is another major release" in p for p in problems), problems


def test_a_vllm_upgrade_that_moves_torch_is_named(kiln: Kiln) -> None:
    problems = pin_problems(kiln.stack, vllm_requires=["torch==2.14.0", "flashinfer-python==0.7.0.post1"],
                            torch_requires=TORCH_2_13)
    assert problems == ["vLLM 0.32.0 pins torch==2.14.0, but gpu_stack.yaml says 2.13.0/2.13.0"]


def test_a_vllm_upgrade_that_moves_flashinfer_is_named(kiln: Kiln) -> None:
    """The role checks the kernels against the pinned FlashInfer: a vLLM pinning another one must move the pin."""
    problems = pin_problems(kiln.stack, vllm_requires=["torch==2.13.0", "flashinfer-python==0.7.2.post1"])
    assert problems == ["vLLM 0.32.0 pins flashinfer-python==0.7.2.post1, but gpu_stack.yaml says 0.7.0.post1"]


def test_a_cuda_without_a_recorded_minimum_is_named(kiln: Kiln) -> None:
    newer = ['cuda-toolkit[cudart]==13.2.0; platform_system == "Linux"']
    problems = pin_problems(kiln.stack, torch_requires=newer)
    assert any("built for CUDA 13.2" in p for p in problems)
    assert any("no minimum driver is recorded for CUDA 13.2" in p for p in problems)


def test_the_roles_defaults_equal_the_stack_file(kiln: Kiln) -> None:
    stack: GpuStack = kiln.stack
    driver, cuda, vllm = defaults("nvidia_driver"), defaults("cuda"), defaults("vllm")
    assert (driver["nvidia_driver_branch"], driver["nvidia_driver_version"]) == (stack.driver.branch,
                                                                                  stack.driver.version)
    assert driver["nvidia_driver_minimum_versions"] == {a.gpus: a.driver
                                                         for a in stack.architecture_minimum_driver.values()}
    assert cuda["cuda_version"] == stack.cuda_toolkit
    assert vllm["vllm_version"] == stack.vllm.version
    assert vllm["vllm_torch_cuda"] == stack.torch.cuda
    assert (vllm["vllm_flashinfer_version"], vllm["vllm_flashinfer_kernels"]) == (stack.flashinfer.version,
                                                                                  stack.flashinfer.kernels)
    assert vllm["vllm_cuda_minimum_driver"] == stack.minimum_driver(stack.torch.cuda)
    assert pin_problems(stack, driver_branch=str(driver["nvidia_driver_branch"]),
                        driver_version=str(driver["nvidia_driver_version"]),
                        cuda_toolkit=str(cuda["cuda_version"])) == []


def test_the_playbook_hands_the_roles_the_stack_file() -> None:
    play = yaml.safe_load((REPO / "image" / "playbook.yml").read_text())[0]
    include = play["pre_tasks"][0]["ansible.builtin.include_vars"]
    assert include["file"].endswith("/agent/kiln/data/gpu_stack.yaml") and include["name"] == "kiln_gpu_stack"
    wired = {r["role"]: r.get("vars", {}) for r in play["roles"]}
    for role, names in {"nvidia_driver": ["nvidia_driver_branch", "nvidia_driver_version",
                                          "nvidia_driver_minimum_versions"],
                        "cuda": ["cuda_version"],
                        "vllm": ["vllm_version", "vllm_torch_cuda", "vllm_cuda_minimum_driver", "vllm_image_driver",
                                 "vllm_flashinfer_version", "vllm_flashinfer_kernels"]
                        }.items():
        for name in names:
            assert "kiln_gpu_stack." in wired[role][name], f"{role}: {name} is not taken from gpu_stack.yaml"


def test_the_fabric_manager_is_installed_at_the_drivers_version() -> None:
    tasks = (REPO / "roles" / "nvidia_driver" / "tasks" / "install.yml").read_text()
    assert "nvidia_driver_fabricmanager_packages if _nvidia_driver_fabricmanager_enabled" in tasks
    assert "_nvidia_driver_version_suffix" in tasks  # one suffix, =VERSION-*, for driver and fabric manager alike
    assert "Check the fabric manager is at exactly the driver's version" in tasks
