"""First boot with a model from the Hub, for real: the agent checks the gated repository with the user's token,
downloads its files once with progress, and starts vLLM offline from the cache. The Hub is the local stand-in of
tests/hub_server.py, serving the tiny model's real files; vLLM is the CPU build."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests
import yaml
from tests.conftest import PROFILES
from tests.hub_server import Hub, Repo, serve

from kiln.tinymodel import make_tiny_model
from kiln.wiring import Kiln

pytestmark = pytest.mark.integration
KILN = str(Path(sys.executable).parent / "kiln")
REPO_ID = "kiln-test/tiny-llama"
TOKEN = "hf_kilnDownloadTestTokenAbCdEfGh"


def profiles_with_a_hub_model(folder: Path) -> Path:
    """The catalog plus `tiny-hub`: tiny-cpu, but a gated repository on the Hub instead of a model made locally."""
    shutil.copytree(PROFILES, folder)
    tiny = yaml.safe_load((PROFILES / "tiny-cpu.yaml").read_text())
    tiny["name"] = "tiny-hub"
    tiny["model"] = {**tiny["model"], "hf_id": REPO_ID, "gated": True}
    tiny["checkpoints"] = {"bf16": {"hf_id": REPO_ID, "revision": "main"}}
    (folder / "tiny-hub.yaml").write_text(yaml.safe_dump(tiny, sort_keys=False))
    return folder


@pytest.fixture
def hub(kiln: Kiln, tmp_path: Path) -> Iterator[Hub]:
    made = tmp_path / "made"
    make_tiny_model(kiln.catalog().get("tiny-cpu"), made)
    with serve(Hub({REPO_ID: Repo.from_folder(made, gated=True, readers={TOKEN})})) as running:
        yield running


@contextlib.contextmanager
def agent(tmp_path: Path, hub: Hub, settings: str, port: int) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    (tmp_path / "root" / "etc" / "kiln").mkdir(parents=True)
    (tmp_path / "root" / "etc" / "kiln" / "kiln.yaml").write_text(settings)
    profiles = profiles_with_a_hub_model(tmp_path / "profiles")
    log = (tmp_path / "agent.log").open("w")
    proc = subprocess.Popen(
        [KILN, "--profiles-dir", str(profiles), "agent", "run", "--machine", "cpu-only", "--root",
         str(tmp_path / "root"), "--state-dir", str(tmp_path / "state"), "--launcher", "process",
         "--public-host", "127.0.0.1", "--port", str(port), "--health-port", str(port + 90), "--router-port",
         str(port + 1), "--router-metrics-port", str(port + 2), "--motd", str(tmp_path / "motd")],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_ENDPOINT": hub.url})
    try:
        yield proc, f"http://127.0.0.1:{port + 90}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
        log.close()


def wait_for(health: str, phases: set[str], seen: list[str], proc: subprocess.Popen[bytes],
             timeout_s: float) -> dict[str, object]:
    status: dict[str, object] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and status.get("phase") not in phases:
        assert proc.poll() is None
        with contextlib.suppress(requests.RequestException):
            status = requests.get(f"{health}/status", timeout=2).json()
            seen.append(str(status.get("phase")))
        time.sleep(0.2)
    return status


def test_a_gated_model_downloads_once_and_serves_offline(hub: Hub, tmp_path: Path) -> None:
    settings = f"profile: tiny-hub\ninstances: 2\nhf_token: {TOKEN}\n"
    hub.bytes_per_s = 20_000  # slow enough to watch the download on /status
    with agent(tmp_path, hub, settings, 18600) as (proc, health):
        seen: list[str] = []
        status = wait_for(health, {"ready", "failed"}, seen, proc, 600)
        assert status.get("phase") == "ready", (tmp_path / "agent.log").read_text()[-3000:]
        assert "downloading" in seen
        download = status["download"]
        assert isinstance(download, dict) and download["repo"] == REPO_ID
        assert download["bytes_done"] == download["bytes_total"] > 0
        files = {p.rsplit("/", 1)[-1] for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p}
        gets = [p for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p]
        assert len(gets) == len(files) >= 3  # every file once, by the agent alone, for two instances
        servers = [p for p in psutil.Process(proc.pid).children(recursive=True)
                   if "vllm.entrypoints.openai.api_server" in " ".join(p.cmdline())]
        assert len(servers) == 2 and all(p.environ().get("HF_HUB_OFFLINE") == "1" for p in servers)
        key = (tmp_path / "state" / "api_key").read_text().strip()
        reply = requests.post("http://127.0.0.1:18600/v1/completions", timeout=60,
                              headers={"Authorization": f"Bearer {key}"},
                              json={"model": "tiny-hub", "prompt": "kiln", "max_tokens": 4})
        assert reply.status_code == 200, reply.text
        log = (tmp_path / "agent.log").read_text()
        assert f"downloading {REPO_ID}" in log and f"download {REPO_ID}: 100%" in log
    assert proc.returncode == 0


def test_a_gated_model_without_a_token_says_what_to_do(hub: Hub, tmp_path: Path) -> None:
    with agent(tmp_path, hub, "profile: tiny-hub\n", 18610) as (proc, health):
        status = wait_for(health, {"failed", "ready"}, [], proc, 120)
        assert status.get("phase") == "failed"
        choice = status["choice"]
        assert isinstance(choice, dict)
        gated = next(p for p in choice["problems"] if p["source"] == "hugging face")
        assert gated["error"].startswith(f"{REPO_ID} is gated and no hf_token is set (Access to model {REPO_ID} is "
                                         "restricted. You must have access to it and be authenticated to access "
                                         "it. Please log in.)")
        assert gated["fix"] == (f"accept the licence at https://huggingface.co/{REPO_ID}, then set hf_token in "
                                "user-data (or the file /etc/kiln/hf_token)")
        assert not [p for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p]  # nothing was downloaded
    log = (tmp_path / "agent.log").read_text()
    assert f"{REPO_ID} is gated and no hf_token is set" in log
