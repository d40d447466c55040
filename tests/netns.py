"""Two network namespaces joined by a veth pair, each with its own address: two "nodes" on one machine. The tests
and the multi-node benchmarks share it; each names its own pair, so they never meet."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Pair:
    namespaces: tuple[str, str]
    links: tuple[str, str]
    addresses: tuple[str, str]  # each with the /24 network the pair shares


NODES = Pair(("kiln-node0", "kiln-node1"), ("kiln-n0", "kiln-n1"), ("10.231.0.1", "10.231.0.2"))
NAMESPACES, LINKS, ADDRESSES = NODES.namespaces, NODES.links, NODES.addresses


def can_make_namespaces() -> bool:
    return os.geteuid() == 0 and shutil.which("ip") is not None


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def namespace_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False, timeout=30).stdout
    return [int(p) for p in out.split()]


def _kill_all(ns: str) -> None:
    for pid in namespace_pids(ns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _remove(pair: Pair) -> None:
    """Every process in them killed, twice (a dying process may start another), then the namespaces."""
    for ns in pair.namespaces:
        _kill_all(ns)
    time.sleep(0.5)
    for ns in pair.namespaces:
        _kill_all(ns)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False, timeout=30)


@contextmanager
def two_namespaces(pair: Pair = NODES) -> Iterator[Pair]:
    """Made (needs root and iproute2), and removed with every process left in them, whatever happens."""
    _remove(pair)  # a crashed run's leftovers
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
        _remove(pair)


def in_namespace(ns: str, argv: Sequence[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def namespaces_left(pair: Pair = NODES) -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [ns for ns in pair.namespaces if ns in listed.split()]
