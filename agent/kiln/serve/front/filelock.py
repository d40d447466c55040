"""A lock that processes share across a read, change and write of one file (the key store: `kiln keys` and the
agent both change it)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def held(path: Path) -> Iterator[None]:
    """An exclusive lock on .NAME.lock beside `path`, released when the block ends or the process dies."""
    lock = path.with_name(f".{path.name}.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
