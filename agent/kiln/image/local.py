"""`kiln image build` (local target): a bootable Debian 12 qcow2 with the kiln roles applied, on this
machine, with no cloud account. Needs root (mmdebstrap's root mode, mounts, a loop device)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kiln.image import recipe
from kiln.image.progress import Progress
from kiln.image.system import BuildError, Host

STEPS = 6
TOOLS = ("mmdebstrap", "qemu-img", "sfdisk", "losetup", "partx", "mkfs.ext4", "blkid", "mount", "chroot")
MOUNT_POINTS = ("boot", "dev", "proc", "run", "sys", "tmp")  # what systemd mounts over at boot
CA_CANDIDATES = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")


@dataclass(frozen=True)
class BuildResult:
    image: Path
    log: Path
    seconds: float
    size_bytes: int
    virtual_size_bytes: int

    def as_dict(self) -> dict[str, object]:
        return {"image": str(self.image), "log": str(self.log), "seconds": round(self.seconds, 1),
                "size_bytes": self.size_bytes, "virtual_size_bytes": self.virtual_size_bytes}


@dataclass
class LocalBuild:
    repo: Path
    out_dir: Path
    image: recipe.LocalImage
    ansible_playbook: str
    wheelhouses: tuple[Path, ...] = ()
    progress: Progress | None = None

    def run(self) -> BuildResult:
        if os.geteuid() != 0:
            raise BuildError("the local image build needs root (mmdebstrap, mounts and a loop device)",
                             fix="run it with sudo, or as root")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        progress = self.progress or Progress.for_stream(STEPS)
        log = self.out_dir / f"{self.image.name}-{self.image.version}.build.log"
        log.write_text(f"kiln image build, {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        host = Host(log, progress)
        host.require(*TOOLS, self.ansible_playbook)
        work = self.out_dir / f".work-{self.image.version}"
        if work.exists():
            _remove_work(work)
        work.mkdir()
        target = self.out_dir / self.image.file_name
        try:
            progress.step("kiln wheel")
            wheel = build_wheel(host, self.repo, work / "dist")
            rootfs = work / "rootfs"
            progress.step("Debian 12 root file system (mmdebstrap)")
            host.run(recipe.mmdebstrap_argv(self.image, rootfs))
            _write_boot_files(rootfs)
            progress.step("kiln roles (Ansible over a chroot)")
            self._apply_roles(host, rootfs, wheel)
            progress.step("disk: partition, file system, GRUB")
            raw = work / "disk.raw"
            self._make_disk(host, rootfs, raw)
            progress.step("compressed qcow2")
            host.run(recipe.qcow2_argv(raw, target))
            progress.step("clean up")
            _remove_work(work)
        except BaseException:
            progress.note(f"build failed; log: {log}")
            with contextlib.suppress(BuildError):
                _remove_work(work)
            raise
        info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(target)], check=True,
                                         capture_output=True, text=True).stdout)
        result = BuildResult(target, log, progress.elapsed_s(), target.stat().st_size, int(info["virtual-size"]))
        progress.done(f"built {target} ({result.size_bytes / 2**20:,.0f} MiB)")
        return result

    def _apply_roles(self, host: Host, rootfs: Path, wheel: Path) -> None:
        policy = rootfs / "usr/sbin/policy-rc.d"
        policy.write_text(recipe.POLICY_RC_D)
        policy.chmod(0o755)
        resolv = rootfs / "etc/resolv.conf"
        resolv.unlink(missing_ok=True)
        shutil.copyfile("/etc/resolv.conf", resolv)
        mount = rootfs / recipe.BUILD_MOUNT.lstrip("/")
        ca = _ca_bundle()
        with contextlib.ExitStack() as mounts:
            mounts.enter_context(host.mounted("proc", rootfs / "proc", "-t", "proc"))
            mounts.enter_context(host.bound(Path("/dev"), rootfs / "dev", read_only=False))
            mounts.enter_context(host.mounted("devpts", rootfs / "dev/pts", "-t", "devpts"))
            if ca:
                mounts.enter_context(host.bound(ca, mount / "ca.crt"))
            for i, wheels in enumerate(self.wheelhouses):
                mounts.enter_context(host.bound(wheels, mount / f"wheels{i}"))
            env = recipe.build_environment(ca is not None, len(self.wheelhouses))
            host.run(recipe.playbook_argv(self.ansible_playbook, self.repo, rootfs, wheel, self.image, env),
                     env=recipe.playbook_env(self.repo, os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")),
                     inherit_env=False)
        if not _mounts_under(mount):
            shutil.rmtree(mount)
        policy.unlink()
        resolv.unlink()  # dhclient writes it at boot

    def _make_disk(self, host: Host, rootfs: Path, raw: Path) -> None:
        missing = [d for d in MOUNT_POINTS if not (rootfs / d).is_dir()]
        if missing:
            raise BuildError(f"the root file system lacks {', '.join(missing)}; systemd could not boot it")
        with raw.open("wb") as f:
            f.truncate(self.image.disk_gb * 2**30)
        host.run(["sfdisk", "--quiet", str(raw)], stdin=recipe.PARTITION_TABLE)
        mnt = raw.parent / "mnt"
        with host.loop_disk(raw) as (disk, part):
            host.run(["mkfs.ext4", "-q", "-L", recipe.ROOT_LABEL, part])
            with contextlib.ExitStack() as mounts:
                mounts.enter_context(host.mounted(part, mnt))
                host.run(["cp", "-a", f"{rootfs}/.", str(mnt)])
                for fs in ("proc", "sys"):
                    mounts.enter_context(host.mounted(f"/{fs}", mnt / fs, "--bind"))
                # A /dev of its own: GRUB writes root=UUID=... only when /dev/disk/by-uuid shows the file
                # system, which a machine without udev (a container) never does; else root=/dev/loopNp1.
                mounts.enter_context(host.mounted("tmpfs", mnt / "dev", "-t", "tmpfs", "-o", "mode=0755"))
                uuid = host.run(["blkid", "-s", "UUID", "-o", "value", part]).strip()
                _populate_dev(mnt / "dev", disk, part, uuid)
                host.run(["chroot", str(mnt), *recipe.grub_install_argv(disk)])
                host.run(["chroot", str(mnt), "update-grub"])
                grub_cfg = (mnt / "boot/grub/grub.cfg").read_text()
                if "vmlinuz" not in grub_cfg or f"root=UUID={uuid}" not in grub_cfg:
                    raise BuildError("update-grub wrote no kernel entry with root=UUID=...; the image would not "
                                     f"boot (see {mnt / 'boot/grub/grub.cfg'})")


def build_wheel(host: Host, repo: Path, dist: Path) -> Path:
    host.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(repo)])
    wheels = sorted(dist.glob("kiln-*.whl"))
    if not wheels:
        raise BuildError(f"pip built no kiln wheel in {dist}")
    return wheels[-1]


def _populate_dev(dev: Path, disk: str, part: str, uuid: str) -> None:
    """Device nodes GRUB needs in the chroot: the usual character devices, the loop disk and its partition,
    and the by-uuid link for the root file system."""
    for source in ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom", disk, part):
        info = os.stat(source)
        os.mknod(dev / Path(source).name, (info.st_mode & 0o170000) | 0o660, info.st_rdev)
    (dev / "disk" / "by-uuid").mkdir(parents=True)
    (dev / "disk" / "by-uuid" / uuid).symlink_to(f"../../{Path(part).name}")


def _write_boot_files(rootfs: Path) -> None:
    (rootfs / "etc/fstab").write_text(recipe.FSTAB)
    (rootfs / "etc/default/grub").write_text(recipe.GRUB_DEFAULTS)
    (rootfs / "etc/network/interfaces").write_text(recipe.INTERFACES)
    (rootfs / "etc/hostname").write_text("localhost\n")


def _ca_bundle() -> Path | None:
    for var in CA_CANDIDATES:
        value = os.environ.get(var)
        if value and Path(value).is_file():
            return Path(value)
    default = Path("/etc/ssl/certs/ca-certificates.crt")
    return default if default.is_file() else None


def pip_wheelhouses() -> tuple[Path, ...]:
    """The local folders this machine's pip takes wheels from (find-links), offered to the image's pip."""
    found: list[str] = os.environ.get("PIP_FIND_LINKS", "").split()
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], check=False, capture_output=True,
                         text=True).stdout
    for line in out.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".find-links"):
            found += value.strip().strip("'\"").split()
    dirs = [Path(p.removeprefix("file://")) for p in found if not p.startswith(("http://", "https://"))]
    return tuple(dict.fromkeys(d for d in dirs if d.is_dir()))


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()).rstrip("/")
    with open("/proc/self/mounts") as f:
        points = [line.split()[1].replace("\\040", " ") for line in f]
    return [p for p in points if p == prefix or p.startswith(prefix + "/")]


def _remove_work(work: Path) -> None:
    """Never delete through a mount: a leftover bind of /dev would take the host's devices with it."""
    left = _mounts_under(work)
    if left:
        raise BuildError(f"still mounted under {work}: {', '.join(left)}",
                         fix=f"unmount them (umount -R {work}), then remove {work}")
    shutil.rmtree(work)
