"""`kiln agent run` where nothing can be served: it says why and how to fix it, stays up, and stops cleanly."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import requests
from tests.conftest import DATA

KILN = str(Path(sys.executable).parent / "kiln")


@dataclass
class FailedAgent:
    proc: subprocess.Popen[str]
    health: str
    status: dict[str, object]
    output: str = ""


@contextlib.contextmanager
def agent_that_fails(tmp_path: Path, machine: str, settings: str, port: int,
                     env: dict[str, str] | None = None) -> Iterator[FailedAgent]:
    """An agent booted on `machine` with these settings in /etc/kiln/kiln.yaml, once it reports phase `failed`;
    on leaving, SIGTERM and its whole output."""
    (tmp_path / "root" / "etc" / "kiln").mkdir(parents=True)
    (tmp_path / "root" / "etc" / "kiln" / "kiln.yaml").write_text(settings)
    health = f"http://127.0.0.1:{port + 90}"
    proc = subprocess.Popen([KILN, "agent", "run", "--machine", machine, "--root", str(tmp_path / "root"),
                             "--state-dir", str(tmp_path / "state"), "--port", str(port), "--health-port",
                             str(port + 90), "--motd", str(tmp_path / "motd"), "--launcher", "process"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    agent = FailedAgent(proc, health, {})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and agent.status.get("phase") != "failed":
            with contextlib.suppress(requests.ConnectionError):
                agent.status = requests.get(f"{health}/status", timeout=2).json()
            time.sleep(0.3)
        assert agent.status.get("phase") == "failed", agent.status
        yield agent
    finally:
        proc.send_signal(signal.SIGTERM)
        agent.output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, agent.output
    assert "Traceback" not in agent.output


def test_an_unservable_choice_fails_on_the_health_endpoint_not_the_machine(tmp_path: Path) -> None:
    with agent_that_fails(tmp_path, "cpu-only", "profile: llama-3.3-70b-instruct\nbogus: 1\n", 18200) as agent:
        error = agent.status["last_error"]
        assert isinstance(error, dict)
        assert "cannot be served on cpu-only" in error["error"] and error["fix"]
        choice = agent.status["choice"]
        assert isinstance(choice, dict)
        problems = choice["problems"]
        assert {p["field"] for p in problems} >= {"bogus", "profile"}
        assert requests.get(f"{agent.health}/health", timeout=2).status_code == 200
        ready = requests.get(f"{agent.health}/ready", timeout=2)
        assert ready.status_code == 503 and "failed" in ready.json()["reason"]
        assert not (tmp_path / "state" / "plan.json").exists()
    assert "nothing to serve" in agent.output


def test_a_blocking_preflight_fails_with_the_fix_and_starts_no_vllm(tmp_path: Path) -> None:
    """An H100 with the R570 driver: the plan is made, the doctor blocks it, and nothing is started."""
    machine = str(DATA / "doctor" / "h100x1-old-driver.yaml")
    with agent_that_fails(tmp_path, machine, "profile: llama-3.1-8b-instruct\n", 18201) as agent:
        error = agent.status["last_error"]
        assert isinstance(error, dict)
        assert error["error"].startswith("pre-flight: driver: driver 570.133.20 is older than 580.65.06")
        assert "nvidia-headless-580-server-open" in error["fix"]
        doctor = agent.status["doctor"]
        assert isinstance(doctor, dict) and doctor["verdict"] == "blocked"
        assert psutil.Process(agent.proc.pid).children(recursive=True) == []
        assert not (tmp_path / "state" / "runtime.json").exists()
        assert not (tmp_path / "state" / "plan.json").exists()
        assert requests.get(f"{agent.health}/ready", timeout=2).status_code == 503
        motd = (tmp_path / "motd").read_text()
        assert motd.startswith("kiln: NOT SERVING: pre-flight: driver: driver 570.133.20") and "kiln doctor" in motd
    assert "pre-flight: driver: driver 570.133.20 is older" in agent.output


def test_a_state_folder_that_cannot_be_written_fails_on_the_health_endpoint_not_with_a_traceback(
        tmp_path: Path) -> None:
    """A full or broken state disk: the agent says which file and how to fix it, and keeps answering."""
    (tmp_path / "state" / "plan.json").mkdir(parents=True)  # replace() onto a folder fails as a full disk would
    with agent_that_fails(tmp_path, "cpu-only", "profile: tiny-cpu\n", 18203) as agent:
        error = agent.status["last_error"]
        assert isinstance(error, dict)
        assert "plan.json" in error["error"] and "cannot be written" in error["error"]
        assert "df -h" in error["fix"]
        assert requests.get(f"{agent.health}/health", timeout=2).status_code == 200
