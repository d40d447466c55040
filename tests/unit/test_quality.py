"""The package stays ruff- and mypy-clean."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *cmd], cwd=REPO, capture_output=True, text=True, check=False)


def test_ruff() -> None:
    result = run("ruff", "check", "agent", "tests", "benchmarks", "roles")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy() -> None:
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr
