"""`kiln image smoke`, the pure half: the NoCloud seed a user would write, QEMU's command line, and the
verdict on what the booted machine reported. No I/O here (kiln/image/vm.py boots and asks)."""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kiln.serve.layout import ServeLayout

SMOKE_USER = "smoke"
SSH_PORT = 22
# Beyond kiln: sshd, the DHCP client, and chrony's command socket on localhost.
PUBLIC_TCP = {SSH_PORT}
PUBLIC_UDP = {68}
LOCAL_UDP = {323}
EPHEMERAL_FROM = 32768  # Linux's ip_local_port_range: vLLM's engine sockets bind there on localhost
AGENT_STARTED = ("starting", "ready", "degraded")
LAYOUT = ServeLayout()  # the image's documented ports
INSTANCE_USER = "kiln"  # kiln-vllm@.service's User=
# HOME, HF_HOME and the compile caches (VLLM_CACHE_ROOT, Inductor, Triton) on the boot disk.
STATE_DIRS = ("/var/lib/kiln/home", "/var/lib/kiln/huggingface", "/var/lib/kiln/compile")
AGENT_DIR = "/var/lib/kiln"  # the agent's own: root's, which the instances' user must not be able to write
OBJECTIVE = "latency"  # not the default (throughput), so the plan shows the user-data was read
# What a model server must not read as its unit runs it (kiln-vllm@.service's InaccessiblePaths=): the owner's
# settings (written world-readable here, as a careless owner might), the user-data cloud-init keeps, the keys.
INSTANCE_SECRETS = ("/etc/kiln/kiln.yaml", "/var/lib/cloud/instance/user-data.txt", "/var/lib/kiln/keys.json")


@dataclass(frozen=True)
class Forwards:
    """Host ports on 127.0.0.1 forwarded into the guest."""
    ssh: int
    public: int  # HTTPS
    health: int  # forwarded to prove the health port does not answer from outside the guest
    http: int = 0  # plain HTTP: the ACME challenge and the redirect; 0: not forwarded


SCAN_MAC = "52:54:00:6b:6c:6e"  # the second NIC, on a host TAP device, that nmap scans as the internet would


@dataclass(frozen=True)
class ScanLink:
    """A TAP device on the host and the guest's address on it: a network path that passes the guest's firewall."""
    tap: str
    host: str
    guest: str
    prefix: int = 30


def user_data(profile: str, ssh_public_key: str, price_per_hour: float = 0.0) -> str:
    """The README's #cloud-config, plus a login for the test."""
    settings = {"profile": profile, "objective": OBJECTIVE, "price_per_hour": price_per_hour}
    doc = {
        "users": [{"name": SMOKE_USER, "sudo": "ALL=(ALL) NOPASSWD:ALL", "shell": "/bin/bash",
                   "lock_passwd": True, "ssh_authorized_keys": [ssh_public_key.strip()]}],
        "write_files": [{"path": "/etc/kiln/kiln.yaml", "owner": "root:root", "permissions": "0644",
                         "content": yaml.safe_dump(settings, sort_keys=False)}],
    }
    return "#cloud-config\n" + yaml.safe_dump(doc, sort_keys=False)


def meta_data(instance_id: str) -> str:
    return f"instance-id: {instance_id}\nlocal-hostname: kiln-smoke\n"


def qemu_argv(overlay: Path, seed_iso: Path, console_log: Path, qmp_socket: Path, forwards: Forwards,
              memory_mb: int, cpus: int, layout: ServeLayout = LAYOUT, scan: ScanLink | None = None) -> list[str]:
    # TCG: KVM is not always there (nested, containers); restrict=on: the guest reaches nothing outside,
    # and only the forwards below, each on 127.0.0.1, reach it.
    fwd = (f"hostfwd=tcp:127.0.0.1:{forwards.ssh}-:{SSH_PORT},"
           f"hostfwd=tcp:127.0.0.1:{forwards.public}-:{layout.public_port},"
           f"hostfwd=tcp:127.0.0.1:{forwards.health}-:{layout.health_port}"
           + (f",hostfwd=tcp:127.0.0.1:{forwards.http}-:{layout.http_port}" if forwards.http else ""))
    tap = ["-netdev", f"tap,id=net1,ifname={scan.tap},script=no,downscript=no",
           "-device", f"virtio-net-pci,netdev=net1,mac={SCAN_MAC}"] if scan else []
    return [
        "qemu-system-x86_64", "-machine", "q35", "-accel", "tcg,thread=multi", "-cpu", "max",
        "-smp", str(cpus), "-m", str(memory_mb), "-display", "none", "-vga", "none", "-monitor", "none",
        "-serial", f"file:{console_log}", "-qmp", f"unix:{qmp_socket},server=on,wait=off",
        "-drive", f"file={overlay},if=virtio,format=qcow2,discard=unmap",
        "-drive", f"file={seed_iso},if=virtio,format=raw,readonly=on",
        "-netdev", f"user,id=net0,restrict=on,{fwd}", "-device", "virtio-net-pci,netdev=net0", *tap,
        "-no-reboot",
    ]


def parse_nmap_open(grepable: str) -> list[int]:
    """Open TCP ports from nmap's grepable output (-oG -): `Ports: 22/open/tcp//ssh///, 80/open/tcp//http///`."""
    ports: list[int] = []
    for line in grepable.splitlines():
        if "Ports:" not in line:
            continue
        for entry in line.split("Ports:", 1)[1].split("\t", 1)[0].split(","):
            fields = entry.strip().split("/")
            if len(fields) > 2 and fields[1] == "open" and fields[2] == "tcp":
                ports.append(int(fields[0]))
    return sorted(ports)


@dataclass(frozen=True)
class Listener:
    proto: str  # tcp | udp
    address: str
    port: int
    process: str


def parse_ss(text: str) -> list[Listener]:
    """`ss -Hltunp` lines: Netid State Recv-Q Send-Q Local:Port Peer:Port [users:(("name",pid=..,fd=..))]."""
    out = []
    for line in text.splitlines():
        cols = line.split()
        if len(cols) < 5 or cols[0] not in ("tcp", "udp"):
            continue
        address, _, port = cols[4].rpartition(":")
        address = address.strip("[]").split("%")[0]
        process = cols[6].split('"')[1] if len(cols) > 6 and '"' in cols[6] else ""
        if port.isdigit():
            out.append(Listener(cols[0], address, int(port), process))
    return out


def _is_local(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def public_tcp(layout: ServeLayout = LAYOUT) -> set[int]:
    """SSH, HTTPS and HTTP: all a machine answers on beyond localhost."""
    return PUBLIC_TCP | {layout.public_port} | ({layout.http_port} if layout.http_port else set())


def unexpected_listeners(listeners: list[Listener], instance_ports: set[int],
                         layout: ServeLayout = LAYOUT) -> list[Listener]:
    local_tcp = {layout.router_port, layout.router_metrics_port, layout.health_port, *instance_ports}
    bad = []
    for s in listeners:
        if _is_local(s.address):
            ok = (s.port in local_tcp or (s.port >= EPHEMERAL_FROM and s.process.startswith(("python", "VLLM")))
                  if s.proto == "tcp" else s.port in LOCAL_UDP)
        else:
            ok = s.port in public_tcp(layout) if s.proto == "tcp" else s.port in PUBLIC_UDP
        if not ok:
            bad.append(s)
    return bad


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class AgentKill:
    """kill -9 of the agent on the booted machine: systemd restarts it; the units it started run on."""
    agent_pids: tuple[int, int]  # the agent's main PID before and after
    units_before: dict[str, str]  # kiln-vllm@NAME, kiln-router, kiln-proxy -> "MainPID NRestarts"
    units_after: dict[str, str]
    endpoint_answered: int  # the public endpoint's answers while the agent was away and back
    endpoint_missed: int
    back_s: float | None  # until the new agent reported its plan; None: not within the wait


def judge_agent_kill(kill: AgentKill) -> Check:
    restarted = kill.agent_pids[1] not in (0, kill.agent_pids[0])
    kept = bool(kill.units_before) and kill.units_after == kill.units_before
    ok = restarted and kept and kill.back_s is not None and kill.endpoint_missed == 0
    return Check("kill -9 of the agent: systemd restarts it, the units it started keep running and the endpoint "
                 "answers throughout", ok,
                 f"agent PID {kill.agent_pids[0]} -> {kill.agent_pids[1]}, back with its plan in "
                 + (f"{kill.back_s:.0f} s" if kill.back_s is not None else "never")
                 + f"; the endpoint answered {kill.endpoint_answered} of "
                 f"{kill.endpoint_answered + kill.endpoint_missed} times; units before "
                 + ", ".join(f"{u} {s}" for u, s in kill.units_before.items())
                 + ("; the same after" if kept else "; after " + ", ".join(f"{u} {s}" for u, s in
                                                                         kill.units_after.items())))


@dataclass
class Observed:
    """What the smoke test collected from the booted machine."""
    cloud_init_result: dict[str, Any] | None = None
    cloud_init_status: str = ""
    agent_status: dict[str, Any] | None = None
    listeners: list[Listener] = field(default_factory=list)
    public_unauthorized: int | None = None  # HTTP status of the public endpoint without a key, from the host
    served_sha256: str | None = None  # the certificate the public endpoint presented, from the host
    http_redirect: str | None = None  # "301 https://..." from the plain-HTTP port, from the host
    nmap_open: list[int] | None = None  # open TCP ports nmap found through the guest's firewall; None: not scanned
    nmap_summary: str = ""
    health_from_outside: str = ""  # what the forwarded health port did from the host
    unwritable_for_instances: list[str] = field(default_factory=list)  # state folders the kiln user cannot write
    agent_dir_writable: bool | None = None  # whether the kiln user can write the agent's own folder
    instance_units: dict[str, str] = field(default_factory=dict)  # kiln-vllm@NAME -> "ActiveState NRestarts"
    readable_in_instance: list[str] | None = None  # INSTANCE_SECRETS an instance's unit could read; None: not asked
    marketplace_report: str | None = None  # DigitalOcean's 99-img-check.sh run on the booted machine
    agent_kill: AgentKill | None = None
    timings_s: dict[str, float] = field(default_factory=dict)


def judge(seen: Observed, profile: str, expect_baked: bool = False) -> list[Check]:
    checks = []
    errors = (seen.cloud_init_result or {}).get("v1", {}).get("errors")
    done = "status: done" in seen.cloud_init_status
    status_line = next((line for line in seen.cloud_init_status.splitlines() if line.startswith("status:")),
                       "no status")  # `--wait` prints a line of dots first
    checks.append(Check("cloud-init finished without errors", done and errors == [],
                        f"{status_line}; errors: {errors}"))
    status = seen.agent_status or {}
    phase = status.get("phase")
    checks.append(Check("the agent started at boot", phase in AGENT_STARTED, f"phase: {phase}"))
    plan = status.get("plan") or {}
    choice = status.get("choice") or {}
    chosen = (choice.get("values") or {}).get("objective")
    checks.append(Check("the agent serves the choice the user-data made",
                        plan.get("profile") == profile and chosen == OBJECTIVE,
                        f"plan: {plan.get('profile')} ({len(plan.get('instances', []))} instance(s)), objective "
                        f"{chosen}; profile from: {(choice.get('origins') or {}).get('profile', 'unknown')}"))
    doctor = status.get("doctor") or {}
    blocking = [c for c in doctor.get("checks", []) if c.get("status") == "fail"]
    checks.append(Check("the boot pre-flight (kiln doctor) found nothing blocking",
                        bool(doctor) and doctor.get("verdict") != "blocked",
                        f"{doctor.get('verdict', 'no report')}: {doctor.get('summary', '')}"
                        + "".join(f"; {c['check']}: {c.get('fix', '')}" for c in blocking)))
    ports = {int(i["port"]) for i in plan.get("instances", []) if "port" in i}
    bad = unexpected_listeners(seen.listeners, ports)
    shown = ", ".join(f"{s.proto} {s.address}:{s.port} ({s.process or '?'})" for s in bad)
    checks.append(Check("only the documented ports listen", bool(seen.listeners) and not bad,
                        shown or f"{len(seen.listeners)} listening sockets, all documented"))
    checks.append(Check("the instances' user can write its state and caches", not seen.unwritable_for_instances,
                        f"not writable by {INSTANCE_USER}: {', '.join(seen.unwritable_for_instances)}"
                        if seen.unwritable_for_instances else f"{', '.join(STATE_DIRS)} writable by {INSTANCE_USER}"))
    checks.append(Check("the agent's own folder is out of the instances' reach", seen.agent_dir_writable is False,
                        f"{AGENT_DIR} {'is writable' if seen.agent_dir_writable else 'is not writable'} by "
                        f"{INSTANCE_USER}"))
    running = {u: s for u, s in seen.instance_units.items() if s == "active 0"}  # up, and never restarted
    checks.append(Check("the vLLM instances run as their systemd units",
                        bool(running) and running == seen.instance_units,
                        ", ".join(f"{u}: {s}" for u, s in seen.instance_units.items()) or "no instance unit"))
    if seen.readable_in_instance is not None:
        checks.append(Check("a model server reads none of the owner's secrets", not seen.readable_in_instance,
                            f"readable in an instance's unit: {', '.join(seen.readable_in_instance)}"
                            if seen.readable_in_instance else f"{', '.join(INSTANCE_SECRETS)} hidden from it"))
    checks.append(Check("the public endpoint asks for the API key", seen.public_unauthorized == 401,
                        f"HTTP {seen.public_unauthorized} without a key"))
    tls = status.get("tls") or {}
    checks.append(Check("the public endpoint serves TLS with the certificate the agent reports",
                        bool(seen.served_sha256) and seen.served_sha256 == tls.get("sha256"),
                        f"served SHA-256 {seen.served_sha256}; reported {tls.get('mode')} {tls.get('sha256')}"))
    checks.append(Check("plain HTTP redirects to HTTPS", (seen.http_redirect or "").startswith("301 https://"),
                        seen.http_redirect or "no answer"))
    if seen.nmap_open is not None:
        expected = sorted(public_tcp())
        checks.append(Check(f"an nmap scan through the firewall finds only {', '.join(map(str, expected))} open",
                            seen.nmap_open == expected, f"open: {seen.nmap_open}; {seen.nmap_summary}"))
    checks.append(Check("the health endpoint is not reachable from outside", seen.health_from_outside != "answered",
                        seen.health_from_outside))
    if seen.agent_kill is not None:
        checks.append(judge_agent_kill(seen.agent_kill))
    if seen.marketplace_report is not None:
        checks.append(marketplace_check(seen.marketplace_report))
    if expect_baked:
        download = status.get("download") or {}
        checks.append(Check("the model baked into the image is used: nothing downloaded or made at boot",
                            download.get("state") == "baked",
                            str(download.get("detail") or f"no baked model found; download: {download or 'none'}")))
    return checks


_COLOURS = re.compile(r"\x1b\[[0-9;]*m")


def strip_colours(text: str) -> str:
    return _COLOURS.sub("", text)


def marketplace_check(report: str) -> Check:
    """DigitalOcean's own check on the booted machine: no FAIL, and the firewall active (a chroot cannot show it).
    The booted machine has logs of its own boot, which the check warns about; the image build runs it before them."""
    lines = report.splitlines()
    fails = [line for line in lines if line.startswith("[FAIL]")]
    warns = [line for line in lines if line.startswith("[WARN]")]
    firewall = next((line for line in lines if "Firewall service" in line or "No firewall" in line), "no firewall line")
    ok = bool(lines) and not fails and firewall.startswith("[PASS]")
    detail = (f"{sum(line.startswith('[PASS]') for line in lines)} PASS, {len(warns)} WARN, {len(fails)} FAIL; "
              f"{firewall.removeprefix('[PASS] ')}" + "".join(f"; {line}" for line in fails))
    return Check("DigitalOcean's Marketplace check (99-img-check.sh) finds no FAIL on the booted image", ok, detail)


def report_dict(checks: list[Check], seen: Observed) -> dict[str, Any]:
    return {"ok": all(c.ok for c in checks), "checks": [c.__dict__ for c in checks],
            "timings_s": {k: round(v, 1) for k, v in seen.timings_s.items()},
            "phase": (seen.agent_status or {}).get("phase"),
            "plan": (seen.agent_status or {}).get("plan"),
            "download": (seen.agent_status or {}).get("download"),
            "cache": (seen.agent_status or {}).get("cache"),
            "startup": (seen.agent_status or {}).get("startup"),
            "marketplace_report": seen.marketplace_report,
            "listeners": [s.__dict__ for s in seen.listeners]}


def dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2)
