"""How profile names compare. Pure."""

from __future__ import annotations


def normalize_name(name: str) -> str:
    """Profile names compare without case and with '.' and '_' as '-' (DigitalOcean tags allow no dots)."""
    return name.strip().lower().replace(".", "-").replace("_", "-")
