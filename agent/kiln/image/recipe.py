"""What the local image build does, as values: command lines and file contents. No I/O here.

The local build needs no cloud account and no base image download: mmdebstrap assembles Debian 12 from
the apt mirror, the same playbook as the DigitalOcean build runs over Ansible's chroot connection, and
the tree goes onto a partitioned disk with GRUB, then into a compressed qcow2.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

SUITE = "bookworm"
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# What a Debian cloud image has that the roles build on: a kernel for VMs, GRUB, systemd, cloud-init
# with growpart, SSH, and Python with apt bindings for Ansible. DHCP through ifupdown, which
# cloud-init's ENI renderer configures.
BASE_PACKAGES = (
    "systemd-sysv", "dbus", "linux-image-cloud-amd64", "grub-pc", "cloud-init", "cloud-guest-utils",
    "openssh-server", "sudo", "python3", "python3-apt", "ifupdown", "isc-dhcp-client", "ca-certificates",
    "iproute2", "netbase", "procps", "locales",
)
# cloud-init sets LANG=en_US.UTF-8 at first boot (its cc_locale), which fails unless that locale exists.
LOCALE_HOOK = 'echo "en_US.UTF-8 UTF-8" > "$1/etc/locale.gen" && chroot "$1" locale-gen'

ROOT_LABEL = "root"
FSTAB = f"LABEL={ROOT_LABEL} / ext4 defaults,errors=remount-ro 0 1\n"
# Serial console first so `kiln image smoke` (and a cloud's serial log) sees the boot.
GRUB_DEFAULTS = """\
GRUB_DEFAULT=0
GRUB_TIMEOUT=1
GRUB_DISTRIBUTOR=kiln
GRUB_CMDLINE_LINUX_DEFAULT=""
GRUB_CMDLINE_LINUX="console=tty0 console=ttyS0,115200n8 net.ifnames=0"
GRUB_TERMINAL="console serial"
GRUB_SERIAL_COMMAND="serial --speed=115200"
"""
# Loopback only: cloud-init's ENI renderer writes the NIC's stanza into interfaces.d at first boot (DHCP
# on the first NIC, eth0 with net.ifnames=0, unless the datasource gives a network config).
INTERFACES = """\
source /etc/network/interfaces.d/*
auto lo
iface lo inet loopback
"""
# Package scripts in a chroot must not start daemons on the build machine.
POLICY_RC_D = "#!/bin/sh\n# kiln image build: no daemons start inside the build chroot\nexit 101\n"
# One bootable DOS partition from 1 MiB: GRUB's core image sits in the gap before it.
PARTITION_TABLE = "label: dos\nstart=2048, type=83, bootable\n"
# Inside the chroot, where the build machine's CA bundle and wheelhouses are bind-mounted read-only.
BUILD_MOUNT = "/run/kiln-build"


@dataclass(frozen=True)
class LocalImage:
    name: str
    version: str
    disk_gb: int = 16
    packages: tuple[str, ...] = BASE_PACKAGES
    mirrors: tuple[str, ...] = MIRRORS
    extra_vars: dict[str, object] = field(default_factory=dict)

    @property
    def file_name(self) -> str:
        return f"{self.name}-{self.version}.qcow2"


def mmdebstrap_argv(image: LocalImage, rootfs: Path) -> list[str]:
    # The apt lists stay for the roles' apt tasks; image_cleanup removes them at the end.
    return ["mmdebstrap", "--variant=minbase", "--components=main", "--skip=cleanup/apt/lists",
            "--include=" + ",".join(image.packages), f"--customize-hook={LOCALE_HOOK}",
            SUITE, str(rootfs), *image.mirrors]


def build_environment(ca_bundle: bool, wheelhouses: int) -> dict[str, str]:
    """Environment for every task of the chroot play: pip trusts the build machine's CAs and sees its
    wheelhouses (bind-mounted, so nothing of them stays in the image); debian_chroot tells Ansible's
    fact gathering it is in a chroot."""
    env = {"debian_chroot": "kiln-build"}
    if ca_bundle:
        # pip, requests (huggingface_hub) and Python's ssl each read their own variable.
        env |= {var: f"{BUILD_MOUNT}/ca.crt" for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")}
    if wheelhouses:
        env["PIP_FIND_LINKS"] = " ".join(f"{BUILD_MOUNT}/wheels{i}" for i in range(wheelhouses))
    return env


def playbook_argv(ansible_playbook: str, repo: Path, rootfs: Path, wheel: Path, image: LocalImage,
                  environment: dict[str, str]) -> list[str]:
    extra = {
        "kiln_agent_wheel": str(wheel),
        "kiln_agent_profiles_dir": str(repo / "profiles"),
        "kiln_build_environment": environment,
        # The chroot connection already runs as root; sudo inside a bare chroot only adds noise.
        "ansible_become": False,
        **image.extra_vars,
    }
    return [ansible_playbook, "-i", f"{rootfs},", "-c", "community.general.chroot",
            "-e", json.dumps(extra), str(repo / "image" / "playbook.yml")]


def playbook_env(repo: Path, path: str) -> dict[str, str]:
    """ansible-playbook's whole environment: the chroot connection hands it to every task, so nothing of
    the build machine's (its pip and CA settings name paths the chroot does not have) may leak in."""
    return {
        "PATH": path,
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "ANSIBLE_ROLES_PATH": str(repo / "roles"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_HOST_KEY_CHECKING": "False",
        "ANSIBLE_RETRY_FILES_ENABLED": "False",
        "debian_chroot": "kiln-build",
    }


def qcow2_argv(raw: Path, out: Path) -> list[str]:
    return ["qemu-img", "convert", "-p", "-f", "raw", "-O", "qcow2", "-c", "-o", "compression_type=zstd",
            str(raw), str(out)]


def grub_install_argv(disk: str) -> list[str]:
    return ["grub-install", "--target=i386-pc", "--recheck", disk]
