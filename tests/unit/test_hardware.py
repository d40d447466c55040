"""Detection through the one NVML adapter, on recorded machines and on this one."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln import datafiles
from kiln.errors import ConfigError, NotFoundError
from kiln.hardware.detect import detect_recorded
from kiln.hardware.fixtures import fixture_names, load_fixture, load_recording
from kiln.hardware.live import detect_live
from kiln.hardware.model import Architecture
from kiln.hardware.nvml import cpus_from_mask, cuda_version_text
from kiln.hardware.specs import hbm_bandwidth_gb_s
from kiln.wiring import Kiln

RECORDED = Path(__file__).resolve().parents[1] / "data" / "recorded"
DROPLET_FIXTURES = ["h100x1", "h100x8", "h200x1", "h200x8", "l40s", "rtx4000ada", "rtx6000ada", "b300x8"]


def test_every_digitalocean_size_has_a_fixture() -> None:
    assert {*DROPLET_FIXTURES, "mi300x1", "mi300x8", "cpu-only"} <= set(fixture_names())


@pytest.mark.parametrize("name", DROPLET_FIXTURES)
def test_nvidia_fixtures_detect_as_known_supported_gpus(kiln: Kiln, name: str) -> None:
    machine = kiln.machine(name)
    droplets = datafiles.read_yaml("droplets.yaml")["sizes"]
    size = droplets[machine.droplet_size]
    assert machine.gpu_count == size["gpu_count"]
    assert machine.host.cpu_count == size["vcpus"]
    for gpu in machine.gpus:
        assert gpu.spec.class_name == size["gpu"], gpu.name
        assert gpu.spec.supported
        assert gpu.spec.memory_bandwidth_gb_s > 0
    assert machine.accelerator_problem() is None
    assert machine.driver_version and machine.cuda_driver_version


def test_hgx_h100x8_topology(kiln: Kiln) -> None:
    m = kiln.machine("h100x8")
    assert all(m.linked(i, j) for i in range(8) for j in range(8))
    assert all(g.architecture is Architecture.HOPPER and g.nvlink_links == 18 for g in m.gpus)
    assert all(g.mig_enabled is False for g in m.gpus)
    assert len({g.uuid for g in m.gpus}) == 8


def test_pcie_gpus_have_no_nvlink_and_no_mig(kiln: Kiln) -> None:
    m = kiln.machine("l40s")
    assert m.gpus[0].architecture is Architecture.ADA
    assert m.gpus[0].nvlink_links == 0 and m.gpus[0].mig_enabled is None


def test_blackwell_b300(kiln: Kiln) -> None:
    m = kiln.machine("b300x8")
    assert m.gpu_count == 8 and m.gpus[0].architecture is Architecture.BLACKWELL
    assert m.gpus[0].compute_capability[0] == 10


@pytest.mark.parametrize("name", ["mi300x1", "mi300x8"])
def test_amd_is_reported_not_supported_yet(kiln: Kiln, name: str) -> None:
    m = kiln.machine(name)
    assert not m.gpus
    problem = m.accelerator_problem()
    assert problem and "not supported yet" in problem and "NVIDIA" in problem


def test_cpu_only_is_no_accelerator(kiln: Kiln) -> None:
    m = kiln.machine("cpu-only")
    assert not m.gpus and "no accelerator" in (m.accelerator_problem() or "")


def test_this_machine_detects_without_crashing() -> None:
    m = detect_live()
    assert m.host.cpu_count >= 1 and m.host.memory_bytes > 0
    if not m.gpus:
        assert "no accelerator" in (m.accelerator_problem() or "") or m.unsupported_accelerators


def test_unknown_gpu_bandwidth_is_derived_from_nvml_clocks(kiln: Kiln) -> None:
    data = load_fixture("h100x1")
    device = dict(data["nvml"]["devices"][0])
    device.update(nvmlDeviceGetName="NVIDIA H100 Future Edition", nvmlDeviceGetMemoryBusWidth=5120,
                  nvmlDeviceGetMaxClockInfo_MEM=2619)
    data["nvml"] = {**data["nvml"], "devices": [device]}
    gpu = detect_recorded(data, kiln.gpus).gpus[0]
    assert gpu.spec.class_name == "unknown" and gpu.architecture is Architecture.HOPPER
    assert gpu.spec.memory_bandwidth_gb_s == pytest.approx(3352, rel=0.01)


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_a_recorded_gpu_reads_back_as_kilns_class(kiln: Kiln, gpu: str) -> None:
    """NVML's answers on a real H100 and H200 (one-GPU virtual machines, recorded by kiln.hardware.record) detect
    as the catalog's class, and their bus width and memory clock give the datasheet's bandwidth."""
    machine = kiln.machine(str(RECORDED / f"{gpu}-lent.yaml"))
    found = machine.gpus[0]
    assert machine.gpu_count == 1 and found.spec.class_name == gpu and found.architecture is Architecture.HOPPER
    assert found.numa_node is None  # the VM answered NVML_ERROR_NOT_SUPPORTED
    assert machine.accelerator_problem() is None and machine.cuda_driver_version
    device = load_recording(RECORDED / f"{gpu}-lent.yaml")["nvml"]["devices"][0]
    derived = hbm_bandwidth_gb_s(device["nvmlDeviceGetMemoryBusWidth"], device["nvmlDeviceGetMaxClockInfo_MEM"])
    assert derived == pytest.approx(found.spec.memory_bandwidth_gb_s, rel=0.01)


@pytest.mark.parametrize("name", ["h100x1", "h100x8", "h200x1", "h200x8"])
def test_the_written_fixtures_answer_as_the_recorded_gpu(name: str) -> None:
    """The GPU's own answers in the hand-written fixtures are the ones a real GPU of the class gave."""
    recorded = load_recording(RECORDED / f"{name[:4]}-lent.yaml")["nvml"]["devices"][0]
    for device in load_fixture(name)["nvml"]["devices"]:
        for key in ("nvmlDeviceGetName", "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetMemoryBusWidth",
                    "nvmlDeviceGetMaxClockInfo_MEM"):
            assert device[key] == recorded[key], key
        assert device["nvmlDeviceGetMemoryInfo"]["total"] == recorded["nvmlDeviceGetMemoryInfo"]["total"]
        assert device["nvmlDeviceGetPciInfo"]["pciDeviceId"] == recorded["nvmlDeviceGetPciInfo"]["pciDeviceId"]


def test_nvml_error_codes_are_answers_not_crashes(kiln: Kiln) -> None:
    data = load_fixture("h100x1")
    device = dict(data["nvml"]["devices"][0])
    device["nvmlDeviceGetNumaNodeId"] = "NVML_ERROR_NOT_SUPPORTED"
    device["nvmlDeviceGetMigMode"] = "NVML_ERROR_NOT_SUPPORTED"
    data["nvml"] = {**data["nvml"], "devices": [device]}
    gpu = detect_recorded(data, kiln.gpus).gpus[0]
    assert gpu.numa_node is None and gpu.mig_enabled is None


def test_helpers() -> None:
    assert cpus_from_mask([0b1011, 1]) == (0, 1, 3, 64)
    assert cuda_version_text(12090) == "12.9"
    assert hbm_bandwidth_gb_s(None, 1000) is None


def test_machine_file_from_the_issue(kiln: Kiln, tmp_path: Path) -> None:
    f = tmp_path / "a100x4.yaml"
    f.write_text('gpus:\n  - {name: "NVIDIA A100-SXM4-80GB", memory_mib: 81920, compute_capability: "8.0", count: 4}\n'
                 "nvlink: true\nmemory_bandwidth_gb_s: 2039\n")
    m = kiln.machine(str(f))
    assert m.gpu_count == 4 and m.gpus[0].architecture is Architecture.AMPERE
    assert m.gpus[0].spec.memory_bandwidth_gb_s == 2039 and m.linked(0, 3)


def test_machine_file_unknown_gpu_needs_bandwidth(kiln: Kiln, tmp_path: Path) -> None:
    f = tmp_path / "odd.json"
    f.write_text('{"gpus": [{"name": "Mystery GPU", "memory_mib": 1000, "compute_capability": "9.0"}]}')
    with pytest.raises(ConfigError) as err:
        kiln.machine(str(f))
    assert "memory_bandwidth_gb_s" in err.value.where and "datasheet" in err.value.fix


def test_machine_file_errors_name_the_key(kiln: Kiln, tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("gpus:\n  - {name: X, memory_mib: -5, compute_capability: nine}\nnvlnk: true\n")
    with pytest.raises(ConfigError) as err:
        kiln.machine(str(f))
    text = err.value.message()
    assert "gpus[0].memory_mib" in text and "gpus[0].compute_capability" in text and "nvlnk" in text


def test_unknown_fixture_lists_the_known_ones(kiln: Kiln) -> None:
    with pytest.raises(NotFoundError) as err:
        kiln.machine("h100x3")
    assert "h100x8" in err.value.fix
