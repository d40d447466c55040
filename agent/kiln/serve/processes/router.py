"""vllm-router: its command line from the plan (pure), and a small client for its worker-management API."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import requests

from kiln.serve.layout import ServeLayout

ROUTER_BINARY = "vllm-router"
ROUTER_POLICIES = ("round_robin", "cache_aware", "power_of_two", "consistent_hash", "random")


@dataclass(frozen=True)
class RouterSettings:
    # round_robin spreads load evenly with no per-request work; prefix affinity (cache_aware) is documented in
    # the README with the measurement behind the choice.
    policy: str = "round_robin"
    # The supervisor takes a dead instance out the moment its process ends; the router's own check only catches a
    # hung one, so it forgives a /health answered late by an API server whose cores the engine keeps busy.
    health_check_interval_s: int = 2
    health_check_timeout_s: int = 5
    health_failure_threshold: int = 3
    request_timeout_s: int = 1800
    max_retries: int = 3  # a worker that cannot be reached; vLLM's own errors come as 520/521, never retried


def router_argv(binary: str, layout: ServeLayout, settings: RouterSettings) -> tuple[str, ...]:
    """Workers are not listed: the agent adds each instance once it serves, and removes it when it stops."""
    return (
        binary,
        "--host", layout.local_host, "--port", str(layout.router_port),
        "--policy", settings.policy,
        "--prometheus-host", layout.local_host, "--prometheus-port", str(layout.router_metrics_port),
        "--health-check-interval-secs", str(settings.health_check_interval_s),
        "--health-check-timeout-secs", str(settings.health_check_timeout_s),
        "--health-failure-threshold", str(settings.health_failure_threshold),
        "--health-success-threshold", "1",
        "--request-timeout-secs", str(settings.request_timeout_s),
        "--retry-max-retries", str(settings.max_retries),
        "--retry-initial-backoff-ms", "50",
        "--retry-max-backoff-ms", "1000",
        # Clients' failing requests must not open its breakers and take every worker out for a minute: a dead
        # instance leaves routing when its process ends (the supervisor), a hung one by the health check.
        "--disable-circuit-breaker",
        "--worker-startup-timeout-secs", "30",
        "--worker-startup-check-interval", "1",
        "--log-level", "warning",
    )


def find_router() -> str | None:
    """The router installed beside this Python (the image's virtualenv), else on PATH."""
    beside = Path(sys.executable).parent / ROUTER_BINARY
    return str(beside) if beside.is_file() else shutil.which(ROUTER_BINARY)


class RouterClient:
    """The router's worker-management endpoints (localhost only)."""

    def __init__(self, base_url: str, session: requests.Session | None = None, timeout_s: float = 35) -> None:
        self.base_url = base_url
        self.session = session or requests.Session()
        self.timeout_s = timeout_s

    def ready(self) -> bool:
        try:
            return self.session.get(f"{self.base_url}/health", timeout=2).ok
        except requests.RequestException:
            return False

    def workers(self) -> list[str]:
        reply = self.session.get(f"{self.base_url}/list_workers", timeout=5)
        reply.raise_for_status()
        return list(reply.json().get("urls", []))

    def health(self) -> dict[str, bool]:
        """GET /workers: each worker's URL and the router's own is_healthy."""
        reply = self.session.get(f"{self.base_url}/workers", timeout=5)
        reply.raise_for_status()
        return {str(w["url"]): bool(w.get("is_healthy", True)) for w in reply.json().get("workers", [])}

    def add(self, url: str) -> None:
        reply = self.session.post(f"{self.base_url}/add_worker", params={"url": url}, timeout=self.timeout_s)
        reply.raise_for_status()

    def remove(self, url: str) -> None:
        reply = self.session.post(f"{self.base_url}/remove_worker", params={"url": url}, timeout=self.timeout_s)
        if reply.status_code != 404:
            reply.raise_for_status()
