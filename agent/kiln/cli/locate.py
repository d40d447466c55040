"""Which local kiln agent a command acts on, found the same way by every command (`status`, `keys`, `reload`,
`bench`, `models`, `doctor`):

1. `--state-dir` when given;
2. else the agent that answers on the health endpoint (`--health`, or the default port), which names its folder;
3. else the one default folder: the image's for root on the image, the per-user one elsewhere (`kiln up`'s too)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from kiln.serve.layout import IMAGE_STATE_DIR, ServeLayout

PROBE_TIMEOUT_S = 1.0  # a local agent answers /health at once; a busy one within a second


def default_state_dir() -> Path:
    """The image's folder for root on the image (its kiln_agent role made it); the per-user state folder elsewhere."""
    if os.geteuid() == 0 and IMAGE_STATE_DIR.is_dir():
        return IMAGE_STATE_DIR
    return Path(os.environ.get("XDG_STATE_HOME") or "~/.local/state").expanduser() / "kiln"


@dataclass(frozen=True)
class LocalAgent:
    state_dir: Path
    health: str  # the health endpoint asked
    running: bool  # an agent of this folder answered there
    found_by: str

    @property
    def layout(self) -> ServeLayout:
        return ServeLayout(state_dir=self.state_dir)

    def said(self) -> str:
        who = f"the kiln agent at {self.health}" if self.running else "no running kiln agent"
        return f"kiln: {who}; state folder {self.state_dir} ({self.found_by})"

    def as_dict(self) -> dict[str, Any]:
        return {"state_dir": str(self.state_dir), "health": self.health, "running": self.running,
                "found_by": self.found_by}


def answering_folder(health: str) -> Path | None:
    """The state folder the agent at `health` names; None when nothing answers there as a kiln agent."""
    try:
        reply = requests.get(f"{health.rstrip('/')}/health", timeout=PROBE_TIMEOUT_S)
        folder = reply.json().get("state_dir") if reply.ok else None
    except (requests.RequestException, ValueError, AttributeError):
        return None
    return Path(folder) if isinstance(folder, str) and folder else None


def locate(state_dir: Path | None, health: str | None = None) -> LocalAgent:
    if state_dir is not None:
        folder = state_dir.expanduser().resolve()
        url = ServeLayout(state_dir=folder).health_of(health)
        answered = answering_folder(url)
        return LocalAgent(folder, url, answered is not None and answered.resolve() == folder, "--state-dir")
    url = health or ServeLayout().health_url
    answered = answering_folder(url)
    if answered is not None:
        return LocalAgent(answered, url, True, f"named by the agent answering at {url}")
    return LocalAgent(default_state_dir(), url, False, "the default folder: no agent answers at " + url)
