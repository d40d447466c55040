"""The endpoint's API key: generated once per machine, kept in a 0600 file, overridable from user-data."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
from pathlib import Path

log = logging.getLogger("kiln.agent")

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


MAX_KEY_FILE_BYTES = 4096


def read_private(path: Path) -> str | None:
    """A small regular file's text, never through a symbolic link: None when absent, or anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a link planted where the file should be
        log.warning("ignoring %s: %s", path, exc.strerror)
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            log.warning("ignoring %s: not a regular file", path)
            return None
        return f.read(MAX_KEY_FILE_BYTES).decode("utf-8", errors="replace")


def ensure_api_key(path: Path, override: str | None) -> str:
    """The user's key when given, else the one kept from an earlier boot, else a new one. The key file sits in a
    folder the instances' user can write, so what is there is read without following links."""
    kept = (read_private(path) or "").strip()
    if override:
        if kept != override:
            write_private(path, override + "\n")
        return override
    if kept:
        return kept
    key = generate_api_key()
    write_private(path, key + "\n")
    return key
