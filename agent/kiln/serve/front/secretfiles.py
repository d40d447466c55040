"""Files only root reads: written atomically, never through a link, read without following one."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from pathlib import Path

from kiln.choice.schema import Problem
from kiln.errors import KilnError
from kiln.serve.front.keys import DEFAULT_NAME, ApiKey, KeyStore

log = logging.getLogger("kiln.agent")


def write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Write a file only its owner can read (or `mode`), atomically and durably: it never exists with wider
    permissions, and after a crash it holds the old text or the new one, never an empty file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # A fresh file of its own name (0600, O_EXCL, never through a link), so that two writers never share one; in
    # the same folder, so that replace() is a rename, which does not follow a link at `path` either.
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)  # the rename itself
    finally:
        os.close(folder)


MAX_KEY_FILE_BYTES = 2**20  # the key store, a certificate chain


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


class KeyStoreError(KilnError):
    """The key store exists and cannot be read."""


def load_keys(path: Path, legacy_key_file: Path | None = None) -> KeyStore:
    """The machine's key store; an earlier boot's single key (the api_key file) becomes the key named default."""
    store, problems = load_keys_checked(path, legacy_key_file)
    for problem in problems:
        log.warning("%s", problem.text())
    return store


def load_keys_checked(path: Path, legacy_key_file: Path | None = None) -> tuple[KeyStore, tuple[Problem, ...]]:
    """load_keys, with a problem for each entry of the store that is left out (KeyStore.read_json)."""
    if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
        # A link, a FIFO or a folder where the store should be: never read as "no store", which would replace every
        # key and revocation with a new default key.
        raise KeyStoreError(f"the key store {path} is not a regular file ({_kind(path)}); it is kept as it is and no "
                            "key changed", fix=f"move it aside (`mv {path} {path}.bad`) and restore the store from a "
                                               "copy, or start again from user-data's keys; then `kiln reload`")
    text = read_private(path)
    if text is not None:
        try:
            store, dropped = KeyStore.read_json(text)
            return store, tuple(Problem(str(path), "", what, f"correct it in {path}, or `kiln keys add NAME` for a "
                                        "new key; then `kiln reload`") for what in dropped)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # Never a new store in its place: every client's key and every revocation would be lost.
            raise KeyStoreError(f"the key store {path} cannot be read ({exc.__class__.__name__}); it is kept as it "
                                "is and no key changed",
                                fix=f"restore {path} from a copy, or move it aside (`mv {path} {path}.bad`) to start "
                                    "again from user-data's keys and a new default key; then `kiln reload`") from None
    old = (read_private(legacy_key_file) or "").strip() if legacy_key_file else ""
    if old:
        return KeyStore((ApiKey(DEFAULT_NAME, old, origin="generated"),)), ()
    return KeyStore(), ()


def _kind(path: Path) -> str:
    mode = os.lstat(path).st_mode
    return ("a symbolic link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a folder" if stat.S_ISDIR(mode) else "not a file")


def save_keys(path: Path, store: KeyStore) -> None:
    write_private(path, store.to_json())
