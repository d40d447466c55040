"""The commands find the local agent the same way, as a user types them: `kiln up` in one terminal with no
--state-dir, then `kiln status`, `kiln keys list`, `kiln keys show default` and `kiln bench --url` with none either,
on the default ports, against real vLLM on the CPU; and again with the agent started with its own --state-dir, which
the commands find through its health endpoint."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from kiln.processes import interrupt

KILN = str(Path(sys.executable).parent / "kiln")
HEALTH = "http://127.0.0.1:8090"  # the defaults: what a user who gives no port gets
URL = "https://127.0.0.1:8000"


def _kiln(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KILN, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _ready() -> bool:
    try:
        return bool(requests.get(f"{HEALTH}/status", timeout=2).json()["phase"] == "ready")
    except (requests.RequestException, ValueError, KeyError):
        return False


@contextlib.contextmanager
def _up(env: dict[str, str], log: Path, *args: str) -> Iterator[None]:
    with log.open("w") as out:
        proc = subprocess.Popen([KILN, "up", "--instances", "1", "--no-self-check", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 900
        while not _ready():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        yield
    finally:
        interrupt(proc)


def _transcript(env: dict[str, str], out: Path) -> tuple[str, dict[str, subprocess.CompletedProcess[str]]]:
    """Each command as typed, with what it printed; none names a folder."""
    done: dict[str, subprocess.CompletedProcess[str]] = {}
    lines: list[str] = []
    key = ""
    for name, given in (("status", ["status"]), ("keys list", ["keys", "list"]),
                        ("keys show", ["keys", "show", "default"]), ("bench", None)):
        argv = given or ["bench", "--url", URL, "--api-key", key, "--concurrency", "1,2", "--input-len", "16",
                         "--output-len", "8", "--num-prompts", "4", "--out", str(out)]
        done[name] = result = _kiln(env, *argv)
        if name == "keys show":
            key = result.stdout.strip()
        shown = " ".join(a if a != key or not key else "$KEY" for a in argv)
        lines += [f"$ kiln {shown}", *(result.stderr.strip().splitlines()[:2]),
                  *(["(the key)"] if name == "keys show" else result.stdout.strip().splitlines()[:12])]
    return "\n".join(lines), done


def _check(done: dict[str, subprocess.CompletedProcess[str]], state: Path) -> None:
    for name, result in done.items():
        assert result.returncode == 0, f"{name}: {result.stdout}{result.stderr[-2000:]}"
        assert f"state folder {state}" in result.stderr, f"{name} does not say which folder: {result.stderr}"
    assert f"state     {state}" in done["status"].stdout
    assert "default" in done["keys list"].stdout
    assert done["keys show"].stdout.strip().startswith("kiln-")
    assert "| 2 |" in done["bench"].stdout  # both levels measured, with the agent's tokenizer and certificate


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "XDG_STATE_HOME": str(tmp_path / "xdg")}


@pytest.mark.parametrize("state_dir", [None, "STATE"], ids=["no-state-dir", "state-dir"])
def test_commands_find_the_agent_without_being_told_its_folder(env: dict[str, str], tmp_path: Path,
                                                                state_dir: str | None,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`kiln up` with no --state-dir, or with its own; the commands after it are given none either way."""
    state = tmp_path / "xdg" / "kiln" if state_dir is None else tmp_path / state_dir
    with _up(env, tmp_path / "up.log", *([] if state_dir is None else ["--state-dir", str(state)])):
        text, done = _transcript(env, tmp_path / "bench")
    with capsys.disabled():
        print(f"\n$ kiln up{'' if state_dir is None else f' --state-dir {state}'}   (another terminal)\n{text}")
    _check(done, state)
    assert json.loads((state / "keys.json").read_text())["keys"]
