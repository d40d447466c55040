"""The local health endpoint: /health, /ready, /status (JSON) and /metrics (Prometheus). Localhost only; nginx
passes the public port's /health to /health/public, which says ok or unavailable and nothing else."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kiln.serve.layout import PUBLIC_HEALTH
from kiln.serve.reports.state import AgentState

log = logging.getLogger("kiln.health")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver listens with a backlog of 5: a burst of checks (a load balancer's, a dashboard's, `kiln status`
    # in a loop) overflowed it and waited out SYN retries; the kernel caps it at net.core.somaxconn.
    request_queue_size = 1024


class HealthServer:
    def __init__(self, state: AgentState, host: str, port: int, metrics: Callable[[], bytes]) -> None:
        handler = _handler(state, metrics)
        self.httpd = _Server((host, port), handler)
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="kiln-health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler(state: AgentState, metrics: Callable[[], bytes]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "kiln"
        sys_version = ""

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            try:
                if path == "/health":
                    self._send(200, {"status": "alive", "phase": state.current_phase(), "state_dir": state.state_dir})
                elif path == PUBLIC_HEALTH:  # what the public port's /health answers a load balancer
                    ok, _ = state.readiness()
                    self._send(200 if ok else 503, {"status": "ok" if ok else "unavailable"})
                elif path == "/ready":
                    ok, reason = state.readiness()
                    self._send(200 if ok else 503, {"ready": ok, "reason": reason})
                elif path == "/status":
                    self._send(200, state.status())
                elif path == "/status/reload":  # what `kiln reload` and `kiln keys` wait for, cheaply
                    self._send(200, {"reload": state.reload})
                elif path == "/metrics":
                    self._send_bytes(200, metrics(), "text/plain; version=0.0.4; charset=utf-8")
                else:
                    self._send(404, {"error": "unknown path", "paths": ["/health", "/ready", "/status", "/metrics"]})
            except Exception as exc:  # a report must never take the agent down
                log.exception("health endpoint %s failed", path)
                self._send(500, {"error": str(exc)})

        def _send(self, code: int, body: object) -> None:
            self._send_bytes(code, (json.dumps(body, default=str) + "\n").encode(), "application/json")

        def _send_bytes(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("health: " + format, *args)

    return Handler
