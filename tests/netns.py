"""Two network namespaces joined by a veth pair, each with its own address: two "nodes" on one machine."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Pair:
    namespaces: tuple[str, str]
    links: tuple[str, str]
    addresses: tuple[str, str]  # each with the /24 network the pair shares


NODES = Pair(("kiln-node0", "kiln-node1"), ("kiln-n0", "kiln-n1"), ("10.231.0.1", "10.231.0.2"))
NAMESPACES, LINKS, ADDRESSES = NODES.namespaces, NODES.links, NODES.addresses


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextmanager
def two_namespaces(pair: Pair = NODES) -> Iterator[Pair]:
    """Made, and removed with every process left in them, whatever happens."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    for ns in pair.namespaces:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)  # a crashed run's leftovers
    try:
        for ns in pair.namespaces:
            ip("netns", "add", ns)
        ip("link", "add", pair.links[0], "type", "veth", "peer", "name", pair.links[1])
        for ns, link, address in zip(pair.namespaces, pair.links, pair.addresses, strict=True):
            ip("link", "set", link, "netns", ns)
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", link)
            ip("-n", ns, "link", "set", link, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield pair
    finally:
        for ns in pair.namespaces:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False).stdout
            for pid in pids.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def in_namespace(ns: str, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def namespaces_left(pair: Pair = NODES) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [ns for ns in pair.namespaces if ns in listed.split()]
