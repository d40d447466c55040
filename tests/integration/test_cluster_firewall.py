"""The cluster's firewall for real: ufw set up as the image sets it (incoming dropped but SSH, 443 and 80), then
kiln's own open_firewall() on the head, in a network namespace whose /etc/ufw is a private copy (so the machine
running the test keeps its own). Connections come from a second namespace, once from an address in the VPC's
range and once from one outside it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from tests.netns import Pair, can_make_namespaces, in_namespace, ip, namespaces_left, two_namespaces

pytestmark = pytest.mark.skipif(not can_make_namespaces(), reason="network namespaces need root and iproute2")

PAIR = Pair(("kiln-fw0", "kiln-fw1"), ("kiln-f0", "kiln-f1"), ("10.233.0.1", "10.233.0.2"))
OUTSIDE = "10.233.1.2"  # the second node's address outside the VPC's range (10.233.0.0/24)
PEER, MASTER, EPHEMERAL, CLOSED, SSH = 8091, 29500, 40000, 9999, 22

HEAD = textwrap.dedent(f"""
    from kiln.cluster.membership import Membership
    from kiln.serve.cluster_node import open_firewall
    head = Membership("pair", 2, 0, "{PAIR.addresses[0]}", "{PAIR.addresses[0]}", "{PAIR.links[0]}", "user-data")
    for _ in range(2):  # again, as at every boot: ufw skips a rule it has
        print("open_firewall:", open_firewall(head, ({PEER}, {MASTER})))
""")


def _image_firewall_then_kiln(copy: Path) -> str:
    """The shell run in a private mount namespace: the image's ufw, then kiln's rules, then ufw's status."""
    ns = PAIR.namespaces[0]
    return " && ".join([
        f"mount --bind {copy / 'ufw'} /etc/ufw", f"mount --bind {copy / 'default-ufw'} /etc/default/ufw",
        *(f"ip netns exec {ns} ufw allow {port}/tcp" for port in (SSH, 443, 80)),
        f"ip netns exec {ns} ufw --force enable",
        f"ip netns exec {ns} {sys.executable} -c '{HEAD}'",
        f"ip netns exec {ns} ufw status"])


def _reaches(source: str, port: int) -> bool:
    argv = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "2", "--interface", source,
            f"http://{PAIR.addresses[0]}:{port}/"]
    done = subprocess.run(in_namespace(PAIR.namespaces[1], argv), capture_output=True, text=True, check=False)
    return done.stdout == "200"


def test_the_cluster_ports_open_to_the_vpc_only_and_ssh_stays_open(tmp_path: Path) -> None:
    if shutil.which("ufw") is None:
        pytest.fail("ufw is not installed (ci/setup.sh installs it)")
    shutil.copytree("/etc/ufw", tmp_path / "ufw")
    default = (Path("/etc/default/ufw").read_text(encoding="utf-8")
               .replace('DEFAULT_INPUT_POLICY="ACCEPT"', 'DEFAULT_INPUT_POLICY="DROP"'))
    (tmp_path / "default-ufw").write_text(default, encoding="utf-8")
    host_rules = Path("/etc/ufw/user.rules").read_bytes()
    servers: list[subprocess.Popen[bytes]] = []
    with two_namespaces(PAIR):
        ip("-n", PAIR.namespaces[1], "addr", "add", f"{OUTSIDE}/24", "dev", PAIR.links[1])
        ip("-n", PAIR.namespaces[0], "route", "add", "10.233.1.0/24", "dev", PAIR.links[0])
        try:
            done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                                   _image_firewall_then_kiln(tmp_path)], capture_output=True, text=True,
                                  check=False, timeout=120)
            assert done.returncode == 0, done.stdout + done.stderr
            assert done.stdout.count("open_firewall: None") == 2, done.stdout
            status = done.stdout[done.stdout.index("Status: active"):]
            assert f"{PEER}/tcp" in status and "10.233.0.0/24" in status and "kiln cluster" in status, status
            for port in (PEER, MASTER, EPHEMERAL, CLOSED, SSH):
                servers.append(subprocess.Popen(in_namespace(PAIR.namespaces[0], [
                    sys.executable, "-m", "http.server", str(port), "--bind", PAIR.addresses[0],
                    "--directory", str(tmp_path)]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            assert all(_wait_listening(port) for port in (PEER, MASTER, EPHEMERAL, CLOSED, SSH)), \
                "the test's servers did not start"
            seen = {(source, port): _reaches(source, port) for source in (PAIR.addresses[1], OUTSIDE)
                    for port in (PEER, MASTER, EPHEMERAL, CLOSED)}
            ssh_from_outside = _reaches(OUTSIDE, SSH)
        finally:
            for server in servers:
                server.kill()
                server.wait()
    inside = PAIR.addresses[1]
    assert seen == {(inside, PEER): True, (inside, MASTER): True, (inside, EPHEMERAL): True, (inside, CLOSED): False,
                    (OUTSIDE, PEER): False, (OUTSIDE, MASTER): False, (OUTSIDE, EPHEMERAL): False,
                    (OUTSIDE, CLOSED): False}
    assert ssh_from_outside
    assert Path("/etc/ufw/user.rules").read_bytes() == host_rules  # this machine's own firewall is untouched
    assert not namespaces_left(PAIR)


def _wait_listening(port: int, tries: int = 100) -> bool:
    """True once the server on `port` answers inside its own namespace, where the firewall lets everything through
    (each server is a Python start-up away, slower while other work shares the cores)."""
    argv = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "2", f"http://{PAIR.addresses[0]}:{port}/"]
    for _ in range(tries):
        done = subprocess.run(in_namespace(PAIR.namespaces[0], argv), capture_output=True, text=True, check=False)
        if done.stdout == "200":
            return True
        time.sleep(0.2)
    return False
