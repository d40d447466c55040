"""Where the image build finds its inputs: the source checkout (image/, roles/, profiles/) and
Ansible, which lives in a virtualenv of its own (its pins would fight vLLM's)."""

from __future__ import annotations

import shutil
from pathlib import Path

from kiln.errors import KilnError

TOOLS_VENV = ".venv-tools"


def find_repo(start: Path | None = None) -> Path:
    """The kiln checkout: the current folder or one above it, else the one this package was installed
    from (an editable install)."""
    here = (start or Path.cwd()).resolve()
    candidates = [here, *here.parents, *Path(__file__).resolve().parents]
    for path in candidates:
        if (path / "image" / "playbook.yml").is_file() and (path / "roles").is_dir():
            return path
    raise KilnError("no kiln source checkout found (a folder with image/playbook.yml and roles/)",
                    fix="run from the kiln repository, or pass --repo PATH")


def find_ansible_playbook(repo: Path, given: str | None = None) -> str:
    if given:
        return given
    pinned = repo / TOOLS_VENV / "bin" / "ansible-playbook"  # the release the roles are linted and tested with
    found = str(pinned) if pinned.is_file() else shutil.which("ansible-playbook")
    if not found:
        raise KilnError("ansible-playbook not found in .venv-tools/ or on PATH",
                        fix="`bash ci/setup.sh` installs it into .venv-tools, or pass --ansible-playbook PATH")
    return found
