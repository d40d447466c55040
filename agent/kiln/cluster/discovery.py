"""The adapters a node finds its cluster through: DigitalOcean's API (droplets by tag), its metadata (this
droplet's ID and private address), and the machine's own interfaces."""

from __future__ import annotations

import ipaddress
import json
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import psutil
import requests

from kiln.choice.sources import DO_METADATA_URL, HttpGet, requests_get
from kiln.cluster.membership import Droplet

DO_API_URL = "https://api.digitalocean.com"
PAGE = 200


class DiscoveryError(Exception):
    def __init__(self, what: str, fix: str) -> None:
        super().__init__(what)
        self.what, self.fix = what, fix


def _private_v4(networks: Any) -> str | None:
    for net in (networks or {}).get("v4") or []:
        if isinstance(net, dict) and net.get("type") == "private" and isinstance(net.get("ip_address"), str):
            return str(net["ip_address"])
    return None


def droplets_from_api(body: Any, tag: str) -> list[Droplet]:
    """The droplets in one page of GET /v2/droplets that carry `tag`."""
    out = []
    for d in (body or {}).get("droplets") or []:
        if isinstance(d, dict) and tag in (d.get("tags") or []) and isinstance(d.get("id"), int):
            vpc = d.get("vpc_uuid")
            out.append(Droplet(int(d["id"]), str(d.get("name") or d["id"]), _private_v4(d.get("networks")),
                               vpc if isinstance(vpc, str) else None))
    return out


@dataclass
class DigitalOceanDroplets:
    """GET /v2/droplets, read-only. GPU droplets are listed only with `type=gpus`, which the API will not combine
    with `tag_name`, so both lists are read and the tag is matched here."""

    token: str
    api_url: str = DO_API_URL
    timeout_s: float = 10.0

    def tagged(self, tag: str) -> list[Droplet]:
        found: dict[int, Droplet] = {}
        for query in ({"tag_name": tag}, {"type": "gpus"}):
            url: str | None = f"{self.api_url.rstrip('/')}/v2/droplets"
            params: dict[str, Any] | None = {**query, "per_page": PAGE}
            while url:
                body = self._get(url, params)
                found.update({d.id: d for d in droplets_from_api(body, tag)})
                url, params = self._next(body), None
        return sorted(found.values(), key=lambda d: d.id)

    def _next(self, body: dict[str, Any]) -> str | None:
        """The next page's link, on this client's API address (the API names its public one)."""
        link = ((body.get("links") or {}).get("pages") or {}).get("next")
        if not isinstance(link, str):
            return None
        parts = urlsplit(link)
        return f"{self.api_url.rstrip('/')}{parts.path}" + (f"?{parts.query}" if parts.query else "")

    def _get(self, url: str, params: dict[str, Any] | None) -> dict[str, Any]:
        try:
            response = requests.get(url, params=params, timeout=self.timeout_s,
                                    headers={"Authorization": f"Bearer {self.token}"})
        except requests.RequestException as exc:
            raise DiscoveryError(f"DigitalOcean's API is unreachable: {type(exc).__name__}",
                                 "check the droplet's outbound network; retrying") from exc
        if response.status_code in (401, 403):
            raise DiscoveryError(f"DigitalOcean's API refused do_token ({response.status_code})",
                                 "give a token with droplet:read scope in user-data's do_token")
        if response.status_code != 200:
            raise DiscoveryError(f"DigitalOcean's API answered {response.status_code} listing droplets",
                                 "retrying; see https://status.digitalocean.com")
        body = response.json()
        return body if isinstance(body, dict) else {}


def droplet_identity(http_get: HttpGet = requests_get, metadata_url: str = DO_METADATA_URL,
                     timeout_s: float = 2.0) -> tuple[int, str | None]:
    """This droplet's ID and private IPv4, from its metadata service."""
    try:
        data = json.loads(http_get(metadata_url, timeout_s))
    except (requests.RequestException, OSError, ValueError) as exc:
        raise DiscoveryError(f"the droplet's metadata is unreachable: {type(exc).__name__}",
                             "finding nodes by tag needs DigitalOcean's metadata service; or give "
                             "cluster.head and cluster.rank") from exc
    private = ((data.get("interfaces") or {}).get("private") or [{}])[0] if isinstance(data, dict) else {}
    address = ((private or {}).get("ipv4") or {}).get("ip_address")
    droplet_id = data.get("droplet_id") if isinstance(data, dict) else None
    if not isinstance(droplet_id, int):
        raise DiscoveryError("the droplet's metadata has no droplet_id", "is this a DigitalOcean droplet?")
    return droplet_id, address if isinstance(address, str) else None


def address_towards(peer: str) -> str:
    """The local address this machine sends from to reach `peer` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer, 9))
        return str(s.getsockname()[0])


def interface_of(address: str) -> tuple[str | None, str | None]:
    """The interface holding `address`, and its network (the VPC's range on a droplet's private interface)."""
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family == socket.AF_INET and a.address == address:
                network = ipaddress.ip_interface(f"{a.address}/{a.netmask}").network if a.netmask else None
                return name, str(network) if network else None
    return None, None
