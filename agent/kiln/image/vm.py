"""`kiln image smoke`, the shell half: boot an overlay of the image under QEMU with a NoCloud seed, ask
the machine over SSH what it did, power it off. Every process it starts ends with it."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from kiln.errors import KilnError
from kiln.image import smoke
from kiln.image.progress import Progress
from kiln.image.system import BuildError
from kiln.image.tools import find_repo
from kiln.serve.processes.probes import served_certificate_sha256
from kiln.serve.processes.systemd_units import SERVICE_UNITS

TOOLS = ("qemu-system-x86_64", "qemu-img", "genisoimage", "ssh", "ssh-keygen")
STEPS = 6
KILN = "/opt/kiln/venv/bin/kiln"
AGENT_UNIT = "kiln-agent.service"
AGENT_BACK_S = 300.0  # the restarted agent's Python start under TCG is the slow part
# with --keep
KEPT = ("console.log", "user-data", "cloud-init.log", "cloud-init-result.json", "agent.journal", "nmap.txt")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Guest:
    """A booted VM reached over its forwarded SSH port."""
    key: Path
    port: int

    def ssh(self, command: str, timeout: float = 60, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        argv = ["ssh", "-i", str(self.key), "-p", str(self.port), "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                "-o", "ConnectTimeout=10", f"{smoke.SMOKE_USER}@127.0.0.1", command]
        try:
            return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout, input=stdin)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 255, "", f"timed out after {timeout:.0f} s")


@dataclass
class SmokeTest:
    image: Path
    profile: str
    timeout_s: float = 900
    memory_mb: int = 4096
    cpus: int = 2
    keep: Path | None = None
    progress: Progress | None = None
    expect_baked: bool = False  # the image was built with kiln_models naming the profile

    def run(self) -> tuple[list[smoke.Check], smoke.Observed]:
        missing = [t for t in TOOLS if shutil.which(t) is None]
        if missing:
            raise BuildError(f"missing on this machine: {', '.join(missing)}",
                             fix="apt-get install qemu-system-x86 qemu-utils genisoimage openssh-client")
        if not self.image.is_file():
            raise BuildError(f"no image at {self.image}", fix="build one with `kiln image build`")
        progress = self.progress or Progress.for_stream(STEPS)
        with tempfile.TemporaryDirectory(prefix="kiln-smoke-") as tmp:
            work = Path(tmp)
            try:
                return self._run(work, progress)
            finally:
                if self.keep:
                    self.keep.mkdir(parents=True, exist_ok=True)
                    for name in KEPT:
                        if (work / name).exists():
                            shutil.copy(work / name, self.keep / name)

    def _run(self, work: Path, progress: Progress) -> tuple[list[smoke.Check], smoke.Observed]:
        deadline = time.monotonic() + self.timeout_s
        seen = smoke.Observed()
        progress.step("seed and overlay")
        overlay, seed, key = self._prepare(work)
        forwards = smoke.Forwards(ssh=free_port(), public=free_port(), health=free_port(), http=free_port())
        console = work / "console.log"
        qmp = work / "qmp.sock"
        progress.step(f"boot under QEMU (TCG), SSH on 127.0.0.1:{forwards.ssh}")
        with _scan_link() as scan, _running(smoke.qemu_argv(overlay, seed, console, qmp, forwards, self.memory_mb,
                                                            self.cpus, scan=scan), work / "qemu.log") as qemu:
            started = time.monotonic()
            guest = Guest(key, forwards.ssh)
            _wait(progress, "SSH", deadline, qemu, console, lambda: guest.ssh("true", timeout=30).returncode == 0)
            seen.timings_s["ssh_s"] = time.monotonic() - started

            progress.step("cloud-init and the kiln agent")
            waited = guest.ssh("cloud-init status --wait --long", timeout=max(30.0, deadline - time.monotonic()))
            seen.cloud_init_status = waited.stdout.strip() or waited.stderr.strip()
            seen.timings_s["cloud_init_s"] = time.monotonic() - started
            result = guest.ssh("sudo cat /run/cloud-init/result.json")
            (work / "cloud-init-result.json").write_text(result.stdout + result.stderr)
            seen.cloud_init_result = _json(result.stdout)

            def agent_reports_plan() -> bool:
                seen.agent_status = _json(guest.ssh(f"sudo {KILN} status --json", timeout=60).stdout)
                status = seen.agent_status or {}
                return status.get("phase") in (*smoke.AGENT_STARTED, "failed") and bool(status.get("plan"))

            _wait(progress, "the agent's plan on its health endpoint", deadline, qemu, console, agent_reports_plan)
            seen.timings_s["agent_plan_s"] = time.monotonic() - started

            progress.step("listening ports, the public endpoint from outside")
            # The agent reports its plan before it has started the front; wait for nginx to answer at all.
            public = f"https://127.0.0.1:{forwards.public}/v1/models"
            _wait(progress, "the public endpoint", deadline, qemu, console, lambda: _http_status(public) is not None)
            seen.public_unauthorized = _http_status(public)
            seen.served_sha256 = served_certificate_sha256("127.0.0.1", forwards.public, timeout_s=15)
            seen.http_redirect = _redirect(f"http://127.0.0.1:{forwards.http}/v1/models")
            if scan is not None:
                progress.line(f"==> nmap: every TCP port of {scan.guest}, through the guest's firewall")
                seen.nmap_open, seen.nmap_summary = _nmap(guest, scan, work)
            seen.listeners = smoke.parse_ss(guest.ssh("sudo ss -Hltunp").stdout)
            seen.unwritable_for_instances = [
                d for d in smoke.STATE_DIRS
                if guest.ssh(f"sudo -u {smoke.INSTANCE_USER} test -w {d}").returncode != 0]
            as_instances = f"sudo -u {smoke.INSTANCE_USER} test -w {smoke.AGENT_DIR}"
            seen.agent_dir_writable = guest.ssh(as_instances).returncode == 0
            for instance in ((seen.agent_status or {}).get("plan") or {}).get("instances", []):
                unit = f"kiln-vllm@{instance['name']}.service"
                props = _unit_props(guest, unit)
                # e.g. "active 0": running, never restarted
                seen.instance_units[unit] = f"{props.get('ActiveState', '?')} {props.get('NRestarts', '?')}"
            if seen.instance_units:
                seen.readable_in_instance = _inside_instance(guest, next(iter(seen.instance_units)))
            seen.health_from_outside = _reach(f"http://127.0.0.1:{forwards.health}/health")
            progress.step("kill -9 of the agent")
            seen.agent_kill = _kill_agent(guest, public, [*seen.instance_units, *SERVICE_UNITS.values()], deadline)
            script = _marketplace_check()
            if script is not None:
                progress.line("==> DigitalOcean's Marketplace check on the booted machine")
                ran = guest.ssh("sudo bash -s", timeout=300, stdin=script)
                seen.marketplace_report = smoke.strip_colours(ran.stdout)
            (work / "cloud-init.log").write_text(guest.ssh("sudo cat /var/log/cloud-init.log").stdout)
            (work / "agent.journal").write_text(guest.ssh("sudo journalctl -b -u 'kiln*' --no-pager").stdout)

            progress.step("power off")
            seen.timings_s["poweroff_s"] = _power_off(qemu, qmp)
        return smoke.judge(seen, self.profile, self.expect_baked), seen

    def _prepare(self, work: Path) -> tuple[Path, Path, Path]:
        overlay = work / "overlay.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(self.image.resolve()), "-F", "qcow2",
                        str(overlay), "24G"], check=True)
        key = work / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "kiln-smoke", "-f", str(key)], check=True)
        seed_dir = work / "seed"
        seed_dir.mkdir()
        user_data = smoke.user_data(self.profile, (work / "id_ed25519.pub").read_text())
        (seed_dir / "user-data").write_text(user_data)
        (work / "user-data").write_text(user_data)
        (seed_dir / "meta-data").write_text(smoke.meta_data(f"kiln-smoke-{uuid.uuid4().hex[:8]}"))
        seed = work / "seed.iso"
        subprocess.run(["genisoimage", "-quiet", "-output", str(seed), "-volid", "cidata", "-joliet", "-rock",
                        str(seed_dir / "user-data"), str(seed_dir / "meta-data")], check=True)
        return overlay, seed, key


@contextlib.contextmanager
def _running(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        time.sleep(1)
        if proc.poll() is not None:
            raise BuildError(f"QEMU exited at once: {log.read_text()[-2000:]}")
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _wait(progress: Progress, what: str, deadline: float, qemu: subprocess.Popen[bytes], console: Path,
          check: Callable[[], bool]) -> None:
    shown = 0.0
    while time.monotonic() < deadline:
        if qemu.poll() is not None:
            raise BuildError(f"the VM stopped while waiting for {what}; console:\n{_tail(console)}")
        if check():
            return
        if progress.live or time.monotonic() - shown >= 30:  # a log gets a line every 30 s, a terminal more
            progress.line(f"==> waiting for {what}; console: {_tail(console, 1)}")
            shown = time.monotonic()
        time.sleep(5)
    raise BuildError(f"timed out waiting for {what}; console:\n{_tail(console)}")


def _unit_props(guest: Guest, unit: str) -> dict[str, str]:
    shown = guest.ssh(f"systemctl show {unit} -p MainPID -p NRestarts -p ActiveState").stdout
    return dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)


def _inside_instance(guest: Guest, unit: str) -> list[str]:
    """The owner's secrets a process of the unit can read: in its mount namespace, as its user."""
    props = dict(line.split("=", 1) for line in guest.ssh(
        f"systemctl show {unit} -p MainPID").stdout.splitlines() if "=" in line)
    as_instance = (f"sudo nsenter --target {props.get('MainPID', '0')} --mount setpriv --reuid {smoke.INSTANCE_USER} "
                   f"--regid {smoke.INSTANCE_USER} --init-groups")
    return [path for path in smoke.INSTANCE_SECRETS
            if guest.ssh(f"{as_instance} cat {shlex.quote(path)}").returncode == 0]


def _kill_agent(guest: Guest, public: str, units: list[str], deadline: float,
                wait_s: float = AGENT_BACK_S) -> smoke.AgentKill:
    """SIGKILL to kiln-agent; the public endpoint is asked every second until the restarted agent reports its plan."""
    def units_now() -> dict[str, str]:
        return {u: f"{p.get('MainPID', '?')} {p.get('NRestarts', '?')}"
                for u in units for p in [_unit_props(guest, u)]}

    before = int(_unit_props(guest, AGENT_UNIT).get("MainPID") or 0)
    units_before = units_now()
    answers: list[bool] = []
    done = threading.Event()

    def ask() -> None:
        while not done.wait(1.0):
            answers.append(_http_status(public) is not None)

    asking = threading.Thread(target=ask, daemon=True)
    guest.ssh(f"sudo systemctl kill --signal=SIGKILL {AGENT_UNIT}")
    killed = time.monotonic()
    asking.start()
    back_s: float | None = None
    try:
        while time.monotonic() < min(deadline, killed + wait_s):
            now = int(_unit_props(guest, AGENT_UNIT).get("MainPID") or 0)
            if now not in (0, before) and (_json(guest.ssh(f"sudo {KILN} status --json", timeout=60).stdout)
                                           or {}).get("plan"):
                back_s = time.monotonic() - killed
                break
            time.sleep(2)
    finally:
        done.set()
        asking.join(timeout=30)
    after = int(_unit_props(guest, AGENT_UNIT).get("MainPID") or 0)
    return smoke.AgentKill((before, after), units_before, units_now(), answers.count(True), answers.count(False),
                           back_s)


def _marketplace_check() -> str | None:
    """DigitalOcean's 99-img-check.sh as the image build carries it, when this is a kiln checkout."""
    try:
        path = find_repo() / "roles" / "image_cleanup" / "files" / "99-img-check.sh"
        return path.read_text(encoding="utf-8")
    except (KilnError, OSError):
        return None


def _power_off(qemu: subprocess.Popen[bytes], qmp: Path, timeout_s: float = 180) -> float:
    """ACPI power button through QMP, as a cloud's "power off" does; the guest shuts down cleanly."""
    started = time.monotonic()
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(qmp))
        s.recv(4096)
        for command in ("qmp_capabilities", "system_powerdown"):
            s.sendall(json.dumps({"execute": command}).encode() + b"\n")
            s.recv(4096)
    try:
        qemu.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"the VM did not power off within {timeout_s:.0f} s") from exc
    return time.monotonic() - started


def _http_status(url: str) -> int | None:
    """The status code, whatever certificate the machine made for itself (it names the guest's addresses)."""
    try:
        return requests.get(url, timeout=15, verify=False).status_code
    except requests.RequestException:
        return None


def _redirect(url: str) -> str | None:
    try:
        reply = requests.get(url, timeout=15, allow_redirects=False)
    except requests.RequestException:
        return None
    return f"{reply.status_code} {reply.headers.get('Location', '')}".strip()


@contextlib.contextmanager
def _scan_link() -> Iterator[smoke.ScanLink | None]:
    """A host TAP device wired to a second NIC of the guest, so nmap scans the machine as the internet reaches it,
    through its firewall. Where the host cannot make one (not root, no /dev/net/tun, no nmap), no scan."""
    if os.geteuid() != 0 or not Path("/dev/net/tun").exists() or not shutil.which("nmap") or not shutil.which("ip"):
        yield None
        return
    subnet = os.getpid() % 250
    link = smoke.ScanLink(f"kscan{os.getpid() % 100000}", f"10.213.{subnet}.1", f"10.213.{subnet}.2")
    made = subprocess.run(["ip", "tuntap", "add", "dev", link.tap, "mode", "tap"], capture_output=True, check=False)
    try:
        if made.returncode != 0:
            yield None
            return
        for argv in (["ip", "addr", "add", f"{link.host}/{link.prefix}", "dev", link.tap],
                     ["ip", "link", "set", link.tap, "up"]):
            subprocess.run(argv, capture_output=True, check=True)
        yield link
    finally:
        if made.returncode == 0:
            subprocess.run(["ip", "link", "del", link.tap], capture_output=True, check=False)


def _nmap(guest: Guest, scan: smoke.ScanLink, work: Path) -> tuple[list[int] | None, str]:
    """Give the guest's second NIC its address, then a SYN scan of all 65,535 TCP ports from the host."""
    up = (f"dev=$(ip -o link | awk -F': ' '/{smoke.SCAN_MAC}/ {{print $2}}'); "
          f"sudo ip addr add {scan.guest}/{scan.prefix} dev $dev && sudo ip link set $dev up")
    configured = guest.ssh(up)
    if configured.returncode != 0:
        return None, f"could not address the guest's scan NIC: {configured.stderr.strip()}"
    # A TAP link to a guest on this host: 3,000 probes a second cover every port in about 25 s, and an open port
    # the guest is slow to answer is asked again (--max-retries) before it is counted filtered.
    ran = subprocess.run(["nmap", "-Pn", "-n", "-sS", "-p-", "-T4", "--max-retries", "2", "--min-rate", "3000",
                          "-oG", "-", scan.guest], capture_output=True, text=True, timeout=900, check=False)
    (work / "nmap.txt").write_text(ran.stdout + ran.stderr)
    summary = next((line for line in ran.stdout.splitlines() if line.startswith("# Nmap done")), ran.stderr.strip())
    return (smoke.parse_nmap_open(ran.stdout) if ran.returncode == 0 else None), summary.removeprefix("# ")


def _reach(url: str) -> str:
    try:
        requests.get(url, timeout=10)
    except requests.RequestException as exc:
        return f"no answer ({type(exc).__name__})"
    return "answered"


def _json(text: str) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(line.strip() for line in text.splitlines()[-lines:])
