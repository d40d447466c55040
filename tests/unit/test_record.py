"""`kiln detect --record`: a machine's answers written as a machine file replay exactly as they were given."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tests.conftest import DATA

from kiln.errors import ConfigError
from kiln.hardware.disks import mount_of
from kiln.hardware.model import Machine
from kiln.hardware.system import RecordedSystem
from kiln.wiring import Kiln

KILN = str(Path(sys.executable).parent / "kiln")
RECORDED = ["h100x1", "h100x8", "b300x8", "l40s", "cpu-only", "mi300x8",
            str(DATA / "doctor" / "h100x8-no-fabric-manager.yaml"), str(DATA / "doctor" / "h100x1-ecc-pending.yaml")]


def comparable(m: Machine) -> Machine:
    return dataclasses.replace(m, name="", source="", description="", droplet_size=None)


@pytest.mark.parametrize("spec", RECORDED)
def test_a_recording_replays_the_same_machine_and_verdicts(kiln: Kiln, tmp_path: Path, spec: str) -> None:
    path = tmp_path / "recorded.yaml"
    path.write_text(yaml.safe_dump(kiln.record(spec, "recorded", "a test"), sort_keys=False))
    assert comparable(kiln.machine(str(path))) == comparable(kiln.machine(spec))
    cache = Path("/var/lib/kiln/huggingface")
    assert kiln.doctor(str(path), cache)[1].checks == kiln.doctor(spec, cache)[1].checks


def test_an_unsupported_query_is_kept_as_nvmls_error(kiln: Kiln) -> None:
    data = kiln.record("h100x1", "h", "")
    device = data["nvml"]["devices"][0]
    assert device["nvmlDeviceGetMinorNumber"] == "NVML_ERROR_NOT_SUPPORTED"
    assert device["nvmlDeviceGetRemappedRows"] == [0, 0, 0, 0]


def test_a_hand_written_machine_file_has_nothing_to_record(kiln: Kiln, tmp_path: Path) -> None:
    path = tmp_path / "box.yaml"
    path.write_text("gpus:\n  - {name: NVIDIA H100 80GB HBM3, memory_mib: 81559, compute_capability: '9.0'}\n")
    with pytest.raises(ConfigError, match="holds no NVML answers"):
        kiln.record(str(path), "box", "")


def test_this_machine_records_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "me.yaml"
    done = subprocess.run([KILN, "detect", "--record", str(path)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "recorded 0 GPU(s)" in done.stdout and path.read_text().startswith("# recorded by `kiln detect --record`")
    back = subprocess.run([KILN, "detect", "--machine", str(path), "--json"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert back.returncode == 0, back.stderr
    assert '"gpus": []' in back.stdout
    # The mounted filesystems too, for the cache disk: here the root on its block device.
    recorded = yaml.safe_load(path.read_text())
    mounts = RecordedSystem(recorded).mounts()
    root = mount_of("/", mounts)
    assert root is not None and root.device.startswith("/dev/") and root.free_bytes > 0
