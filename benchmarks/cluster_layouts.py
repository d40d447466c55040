"""The layouts of a model across nodes, predicted side by side for each link between the nodes.

Run: .venv/bin/python -m benchmarks.cluster_layouts [PROFILE] [MACHINE] [NODES]
(default: deepseek-v3.2 on 2 x h100x8). For each bandwidth, from DigitalOcean's 25 Gbit/s VPC to a 3,200 Gbit/s
GPU fabric, every layout kiln plans (a pipeline stage per node; experts over every GPU of every node) with the
predicted output and time per token for the default workload, and its output as a ratio of the VPC's best:
where the network decides the layout, and by how much.
"""

from __future__ import annotations

import sys
import time

from kiln.choice.schema import Choice
from kiln.cli.output import table
from kiln.perf.predict import kiln_steps
from kiln.perf.workload import resolve
from kiln.planner.cluster import ClusterPlan, plan_cluster
from kiln.wiring import Kiln

LINKS_GBPS = (25, 100, 400, 3200)


def main(argv: list[str]) -> int:
    profile_name, machine_name, nodes = (argv + ["deepseek-v3.2", "h100x8", "2"][len(argv):])[:3]
    kiln = Kiln.create()
    machine, profile = kiln.machine(machine_name), kiln.catalog().get(profile_name)
    workload = resolve(None)
    rows, baseline = [], None
    for gbps in LINKS_GBPS:
        network = kiln.network("vpc" if gbps == 25 else "fabric", gbps)
        began = time.perf_counter()
        result = plan_cluster(machine, int(nodes), profile, Choice(), workload, kiln.constants, network,
                              lambda plan: kiln_steps(plan, machine, profile, kiln.constants))
        took = time.perf_counter() - began
        if not isinstance(result, ClusterPlan):
            print(f"{gbps} Gbit/s: not a cluster: {getattr(result, 'reason', 'one node holds it')}")
            return 1
        for option in (result.chosen, *result.alternatives):
            f = option.option.forecast
            baseline = baseline or result.chosen.option.forecast.output_tokens_per_s
            spec = option.option.plan.engine.speculative_config
            rows.append([f"{gbps:,}", option.layout.label, "on" if spec else "off",
                         f"{f.output_tokens_per_s:,.0f}", f"{f.output_tokens_per_s / baseline:.2f}x",
                         f"{f.tpot_ms['p50']:,.1f}", "chosen" if option is result.chosen else ""])
        rows.append(["", f"(search: {took:.1f} s)", "", "", "", "", ""])
    print(f"{profile.name} on {nodes} x {machine.name}, {workload.shape()}, kiln's engine")
    print(table(["Gbit/s per node", "Layout", "Speculative", "Output tok/s", "vs VPC's best", "TPOT p50 ms", ""],
                rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
