"""kiln's systemd units and a plan's drop-ins pass the real `systemd-analyze verify`, and stay hardened."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kiln.choice.schema import Choice
from kiln.planner.search import make_plan
from kiln.render.systemd import TARGET, VLLM_TEMPLATE, dropin_path, instance_dropin, instance_unit_name, unit_files
from kiln.render.vllm import RenderedInstance, Runtime, render_instances
from kiln.setup.types import Plan
from kiln.wiring import Kiln

KILN_BIN = "/opt/kiln/venv/bin/kiln"
SERVICES = ("kiln-agent.service", VLLM_TEMPLATE, "kiln-router.service", "kiln-router@.service", "kiln-proxy.service")
HOST_UNITS = Path("/usr/lib/systemd/system")
# cloud-init's own target (upstream systemd/cloud-init.target); enabled by its generator. Its ordering
# after multi-user.target is what made kiln.target need DefaultDependencies=no.
CLOUD_INIT_TARGET = "[Unit]\nDescription=Cloud-init target\nAfter=multi-user.target\n"


Unit = dict[tuple[str, str], list[str]]


def parse(text: str) -> Unit:
    """A unit file as {(section, key): values}; keys like DeviceAllow= repeat."""
    unit: Unit = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, value = line.split("=", 1)
        unit.setdefault((section, key), []).append(value)
    return unit


def values(unit: Unit, section: str, key: str) -> list[str]:
    return unit.get((section, key), [])


def plan_dropins(kiln: Kiln) -> tuple[list[RenderedInstance], dict[str, str]]:
    p = make_plan(kiln.machine("h100x8"), kiln.catalog().get("llama-3.1-8b-instruct"), Choice(), kiln.constants)
    assert isinstance(p, Plan)
    rendered = render_instances(p, Runtime())
    # The cache on a scratch disk, as the agent writes it, so systemd-analyze reads ReadWritePaths= too.
    return rendered, {dropin_path(r.name): instance_dropin(r, profile=p.profile, writable=("/mnt/scratch/kiln",))
                      for r in rendered}


def test_unit_files_are_shipped() -> None:
    units = unit_files()
    assert set(units) == {TARGET, *SERVICES}
    for name, text in units.items():
        assert text.startswith(f"# {name}: "), f"{name} lacks its header comment"
    target = parse(units[TARGET])
    assert values(target, "Install", "WantedBy") == ["multi-user.target"]
    assert values(target, "Unit", "DefaultDependencies") == ["no"]


def test_every_service_is_hardened_and_started_through_kiln() -> None:
    units = unit_files()
    for name in SERVICES:
        unit = parse(units[name])
        where = name
        assert values(unit, "Service", "NoNewPrivileges") == ["yes"], where
        assert values(unit, "Service", "PrivateTmp") == ["yes"], where
        assert values(unit, "Service", "ProtectSystem") in (["full"], ["strict"]), where
        assert values(unit, "Unit", "PartOf") == [TARGET], where
        # One owner of restarts: kiln's supervisor restarts what it starts (with its backoff, its routing and
        # /status); systemd restarts only the agent itself.
        assert values(unit, "Service", "Restart") == (["on-failure"] if name == "kiln-agent.service" else ["no"]), where
        (exec_start,) = values(unit, "Service", "ExecStart")
        assert exec_start.startswith(f"{KILN_BIN} agent "), where
        if name == "kiln-agent.service":
            assert exec_start == f"{KILN_BIN} agent run"
            assert values(unit, "Service", "ExecReload") == ["/bin/kill -s HUP $MAINPID"]  # `kiln reload`
            assert values(unit, "Service", "Type") == ["notify"]
            assert values(unit, "Service", "NotifyAccess") == ["main"]
            assert not values(unit, "Service", "User")  # root: it drives systemctl
            continue
        assert exec_start.startswith(f"{KILN_BIN} agent exec "), where
        if name == "kiln-proxy.service":  # a root master that may do nothing but bind, drop to www-data and chown
            assert not values(unit, "Service", "User"), where
            assert values(unit, "Service", "CapabilityBoundingSet") == [
                "CAP_NET_BIND_SERVICE CAP_SETUID CAP_SETGID CAP_CHOWN"], where
        else:
            assert values(unit, "Service", "User") == ["kiln"], where
        assert values(unit, "Service", "ProtectSystem") == ["strict"], where
        assert values(unit, "Service", "DevicePolicy") == ["closed"], where
        for key in ("ProtectHome", "ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups",
                    "RestrictSUIDSGID", "LockPersonality"):
            assert values(unit, "Service", key) == ["yes"], f"{where}: {key}"
    vllm = parse(units[VLLM_TEMPLATE])
    assert values(vllm, "Service", "ExecStart") == [f"{KILN_BIN} agent exec %i"]
    assert values(vllm, "Service", "LimitMEMLOCK") == ["infinity"]
    assert values(vllm, "Service", "KillMode") == ["mixed"]
    # Their own folders in the agent's state folder, never the state folder itself (the agent's key and runtime).
    writable = values(vllm, "Service", "ReadWritePaths")[0].split()
    assert writable == ["-/var/lib/kiln/home", "-/var/lib/kiln/huggingface", "-/var/lib/kiln/compile",
                        "-/var/lib/kiln/models"]
    assert values(vllm, "Service", "Environment") == ["HOME=/var/lib/kiln/home"]
    # What holds the owner's keys and tokens is out of the model server's reach, and so is the metadata service.
    hidden = values(vllm, "Service", "InaccessiblePaths")[0].split()
    for secret in ("/etc/kiln", "/var/lib/cloud", "/var/lib/kiln/keys.json", "/var/lib/kiln/tls"):
        assert f"-{secret}" in hidden, secret
    assert values(vllm, "Service", "IPAddressDeny") == ["169.254.169.254/32"]
    assert values(parse(units["kiln-proxy.service"]), "Service", "ReadWritePaths") == ["/var/lib/kiln/proxy/tmp"]
    for name in ("kiln-router.service", "kiln-proxy.service"):
        assert values(parse(units[name]), "Service", "PrivateDevices") == ["yes"], name


def test_nvidia_devices_only_in_the_instance_units(kiln: Kiln) -> None:
    units = unit_files()
    _, dropins = plan_dropins(kiln)
    for name, text in {**units, **dropins}.items():
        allowed = values(parse(text), "Service", "DeviceAllow")
        if name == VLLM_TEMPLATE or name.startswith("kiln-vllm@"):
            assert allowed and all("nvidia" in a for a in allowed), name
        else:
            assert not allowed, name
    template = values(parse(units[VLLM_TEMPLATE]), "Service", "DeviceAllow")
    # Control devices only: a GPU's own /dev/nvidiaN comes from its instance's drop-in.
    assert not any(a.split()[0].removeprefix("/dev/nvidia").isdigit() for a in template)
    assert {"/dev/nvidiactl rw", "/dev/nvidia-uvm rw", "/dev/nvidia-uvm-tools rw"} <= set(template)


def _stage_root(root: Path, units: dict[str, str], dropins: dict[str, str]) -> None:
    """A file-system root like the image's: systemd's own units, kiln's units and drop-ins, the programs."""
    unit_dir = root / "etc/systemd/system"
    unit_dir.mkdir(parents=True)
    shutil.copytree(HOST_UNITS, root / HOST_UNITS.relative_to("/"), symlinks=True)
    (root / HOST_UNITS.relative_to("/") / "cloud-init.target").write_text(CLOUD_INIT_TARGET)
    for name, text in {**units, **dropins}.items():
        (unit_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (unit_dir / name).write_text(text)
    # Enabled as the image enables them.
    wants = unit_dir / "multi-user.target.wants"
    wants.mkdir()
    (wants / TARGET).symlink_to(f"/etc/systemd/system/{TARGET}")
    (wants / "cloud-init.target").symlink_to(f"/{HOST_UNITS.relative_to('/')}/cloud-init.target")
    # verify checks that every Exec*= program exists under --root. kiln is a stub (the image's venv
    # is not on this machine); the others (/bin/kill) are this Debian machine's own.
    for text in units.values():
        for line in text.splitlines():
            if line.startswith("Exec") and "=" in line:
                program = line.split("=", 1)[1].lstrip("-@:+!").split()[0]
                target = root / program.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                if program == KILN_BIN:
                    target.write_text("#!/bin/sh\nexit 0\n")
                    target.chmod(0o755)
                else:
                    assert Path(program).is_file(), f"{program} is not on this machine"
                    shutil.copy2(program, target)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not on PATH")
def test_systemd_analyze_verify(kiln: Kiln, tmp_path: Path) -> None:
    rendered, dropins = plan_dropins(kiln)
    assert len(rendered) == 8
    root = tmp_path / "root"
    _stage_root(root, unit_files(), dropins)
    names = [TARGET, "kiln-agent.service", "kiln-router.service", "kiln-proxy.service", "multi-user.target",
             *(instance_unit_name(r.name) for r in rendered)]
    result = subprocess.run(["systemd-analyze", "verify", f"--root={root}", *names],
                            capture_output=True, text=True, check=False, timeout=120, cwd=tmp_path)
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 0, output
    # verify exits 0 on warnings (unknown keys, ordering cycles): none may concern kiln.
    assert not [line for line in output.splitlines() if "kiln" in line], output


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not on PATH")
def test_systemd_analyze_verify_reads_the_dropins(kiln: Kiln, tmp_path: Path) -> None:
    """The check above would pass vacuously if verify never read the drop-ins: a bad key must show."""
    rendered, dropins = plan_dropins(kiln)
    first = dropin_path(rendered[0].name)
    dropins[first] += "NoSuchKey=1\n"
    root = tmp_path / "root"
    _stage_root(root, unit_files(), dropins)
    result = subprocess.run(["systemd-analyze", "verify", f"--root={root}", instance_unit_name(rendered[0].name)],
                            capture_output=True, text=True, check=False, timeout=120, cwd=tmp_path)
    assert "NoSuchKey" in result.stdout + result.stderr
