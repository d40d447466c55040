"""`kiln fleet up | scale | down | status`: read what exists, say what will change and what it costs per hour,
and change it only once the user agrees. The API and the question to the user are passed in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from kiln.choice.schema import validate_fields
from kiln.choice.userdata import SOURCE, extract_settings
from kiln.errors import ConfigError, KilnError
from kiln.fleet.spec import Changes, FleetSpec, changes_for, droplet_requests, firewall_request, load_balancer_request

Confirm = Callable[[str], bool]
Probe = Callable[[str], str]  # a droplet's public address -> what its /health says


class Api(Protocol):
    def sizes(self) -> list[dict[str, Any]]: ...
    def droplets(self, tag: str) -> list[dict[str, Any]]: ...
    def load_balancer(self, name: str) -> dict[str, Any] | None: ...
    def firewall(self, name: str) -> dict[str, Any] | None: ...
    def create_droplets(self, body: dict[str, Any]) -> list[dict[str, Any]]: ...
    def create_load_balancer(self, body: dict[str, Any]) -> dict[str, Any]: ...
    def create_firewall(self, body: dict[str, Any]) -> dict[str, Any]: ...
    def delete_droplet(self, droplet_id: int) -> None: ...
    def delete_tagged_droplets(self, tag: str) -> None: ...
    def delete_load_balancer(self, lb_id: str) -> None: ...
    def delete_firewall(self, firewall_id: str) -> None: ...


class NotConfirmedError(KilnError):
    """The user did not confirm; nothing was changed."""


@dataclass(frozen=True)
class Existing:
    droplets: list[dict[str, Any]]
    load_balancer: dict[str, Any] | None
    firewall: dict[str, Any] | None


def read(api: Api, spec: FleetSpec) -> Existing:
    return Existing(api.droplets(spec.tag), api.load_balancer(spec.resource_name), api.firewall(spec.resource_name))


def price_per_hour(api: Api, spec: FleetSpec) -> float:
    """The size's hourly price from the API's size list; a size it does not offer, or not in the region, is
    refused with the sizes and regions it does offer."""
    sizes = api.sizes()
    size = next((s for s in sizes if s["slug"] == spec.size), None)
    if size is None:
        gpu = sorted(s["slug"] for s in sizes if s.get("gpu_info") and s.get("regions"))
        raise ConfigError(f"DigitalOcean offers no size {spec.size!r} to this account",
                          fix="GPU sizes offered: " + (", ".join(gpu) or "none (ask support for GPU quota)"))
    if spec.region and spec.region not in size.get("regions", []):
        raise ConfigError(f"{spec.size} is not offered in {spec.region}",
                          fix="regions that offer it: " + (", ".join(size.get("regions") or []) or "none"))
    return float(size["price_hourly"])


def describe(spec: FleetSpec, changes: Changes, hourly: float, running: int) -> str:
    lines = []
    if changes.create:
        lines.append(f"create {len(changes.create)} droplet(s) {spec.size} in {spec.region} "
                     f"({', '.join(changes.create)}) at ${hourly:,.2f}/h each")
    if changes.delete:
        lines.append(f"delete {len(changes.delete)} droplet(s): ids {', '.join(map(str, changes.delete))}")
    if changes.load_balancer:
        lines.append(f"create load balancer {spec.resource_name}: HTTPS 443 to the tag {spec.tag}, "
                     "health check GET /health")
    if changes.firewall:
        lines.append(f"create firewall {spec.resource_name}: SSH from {', '.join(spec.ssh_from)}, 443 from the "
                     "load balancer only")
    after = running + len(changes.create) - len(changes.delete)
    lines.append(f"the fleet then runs {after} droplet(s): ${after * hourly:,.2f}/h "
                 "(plus the load balancer's own price)")
    return "\n".join(f"  - {line}" for line in lines)


def apply(api: Api, spec: FleetSpec, changes: Changes, existing: Existing) -> dict[str, Any]:
    """Make the changes: droplets first (the load balancer and firewall follow their tag), then the load
    balancer, then the firewall that lets only it reach port 443."""
    created: list[dict[str, Any]] = []
    for body in droplet_requests(spec, list(changes.create)):
        created += api.create_droplets(body)
    for droplet_id in changes.delete:
        api.delete_droplet(droplet_id)
    lb = existing.load_balancer or api.create_load_balancer(load_balancer_request(spec))
    fw = existing.firewall or api.create_firewall(firewall_request(spec, str(lb["id"])))
    return {"created": [d["name"] for d in created], "deleted": list(changes.delete),
            "load_balancer": {"id": lb["id"], "ip": lb.get("ip") or None, "status": lb.get("status")},
            "firewall": {"id": fw["id"], "status": fw.get("status")}}


def check_user_data(text: str) -> None:
    """The agent's own reading of the user-data, before any droplet is paid for: a problem it would report at
    boot on every droplet is refused here."""
    found = extract_settings(text.encode("utf-8"))
    problems = [*found.problems, *validate_fields(found.settings, source=SOURCE).problems]
    if problems:
        raise ConfigError("the user-data has problems every droplet would report at boot: "
                          + "; ".join(p.text() for p in problems),
                          fix="fix the user-data (`kiln choice --root DIR` reads it as the agent will)")


def up(api: Api, spec: FleetSpec, confirm: Confirm) -> dict[str, Any]:
    """The fleet as `spec` says: only what is missing is created; a second `up` changes nothing."""
    check_user_data(spec.user_data)
    existing = read(api, spec)
    changes = changes_for(spec, existing.droplets, existing.load_balancer is not None,
                          existing.firewall is not None, max(spec.count, len(existing.droplets)))
    return _change(api, spec, changes, existing, confirm)


def scale(api: Api, spec: FleetSpec, count: int | Callable[[str], int], confirm: Confirm) -> dict[str, Any]:
    """The fleet at `count` droplets, or at the count a function of its droplets' size gives (sizing by demand),
    from one read of the fleet."""
    existing = read(api, spec)
    if not existing.droplets:
        raise ConfigError(f"fleet {spec.name} has no droplets to scale", fix=f"create it with `kiln fleet up --name "
                          f"{spec.name} ...`")
    first = existing.droplets[0]  # new droplets match the fleet's: its size, region, image and network
    if callable(count):
        count = count(str(first["size_slug"]))
    spec = replace(spec, size=first["size_slug"], count=count, region=first["region"]["slug"],
                   image=spec.image or str(first.get("image", {}).get("id", "")), vpc_uuid=first.get("vpc_uuid"))
    changes = changes_for(spec, existing.droplets, True, True, count)
    if changes.create and not spec.user_data:
        raise ConfigError("new droplets need the fleet's user-data", fix="pass --user-data FILE, as to `kiln fleet up`")
    if changes.create:
        check_user_data(spec.user_data)
    return _change(api, spec, changes, existing, confirm)


def _change(api: Api, spec: FleetSpec, changes: Changes, existing: Existing, confirm: Confirm) -> dict[str, Any]:
    if changes.none:
        return {"changed": False, "droplets": len(existing.droplets), "summary": "nothing to change"}
    hourly = price_per_hour(api, spec) if changes.create or changes.delete else 0.0
    summary = describe(spec, changes, hourly, len(existing.droplets))
    if not confirm(f"kiln fleet {spec.name} will:\n{summary}"):
        raise NotConfirmedError("not confirmed; nothing was changed", fix="run it again and confirm, or pass --yes")
    done = apply(api, spec, changes, existing)
    return {"changed": True, "summary": summary, "usd_per_hour_each": hourly, **done}


def down(api: Api, spec: FleetSpec, confirm: Confirm) -> dict[str, Any]:
    existing = read(api, spec)
    if not existing.droplets and not existing.load_balancer and not existing.firewall:
        return {"changed": False, "summary": f"fleet {spec.name} does not exist"}
    parts = [f"delete {len(existing.droplets)} droplet(s) tagged {spec.tag}: "
             + ", ".join(d["name"] for d in existing.droplets)] if existing.droplets else []
    parts += [f"delete load balancer {spec.resource_name}"] if existing.load_balancer else []
    parts += [f"delete firewall {spec.resource_name}"] if existing.firewall else []
    summary = "\n".join(f"  - {p}" for p in parts)
    if not confirm(f"kiln fleet {spec.name} will:\n{summary}\nThe droplets' disks and data are lost."):
        raise NotConfirmedError("not confirmed; nothing was deleted", fix="run it again and confirm, or pass --yes")
    if existing.load_balancer:
        api.delete_load_balancer(str(existing.load_balancer["id"]))
    if existing.firewall:
        api.delete_firewall(str(existing.firewall["id"]))
    if existing.droplets:
        api.delete_tagged_droplets(spec.tag)
    return {"changed": True, "summary": summary}


def _address(droplet: dict[str, Any], kind: str) -> str | None:
    return next((n["ip_address"] for n in droplet.get("networks", {}).get("v4", []) if n.get("type") == kind), None)


def status(api: Api, spec: FleetSpec, probe: Probe) -> dict[str, Any]:
    """Each droplet (state, addresses, its own /health) and the load balancer's view (state, the droplets it
    targets)."""
    existing = read(api, spec)
    lb = existing.load_balancer
    targeted = set(lb.get("droplet_ids") or []) if lb else set()
    rows = []
    for d in existing.droplets:
        public = _address(d, "public")
        rows.append({"id": d["id"], "name": d["name"], "status": d["status"], "size": d.get("size_slug"),
                     "public_ip": public, "private_ip": _address(d, "private"),
                     "health": probe(public) if public and d["status"] == "active" else "not reachable yet",
                     "behind_load_balancer": d["id"] in targeted})
    return {"fleet": spec.name, "tag": spec.tag, "droplets": rows,
            "load_balancer": None if lb is None else {"id": lb["id"], "ip": lb.get("ip") or None,
                                                      "status": lb.get("status"),
                                                      "droplet_ids": sorted(targeted)},
            "firewall": None if existing.firewall is None else {"id": existing.firewall["id"],
                                                                "status": existing.firewall.get("status")}}
