"""Values as dicts for --json, and as text for people."""

from __future__ import annotations

import shlex
from typing import Any

from kiln.cli.coldstart_view import cold_start_table
from kiln.cli.output import gib, table
from kiln.hardware.model import Machine
from kiln.profiles.schema import Profile
from kiln.render.vllm import RenderedInstance
from kiln.setup.headline import capacity_clause, headline_of, held_phrase
from kiln.setup.types import Plan


def machine_dict(m: Machine) -> dict[str, Any]:
    return {
        "name": m.name,
        "source": m.source,
        "description": m.description,
        "droplet_size": m.droplet_size,
        "driver_version": m.driver_version,
        "cuda_driver_version": m.cuda_driver_version,
        "host": {"cpu_count": m.host.cpu_count, "memory_bytes": m.host.memory_bytes,
                 "disk_free_bytes": m.host.disk_free_bytes},
        "gpus": [
            {"index": g.index, "name": g.name, "uuid": g.uuid, "memory_bytes": g.memory_bytes,
             "compute_capability": f"{g.compute_capability[0]}.{g.compute_capability[1]}",
             "architecture": g.architecture.value, "gpu_class": g.spec.class_name,
             "memory_bandwidth_gb_s": g.spec.memory_bandwidth_gb_s, "pci_bus_id": g.pci_bus_id,
             "numa_node": g.numa_node, "cpus": list(g.cpus), "mig_enabled": g.mig_enabled,
             "nvlink_links": g.nvlink_links}
            for g in m.gpus
        ],
        "nvlink": [list(row) for row in m.nvlink],
        "topology": [list(row) for row in m.topology],
        "unsupported_accelerators": list(m.unsupported_accelerators),
        "accelerator_problem": m.accelerator_problem(),
    }


def _cpu_ranges(cpus: tuple[int, ...]) -> str:
    if not cpus:
        return "-"
    return f"{cpus[0]}-{cpus[-1]}" if cpus == tuple(range(cpus[0], cpus[-1] + 1)) else f"{len(cpus)} cpus"


def machine_text(m: Machine) -> str:
    head = [f"Machine   {m.name}" + (f"  ({m.description})" if m.description else ""),
            f"Source    {m.source}"]
    if m.droplet_size:
        head.append(f"Droplet   {m.droplet_size}")
    head.append(f"Host      {m.host.cpu_count} CPUs, {gib(m.host.memory_bytes)} RAM, "
                f"{gib(m.host.disk_free_bytes)} free disk")
    if m.driver_version:
        head.append(f"Driver    {m.driver_version} (CUDA {m.cuda_driver_version})")
    parts = ["\n".join(head)]
    if m.gpus:
        rows = [[g.index, g.name, f"{g.memory_gib:.1f} GiB", f"{g.compute_capability[0]}.{g.compute_capability[1]}",
                 g.architecture.value, g.pci_bus_id, "-" if g.numa_node is None else g.numa_node,
                 _cpu_ranges(g.cpus), {None: "n/a", True: "on", False: "off"}[g.mig_enabled], g.nvlink_links]
                for g in m.gpus]
        parts.append(table(["GPU", "Name", "Memory", "CC", "Arch", "PCI bus", "NUMA", "CPUs", "MIG", "NVLinks"],
                           rows))
        if m.gpu_count > 1:
            linked = all(m.linked(i, j) for i in range(m.gpu_count) for j in range(m.gpu_count))
            parts.append("Topology  " + ("every GPU pair is NVLink-connected" if linked else
                                         "not every GPU pair is NVLink-connected"))
    problem = m.accelerator_problem()
    if problem:
        parts.append(f"Note      {problem}")
    return "\n\n".join(parts)


def engine_rows(plan: Plan) -> list[list[str]]:
    """The engine's figures for the plan's workload, with the band its out-of-sample error gives."""
    p = plan.predicted
    if p.capacity is not None:
        return capacity_rows(plan, p.capacity)
    if p.output_tokens_per_s is None:
        return [["output tok/s", "not predicted"]]
    band = f" (likely {p.band.low:,.0f} to {p.band.high:,.0f}{p.band.promise()})" if p.band else ""
    rows = [["output tok/s (all instances)", f"{p.output_tokens_per_s:,.0f}{band}"]]
    if p.tokens_per_s_per_user is not None:
        rows.append(["tok/s per user (p50)", f"{p.tokens_per_s_per_user:,.1f}"])
    if p.ttft_ms_p90 is not None and p.tpot_ms_p90 is not None:
        rows.append(["TTFT / TPOT p90 ms", f"{p.ttft_ms_p90:,.0f} / {p.tpot_ms_p90:,.1f}"])
    if plan.workload:
        rows.append(["for the workload", str(plan.workload.get("description") or plan.workload.get("preset"))])
    return rows


def capacity_rows(plan: Plan, cap: dict[str, Any]) -> list[list[str]]:
    """The capacity at the budget first, then the figures at that load."""
    if not cap["streams"]:
        return [["capacity", headline_of(cap)]]
    band = cap.get("band")
    rows = [["capacity (all instances)", capacity_clause(cap)],
            ["output tok/s there", f"{cap['output_tokens_per_s']:,.0f}" + (
                f" (likely {band['output_tokens_per_s'][0]:,.0f} to {band['output_tokens_per_s'][1]:,.0f}"
                f"{held_phrase(band.get('held'))})"
                if band else "")],
            ["tok/s per GPU there", f"{cap['tokens_per_s_per_gpu']:,.0f}"],
            ["tok/s per user (p50)", f"{cap['tokens_per_s_per_user']:,.1f}"],
            ["TTFT / TPOT p90 ms there", f"{cap['ttft_ms_p90']:,.0f} / {cap['tpot_ms_p90']:,.1f}"]]
    if plan.workload:
        rows.append(["for the workload", str(plan.workload.get("description") or plan.workload.get("preset"))])
    return rows


def plan_text(plan: Plan, rendered: list[RenderedInstance]) -> str:
    p = plan.predicted
    e = plan.engine
    head = [
        f"Plan      {plan.profile} on {plan.machine} for {plan.objective}",
        f"Model     {e.model}" + (f" @ {e.revision}" if e.revision != "main" else ""),
        f"Serving   {plan.layout()}, {plan.quantization} weights, "
        f"KV cache {plan.kv_cache_dtype}, context {e.max_model_len:,}",
    ]
    rows = [[r.name, ",".join(map(str, r.gpus)) or "cpu", r.port,
             "-" if r.numa_node is None else r.numa_node] for r in rendered]
    predicted = table(["Predicted", "Value"], [
        ["weights per GPU", gib(p.weight_bytes_per_gpu)],
        ["KV bytes per token", f"{p.kv_bytes_per_token:,}"],
        ["KV cache per GPU", gib(p.kv_cache_bytes_per_gpu)],
        ["KV cache tokens per instance", f"{p.kv_cache_tokens_per_instance:,}"],
        ["max concurrency at full context", f"{p.max_concurrency_per_instance:.2f}"],
        *engine_rows(plan),
    ])
    why = "\n".join(f"  - {line}" for line in plan.explanation)
    commands = "\n".join(f"  {r.name}: " + shlex.join(r.argv) for r in rendered)
    parts = ["\n".join(head), table(["Instance", "GPUs", "Port", "NUMA"], rows), predicted, "Why\n" + why,
             "Commands\n" + commands]
    if plan.cold_start:
        parts.insert(3, cold_start_table(plan.cold_start))
    if plan.warnings:
        parts.append("Warnings\n" + "\n".join(f"  - {w}" for w in plan.warnings))
    return "\n\n".join(parts)


def profile_row(p: Profile) -> list[str]:
    a = p.architecture
    params = f"{a.params_total / 1e9:.1f}B" + (f" ({a.params_active / 1e9:.1f}B active)" if a.moe else "")
    spec = ",".join(dict.fromkeys(s.method for s in p.speculative)) or "-"  # one method may have several heads
    return [p.name, params, ",".join(p.checkpoints), f"{p.serving.max_model_len:,}", spec]
