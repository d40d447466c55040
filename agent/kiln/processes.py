"""The one adapter over child processes: start a command in its own process group, logging to a file, and stop
the whole group. The supervisor sees only ProcessSpec and Running."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
LOG_READ_MAX = 4 * 2**20  # a start-up's lines are a few hundred; vLLM's later request logs are not read


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)  # added to the agent's own environment
    log_file: Path | None = None
    # KEY=VALUE files read when the process starts, for secrets (a missing file adds nothing). Under systemd the
    # unit's EnvironmentFile= does this instead.
    env_files: tuple[Path, ...] = ()
    # The CPUs the process and its children run on (none: any). Under systemd the unit's CPUAffinity= does this.
    cpus: tuple[int, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "argv": list(self.argv), "env": dict(self.env),
                "log_file": str(self.log_file) if self.log_file else None,
                "env_files": [str(p) for p in self.env_files], "cpus": list(self.cpus)}


def read_env_file(path: Path) -> dict[str, str]:
    """systemd's EnvironmentFile= format, as far as kiln writes it: KEY=VALUE lines, # comments."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and not line.lstrip().startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def die_with_parent() -> None:
    """Linux: the child gets SIGTERM if the agent dies, so a killed agent leaves no server behind."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def child_setup(cpus: tuple[int, ...]) -> Callable[[], None]:
    """What a child does between fork and exec: die with the agent, and keep to its CPUs, so that the processes it
    starts (vLLM's engine core and workers) inherit them and an instance's start-up does not queue behind another
    instance's pinned threads."""

    def setup() -> None:
        die_with_parent()
        if cpus:
            with contextlib.suppress(OSError):  # CPUs outside this machine's set: run anywhere
                os.sched_setaffinity(0, cpus)

    return setup


class Running:
    """A started process group."""

    def __init__(self, spec: ProcessSpec, popen: subprocess.Popen[bytes], log_offset: int = 0) -> None:
        self.spec = spec
        self.popen = popen
        self.started = time.monotonic()
        self.log_offset = log_offset  # where this start's lines begin in an appended log file

    def log_lines(self) -> list[str]:
        """What this start has logged so far."""
        if not self.spec.log_file:
            return []
        try:
            with self.spec.log_file.open("rb") as f:
                f.seek(self.log_offset)
                return f.read(LOG_READ_MAX).decode("utf-8", errors="replace").splitlines()
        except OSError:
            return []

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exit_code(self) -> int | None:
        return self.popen.poll()

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def reload(self) -> None:
        """SIGHUP to the main process alone (nginx's master re-reads its configuration; its workers must not)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.popen.pid, signal.SIGHUP)

    def terminate(self) -> None:
        if self.popen.poll() is None:
            self.signal_group(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            self.signal_group(signal.SIGTERM)

    def finish(self, deadline: float) -> int:
        """Wait for the exit until the deadline (monotonic), then SIGKILL the group; the exit code."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=max(deadline - time.monotonic(), 0))
        # Children of the leader (vLLM's engine core, compilers) may outlive it.
        self.signal_group(signal.SIGKILL)
        return self.popen.wait()

    def stop(self, grace_s: float = 20.0) -> int:
        """SIGTERM to the group, then SIGKILL after the grace period; the exit code."""
        self.terminate()
        return self.finish(time.monotonic() + grace_s)


class LocalProcesses:
    """Starts processes directly: `kiln up`, and the agent outside systemd."""

    def start(self, spec: ProcessSpec) -> Running:
        secrets = {k: v for path in spec.env_files for k, v in read_env_file(path).items()}
        log, offset = subprocess.DEVNULL, 0
        if spec.log_file:
            spec.log_file.parent.mkdir(parents=True, exist_ok=True)
            log = os.open(spec.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o640)
            offset = os.fstat(log).st_size
        try:
            popen = subprocess.Popen(
                list(spec.argv), env={**os.environ, **spec.env, **secrets}, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=child_setup(spec.cpus))  # noqa: PLW1509 - two system calls, no lock taken
        finally:
            if isinstance(log, int) and log >= 0:
                os.close(log)
        return Running(spec, popen, offset)


def interrupt(popen: subprocess.Popen[Any], grace_s: float = 90.0) -> int:
    """Ctrl-C for a command run in the foreground (`kiln up` stops all it started on SIGINT), SIGKILL after the
    grace: its exit code."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGINT)
        try:
            return popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            popen.kill()
    return popen.wait()


def run_to_end(argv: Sequence[str], timeout_s: float = 30.0) -> tuple[int, str]:
    """A short command run to its end: its exit code and its output (stdout and stderr together)."""
    try:
        done = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]} did not finish within {timeout_s:.0f} s"
    except OSError as exc:
        return 127, f"{argv[0]} cannot run: {exc.strerror}"
    return done.returncode, done.stdout.decode("utf-8", errors="replace")


def children_of(pid: int, proc: Path = Path("/proc")) -> dict[int, str]:
    """The processes whose parent is `pid`, each with its title (its command line, which a server such as nginx
    rewrites to say what the process does). Read from /proc; a process that exits meanwhile is left out."""
    found: dict[int, str] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii", errors="replace")
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so read after its last ")"
            if int(stat.rpartition(")")[2].split()[1]) != pid:
                continue
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        found[int(entry.name)] = title.strip()
    return found
