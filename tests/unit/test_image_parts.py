"""The image build's and the smoke test's pure parts: command lines, the seed, the port verdict."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest
import yaml

from kiln.choice.userdata import extract_settings
from kiln.image import local, recipe, smoke
from kiln.image.progress import Progress

ROOTFS = Path("/build/rootfs")


def test_mmdebstrap_keeps_apt_lists_for_the_roles_and_includes_the_boot_essentials() -> None:
    argv = recipe.mmdebstrap_argv(recipe.LocalImage("kiln", "1.2.3"), ROOTFS)
    assert argv[:2] == ["mmdebstrap", "--variant=minbase"]
    assert "--skip=cleanup/apt/lists" in argv
    included = next(a for a in argv if a.startswith("--include=")).removeprefix("--include=").split(",")
    assert {"linux-image-cloud-amd64", "grub-pc", "cloud-init", "systemd-sysv", "python3-apt"} <= set(included)
    assert argv[argv.index(str(ROOTFS)) - 1] == recipe.SUITE
    assert any("bookworm-security" in m for m in argv)


def test_the_playbook_runs_over_the_chroot_with_the_build_environment() -> None:
    image = recipe.LocalImage("kiln", "1.2.3", extra_vars={"vllm_flavour": "cpu"})
    env = recipe.build_environment(ca_bundle=True, wheelhouses=2)
    argv = recipe.playbook_argv("/tools/ansible-playbook", Path("/repo"), ROOTFS, Path("/w/kiln.whl"), image, env)
    assert argv[:5] == ["/tools/ansible-playbook", "-i", f"{ROOTFS},", "-c", "community.general.chroot"]
    assert argv[-1] == "/repo/image/playbook.yml"
    extra = json.loads(argv[argv.index("-e") + 1])
    assert extra["kiln_agent_wheel"] == "/w/kiln.whl" and extra["kiln_agent_profiles_dir"] == "/repo/profiles"
    assert extra["vllm_flavour"] == "cpu" and extra["ansible_become"] is False
    ca = "/run/kiln-build/ca.crt"
    assert extra["kiln_build_environment"] == {
        "debian_chroot": "kiln-build", "PIP_CERT": ca, "REQUESTS_CA_BUNDLE": ca, "SSL_CERT_FILE": ca,
        "PIP_FIND_LINKS": "/run/kiln-build/wheels0 /run/kiln-build/wheels1"}
    env = recipe.playbook_env(Path("/repo"), "/usr/bin:/bin")
    assert env["ANSIBLE_ROLES_PATH"] == "/repo/roles" and env["PATH"] == "/usr/bin:/bin"
    assert not any(k.startswith(("PIP_", "REQUESTS_", "SSL_")) for k in env)
    assert recipe.build_environment(ca_bundle=False, wheelhouses=0) == {"debian_chroot": "kiln-build"}


def test_the_disk_boots_by_label_with_a_serial_console() -> None:
    assert recipe.FSTAB.startswith(f"LABEL={recipe.ROOT_LABEL} / ext4")
    assert "console=ttyS0" in recipe.GRUB_DEFAULTS
    assert "start=2048" in recipe.PARTITION_TABLE and "bootable" in recipe.PARTITION_TABLE
    assert recipe.POLICY_RC_D.rstrip().endswith("exit 101")


def test_the_smoke_user_data_is_what_a_user_writes() -> None:
    text = smoke.user_data("tiny-cpu", "ssh-ed25519 AAAA test\n")
    assert text.startswith("#cloud-config\n")
    doc = yaml.safe_load(text)
    assert doc["users"][0]["ssh_authorized_keys"] == ["ssh-ed25519 AAAA test"]
    settings = extract_settings(text.encode())
    assert not settings.problems
    assert settings.settings["profile"] == "tiny-cpu" and settings.settings["objective"] == "latency"


def test_qemu_is_tcg_restricted_and_forwards_only_on_localhost() -> None:
    fwd = smoke.Forwards(ssh=2222, public=2443, health=2890, http=2080)
    argv = smoke.qemu_argv(Path("/w/o.qcow2"), Path("/w/seed.iso"), Path("/w/c.log"), Path("/w/q.sock"), fwd, 4096, 2)
    joined = " ".join(argv)
    assert "-accel tcg" in joined and "kvm" not in joined
    netdev = argv[argv.index("-netdev") + 1]
    assert "restrict=on" in netdev
    forwards = [part for part in netdev.split(",") if part.startswith("hostfwd=")]
    assert forwards == ["hostfwd=tcp:127.0.0.1:2222-:22", "hostfwd=tcp:127.0.0.1:2443-:443",
                        "hostfwd=tcp:127.0.0.1:2890-:8090", "hostfwd=tcp:127.0.0.1:2080-:80"]
    assert "tap" not in joined
    scanned = smoke.qemu_argv(Path("/w/o.qcow2"), Path("/w/seed.iso"), Path("/w/c.log"), Path("/w/q.sock"), fwd,
                              4096, 2, scan=smoke.ScanLink("kscan1", "10.213.1.1", "10.213.1.2"))
    assert "tap,id=net1,ifname=kscan1,script=no,downscript=no" in scanned
    assert f"virtio-net-pci,netdev=net1,mac={smoke.SCAN_MAC}" in scanned


def test_nmaps_grepable_output_gives_the_open_ports() -> None:
    out = ("# Nmap 7.93 scan initiated as: nmap -Pn -n -sS -p- -oG - 10.213.1.2\n"
           "Host: 10.213.1.2 ()\tStatus: Up\n"
           "Host: 10.213.1.2 ()\tPorts: 22/open/tcp//ssh///, 80/open/tcp//http///, 443/open/tcp//https///, "
           "8000/closed/tcp//http-alt///\tIgnored State: filtered (65531)\n"
           "# Nmap done at Mon Nov 23 12:00:00 2026 -- 1 IP address (1 host up) scanned in 80.12 seconds\n")
    assert smoke.parse_nmap_open(out) == [22, 80, 443]


SS = """\
udp   UNCONN 0      0            0.0.0.0:68         0.0.0.0:*    users:(("dhclient",pid=401,fd=7))
udp   UNCONN 0      0          127.0.0.1:323        0.0.0.0:*    users:(("chronyd",pid=512,fd=5))
tcp   LISTEN 0      128          0.0.0.0:22         0.0.0.0:*    users:(("sshd",pid=600,fd=3))
tcp   LISTEN 0      4096         0.0.0.0:443        0.0.0.0:*    users:(("nginx",pid=900,fd=6))
tcp   LISTEN 0      511          0.0.0.0:80         0.0.0.0:*    users:(("nginx",pid=900,fd=7))
tcp   LISTEN 0      128        127.0.0.1:8090       0.0.0.0:*    users:(("kiln",pid=700,fd=9))
tcp   LISTEN 0      128        127.0.0.1:8001       0.0.0.0:*    users:(("vllm-router",pid=800,fd=9))
tcp   LISTEN 0      128        127.0.0.1:8002       0.0.0.0:*    users:(("vllm-router",pid=800,fd=10))
tcp   LISTEN 0      2048       127.0.0.1:8100       0.0.0.0:*    users:(("python",pid=850,fd=20))
tcp   LISTEN 0      100        127.0.0.1:41233      0.0.0.0:*    users:(("VLLM::EngineCor",pid=851,fd=30))
tcp   LISTEN 0      128             [::]:22            [::]:*    users:(("sshd",pid=600,fd=4))
"""


def test_ss_output_is_parsed_with_owners() -> None:
    listeners = smoke.parse_ss(SS)
    assert len(listeners) == 11
    assert listeners[0] == smoke.Listener("udp", "0.0.0.0", 68, "dhclient")
    assert listeners[-1] == smoke.Listener("tcp", "::", 22, "sshd")


def test_documented_ports_pass_and_anything_else_is_named() -> None:
    listeners = smoke.parse_ss(SS)
    assert smoke.unexpected_listeners(listeners, {8100}) == []
    extra = smoke.parse_ss(SS + 'tcp LISTEN 0 128 0.0.0.0:8090 0.0.0.0:* users:(("kiln",pid=700,fd=11))\n'
                                'tcp LISTEN 0 128 127.0.0.1:6379 0.0.0.0:* users:(("redis",pid=1,fd=1))\n')
    assert [(s.address, s.port) for s in smoke.unexpected_listeners(extra, {8100})] == [
        ("0.0.0.0", 8090), ("127.0.0.1", 6379)]
    # An instance port the plan does not have is not documented.
    assert [s.port for s in smoke.unexpected_listeners(listeners, set())] == [8100]


DOCTOR_HEALTHY = {"verdict": "healthy", "summary": "every check passed",
                  "checks": [{"check": "gpus", "status": "skip", "detail": "no NVIDIA GPU"}]}


UNITS = {"kiln-vllm@vllm-0.service": "2211 0", "kiln-router.service": "2105 0", "kiln-proxy.service": "2101 0"}
AGENT_KILLED = smoke.AgentKill((1804, 2950), UNITS, UNITS, endpoint_answered=41, endpoint_missed=0, back_s=38.2)


def _observed(**overrides: object) -> smoke.Observed:
    seen = smoke.Observed(
        cloud_init_result={"v1": {"datasource": "DataSourceNoCloud", "errors": []}},
        cloud_init_status="status: done\ntime: Sun, 22 Nov 2026 20:00:00 +0000",
        agent_status={"phase": "starting", "plan": {"profile": "tiny-cpu", "instances": [{"port": 8100}]},
                      "choice": {"values": {"profile": "tiny-cpu", "objective": "latency"},
                                 "origins": {"profile": "user-data (cloud-init)"}},
                      "doctor": DOCTOR_HEALTHY, "tls": {"mode": "self-signed", "sha256": "AB:CD"}},
        listeners=smoke.parse_ss(SS), public_unauthorized=401, health_from_outside="no answer (ReadTimeout)",
        served_sha256="AB:CD", http_redirect="301 https://10.0.2.15/v1/models", nmap_open=[22, 80, 443],
        agent_dir_writable=False, instance_units={"kiln-vllm@vllm-0.service": "active 0"},
        readable_in_instance=[],
        agent_kill=AGENT_KILLED)
    for key, value in overrides.items():
        setattr(seen, key, value)
    return seen


def test_a_healthy_boot_passes_every_check() -> None:
    checks = smoke.judge(_observed(), "tiny-cpu")
    assert [c.name for c in checks if not c.ok] == []
    assert len(checks) == 15


def test_each_failure_is_reported_by_its_check() -> None:
    def failed(seen: smoke.Observed, profile: str = "tiny-cpu") -> list[str]:
        return [c.name for c in smoke.judge(seen, profile) if not c.ok]

    assert failed(_observed(cloud_init_result={"v1": {"errors": ["boom"]}})) == ["cloud-init finished without errors"]
    assert failed(_observed(cloud_init_status="status: error")) == ["cloud-init finished without errors"]
    assert failed(_observed(agent_status={"phase": "failed", "plan": {"profile": "tiny-cpu"}})) == [
        "the agent started at boot", "the agent serves the choice the user-data made",
        "the boot pre-flight (kiln doctor) found nothing blocking", "only the documented ports listen",
        "the public endpoint serves TLS with the certificate the agent reports"]
    blocked = {"verdict": "blocked", "summary": "shared memory: /dev/shm is not mounted",
               "checks": [{"check": "shared memory", "status": "fail", "fix": "mount a larger /dev/shm"}]}
    seen = _observed()
    assert seen.agent_status is not None
    assert failed(_observed(agent_status={**seen.agent_status, "doctor": blocked})) == [
        "the boot pre-flight (kiln doctor) found nothing blocking"]
    assert failed(_observed(), profile="qwen3-8b") == ["the agent serves the choice the user-data made"]
    assert failed(_observed(public_unauthorized=200)) == ["the public endpoint asks for the API key"]
    assert failed(_observed(health_from_outside="answered")) == ["the health endpoint is not reachable from outside"]
    assert failed(_observed(served_sha256="EF:01")) == [
        "the public endpoint serves TLS with the certificate the agent reports"]
    assert failed(_observed(http_redirect="200 ")) == ["plain HTTP redirects to HTTPS"]
    assert failed(_observed(nmap_open=[22, 80, 443, 8000])) == [
        "an nmap scan through the firewall finds only 22, 80, 443 open"]
    assert failed(_observed(listeners=[])) == ["only the documented ports listen"]
    assert failed(_observed(unwritable_for_instances=["/var/lib/kiln/home"])) == [
        "the instances' user can write its state and caches"]
    assert failed(_observed(agent_dir_writable=True)) == ["the agent's own folder is out of the instances' reach"]
    assert failed(_observed(readable_in_instance=["/etc/kiln/kiln.yaml"])) == [
        "a model server reads none of the owner's secrets"]
    for crashed in ("failed 5", "activating 2"):
        assert failed(_observed(instance_units={"kiln-vllm@vllm-0.service": crashed})) == [
            "the vLLM instances run as their systemd units"]
    kill = "kill -9 of the agent: systemd restarts it, the units it started keep running and the endpoint answers " \
           "throughout"
    restarted_instance = {**UNITS, "kiln-vllm@vllm-0.service": "3310 0"}
    for broken in (dataclasses.replace(AGENT_KILLED, agent_pids=(1804, 0)),  # systemd did not restart it
                   dataclasses.replace(AGENT_KILLED, back_s=None),  # it restarted but never planned again
                   dataclasses.replace(AGENT_KILLED, units_after=restarted_instance),  # it restarted an instance
                   dataclasses.replace(AGENT_KILLED, endpoint_missed=3)):  # the endpoint went away meanwhile
        assert failed(_observed(agent_kill=broken)) == [kill]
    assert "2211 0" in smoke.judge_agent_kill(AGENT_KILLED).detail
    report = smoke.report_dict(smoke.judge(_observed(), "tiny-cpu"), _observed())
    assert report["ok"] is True and report["phase"] == "starting"


# Lines as DigitalOcean's 99-img-check.sh v1.8.1 prints them (roles/image_cleanup/files), colours and all.
MARKETPLACE_BOOTED = (
    "\x1b[32m[PASS]\x1b[0m Cloud-init is installed.\n"
    "\x1b[32m[PASS]\x1b[0m Firewall service (ufw) is active\n"
    "\x1b[32m[PASS]\x1b[0m There are no pending security updates for this image.\n"
    "\x1b[93m[WARN]\x1b[0m un-cleared log file, /var/log/cloud-init.log found; Contents:\n"
    "\x1b[32m[PASS]\x1b[0m User root has no password set.\n")


def test_digitaloceans_marketplace_check_on_the_booted_image() -> None:
    report = smoke.strip_colours(MARKETPLACE_BOOTED)
    check = smoke.marketplace_check(report)
    assert check.ok and check.detail == "4 PASS, 1 WARN, 0 FAIL; Firewall service (ufw) is active"
    root = report.replace("[PASS] User root has no password set.",
                          "[FAIL] User root has a password set on their account.")
    failed = smoke.marketplace_check(root)
    assert not failed.ok and failed.detail.endswith("; [FAIL] User root has a password set on their account.")
    chroot = report.replace("[PASS] Firewall service (ufw) is active",
                            "[WARN] No firewall is configured. Ensure ufw is installed and configured")
    assert not smoke.marketplace_check(chroot).ok  # booted, the firewall must be on
    assert smoke.judge(_observed(marketplace_report=root), "tiny-cpu")[-1].name.startswith("DigitalOcean's")


def test_progress_shows_milestones_not_every_line() -> None:
    out = io.StringIO()
    progress = Progress(steps=2, out=out)
    progress.step("roles")
    for line in ["TASK [vllm : Install vLLM] ****", "ok: [/rootfs]", "I: extracting archives...", "noise"]:
        progress.line(line)
    progress.done("built")
    text = out.getvalue()
    assert "[1/2] roles" in text and "TASK [vllm : Install vLLM]" in text and "I: extracting archives" in text
    assert "ok: [/rootfs]" not in text and "noise" not in text and "in all)" in text


def test_the_work_folder_is_never_removed_through_a_mount(tmp_path: Path) -> None:
    assert "/proc" in local._mounts_under(Path("/"))
    assert local._mounts_under(tmp_path) == []
    (tmp_path / "work" / "rootfs").mkdir(parents=True)
    local._remove_work(tmp_path / "work")
    assert not (tmp_path / "work").exists()


def test_the_wheelhouses_offered_are_existing_local_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_FIND_LINKS", f"{tmp_path} https://example.invalid/wheels {tmp_path / 'missing'}")
    assert tmp_path in local.pip_wheelhouses()
    assert all(p.is_dir() for p in local.pip_wheelhouses())
