"""The agent's looks at its own local services over the network: one place for the HTTP and TLS calls that
health checks, metrics and the certificate swap make."""

from __future__ import annotations

import ssl

import requests

from kiln.serve.front.tls import inspect


def http_probe(url: str, timeout_s: float = 5.0) -> bool:
    """200 within the timeout; an API server whose cores the engine keeps busy may answer seconds late."""
    try:
        return requests.get(url, timeout=timeout_s).status_code == 200
    except requests.RequestException:
        return False


def fetch_text(url: str, timeout_s: float = 2) -> str:
    """The body of a 200 answer, or "" (a scrape that fails is an empty one)."""
    try:
        reply = requests.get(url, timeout=timeout_s)
        return reply.text if reply.ok else ""
    except requests.RequestException:
        return ""


def served_certificate_sha256(host: str, port: int, timeout_s: float = 5.0) -> str | None:
    """The SHA-256 of the certificate a TLS listener presents now, or None when it does not answer TLS."""
    try:
        return inspect(ssl.get_server_certificate((host, port), timeout=timeout_s)).sha256
    except (OSError, ValueError):
        return None
