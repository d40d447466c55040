"""A droplet's metadata service, GET /metadata/v1.json, answering as DigitalOcean's does (the fields kiln reads:
droplet_id, hostname, tags, interfaces.private[].ipv4). In-process for unit tests, or inside a network namespace
on 169.254.169.254:80, where an agent finds it exactly as on a droplet:
    python -m tests.do_metadata --bind 169.254.169.254:80 --droplet-id 500000001 --hostname big-0 \
        --private-ip 10.231.0.1 --tag kiln-cluster:big
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def droplet_metadata(droplet_id: int, hostname: str, private_ip: str, tags: list[str]) -> dict[str, Any]:
    return {"droplet_id": droplet_id, "hostname": hostname, "region": "nyc2", "tags": tags,
            "interfaces": {"private": [{"ipv4": {"ip_address": private_ip, "netmask": "255.255.255.0",
                                                 "gateway": "0.0.0.0"}, "type": "private"}],
                           "public": [{"ipv4": {"ip_address": "203.0.113.9", "netmask": "255.255.255.0",
                                                "gateway": "203.0.113.1"}, "type": "public"}]},
            "features": {"dhcp_enabled": False}}


def _server(body: dict[str, Any], host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path == "/metadata/v1.json"
            data = json.dumps(body if found else {"id": "not_found"}).encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_args: Any) -> None:
            pass

    return ThreadingHTTPServer((host, port), Handler)


@contextmanager
def metadata_service(body: dict[str, Any]) -> Iterator[str]:
    """The service on a free loopback port; yields the URL of v1.json."""
    httpd = _server(body, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/metadata/v1.json"
    finally:
        httpd.shutdown()
        httpd.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bind", required=True, help="HOST:PORT")
    parser.add_argument("--droplet-id", type=int, required=True)
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--private-ip", required=True)
    parser.add_argument("--tag", action="append", default=[])
    args = parser.parse_args()
    host, port = args.bind.rsplit(":", 1)
    _server(droplet_metadata(args.droplet_id, args.hostname, args.private_ip, args.tag), host,
            int(port)).serve_forever()


if __name__ == "__main__":
    main()
