"""What the agent reads back from what it runs, every few seconds and on each scrape: each instance's start-up
timeline from its log, the token rate from vLLM's counters, and the Prometheus exposition of kiln, the router
and the instances together."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

from kiln.serve.layout import ServeLayout
from kiln.serve.processes.probes import fetch_text
from kiln.serve.processes.supervisor import Supervisor
from kiln.serve.reports import metrics as prom
from kiln.serve.reports.startup import parse_startup
from kiln.serve.reports.state import AgentState

log = logging.getLogger("kiln.agent")


@dataclass
class Reports:
    state: AgentState
    layout: ServeLayout
    supervisor: Callable[[], Supervisor | None]  # none until the plan starts
    _timelines: dict[str, tuple[object, bool]] = field(default_factory=dict)  # instance -> (its run, complete)

    def instance_metrics(self) -> dict[str, str]:
        sup = self.supervisor()
        if not sup:
            return {}
        return {m.name: fetch_text(f"{m.route_url}/metrics") for m in sup.ready_instances() if m.route_url}

    def read_startups(self) -> None:
        """Each instance's start-up phases from its log, until its current run is ready."""
        sup = self.supervisor()
        if not sup:
            return
        for member in sup.instances:
            running = member.running
            seen = self._timelines.get(member.name)
            if running is None or (seen and seen[0] is running and seen[1]):
                continue
            timeline = parse_startup(running.log_lines())
            self._timelines[member.name] = (running, timeline.ready_s is not None)
            self.state.startup.setdefault("instances", {})[member.name] = timeline.as_dict()
            if timeline.ready_s is not None:
                log.info("%s ready %.1f s after vLLM started: %s", member.name, timeline.ready_s,
                         ", ".join(f"{p.name} {p.seconds:.1f} s" for p in timeline.phases))

    def meter(self) -> None:
        self.read_startups()
        texts = self.instance_metrics()
        self.state.meter.observe(time.monotonic(), {n: prom.generation_tokens(t) for n, t in texts.items() if t})

    def router_families(self) -> list[Metric]:
        """vllm-router's metrics; with several models, every model's router's, labelled kiln_router."""
        def text(n: int) -> str:
            return fetch_text(f"http://{self.layout.local_host}:{self.layout.for_router(n).router_metrics_port}/metrics")

        sup = self.supervisor()
        more = [link.member.name for link in sup.more_routers] if sup else []
        if not more:
            return prom.parse(text(0))
        texts = {"router": text(0), **{name: text(int(name.rsplit("-", 1)[1])) for name in more}}
        return prom.merge_labelled(texts, "kiln_router")

    def metrics(self) -> bytes:
        status = self.state.status(with_telemetry=False)
        families = prom.kiln_families(status, self.state.telemetry())
        families += self.router_families()
        texts = self.instance_metrics()
        families += prom.capacity_families(status.get("plan"), texts)
        families += prom.merge_labelled(texts, "kiln_instance")
        return prom.exposition(families)
