"""The image's Packer templates and Ansible roles, checked by the real tools: Debian's packer validates both
targets (the DigitalOcean one with a fake token), ansible-lint and ansible-playbook check the roles."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import REPO

TOOLS = REPO / ".venv-tools" / "bin"


def run(cmd: list[str], cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, check=False, env=env)


def tool(name: str) -> str:
    found = TOOLS / name if (TOOLS / name).exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed: run ci/setup.sh")
    return str(found)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("wheel") / "kiln-0.1.0-py3-none-any.whl"
    path.write_bytes(b"")
    return path


@pytest.mark.parametrize("target", ["digitalocean", "qemu"])
def test_packer_validates_each_target(target: str, wheel: Path) -> None:
    # validate runs `ansible-playbook --version`: the tools' virtualenv comes first on PATH.
    env = {"PATH": f"{TOOLS}:/usr/bin:/bin", "HOME": str(wheel.parent), "DIGITALOCEAN_TOKEN": "fake-token-for-validate"}
    result = run([tool("packer"), "validate", "-var", f"kiln_wheel={wheel}", "."], cwd=REPO / "image" / target,
                 env=env)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("folder", ["digitalocean", "qemu", "plugins"])
def test_packer_files_are_formatted(folder: str) -> None:
    # Debian's packer 1.6.6 has no `fmt -recursive`: one folder at a time.
    result = run([tool("packer"), "fmt", "-check", str(REPO / "image" / folder)])
    assert result.returncode == 0, "unformatted: " + result.stdout


def test_the_roles_pass_ansible_lint() -> None:
    result = run([tool("ansible-lint"), "--profile", "production", "roles", "image/playbook.yml"])
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_playbook_parses() -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(REPO), "ANSIBLE_ROLES_PATH": str(REPO / "roles")}
    result = run([tool("ansible-playbook"), "--syntax-check", "-i", "localhost,", "image/playbook.yml"], env=env)
    assert result.returncode == 0, result.stdout + result.stderr


def test_kiln_validates_the_digitalocean_build_with_a_fake_token(tmp_path: Path) -> None:
    kiln = str(Path(sys.executable).parent / "kiln")
    env = {**os.environ, "DIGITALOCEAN_TOKEN": "fake-token-for-validate", "HOME": str(tmp_path)}
    result = run([kiln, "image", "build", "--target", "digitalocean", "--validate", "--out", str(tmp_path)], env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[2/2] packer validate" in result.stderr and "template valid" in result.stderr
    assert list((tmp_path / "dist").glob("kiln-*.whl")), "the build's wheel is not there"


def test_kiln_says_the_token_is_missing_before_building() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DIGITALOCEAN_TOKEN"}
    kiln = str(Path(sys.executable).parent / "kiln")
    result = run([kiln, "image", "build", "--target", "digitalocean"], env=env)
    assert result.returncode == 2
    assert "DIGITALOCEAN_TOKEN is not set" in result.stderr and "fix: export DIGITALOCEAN_TOKEN=" in result.stderr
