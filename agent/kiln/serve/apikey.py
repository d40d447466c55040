"""The endpoint's API key: generated once per machine, kept in a 0600 file, overridable from user-data."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

KEY_PREFIX = "kiln-"


def generate_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, atomically: it never exists with wider permissions."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    # A fresh file, never through a link someone left at the temporary name; replace() does not follow either.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def ensure_api_key(path: Path, override: str | None) -> str:
    """The user's key when given, else the one kept from an earlier boot, else a new one."""
    if override:
        if not path.exists() or path.read_text(encoding="utf-8").strip() != override:
            write_private(path, override + "\n")
        return override
    if path.exists():
        kept = path.read_text(encoding="utf-8").strip()
        if kept:
            return kept
    key = generate_api_key()
    write_private(path, key + "\n")
    return key
