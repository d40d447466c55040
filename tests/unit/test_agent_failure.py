"""`kiln agent run` where nothing can be served: it says why and how to fix it, stays up, and stops cleanly."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import requests

KILN = str(Path(sys.executable).parent / "kiln")


def test_an_unservable_choice_fails_on_the_health_endpoint_not_the_machine(tmp_path: Path) -> None:
    (tmp_path / "root" / "etc" / "kiln").mkdir(parents=True)
    (tmp_path / "root" / "etc" / "kiln" / "kiln.yaml").write_text("profile: llama-3.3-70b-instruct\nbogus: 1\n")
    health = "http://127.0.0.1:18290"
    proc = subprocess.Popen([KILN, "agent", "run", "--machine", "cpu-only", "--root", str(tmp_path / "root"),
                             "--state-dir", str(tmp_path / "state"), "--port", "18200", "--health-port", "18290",
                             "--motd", str(tmp_path / "motd"), "--launcher", "process"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        status: dict[str, object] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and status.get("phase") != "failed":
            with contextlib.suppress(requests.ConnectionError):
                status = requests.get(f"{health}/status", timeout=2).json()
            time.sleep(0.3)
        assert status.get("phase") == "failed", status
        error = status["last_error"]
        assert isinstance(error, dict)
        assert "cannot be served on cpu-only" in error["error"] and error["fix"]
        choice = status["choice"]
        assert isinstance(choice, dict)
        problems = choice["problems"]
        assert {p["field"] for p in problems} >= {"bogus", "profile"}
        assert requests.get(f"{health}/health", timeout=2).status_code == 200
        ready = requests.get(f"{health}/ready", timeout=2)
        assert ready.status_code == 503 and "failed" in ready.json()["reason"]
        assert not (tmp_path / "state" / "plan.json").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "nothing to serve" in out and "Traceback" not in out


def test_a_blocking_preflight_fails_with_the_fix_and_starts_no_vllm(tmp_path: Path) -> None:
    """An H100 with the R570 driver: the plan is made, the doctor blocks it, and nothing is started."""
    (tmp_path / "root" / "etc" / "kiln").mkdir(parents=True)
    (tmp_path / "root" / "etc" / "kiln" / "kiln.yaml").write_text("profile: llama-3.1-8b-instruct\n")
    machine = Path(__file__).resolve().parents[1] / "data" / "doctor" / "h100x1-old-driver.yaml"
    health = "http://127.0.0.1:18291"
    proc = subprocess.Popen([KILN, "agent", "run", "--machine", str(machine), "--root", str(tmp_path / "root"),
                             "--state-dir", str(tmp_path / "state"), "--port", "18201", "--health-port", "18291",
                             "--motd", str(tmp_path / "motd"), "--launcher", "process"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        status: dict[str, object] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and status.get("phase") != "failed":
            with contextlib.suppress(requests.ConnectionError):
                status = requests.get(f"{health}/status", timeout=2).json()
            time.sleep(0.3)
        assert status.get("phase") == "failed", status
        error = status["last_error"]
        assert isinstance(error, dict)
        assert error["error"].startswith("pre-flight: driver: driver 570.133.20 is older than 580.65.06")
        assert "nvidia-headless-580-server-open" in error["fix"]
        doctor = status["doctor"]
        assert isinstance(doctor, dict) and doctor["verdict"] == "blocked"
        assert psutil.Process(proc.pid).children(recursive=True) == []
        assert not (tmp_path / "state" / "runtime.json").exists()
        assert not (tmp_path / "state" / "plan.json").exists()
        assert requests.get(f"{health}/ready", timeout=2).status_code == 503
        motd = (tmp_path / "motd").read_text()
        assert motd.startswith("kiln: NOT SERVING: driver: driver 570.133.20") and "kiln doctor" in motd
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "pre-flight: driver: driver 570.133.20 is older" in out and "Traceback" not in out
