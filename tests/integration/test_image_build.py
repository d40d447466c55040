"""`kiln image build` for real: the local Debian 12 image from mmdebstrap and the roles over a chroot,
then `kiln image smoke` boots it under QEMU (TCG) with NoCloud user-data and checks what it did.

The build takes several minutes and the boot a few more; both print their progress and figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

KILN = str(Path(sys.executable).parent / "kiln")
BUILD_TIMEOUT_S = 2400
SMOKE_TIMEOUT_S = 1200


def report(capsys: pytest.CaptureFixture[str], text: str) -> None:
    with capsys.disabled():
        print(f"\n{text}")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if os.geteuid() != 0:
        pytest.fail("the local image build needs root (mmdebstrap, mounts, a loop device)")
    out = tmp_path_factory.mktemp("image")
    proc = subprocess.run([KILN, "image", "build", "--out", str(out), "--json", "-e", 'kiln_models=["tiny-cpu"]'],
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    assert proc.returncode == 0, f"build failed:\n{proc.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(proc.stdout)
    result["progress"] = proc.stderr
    return result


def test_the_local_build_makes_a_bootable_qcow2(built: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    image = Path(built["image"])
    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(image)], capture_output=True,
                                     text=True, check=True).stdout)
    assert info["format"] == "qcow2" and info["virtual-size"] == 16 * 2**30
    assert built["size_bytes"] == image.stat().st_size
    steps = [line for line in built["progress"].splitlines() if line.startswith("[")]
    assert [s.split("]")[0] + "]" for s in steps] == [f"[{i}/6]" for i in range(1, 7)]
    assert "TASK [image_cleanup : Run the image check]" in built["progress"]
    assert "TASK [kiln_agent : Bake the models into the image]" in built["progress"]
    # DigitalOcean's own Marketplace check ran in the image and found nothing failing.
    log = Path(built["log"]).read_text(errors="replace")
    assert "TASK [image_cleanup : Marketplace check | Run it]" in log
    assert "User root has no password set." in log and "0 Tests FAILED" in log
    assert not list(image.parent.glob(".work-*")), "the build's work folder is left behind"
    mounts = Path("/proc/self/mounts").read_text()
    assert str(image.parent) not in mounts
    report(capsys, f"  measured: local build {built['seconds'] / 60:.1f} min, image {built['size_bytes'] / 2**20:,.0f} "
                   f"MiB on disk ({built['virtual_size_bytes'] / 2**30:.0f} GiB virtual)")


def test_the_image_boots_reads_user_data_and_serves_the_documented_ports(
        built: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = {p.pid for p in psutil.process_iter() if p.name().startswith("qemu-system")}
    proc = subprocess.run([KILN, "image", "smoke", built["image"], "--json", "--keep", str(tmp_path), "--expect-baked"],
                          capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S, check=False)
    assert proc.stdout, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    failed = [c for c in result["checks"] if not c["ok"]]
    console = (tmp_path / "console.log").read_text(errors="replace")[-3000:] if failed else ""
    assert not failed and proc.returncode == 0, f"{failed}\n{proc.stderr[-3000:]}\n{console}"
    assert result["plan"]["profile"] == "tiny-cpu"
    lines = "\n".join(f"  PASS {c['name']}: {c['detail']}" for c in result["checks"])
    report(capsys, f"{lines}\n  measured: {result['timings_s']}\n  start-up: {json.dumps(result['startup'])}")
    after = {p.pid for p in psutil.process_iter() if p.name().startswith("qemu-system")}
    assert after <= before, "a QEMU process outlived the smoke test"
    assert "Cloud-init" in (tmp_path / "console.log").read_text(errors="replace")


def test_an_interrupted_build_unmounts_and_cleans_up(tmp_path: Path) -> None:
    """SIGTERM while the roles run in the chroot (its /proc, /dev and bind mounts are up): the build stops the
    play, unmounts everything and removes its work folder, so nothing of the host is left mounted or deleted."""
    if os.geteuid() != 0:
        pytest.fail("the local image build needs root (mmdebstrap, mounts, a loop device)")
    proc = subprocess.Popen([KILN, "image", "build", "--out", str(tmp_path)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "TASK [base : Write kiln sysctl settings]" in line:
            break
    assert str(tmp_path) in Path("/proc/self/mounts").read_text(), "".join(seen[-20:])
    proc.terminate()
    rest = proc.stderr.read()
    assert proc.wait(timeout=180) == 130, rest
    assert "kiln: interrupted" in rest and "build failed; log:" in rest
    assert str(tmp_path) not in Path("/proc/self/mounts").read_text()
    assert not list(tmp_path.glob(".work-*"))
    assert Path("/dev/null").exists() and Path("/proc/self").exists()
