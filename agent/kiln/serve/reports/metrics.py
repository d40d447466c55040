"""/metrics: kiln's own gauges, vllm-router's metrics, and every instance's vLLM metrics labelled by instance,
merged into one valid Prometheus exposition."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

GENERATION_TOKENS = "vllm:generation_tokens"  # counter family; its sample is vllm:generation_tokens_total


def parse(text: str) -> list[Metric]:
    try:
        return list(text_string_to_metric_families(text))
    except ValueError:
        return []


def generation_tokens(text: str) -> float:
    """The instance's output tokens so far, summed over its engines."""
    return sum(s.value for f in parse(text) if f.name == GENERATION_TOKENS for s in f.samples
               if s.name.endswith("_total"))


def requests_in_flight(text: str) -> float | None:
    """Requests an instance is running or holding in its queue, summed over its engines; None when the text does
    not parse or lacks vLLM's gauges (unknown, which is not idle)."""
    gauges = [f for f in parse(text) if f.name in ("vllm:num_requests_running", "vllm:num_requests_waiting")]
    if len({f.name for f in gauges}) < 2:
        return None
    return sum(s.value for f in gauges for s in f.samples)


def merge_labelled(sources: Mapping[str, str], label: str) -> list[Metric]:
    """Families of the same name from several sources become one family, each sample labelled with its source."""
    merged: dict[str, Metric] = {}
    for source, text in sources.items():
        for family in parse(text):
            target = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type,
                                                           family.unit))
            target.samples.extend(s._replace(labels={**s.labels, label: source}) for s in family.samples)
    return list(merged.values())


def kiln_families(status: Mapping[str, Any], telemetry: Iterable[Mapping[str, Any]]) -> list[Metric]:
    phase = GaugeMetricFamily("kiln_phase", "1 for the agent's current phase", labels=["phase"])
    phase.add_metric([str(status.get("phase"))], 1)
    ready = GaugeMetricFamily("kiln_instance_ready", "1 while the instance serves and is routed",
                              labels=["instance"])
    restarts = GaugeMetricFamily("kiln_instance_restarts", "times the instance was restarted", labels=["instance"])
    for inst in status.get("instances", []):
        ready.add_metric([inst["name"]], 1 if inst["state"] == "ready" else 0)
        restarts.add_metric([inst["name"]], inst["restarts"])
    families: list[Metric] = [phase, ready, restarts]
    serving = status.get("serving", {})
    families.append(GaugeMetricFamily("kiln_output_tokens_per_second",
                                      "output tokens per second over the last minute, all instances",
                                      value=serving.get("output_tokens_per_s", 0.0)))
    if serving.get("usd_per_hour") is not None:
        families.append(GaugeMetricFamily("kiln_usd_per_hour", "the machine's price per hour",
                                          value=serving["usd_per_hour"]))
    if serving.get("usd_per_million_output_tokens") is not None:
        families.append(GaugeMetricFamily("kiln_usd_per_million_output_tokens",
                                          "cost of a million output tokens at the current rate",
                                          value=serving["usd_per_million_output_tokens"]))
    gauges = {"utilization_percent": ("kiln_gpu_utilization_percent", "GPU utilization"),
              "memory_used_bytes": ("kiln_gpu_memory_used_bytes", "GPU memory in use"),
              "temperature_c": ("kiln_gpu_temperature_celsius", "GPU temperature"),
              "power_w": ("kiln_gpu_power_watts", "GPU power draw")}
    readings = list(telemetry)
    for key, (name, doc) in gauges.items():
        family = GaugeMetricFamily(name, doc, labels=["gpu"])
        for gpu in readings:
            if gpu.get(key) is not None:
                family.add_metric([str(gpu["index"])], float(gpu[key]))
        families.append(family)
    return families


def capacity_families(plan: Mapping[str, Any] | None, instance_texts: Mapping[str, str]) -> list[Metric]:
    """The load against the plan's capacity within its budget: requests in flight (running or queued in vLLM)
    over the streams the machine carries, for an operator's autoscaler. Absent when the plan has no capacity."""
    capacity = ((plan or {}).get("predicted") or {}).get("capacity") or {}
    if not capacity.get("streams"):
        return []
    families: list[Metric] = [
        GaugeMetricFamily("kiln_capacity_streams", "requests in flight the machine carries within the plan's latency "
                          "budget (predicted)", value=float(capacity["streams"])),
        GaugeMetricFamily("kiln_capacity_requests_per_second", "Poisson arrivals the machine carries within the "
                          "plan's latency budget (predicted)", value=float(capacity["requests_per_s"]))]
    counts = [requests_in_flight(text) for text in instance_texts.values()]
    if counts and all(c is not None for c in counts):
        in_flight = sum(c for c in counts if c is not None)
        families.append(GaugeMetricFamily("kiln_requests_in_flight", "requests running or queued, all instances",
                                          value=in_flight))
        families.append(GaugeMetricFamily("kiln_load_vs_capacity", "requests in flight over the capacity's streams: "
                                          "above 1 the latency budget no longer holds", value=in_flight /
                                          float(capacity["streams"])))
    return families


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        seen: set[str] = set()
        for family in self.families:
            if family.name not in seen:
                seen.add(family.name)
                yield family


def exposition(families: list[Metric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)
