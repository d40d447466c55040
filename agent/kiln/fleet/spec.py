"""A fleet on DigitalOcean: N droplets from one image behind a managed load balancer, and what to ask the API for
to get there from what exists. Pure: the request bodies and the changes, no I/O.

Shapes follow DigitalOcean's API specification (github.com/digitalocean/openapi): droplet multi-create
(`names`, at most ten per request), a load balancer that targets a tag, a cloud firewall on the same tag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kiln.errors import ConfigError

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")  # fits droplet, tag, firewall and load balancer names
MAX_NAMES_PER_CREATE = 10  # "Up to ten Droplets may be created this way at a time."
ANYWHERE = ("0.0.0.0/0", "::/0")


@dataclass(frozen=True)
class FleetSpec:
    name: str
    size: str = ""
    count: int = 0
    region: str = ""
    image: str = ""  # a snapshot's id, or an image slug
    user_data: str = ""
    ssh_keys: tuple[str, ...] = ()  # key ids or fingerprints registered with DigitalOcean
    ssh_from: tuple[str, ...] = ANYWHERE  # addresses allowed to reach port 22
    certificate_id: str | None = None  # a DigitalOcean certificate: the load balancer terminates TLS with it
    vpc_uuid: str | None = None
    tags: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not NAME.match(self.name):
            raise ConfigError(f"fleet name {self.name!r} is not usable",
                              fix="use 1 to 31 lower-case letters, digits and dashes, starting with a letter or digit")

    @property
    def tag(self) -> str:
        return f"kiln-fleet:{self.name}"

    @property
    def resource_name(self) -> str:
        """The load balancer's and the firewall's name (firewall names take no colon or underscore)."""
        return f"kiln-fleet-{self.name}"

    def droplet_name(self, index: int) -> str:
        return f"kiln-{self.name}-{index}"


def new_names(spec: FleetSpec, existing: list[str], count: int) -> list[str]:
    """`count` droplet names not yet taken, lowest numbers first."""
    taken, i = set(existing), 0
    out: list[str] = []
    while len(out) < count:
        if spec.droplet_name(i) not in taken:
            out.append(spec.droplet_name(i))
        i += 1
    return out


def droplet_requests(spec: FleetSpec, names: list[str]) -> list[dict[str, Any]]:
    """POST /v2/droplets bodies, at most ten names each."""
    bodies = []
    for start in range(0, len(names), MAX_NAMES_PER_CREATE):
        body: dict[str, Any] = {"names": names[start:start + MAX_NAMES_PER_CREATE], "region": spec.region,
                                "size": spec.size, "image": _image(spec.image), "tags": [spec.tag, *spec.tags],
                                "user_data": spec.user_data, "monitoring": True}
        if spec.ssh_keys:
            body["ssh_keys"] = [_image(k) for k in spec.ssh_keys]
        if spec.vpc_uuid:
            body["vpc_uuid"] = spec.vpc_uuid
        bodies.append(body)
    return bodies


def _image(ref: str) -> int | str:
    """Snapshot and key ids are integers in the API; slugs and fingerprints stay strings."""
    return int(ref) if ref.isdigit() else ref


def load_balancer_request(spec: FleetSpec) -> dict[str, Any]:
    """POST /v2/load_balancers: HTTPS to every droplet with the fleet's tag, health-checked on the public
    /health (no key; 200 while an instance is routed). Without a certificate the droplets' own TLS passes
    through; with one, the load balancer terminates TLS and re-encrypts to the droplets."""
    if spec.certificate_id:
        rule = {"entry_protocol": "https", "entry_port": 443, "target_protocol": "https", "target_port": 443,
                "certificate_id": spec.certificate_id}
    else:
        rule = {"entry_protocol": "https", "entry_port": 443, "target_protocol": "https", "target_port": 443,
                "tls_passthrough": True}
    body: dict[str, Any] = {
        "name": spec.resource_name, "region": spec.region, "tag": spec.tag, "forwarding_rules": [rule],
        # The agent's /health answers within milliseconds; three misses 10 s apart take a droplet out, and two
        # answers bring it back once its model serves again.
        "health_check": {"protocol": "https", "port": 443, "path": "/health", "check_interval_seconds": 10,
                         "response_timeout_seconds": 5, "unhealthy_threshold": 3, "healthy_threshold": 2},
        # Streams of long generations stay open well past the default 60 s idle time.
        "http_idle_timeout_seconds": 600,
    }
    if spec.vpc_uuid:
        body["vpc_uuid"] = spec.vpc_uuid
    return body


def firewall_request(spec: FleetSpec, load_balancer_id: str) -> dict[str, Any]:
    """POST /v2/firewalls: SSH from the user's addresses, 443 from the load balancer only; out, anything (the
    droplets fetch models from the Hugging Face Hub)."""
    anywhere = {"addresses": list(ANYWHERE)}
    out = [{"protocol": "tcp", "ports": "0", "destinations": anywhere},
           {"protocol": "udp", "ports": "0", "destinations": anywhere},
           {"protocol": "icmp", "destinations": anywhere}]
    return {"name": spec.resource_name, "tags": [spec.tag],
            "inbound_rules": [
                {"protocol": "tcp", "ports": "22", "sources": {"addresses": list(spec.ssh_from)}},
                {"protocol": "tcp", "ports": "443", "sources": {"load_balancer_uids": [load_balancer_id]}}],
            "outbound_rules": out}


@dataclass(frozen=True)
class Changes:
    """What `kiln fleet up` or `scale` will ask for."""

    create: tuple[str, ...] = ()  # droplet names
    delete: tuple[int, ...] = ()  # droplet ids
    load_balancer: bool = False
    firewall: bool = False

    @property
    def none(self) -> bool:
        return not (self.create or self.delete or self.load_balancer or self.firewall)


def changes_for(spec: FleetSpec, droplets: list[dict[str, Any]], has_load_balancer: bool, has_firewall: bool,
                count: int) -> Changes:
    """From the fleet's droplets (API objects) and resources, what reaches `count` droplets: the missing
    created, or the newest deleted."""
    names = [d["name"] for d in droplets]
    if count >= len(droplets):
        create = tuple(new_names(spec, names, count - len(droplets)))
        delete: tuple[int, ...] = ()
    else:
        create = ()
        delete = tuple(sorted((int(d["id"]) for d in droplets), reverse=True)[:len(droplets) - count])
    return Changes(create, delete, not has_load_balancer, not has_firewall)
