"""The build machine, for the image build and the smoke test: processes, mounts and loop devices.
The one place that touches them, so failures name the command and where its full output is."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import KilnError
from kiln.image.progress import Progress


class BuildError(KilnError):
    pass


@dataclass
class Host:
    log: Path
    progress: Progress

    def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None, stdin: str | None = None,
            cwd: Path | None = None, inherit_env: bool = True) -> str:
        """Run a command to completion, its output into the build log (and milestones onto the screen)."""
        full_env = {**(os.environ if inherit_env else {}), **(env or {})}
        with self.log.open("a") as log:
            log.write(f"\n$ {' '.join(argv)}\n")
            log.flush()
            proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                    env=full_env, cwd=cwd, errors="replace")
            if stdin is not None and proc.stdin:
                proc.stdin.write(stdin)
                proc.stdin.close()
            assert proc.stdout is not None
            lines: list[str] = []
            try:
                for line in proc.stdout:
                    log.write(line)
                    lines.append(line)
                    del lines[:-40]
                    self.progress.line(line)
            except BaseException:  # interrupted: the command stops before the caller unmounts under it
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                raise
            code = proc.wait()
        if code != 0:
            tail = "".join(lines[-15:]).rstrip()
            raise BuildError(f"`{' '.join(argv[:3])} ...` failed with exit code {code}:\n{tail}\n"
                             f"(full output in {self.log})")
        return "".join(lines)

    def require(self, *tools: str) -> None:
        missing = [t for t in tools if shutil.which(t) is None]
        if missing:
            raise BuildError(f"missing on this machine: {', '.join(missing)}",
                             fix="install them, e.g. `bash ci/setup.sh` or `apt-get install mmdebstrap qemu-utils "
                             "qemu-system-x86 fdisk genisoimage`")

    @contextlib.contextmanager
    def mounted(self, source: str, target: Path, *options: str) -> Iterator[Path]:
        if not target.exists():
            target.mkdir(parents=True)
        self.run(["mount", *options, source, str(target)])
        try:
            yield target
        finally:
            if subprocess.run(["umount", str(target)], check=False, capture_output=True).returncode != 0:
                subprocess.run(["umount", "--lazy", str(target)], check=False, capture_output=True)

    @contextlib.contextmanager
    def bound(self, source: Path, target: Path, read_only: bool = True) -> Iterator[Path]:
        """A bind mount of a file or folder; a read-only one cannot leak writes back to the host."""
        if source.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch(exist_ok=True)
        with self.mounted(str(source), target, "--bind"):
            if read_only:
                self.run(["mount", "-o", "remount,bind,ro", str(target)])
            yield target

    @contextlib.contextmanager
    def loop_disk(self, image: Path) -> Iterator[tuple[str, str]]:
        """The disk image on a loop device with its partitions: (disk device, first partition)."""
        disk = self.run(["losetup", "--find", "--show", "--partscan", str(image)]).strip()
        try:
            part = f"{disk}p1"
            if not Path(part).exists():
                self.run(["partx", "--add", disk])
                _make_partition_node(disk, part)
            yield disk, part
        finally:
            subprocess.run(["partx", "--delete", disk], check=False, capture_output=True)
            subprocess.run(["losetup", "--detach", disk], check=False, capture_output=True)


def _make_partition_node(disk: str, part: str) -> None:
    """Containers without udev get no /dev node for a new partition; make it from sysfs."""
    if Path(part).exists():
        return
    dev = Path(f"/sys/class/block/{Path(part).name}/dev")
    if not dev.exists():
        raise BuildError(f"the kernel shows no partition {part} on {disk}")
    major, minor = (int(x) for x in dev.read_text().split(":"))
    os.mknod(part, 0o660 | 0o060000, os.makedev(major, minor))
