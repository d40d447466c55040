"""When a reloaded nginx has put its new configuration in force. After SIGHUP its master starts new workers, waits
100 ms, then tells the old ones to shut down gracefully: until an old worker has done so, it still accepts
connections and answers them with the old keys. Judged from the workers' titles, which nginx rewrites."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Set

WORKER = "nginx: worker process"
SHUTTING_DOWN = "nginx: worker process is shutting down"  # set just before the worker closes its listening sockets


def serving_workers(children: Mapping[int, str]) -> set[int]:
    """The master's workers that accept connections."""
    return {pid for pid, title in children.items() if title.startswith(WORKER) and not title.startswith(SHUTTING_DOWN)}


def in_force(children: Mapping[int, str], before: Set[int]) -> bool:
    """True once a worker started after the reload accepts connections and none from before does."""
    serving = serving_workers(children)
    return bool(serving - before) and not serving & before


def wait_in_force(read_children: Callable[[], Mapping[int, str]], before: Set[int], timeout_s: float,
                  poll_s: float = 0.02) -> bool:
    """Poll the master's workers until the new configuration is in force; False when it was not within timeout_s
    (nginx refused it, or is too busy to start its workers)."""
    deadline = time.monotonic() + timeout_s
    while not in_force(read_children(), before):
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True
