"""Who owns the agent's files on the image: the state folder is root's, the units (User=kiln) write only the
folders handed to them and read root's files through their group."""

from __future__ import annotations

import logging
import os
import pwd
import stat
from pathlib import Path

from kiln.errors import KilnError

log = logging.getLogger("kiln.agent")


def give_to_user(user: str, state_dir: Path, paths: list[Path]) -> None:
    """Hand the folders the units write to their user."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        log.warning("user %s does not exist; the units may not read %s", user, state_dir)
        return
    for path in paths:
        for target in [path, *path.rglob("*")] if path.is_dir() and not path.is_symlink() else [path]:
            # A link the user planted is chowned itself, never what it points at.
            os.chown(target, entry.pw_uid, entry.pw_gid, follow_symlinks=False)


def keep_for_root(folder: Path) -> None:
    """The agent's own folder: a real directory, root's, which no one else may write (not even the instances)."""
    try:
        info = os.lstat(folder)
    except OSError as exc:
        raise KilnError(f"{folder} cannot be read: {exc.strerror}",
                        fix="the kiln_agent role makes it; rebuild the image or create it, root's, mode 0755") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise KilnError(f"{folder} is not a directory (a link or a file is there)",
                        fix=f"remove it (`rm {folder}`), then `systemctl restart kiln-agent`, which makes the folder")
    if info.st_uid != 0 or info.st_gid != 0:
        os.chown(folder, 0, 0, follow_symlinks=False)
    os.chmod(folder, 0o755)


def share_with_group(user: str, files: list[Path]) -> None:
    """Root's files the units must read: root-owned, readable by the units' group, written by no one else."""
    try:
        group = pwd.getpwnam(user).pw_gid
    except KeyError:
        return
    for path in files:
        os.chown(path, 0, group, follow_symlinks=False)
        os.chmod(path, 0o640)
