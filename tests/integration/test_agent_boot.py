"""`kiln agent run` as the image runs it at boot, outside systemd: cloud-init user-data picks the model and the key,
and the agent serves it behind the public endpoint, reports it, and stops cleanly on SIGTERM."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import requests

KILN = str(Path(sys.executable).parent / "kiln")
KEY = "user-chosen-key-0123456789"
CI_KEY = "kiln-ci-key-from-user-data-0123"
HF_TOKEN = "hf_kilnTestTokenNotRealAbCdEfGhIjKlMnOp"
USER_DATA = f"""#cloud-config
write_files:
  - path: /etc/kiln/kiln.yaml
    permissions: "0600"
    content: |
      profile: tiny-cpu
      instances: 1
      api_key: {KEY}
      hf_token: {HF_TOKEN}
      tls: off
"""


def token_leaks(tmp_path: Path, state: Path, agent: subprocess.Popen[bytes], health: str) -> list[str]:
    """Every place the Hugging Face token must not be: argv, state files, reports, the journal, the MOTD, the CLI."""
    where: list[str] = []
    for proc in [psutil.Process(agent.pid), *psutil.Process(agent.pid).children(recursive=True)]:
        if HF_TOKEN in " ".join(proc.cmdline()):
            where.append(f"argv of {proc.pid}")
    for path in [*state.rglob("*"), tmp_path / "motd", tmp_path / "agent.log"]:
        if path.is_file() and path.parent.name != "secrets" and HF_TOKEN in path.read_text(errors="replace"):
            where.append(str(path))
    for url in (f"{health}/status", f"{health}/metrics"):
        if HF_TOKEN in requests.get(url, timeout=10).text:
            where.append(url)
    for argv in (["choice", "--root", str(tmp_path / "root")], ["choice", "--root", str(tmp_path / "root"), "--json"],
                 ["status", "--health", health], ["status", "--health", health, "--json"],
                 ["plan", "--machine", "cpu-only", "--profile", "tiny-cpu", "--json"]):
        shown = subprocess.run([KILN, *argv], capture_output=True, text=True, timeout=60, check=False)
        if HF_TOKEN in shown.stdout + shown.stderr:
            where.append("kiln " + " ".join(argv[:1] + argv[-1:]))
    return where


def test_the_agent_serves_what_user_data_chose(tmp_path: Path) -> None:
    seed = tmp_path / "root" / "var" / "lib" / "cloud" / "instance"
    seed.mkdir(parents=True)
    (seed / "user-data.txt").write_text(USER_DATA)
    state = tmp_path / "state"
    health = "http://127.0.0.1:18490"
    log = tmp_path / "agent.log"
    with log.open("w") as out:
        agent = subprocess.Popen(
            [KILN, "agent", "run", "--root", str(tmp_path / "root"), "--state-dir", str(state), "--launcher", "process",
             "--public-host", "127.0.0.1", "--port", "18400", "--http-port", "0", "--health-port", "18490",
             "--router-port", "18401",
             "--router-metrics-port", "18402", "--motd", str(tmp_path / "motd")], stdout=out, stderr=subprocess.STDOUT)
    try:
        status: dict[str, object] = {}
        deadline = time.monotonic() + 480
        while time.monotonic() < deadline and status.get("phase") != "ready":
            assert agent.poll() is None, log.read_text()[-3000:]
            with contextlib.suppress(requests.RequestException):
                status = requests.get(f"{health}/status", timeout=2).json()
            time.sleep(2)
        assert status.get("phase") == "ready", log.read_text()[-3000:]
        choice = status["choice"]
        assert isinstance(choice, dict) and choice["profile"] == "tiny-cpu" and choice["api_key_set"]
        assert choice["origins"]["profile"].startswith("user-data (cloud-init")
        plan = json.loads((state / "plan.json").read_text())
        assert plan == status["plan"] and len(plan["instances"]) == 1
        assert json.loads((state / "keys.json").read_text())["keys"] == [
            {"name": "default", "key": KEY, "requests_per_minute": None, "origin": "user-data"}]
        motd = (tmp_path / "motd").read_text()
        assert KEY not in motd and "API keys: default" in motd and "TLS off" in motd
        assert status["tls"] == {"mode": "off"}
        assert str(status["endpoint"]).startswith("http://") and str(status["endpoint"]).endswith(":18400")
        assert choice["hf_token_set"] is True and "hf_token" not in choice["values"]

        # The token reaches vLLM through its environment file alone, and nowhere else.
        env_file = state / "secrets" / "hf_token.env"
        assert env_file.read_text() == f"HF_TOKEN={HF_TOKEN}\n"
        assert env_file.stat().st_mode & 0o777 == 0o600 and env_file.parent.stat().st_mode & 0o777 == 0o700
        servers = [p for p in psutil.Process(agent.pid).children(recursive=True)
                   if "vllm.entrypoints.openai.api_server" in " ".join(p.cmdline())]
        assert servers and all(p.environ().get("HF_TOKEN") == HF_TOKEN for p in servers)
        assert token_leaks(tmp_path, state, agent, health) == []

        reply = requests.post("http://127.0.0.1:18400/v1/completions", timeout=60,
                              headers={"Authorization": f"Bearer {KEY}"},
                              json={"model": "tiny-cpu", "prompt": "kiln", "max_tokens": 8, "ignore_eos": True})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 8

        # A key added to user-data applies on `kiln reload`, with nothing restarted.
        def members() -> list[tuple[str, int]]:
            status = requests.get(f"{health}/status", timeout=10).json()
            return [(m["name"], m["pid"]) for m in [*status["instances"], *status["services"]]]

        pids = members()
        (seed / "user-data.txt").write_text(USER_DATA.replace("      tls: off", f"      tls: off\n      api_keys:\n"
                                                                             f"        ci: {CI_KEY}"))
        reload = subprocess.run([KILN, "reload", "--state-dir", str(state), "--health", health, "--json"],
                                capture_output=True, text=True, timeout=30, check=True)
        assert json.loads(reload.stdout)["reload"]["changed"] == ["keys"], reload.stdout
        models = requests.get("http://127.0.0.1:18400/v1/models", timeout=10,
                              headers={"Authorization": f"Bearer {CI_KEY}"})
        assert models.status_code == 200
        assert members() == pids  # nginx's master re-read its configuration; its workers alone were replaced
        children = psutil.Process(agent.pid).children(recursive=True)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=90)
    assert agent.returncode == 0
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive
