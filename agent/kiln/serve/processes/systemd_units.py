"""The agent's launcher on the image: each process is a systemd unit (kiln-vllm@NAME, kiln-router, kiln-proxy).

The supervisor alone restarts these units (they have Restart=no): it sees a unit that exited (failed or
inactive) and starts it again after its own backoff, out of routing meanwhile; systemd restarts only the agent.
`systemctl` is the one command this adapter runs."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from kiln.processes import ProcessSpec
from kiln.render.systemd import instance_unit_name

RUNTIME_UNIT_DIR = Path("/run/systemd/system")
CGROUP_ROOT = Path("/sys/fs/cgroup")
SERVICE_UNITS = {"proxy": "kiln-proxy.service", "router": "kiln-router.service"}

Run = Callable[[list[str]], subprocess.CompletedProcess[str]]


def run_systemctl(argv: list[str]) -> subprocess.CompletedProcess[str]:
    # Without NOTIFY_SOCKET: only the agent itself may speak sd_notify for kiln-agent.service.
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
    return subprocess.run(["systemctl", *argv], capture_output=True, text=True, check=False, timeout=60, env=env)


def run_journalctl(argv: list[str]) -> str:
    try:
        return subprocess.run(["journalctl", *argv], capture_output=True, text=True, errors="replace", check=False,
                              timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


ROUTER_TEMPLATE = "kiln-router@{}.service"  # the routers of the second model on (router-1, router-2, ...)


def unit_of(name: str) -> str:
    if re.fullmatch(r"router-[0-9]{1,2}", name):
        return ROUTER_TEMPLATE.format(name)
    return SERVICE_UNITS.get(name) or instance_unit_name(name)


class Unit:
    """A started unit, seen through `systemctl show` when the kernel says its processes changed: its cgroup's
    cgroup.events file (a read, no subprocess) says whether any process is left, so the supervisor's every tick does
    not run systemctl once per unit."""

    def __init__(self, unit: str, run: Run, journal: Callable[[list[str]], str] = run_journalctl,
                 cgroup_root: Path = CGROUP_ROOT) -> None:
        self.unit = unit
        self.run = run
        self.journal = journal
        self.cgroup_root = cgroup_root
        self._events: Path | None = None  # the unit's cgroup.events, once systemd has named its cgroup
        self._pid: int | None = None  # MainPID as systemd last said it

    def _populated(self) -> bool | None:
        """Whether a process is left in the unit's cgroup; None when the kernel cannot tell (no cgroup v2 here, or
        no cgroup yet)."""
        if self._events is None:
            return None
        try:
            lines = self._events.read_text(encoding="ascii").splitlines()
        except OSError:
            return None
        return next((line.split()[1] == "1" for line in lines if line.startswith("populated ")), None)

    def log_lines(self) -> list[str]:
        """What the unit's current run has logged to the journal."""
        invocation = self.run(["show", self.unit, "-p", "InvocationID", "--value"]).stdout.strip()
        if not invocation:
            return []
        return self.journal(["-u", self.unit, f"_SYSTEMD_INVOCATION_ID={invocation}", "-o", "cat", "-q",
                             "--no-pager"]).splitlines()

    def _show(self) -> dict[str, str]:
        out = self.run(["show", self.unit, "-p", "ActiveState,MainPID,ExecMainStatus,NRestarts,ControlGroup"]).stdout
        props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        if props.get("ControlGroup"):
            self._events = self.cgroup_root / props["ControlGroup"].lstrip("/") / "cgroup.events"
        self._pid = int(props.get("MainPID") or 0)
        return props

    @property
    def pid(self) -> int:
        """The main process as last seen: a report never waits on systemctl."""
        return self._pid if self._pid is not None else int(self._show().get("MainPID") or 0)

    def exit_code(self) -> int | None:
        if self._pid and self._populated():  # it runs, and nothing changed since systemd last said so
            return None
        props = self._show()
        if props.get("ActiveState") in ("failed", "inactive"):
            return int(props.get("ExecMainStatus") or 1)
        return None

    def signal_group(self, sig: int) -> None:
        self.run(["kill", "--signal", str(sig), self.unit])

    def reload(self) -> None:
        self.run(["reload", self.unit])  # the unit's ExecReload=: SIGHUP to its main process

    def terminate(self) -> None:
        self.run(["stop", "--no-block", self.unit])

    def finish(self, deadline: float) -> int:
        while time.monotonic() < deadline and self.exit_code() is None:
            time.sleep(0.5)
        self.run(["kill", "--signal", "SIGKILL", self.unit])
        return self.exit_code() or 0

    def stop(self, grace_s: float = 20.0) -> int:
        self.terminate()
        return self.finish(time.monotonic() + grace_s)


class SystemdUnits:
    """Starts each process as its unit; an instance's drop-in (devices, CPUs, NUMA) is written first."""

    def __init__(self, dropins: Mapping[str, str], run: Run = run_systemctl,
                 unit_dir: Path = RUNTIME_UNIT_DIR) -> None:
        self.dropins = dropins  # process name -> drop-in text
        self.run = run
        self.unit_dir = unit_dir
        self._reloaded = False

    def set_dropins(self, dropins: Mapping[str, str]) -> None:
        """A new plan's drop-ins, written (with a daemon-reload) before its first instance starts."""
        self.dropins = dropins
        self._reloaded = False

    def put_dropin(self, name: str, text: str) -> None:
        """One unit's drop-in, now (a rolling change's successor): the other units keep theirs."""
        self.dropins = {**self.dropins, name: text}
        path = self.unit_dir / f"{unit_of(name)}.d" / "50-kiln.conf"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        self.run(["daemon-reload"])

    def start(self, spec: ProcessSpec) -> Unit:
        unit = unit_of(spec.name)
        if spec.name in self.dropins and not self._reloaded:
            for name, text in self.dropins.items():
                path = self.unit_dir / f"{unit_of(name)}.d" / "50-kiln.conf"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
            self.run(["daemon-reload"])
            self._reloaded = True
        self.run(["reset-failed", unit])
        result = self.run(["start", "--no-block", unit])
        if result.returncode != 0:
            raise OSError(f"systemctl start {unit}: {result.stderr.strip()}")
        return Unit(unit, self.run)
