"""The DigitalOcean build: Packer's digitalocean builder runs the same playbook on a GPU Droplet and
snapshots it. Packer is called directly, its output streamed line by line as progress and into a log:
python-packer takes a single template file, not an HCL2 folder, and its build() leaves no hook on the output."""

from __future__ import annotations

import os
from pathlib import Path

from kiln.errors import KilnError
from kiln.image.local import build_wheel
from kiln.image.progress import Progress
from kiln.image.system import Host

TOKEN_ENV = "DIGITALOCEAN_TOKEN"


def packer_argv(repo: Path, wheel: Path, variables: dict[str, str], action: str = "build") -> list[str]:
    argv = ["packer", action, "-var", f"kiln_wheel={wheel}"]
    for key, value in sorted(variables.items()):
        argv += ["-var", f"{key}={value}"]
    return [*argv, str(repo / "image" / "digitalocean")]


def packer_env(ansible_playbook: str) -> dict[str, str]:
    """Packer's ansible provisioner runs ansible-playbook from PATH."""
    bin_dir = str(Path(ansible_playbook).parent)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def digitalocean_build(repo: Path, out_dir: Path, ansible_playbook: str, variables: dict[str, str],
                       validate_only: bool = False) -> str:
    if not os.environ.get(TOKEN_ENV):
        raise KilnError(f"{TOKEN_ENV} is not set",
                        fix=f"export {TOKEN_ENV}=<an API token with write access> (the template reads only it)")
    out_dir.mkdir(parents=True, exist_ok=True)
    progress = Progress.for_stream(2)
    host = Host(out_dir / "digitalocean.build.log", progress)
    host.require("packer", ansible_playbook)
    progress.step("kiln wheel")
    wheel = build_wheel(host, repo, out_dir / "dist")
    progress.step("packer validate" if validate_only else "packer build (a billed GPU Droplet while it runs)")
    output = host.run(packer_argv(repo, wheel, variables, "validate" if validate_only else "build"),
                      env=packer_env(ansible_playbook))
    progress.done("template valid" if validate_only else "snapshot made")
    return output
