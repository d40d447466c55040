"""The host beyond NVML, as `kiln doctor` and `kiln detect --record` read it: NVSwitches on the PCI bus, the NVIDIA
services, /dev/shm, the cache disk. One adapter for the live machine (sysfs, statvfs, `systemctl is-active`) and one
for a recorded fixture."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kiln.hardware.disks import Mount, parse_mountinfo
from kiln.hardware.host import pci_devices

NVIDIA_VENDOR = "0x10de"
BRIDGE_CLASS = "0x0680"  # NVSwitch
UNITS = ("nvidia-fabricmanager", "nvidia-persistenced")


@dataclass(frozen=True)
class SystemFacts:
    nvswitches: int = 0  # NVIDIA bridges (PCI class 0x0680) on the bus: an HGX board's NVSwitches
    units: dict[str, str | None] = field(default_factory=dict)  # systemd unit -> is-active answer; None: absent
    shm_bytes: int | None = None  # the size of /dev/shm; None: not mounted
    cache_dir: str = ""
    cache_free_bytes: int | None = None
    cached_bytes: int = 0  # what the cache already holds of the planned model
    described: bool = True  # False: a hand-written machine file, which says nothing of the host's services


class SystemProbe(Protocol):
    def facts(self, cache_dir: Path, model: str | None) -> SystemFacts: ...

    def mounts(self) -> list[Mount]: ...


def hub_cache(hf_home: Path) -> Path:
    """huggingface_hub's cache under HF_HOME."""
    return hf_home / "hub"


def repo_folder(cache: Path, repo: str) -> Path:
    """A model repository's folder in huggingface_hub's cache."""
    return cache / ("models--" + repo.replace("/", "--"))


def blob_bytes(folder: Path) -> int:
    """The bytes a repository's cache folder holds: its blobs, whole or still `.incomplete`. The snapshots only link
    to them, so they are not counted again."""
    total = 0
    for path in folder.glob("blobs/*"):
        try:
            total += path.stat().st_size
        except OSError:
            continue
    return total


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


class LiveSystem:
    def __init__(self, sysfs: Path = Path("/sys/bus/pci/devices"), shm: Path = Path("/dev/shm"),
                 mountinfo: Path = Path("/proc/self/mountinfo")) -> None:
        self._sysfs = sysfs
        self._shm = shm
        self._mountinfo = mountinfo

    def mounts(self) -> list[Mount]:
        """The mounted filesystems with their size and free space (statvfs; a mount that cannot be read is 0)."""
        try:
            text = self._mountinfo.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        sized: list[Mount] = []
        for mount in parse_mountinfo(text):
            try:
                st = os.statvfs(mount.path)
                total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
            except OSError:
                total = free = 0
            sized.append(dataclasses.replace(mount, total_bytes=total, free_bytes=free))
        return sized

    def _nvswitches(self) -> int:
        return sum(d.vendor == NVIDIA_VENDOR and d.pci_class.startswith(BRIDGE_CLASS) for d in pci_devices(self._sysfs))

    @staticmethod
    def _unit(name: str) -> str | None:
        """`systemctl is-active` for a unit that exists; None when it is not installed (or no systemd)."""
        if not shutil.which("systemctl"):
            return None
        env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
        try:
            loaded = subprocess.run(["systemctl", "show", name, "-p", "LoadState", "--value"], capture_output=True,
                                    text=True, check=False, timeout=20, env=env).stdout.strip()
            if loaded != "loaded":
                return None
            return subprocess.run(["systemctl", "is-active", name], capture_output=True, text=True, check=False,
                                  timeout=20, env=env).stdout.strip() or "unknown"
        except (OSError, subprocess.TimeoutExpired):
            return None

    def _shm_bytes(self) -> int | None:
        if not os.path.ismount(self._shm):
            return None
        st = os.statvfs(self._shm)
        return st.f_blocks * st.f_frsize

    def facts(self, cache_dir: Path, model: str | None) -> SystemFacts:
        try:
            free: int | None = shutil.disk_usage(_existing(cache_dir)).free
        except OSError:
            free = None
        return SystemFacts(
            nvswitches=self._nvswitches(),
            units={name: self._unit(name) for name in UNITS},
            shm_bytes=self._shm_bytes(),
            cache_dir=str(cache_dir),
            cache_free_bytes=free,
            cached_bytes=blob_bytes(repo_folder(hub_cache(cache_dir), model)) if model else 0,
        )


class RecordedSystem:
    """A fixture's `system` block; the cache disk is the fixture's host disk. A fixture without one says nothing of
    the host's services, and the checks that need them are skipped."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._described = "system" in data
        self._system: Mapping[str, Any] = data.get("system") or {}
        self._disk_free = int(data["host"]["disk_free_bytes"])

    def mounts(self) -> list[Mount]:
        """The recorded filesystems; a recording without them has one: the root on its host disk."""
        listed = self._system.get("mounts")
        if listed:
            return [Mount.from_dict(m) for m in listed]
        return [Mount("/", "/dev/vda1", "ext4", "252:1", total_bytes=self._disk_free, free_bytes=self._disk_free)]

    def facts(self, cache_dir: Path, model: str | None) -> SystemFacts:
        s = self._system
        units = s.get("units") or {}
        shm = s.get("shm_bytes")
        return SystemFacts(
            nvswitches=int(s.get("nvswitches", 0)),
            units={name: units.get(name) for name in UNITS},
            shm_bytes=None if shm is None else int(shm),
            cache_dir=str(cache_dir),
            cache_free_bytes=int(s.get("cache_free_bytes", self._disk_free)),
            cached_bytes=int(s.get("cached_bytes", 0)),
            described=self._described,
        )
