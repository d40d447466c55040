"""This node's place in a cluster: its rank, the head's address, the nodes by rank. Pure.

Given explicitly (`cluster: {head, rank}`) or found from the droplets tagged `kiln-cluster:NAME`: ranks follow
the droplets' IDs, lowest first, so every node works out the same answer from the same list, and the head
(rank 0) is the oldest droplet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kiln.choice.schema import ClusterSetting


@dataclass(frozen=True)
class Droplet:
    id: int
    name: str
    private_address: str | None
    vpc_uuid: str | None = None


@dataclass(frozen=True)
class Membership:
    name: str
    nodes: int
    rank: int
    head_address: str
    address: str  # this node's private address
    interface: str | None  # the interface that holds it
    found_by: str  # "user-data" or the tag
    names: tuple[str, ...] = ()  # the nodes' names by rank, where known

    @property
    def is_head(self) -> bool:
        return self.rank == 0

    def node_name(self, rank: int) -> str:
        return self.names[rank] if rank < len(self.names) else f"rank {rank}"

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "nodes": self.nodes, "rank": self.rank,
                "role": "head" if self.is_head else "worker", "head": self.head_address, "address": self.address,
                "interface": self.interface, "found_by": self.found_by}


@dataclass(frozen=True)
class NotYet:
    """The cluster cannot be formed yet, or not by this node: what is wrong and the fix."""

    what: str
    fix: str
    final: bool = False  # waiting will not help


def explicit(setting: ClusterSetting, address: str, interface: str | None) -> Membership:
    assert setting.head is not None and setting.rank is not None
    return Membership(setting.name, setting.nodes, setting.rank, setting.head, address, interface, "user-data")


def from_droplets(setting: ClusterSetting, own_id: int, droplets: Sequence[Droplet],
                  interface: str | None) -> Membership | NotYet:
    """The membership the tagged droplets give, or why it cannot be made from them yet."""
    tag = setting.tag
    tagged = sorted({d.id: d for d in droplets}.values(), key=lambda d: d.id)
    if own_id not in {d.id for d in tagged}:
        return NotYet(f"this droplet ({own_id}) is not among the {len(tagged)} tagged {tag}",
                      f"tag it: doctl compute droplet tag {own_id} --tag-name {tag}")
    if len(tagged) < setting.nodes:
        return NotYet(f"{len(tagged)} of {setting.nodes} droplets tagged {tag} so far "
                      f"({', '.join(d.name for d in tagged)})",
                      f"create the other {setting.nodes - len(tagged)} with the same user-data and tag {tag}")
    chosen = tagged[:setting.nodes]
    rank = next((i for i, d in enumerate(chosen) if d.id == own_id), None)
    if rank is None:
        return NotYet(f"{len(tagged)} droplets are tagged {tag} but the cluster has {setting.nodes} nodes; this one "
                      f"({own_id}) is not among the {setting.nodes} oldest, so it takes no part",
                      f"delete it, or raise cluster.nodes to {len(tagged)} on every node", final=True)
    vpcs = {d.vpc_uuid for d in chosen if d.vpc_uuid}
    if len(vpcs) > 1:
        return NotYet(f"the droplets tagged {tag} are in {len(vpcs)} VPCs ("
                      f"{', '.join(f'{d.name}: {d.vpc_uuid}' for d in chosen)}); nodes reach each other only "
                      "inside one", "recreate them in one VPC (doctl compute droplet create --vpc-uuid ...)",
                      final=True)
    missing = [d.name for d in chosen if not d.private_address]
    if missing:
        return NotYet(f"{', '.join(missing)} has no private address yet",
                      "droplets in one cluster need the same VPC; wait for the network, or recreate them in it")
    me = chosen[rank]
    head = chosen[0]
    assert me.private_address is not None and head.private_address is not None
    return Membership(setting.name, setting.nodes, rank, head.private_address, me.private_address, interface,
                      f"tag {tag}", tuple(d.name for d in chosen))
