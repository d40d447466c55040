"""The nodes' own channel, on the private network only: each worker POSTs its report to the head's
/cluster/report and reads back the head's generation. The head also answers GET /cluster with every node."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests

from kiln.cluster.roster import NodeReport

PEER_PORT = 8091
MAX_BODY = 64 << 10
log = logging.getLogger("kiln.cluster")

OnReport = Callable[[NodeReport], dict[str, Any]]


class PeerServer:
    """The head's side: listens on its private address, never the public one."""

    def __init__(self, host: str, port: int, on_report: OnReport, view: Callable[[], dict[str, Any]]) -> None:
        self.httpd = ThreadingHTTPServer((host, port), _handler(on_report, view))
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="kiln-peers", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler(on_report: OnReport, view: Callable[[], dict[str, Any]]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "kiln"
        sys_version = ""

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] == "/cluster":
                self._send(200, view())
            else:
                self._send(404, {"error": "unknown path", "paths": ["/cluster", "/cluster/report"]})

        def do_POST(self) -> None:
            if self.path != "/cluster/report":
                self._send(404, {"error": "unknown path"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY:
                self._send(413, {"error": f"a report is 1 to {MAX_BODY} bytes"})
                return
            try:
                report = NodeReport.from_dict(json.loads(self.rfile.read(length)))
            except (ValueError, KeyError, TypeError) as exc:
                self._send(400, {"error": f"not a node report: {exc}"})
                return
            self._send(200, on_report(report))

        def _send(self, code: int, body: object) -> None:
            data = (json.dumps(body, default=str) + "\n").encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("peers: " + format, *args)

    return Handler


def send_report(head: str, report: NodeReport, *, port: int = PEER_PORT, timeout_s: float = 3.0) -> dict[str, Any]:
    """A worker's report to the head; the head's answer (its generation). Raises requests' errors."""
    response = requests.post(f"http://{head}:{port}/cluster/report", json=report.as_dict(), timeout=timeout_s)
    response.raise_for_status()
    answer = response.json()
    if not isinstance(answer, dict):
        raise ValueError("the head's answer is not a JSON object")
    return answer
