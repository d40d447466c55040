"""The firewall rules a cluster's node needs, opened to the VPC's range only. Pure; the agent runs them with ufw.

Fixed ports: kiln's peer channel, torch's rendezvous (pipeline) or vLLM's data-parallel coordinator. The rest of
the traffic between nodes (Gloo, NCCL and vLLM's message queues) binds ephemeral ports, so Linux's ephemeral
range is opened too, to the VPC only: the public interface stays closed.
"""

from __future__ import annotations

from collections.abc import Iterable

EPHEMERAL = "32768:60999"  # net.ipv4.ip_local_port_range's default
COMMENT = "kiln cluster"


def cluster_rules(vpc: str, ports: Iterable[int]) -> list[list[str]]:
    """ufw's argv for each rule: TCP from the VPC's range to each port, and to the ephemeral range."""
    out = [["ufw", "allow", "proto", "tcp", "from", vpc, "to", "any", "port", str(p), "comment", COMMENT]
           for p in sorted(set(ports))]
    out.append(["ufw", "allow", "proto", "tcp", "from", vpc, "to", "any", "port", EPHEMERAL, "comment", COMMENT])
    return out
