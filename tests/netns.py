"""Two network namespaces joined by a veth pair, each with its own address: two "nodes" on one machine."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

NAMESPACES = ("kiln-node0", "kiln-node1")
LINKS = ("kiln-n0", "kiln-n1")
ADDRESSES = ("10.231.0.1", "10.231.0.2")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextmanager
def two_namespaces() -> Iterator[None]:
    """Made, and removed with every process left in them, whatever happens."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    for ns in NAMESPACES:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)  # a crashed run's leftovers
    try:
        for ns in NAMESPACES:
            _ip("netns", "add", ns)
        _ip("link", "add", LINKS[0], "type", "veth", "peer", "name", LINKS[1])
        for ns, link, address in zip(NAMESPACES, LINKS, ADDRESSES, strict=True):
            _ip("link", "set", link, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", ns, "link", "set", link, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield
    finally:
        for ns in NAMESPACES:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False).stdout
            for pid in pids.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def in_namespace(ns: str, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def namespaces_left() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [ns for ns in NAMESPACES if ns in listed]
