"""An instance out of routing finishes its requests in flight before it stops (a rolling change)."""

from __future__ import annotations

import logging
import threading
import time

from kiln.serve.processes.probes import fetch_text
from kiln.serve.processes.supervisor import Member
from kiln.serve.reports import metrics as prom

log = logging.getLogger("kiln.agent")
DRAIN_S = 120.0  # a rolling change waits this long for an instance's requests in flight
# ... and wants it idle this long in a row: a request the router sent just before the instance left routing may still
# be in its API server, which vLLM's gauges (the engine's running and waiting requests) do not count yet.
DRAIN_SETTLE_S = 2.0


def drain(member: Member, stopping: threading.Event, timeout_s: float = DRAIN_S) -> None:
    """Wait until an instance out of routing has had no request running or waiting for DRAIN_SETTLE_S, or the
    bound passes. Metrics that do not come (a server busy streaming may answer late) say nothing: only its exit
    ends the wait early."""
    deadline = time.monotonic() + timeout_s
    idle_since: float | None = None
    while time.monotonic() < deadline and not stopping.is_set():
        if not member.route_url or member.running is None or member.running.exit_code() is not None:
            return
        text = fetch_text(f"{member.route_url}/metrics", timeout_s=5)
        if prom.requests_in_flight(text) == 0:  # None (no answer, or one that does not parse) is not idle
            idle_since = time.monotonic() if idle_since is None else idle_since
            if time.monotonic() - idle_since >= DRAIN_SETTLE_S:
                return
        else:
            idle_since = None
        time.sleep(0.5)
    log.warning("%s: still busy after %.0f s of draining; stopping it", member.name, timeout_s)
