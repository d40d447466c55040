"""Which disk holds the model cache and the compile caches. Pure: the mounted filesystems come in as values.

DigitalOcean's H100/H200 droplets carry a scratch disk (5 TiB NVMe on one GPU, 40 TiB on eight; droplets.yaml) beside
the boot disk, but its documentation gives no mount point. So kiln looks at what is mounted: a local, writable block
device filesystem other than the boot disk is a candidate, and the cache goes to the one with the most room when
that is more than the boot disk has. A disk that already holds the planned model's files wins, so a reboot or an
image with baked weights never downloads again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Any

# Local filesystems a block device carries; network, pseudo and read-only image filesystems never hold the cache.
LOCAL_FILESYSTEMS = ("ext4", "ext3", "ext2", "xfs", "btrfs", "f2fs")
SKIPPED_UNDER = ("/boot", "/snap", "/proc", "/sys", "/dev", "/run")
CACHE_FOLDER = "kiln"  # the cache root on a scratch disk: <mount>/kiln


@dataclass(frozen=True)
class Mount:
    path: str
    device: str  # the source: /dev/nvme1n1
    fstype: str
    dev_id: str  # major:minor, the same for every bind mount of one filesystem
    read_only: bool = False
    total_bytes: int = 0
    free_bytes: int = 0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Mount:
        return cls(path=str(data["path"]), device=str(data["device"]), fstype=str(data["fstype"]),
                   dev_id=str(data.get("dev_id", data["device"])), read_only=bool(data.get("read_only", False)),
                   total_bytes=int(data.get("total_bytes", 0)), free_bytes=int(data.get("free_bytes", 0)))

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "device": self.device, "fstype": self.fstype, "dev_id": self.dev_id,
                "read_only": self.read_only, "total_bytes": self.total_bytes, "free_bytes": self.free_bytes}


@dataclass(frozen=True)
class CacheDisk:
    root: str  # the folder holding HF_HOME and the compile caches
    mount: str
    device: str
    free_bytes: int
    scratch: bool  # not the boot disk
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"root": self.root, "mount": self.mount, "device": self.device, "free_bytes": self.free_bytes,
                "disk": "scratch" if self.scratch else "boot", "reason": self.reason}


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """/proc/self/mountinfo as mounts, sizes not yet known (proc(5): ID PARENT MAJ:MIN ROOT PATH OPTS ... - FS SRC)."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or len(tail) < 2:
            continue
        options = fields[5].split(",")
        mounts.append(Mount(path=_unescape(fields[4]), device=_unescape(tail[1]), fstype=tail[0], dev_id=fields[2],
                            read_only="ro" in options))
    return mounts


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount a path lives on: the last-mounted one whose path is the longest prefix."""
    best: Mount | None = None
    target = PurePosixPath(path)
    for mount in mounts:
        where = PurePosixPath(mount.path)
        if (target == where or where in target.parents) and (best is None or len(mount.path) >= len(best.path)):
            best = mount
    return best


def _under(path: str, folders: tuple[str, ...]) -> bool:
    p = PurePosixPath(path)
    return any(p == PurePosixPath(f) or PurePosixPath(f) in p.parents for f in folders)


def scratch_candidates(mounts: list[Mount], boot: Mount) -> list[Mount]:
    """Local, writable block-device filesystems other than the boot disk, once each (bind mounts share a dev_id)."""
    seen = {boot.dev_id}
    found: list[Mount] = []
    for mount in mounts:  # in mount order: a bind mount comes after the filesystem it shows again
        if (mount.dev_id in seen or mount.read_only or mount.fstype not in LOCAL_FILESYSTEMS
                or not mount.device.startswith("/dev/") or _under(mount.path, SKIPPED_UNDER)):
            continue
        seen.add(mount.dev_id)
        found.append(mount)
    return found


def scratch_root(mount: Mount) -> str:
    return str(PurePosixPath(mount.path) / CACHE_FOLDER)


def _gib(n: int) -> str:
    return f"{n / 2**30:,.0f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def choose_cache_disk(mounts: list[Mount], boot_root: str, held: Mapping[str, int]) -> CacheDisk:
    """The cache root: where the model already is, else the roomiest scratch disk with more room than the boot disk,
    else `boot_root` on the boot disk. `held` maps a candidate root to the bytes of the planned model it holds."""
    boot = mount_of(boot_root, mounts) or Mount("/", "unknown", "unknown", "0:0")
    on_boot = CacheDisk(boot_root, boot.path, boot.device, boot.free_bytes, False, "")
    options = [on_boot] + [CacheDisk(scratch_root(m), m.path, m.device, m.free_bytes, True, "")
                           for m in scratch_candidates(mounts, boot)]
    holding = [o for o in options if held.get(o.root, 0) > 0]
    if holding:
        best = max(holding, key=lambda o: (held[o.root], o.free_bytes))
        where = "the scratch disk" if best.scratch else "the boot disk"
        return replace(best, reason=f"{where} already holds {_gib(held[best.root])} of the model")
    scratch = max(options[1:], key=lambda o: o.free_bytes, default=None)
    boot_free = _gib(on_boot.free_bytes)
    if scratch is None:
        return replace(on_boot, reason=f"no other local disk is mounted; the boot disk has {boot_free} free")
    if scratch.free_bytes > on_boot.free_bytes:
        return replace(scratch, reason=f"the scratch disk {scratch.mount} ({scratch.device}) has more room than the "
                                       f"boot disk: {_gib(scratch.free_bytes)} free against {boot_free}")
    return replace(on_boot, reason=f"the boot disk has more room ({boot_free} free) than the largest other disk, "
                                   f"{scratch.mount} ({_gib(scratch.free_bytes)})")
