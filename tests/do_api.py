"""A local HTTP server that answers as DigitalOcean's API v2 does, for `kiln fleet`'s tests.

Request and response shapes follow DigitalOcean's OpenAPI specification (github.com/digitalocean/openapi at
7c1300c: specification/resources/{droplets,load_balancers,firewalls,sizes}, specification/shared): paginated lists
with `links.pages.next` and `meta.total`; droplets created with `status: new` and no addresses, active with a
public and a private address when next read; GPU droplets listed only with `type=gpus`; 202 on creates, 204 on
deletes; errors as `{"id", "message"}`. Every request is recorded, so tests can check exactly what was asked.
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

TOKEN = "dop_v1_kilntest0123456789abcdef"  # the shape of a real token: do_token takes 16 or more characters


def _size(slug: str, hourly: float, regions: list[str], gpus: int = 0, vram_gib: int = 0, model: str = "") -> dict:
    size: dict[str, Any] = {"slug": slug, "memory": 1966080 if gpus == 8 else 245760 if gpus else 1024,
                            "vcpus": 160 if gpus == 8 else 20 if gpus else 1, "disk": 2046 if gpus == 8 else 720,
                            "transfer": 60.0 if gpus == 8 else 15.0, "price_monthly": round(hourly * 744, 2),
                            "price_hourly": hourly, "regions": regions, "available": True,
                            "description": f"{model} GPU - {gpus}X" if gpus else "Basic"}
    if gpus:
        size["gpu_info"] = {"count": gpus, "vram": {"amount": vram_gib, "unit": "gib"}, "model": model}
    return size


SIZES = [
    _size("s-1vcpu-1gb", 0.00744, ["nyc1", "nyc2", "tor1"]),
    _size("gpu-h100x1-80gb", 3.39, ["nyc2", "tor1"], 1, 80, "nvidia_h100"),
    _size("gpu-h100x8-640gb", 23.92, ["nyc2", "tor1"], 8, 640, "nvidia_h100"),
    _size("gpu-h200x8-1128gb", 27.52, ["atl1"], 8, 1128, "nvidia_h200"),
]


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    body: Any


@dataclass
class State:
    droplet_limit: int = 25
    droplets: dict[int, dict[str, Any]] = field(default_factory=dict)
    load_balancers: dict[str, dict[str, Any]] = field(default_factory=dict)
    firewalls: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(500000001))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def writes(self) -> list[tuple[str, str]]:
        """The changing requests, in order: what a test asserts `kiln fleet` asked for."""
        return [(r.method, r.path + ("?" + "&".join(f"{k}={v}" for k, v in sorted(r.query.items())) if r.query
                                     else "")) for r in self.requests if r.method != "GET"]


def _error(status: int, ident: str, message: str) -> tuple[int, dict[str, Any]]:
    return status, {"id": ident, "message": message, "request_id": "00000000-kiln-test"}


def _page(key: str, items: list[Any], query: dict[str, str], path: str) -> dict[str, Any]:
    per_page, page = int(query.get("per_page", 20)), int(query.get("page", 1))
    chunk = items[(page - 1) * per_page: page * per_page]
    pages = {}
    if page * per_page < len(items):
        pages = {"next": f"https://api.digitalocean.com{path}?page={page + 1}&per_page={per_page}",
                 "last": f"https://api.digitalocean.com{path}?page={-(-len(items) // per_page)}&per_page={per_page}"}
    return {key: chunk, "links": {"pages": pages}, "meta": {"total": len(items)}}


class Api:
    def __init__(self, state: State) -> None:
        self.s = state

    def handle(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
        parts = path.strip("/").split("/")
        if parts[:1] != ["v2"] or len(parts) < 2:
            return _error(404, "not_found", "The resource you requested could not be found.")
        kind, ident = parts[1], parts[2] if len(parts) > 2 else None
        handler = getattr(self, f"{method.lower()}_{kind}", None)
        if handler is None:
            return _error(404, "not_found", "The resource you requested could not be found.")
        return handler(ident, query, body)  # type: ignore[no-any-return]

    # -- sizes --------------------------------------------------------------------------------------------------
    def get_sizes(self, _ident: str | None, query: dict[str, str], _body: Any) -> tuple[int, Any]:
        return 200, _page("sizes", SIZES, query, "/v2/sizes")

    # -- droplets -----------------------------------------------------------------------------------------------
    def _settle(self) -> None:
        """A droplet created earlier is active, with its addresses, when next read."""
        for d in self.s.droplets.values():
            if d["status"] == "new" and d.get("_seen"):
                n = d["id"] % 250
                d["status"] = "active"
                d["networks"]["v4"] = [
                    {"ip_address": f"10.116.0.{n}", "netmask": "255.255.240.0", "gateway": "10.116.0.1",
                     "type": "private"},
                    {"ip_address": f"203.0.113.{n}", "netmask": "255.255.255.0", "gateway": "203.0.113.1",
                     "type": "public"}]
            d["_seen"] = True

    def get_droplets(self, ident: str | None, query: dict[str, str], _body: Any) -> tuple[int, Any]:
        self._settle()
        if "tag_name" in query and "type" in query:
            return _error(400, "bad_request", "tag_name can not be combined with name or type")
        every = [{k: v for k, v in d.items() if not k.startswith("_")} for d in self.s.droplets.values()]
        gpu = query.get("type") == "gpus"
        # "By default, only non-GPU Droplets are returned."
        chosen = [d for d in every if bool(d["gpu_info"]) == gpu]
        if "tag_name" in query:
            chosen = [d for d in chosen if query["tag_name"] in d["tags"]]
        return 200, _page("droplets", chosen, query, "/v2/droplets")

    def post_droplets(self, _ident: str | None, _query: dict[str, str], body: Any) -> tuple[int, Any]:
        names = body.get("names") or [body.get("name")]
        size = next((s for s in SIZES if s["slug"] == body.get("size")), None)
        if size is None or len(names) > 10 or not body.get("image"):
            return _error(422, "unprocessable_entity", "request payload validation failed")
        if body.get("region") not in size["regions"]:
            return _error(422, "unprocessable_entity", "Size is not available in this region.")
        if len(self.s.droplets) + len(names) > self.s.droplet_limit:
            return _error(422, "unprocessable_entity", "creating this/these droplet(s) will exceed your droplet limit")
        made = []
        for name in names:
            droplet_id = next(self.s.ids)
            droplet = {"id": droplet_id, "name": name, "memory": size["memory"], "vcpus": size["vcpus"],
                       "disk": size["disk"], "locked": False, "status": "new", "created_at": "2026-11-23T12:00:00Z",
                       "image": {"id": body["image"]} if isinstance(body["image"], int) else {"slug": body["image"]},
                       "size": size, "size_slug": size["slug"], "networks": {"v4": [], "v6": []},
                       "region": {"name": body["region"], "slug": body["region"], "available": True},
                       "tags": list(body.get("tags") or []), "vpc_uuid": body.get("vpc_uuid") or "vpc-default",
                       "gpu_info": size.get("gpu_info")}
            self.s.droplets[droplet_id] = droplet
            made.append({k: v for k, v in droplet.items() if not k.startswith("_")})
        actions = [{"id": d["id"] + 7000, "rel": "create", "href": f"https://api.digitalocean.com/v2/actions/"
                    f"{d['id'] + 7000}"} for d in made]
        return 202, {"droplets": made, "links": {"actions": actions}}

    def delete_droplets(self, ident: str | None, query: dict[str, str], _body: Any) -> tuple[int, Any]:
        if ident is not None:
            if self.s.droplets.pop(int(ident), None) is None:
                return _error(404, "not_found", "The resource you requested could not be found.")
            return 204, None
        tag = query.get("tag_name", "")
        for droplet_id in [i for i, d in self.s.droplets.items() if tag in d["tags"]]:
            del self.s.droplets[droplet_id]
        return 204, None

    # -- load balancers -----------------------------------------------------------------------------------------
    def _lb_view(self, lb: dict[str, Any]) -> dict[str, Any]:
        lb["droplet_ids"] = sorted(i for i, d in self.s.droplets.items() if lb["tag"] in d["tags"])
        return lb

    def get_load_balancers(self, ident: str | None, query: dict[str, str], _body: Any) -> tuple[int, Any]:
        for lb in self.s.load_balancers.values():
            if lb["status"] == "new":
                lb["status"], lb["ip"] = "active", "198.51.100.10"
        if ident is not None:
            lb = self.s.load_balancers.get(ident)
            return (200, {"load_balancer": self._lb_view(lb)}) if lb else _error(
                404, "not_found", "The resource you requested could not be found.")
        every = [self._lb_view(lb) for lb in self.s.load_balancers.values()]
        return 200, _page("load_balancers", every, query, "/v2/load_balancers")

    def post_load_balancers(self, _ident: str | None, _query: dict[str, str], body: Any) -> tuple[int, Any]:
        if not body.get("forwarding_rules") or not body.get("region") or not (body.get("tag") or
                                                                              body.get("droplet_ids")):
            return _error(422, "unprocessable_entity", "request payload validation failed")
        lb_id = f"4de7ac8b-495b-4884-9a69-{next(self.s.ids):012d}"
        lb = {"id": lb_id, "name": body.get("name"), "ip": "", "status": "new", "created_at": "2026-11-23T12:00:00Z",
              "forwarding_rules": body["forwarding_rules"], "health_check": body.get("health_check"),
              "sticky_sessions": {"type": "none"}, "region": {"slug": body["region"], "available": True},
              "tag": body.get("tag", ""), "redirect_http_to_https": False, "enable_proxy_protocol": False,
              "http_idle_timeout_seconds": body.get("http_idle_timeout_seconds", 60)}
        self.s.load_balancers[lb_id] = lb
        return 202, {"load_balancer": self._lb_view(lb)}

    def delete_load_balancers(self, ident: str | None, _query: dict[str, str], _body: Any) -> tuple[int, Any]:
        if ident is None or self.s.load_balancers.pop(ident, None) is None:
            return _error(404, "not_found", "The resource you requested could not be found.")
        return 204, None

    # -- firewalls ----------------------------------------------------------------------------------------------
    def get_firewalls(self, _ident: str | None, query: dict[str, str], _body: Any) -> tuple[int, Any]:
        for fw in self.s.firewalls.values():
            fw["status"] = "succeeded"
        return 200, _page("firewalls", list(self.s.firewalls.values()), query, "/v2/firewalls")

    def post_firewalls(self, _ident: str | None, _query: dict[str, str], body: Any) -> tuple[int, Any]:
        name = str(body.get("name", ""))
        if not name or "_" in name or ":" in name or not (body.get("inbound_rules") or body.get("outbound_rules")):
            return _error(400, "bad_request", "name: must only contain letters, numbers, dashes and periods")
        fw_id = f"bb4b2611-3d72-467b-8602-{next(self.s.ids):012d}"
        fw = {"id": fw_id, "name": name, "status": "waiting", "created_at": "2026-11-23T12:00:00Z",
              "inbound_rules": body.get("inbound_rules", []), "outbound_rules": body.get("outbound_rules", []),
              "droplet_ids": body.get("droplet_ids", []), "tags": body.get("tags", []), "pending_changes": []}
        self.s.firewalls[fw_id] = fw
        return 202, {"firewall": fw}

    def delete_firewalls(self, ident: str | None, _query: dict[str, str], _body: Any) -> tuple[int, Any]:
        if ident is None or self.s.firewalls.pop(ident, None) is None:
            return _error(404, "not_found", "The resource you requested could not be found.")
        return 204, None


def _handler(state: State) -> type[BaseHTTPRequestHandler]:
    api = Api(state)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_args: Any) -> None:
            pass

        def _serve(self) -> None:
            url = urlparse(self.path)
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            with state.lock:
                state.requests.append(Recorded(self.command, url.path, query, body))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    status, answer = _error(401, "unauthorized", "Unable to authenticate you.")
                else:
                    status, answer = api.handle(self.command, url.path, query, body)
            data = b"" if answer is None else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("ratelimit-limit", "5000")
            self.send_header("ratelimit-remaining", "4999")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def do_DELETE(self) -> None:
            self._serve()

    return Handler


@contextmanager
def serve_api(state: State | None = None) -> Iterator[tuple[str, State]]:
    state = state or State()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


def main() -> None:
    """The API on HOST:PORT with the droplets of a JSON file (a list of droplet objects), e.g. inside a network
    namespace for agents to find each other by tag: python -m tests.do_api --bind 10.231.0.1:8088 --droplets F"""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--bind", required=True, help="HOST:PORT")
    parser.add_argument("--droplets", type=Path, required=True)
    args = parser.parse_args()
    state = State()
    for droplet in json.loads(args.droplets.read_text(encoding="utf-8")):
        state.droplets[int(droplet["id"])] = {**droplet, "_seen": True}
    host, port = args.bind.rsplit(":", 1)
    ThreadingHTTPServer((host, int(port)), _handler(state)).serve_forever()


if __name__ == "__main__":
    main()
