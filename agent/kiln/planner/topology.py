"""Tensor-parallel sizes a model allows, and which GPUs serve together. Pure."""

from __future__ import annotations

from functools import partial

from kiln.hardware.model import Machine
from kiln.profiles.schema import Architecture as ModelArch


def tp_problem(arch: ModelArch, tp: int) -> str | None:
    """Why vLLM cannot shard this model `tp` ways, or None."""
    if tp < 1:
        return "tensor_parallel_size must be at least 1"
    if arch.num_attention_heads % tp:
        return f"{arch.num_attention_heads} attention heads do not split evenly over {tp} GPUs"
    if arch.mla is None and arch.num_kv_heads % tp and tp % arch.num_kv_heads:
        return f"{arch.num_kv_heads} KV heads neither divide nor are divided by {tp}"
    return None


def valid_tp_sizes(arch: ModelArch, gpu_count: int) -> list[int]:
    return [t for t in range(1, gpu_count + 1) if gpu_count % t == 0 and tp_problem(arch, t) is None]


def _linked_to_all(machine: Machine, gpu: int, chosen: list[int]) -> bool:
    return all(machine.linked(gpu, c) for c in chosen)


def _closeness(machine: Machine, anchor: int, gpu: int) -> tuple[bool, int, str]:
    """Sort key: same NUMA node first, then nearest in the PCIe/NVLink tree."""
    distance = machine.topology[anchor][gpu] if machine.topology else 0
    return (machine.gpus[gpu].numa_node != machine.gpus[anchor].numa_node, distance, machine.gpus[gpu].pci_bus_id)


def gpu_groups(machine: Machine, tp: int, count: int) -> list[tuple[int, ...]] | None:
    """`count` disjoint groups of `tp` GPUs, each NVLink-connected where the machine has NVLink,
    preferring GPUs on one NUMA node and close in the PCIe tree. None if they cannot be formed."""
    free = sorted(range(machine.gpu_count),
                  key=lambda i: (machine.gpus[i].numa_node or 0, machine.gpus[i].pci_bus_id))
    has_nvlink = any(machine.linked(i, j) for i in range(machine.gpu_count) for j in range(machine.gpu_count)
                     if i != j)
    groups: list[tuple[int, ...]] = []
    for _ in range(count):
        if len(free) < tp:
            return None
        chosen = [free[0]]
        while len(chosen) < tp:
            candidates = [g for g in free if g not in chosen
                          and (not has_nvlink or _linked_to_all(machine, g, chosen))]
            if not candidates:
                return None
            anchor = chosen[0]
            chosen.append(min(candidates, key=partial(_closeness, machine, anchor)))
        groups.append(tuple(sorted(chosen)))
        free = [g for g in free if g not in chosen]
    return groups


def group_numa(machine: Machine, group: tuple[int, ...]) -> tuple[int | None, tuple[int, ...]]:
    """The NUMA node all of a group's GPUs sit on (or None), and the CPUs close to them."""
    nodes = {machine.gpus[g].numa_node for g in group}
    cpus = sorted({c for g in group for c in machine.gpus[g].cpus})
    node = nodes.pop() if len(nodes) == 1 else None
    return node, tuple(cpus)
