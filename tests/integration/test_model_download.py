"""First boot with a model from the Hub, for real: the agent checks the gated repository with the user's token,
downloads its files once with progress, and starts vLLM offline from the cache. The Hub is the local stand-in of
tests/hub_server.py, serving the tiny model's real files; vLLM is the CPU build."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
import yaml
from tests.conftest import PROFILES
from tests.hub_server import Hub, Repo, serve

from kiln.tinymodel import make_tiny_model
from kiln.wiring import Kiln

KILN = str(Path(sys.executable).parent / "kiln")
REPO_ID = "kiln-test/tiny-llama"
TOKEN = "hf_kilnDownloadTestTokenAbCdEfGh"


def profiles_with_a_hub_model(folder: Path) -> Path:
    """The catalog plus `tiny-hub`: tiny-cpu, but a gated repository on the Hub instead of a model made locally."""
    if folder.exists():
        return folder
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


@pytest.fixture
def scratch_disk(tmp_path: Path) -> Iterator[Path]:
    """A real scratch disk: a sparse 1 TiB ext4 image on a loop device, mounted beside the boot disk (which has less
    room), as a droplet's NVMe scratch disk is."""
    image, mount = tmp_path / "scratch.img", tmp_path / "scratch"
    mount.mkdir()
    subprocess.run(["truncate", "-s", "1T", str(image)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=False)
        image.unlink()


@contextlib.contextmanager
def agent(tmp_path: Path, hub: Hub, settings: str, port: int) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    (tmp_path / "root" / "etc" / "kiln").mkdir(parents=True)
    (tmp_path / "root" / "etc" / "kiln" / "kiln.yaml").write_text(settings)
    profiles = profiles_with_a_hub_model(tmp_path / "profiles")
    log = (tmp_path / "agent.log").open("w")
    proc = subprocess.Popen(
        [KILN, "--profiles-dir", str(profiles), "agent", "run", "--machine", "cpu-only", "--root",
         str(tmp_path / "root"), "--state-dir", str(tmp_path / "state"), "--launcher", "process",
         "--public-host", "127.0.0.1", "--port", str(port), "--http-port", "0", "--health-port", str(port + 90),
         "--router-port",
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


def test_a_gated_model_downloads_once_to_the_scratch_disk_and_serves_offline(hub: Hub, tmp_path: Path,
                                                                              scratch_disk: Path) -> None:
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
        cache = status["cache"]
        assert isinstance(cache, dict) and cache["disk"] == "scratch" and cache["root"] == str(scratch_disk / "kiln")
        assert "more room than the boot disk" in cache["reason"]
        assert (scratch_disk / "kiln" / "huggingface" / "hub" / "models--kiln-test--tiny-llama" / "blobs").is_dir()
        servers = [p for p in psutil.Process(proc.pid).children(recursive=True)
                   if "vllm.entrypoints.openai.api_server" in " ".join(p.cmdline())]
        assert len(servers) == 2 and all(p.environ().get("HF_HUB_OFFLINE") == "1" for p in servers)
        compiled = scratch_disk / "kiln" / "compile" / "vllm"
        assert all(p.environ().get("VLLM_CACHE_ROOT") == str(compiled) for p in servers)
        assert any(compiled.rglob("*")), "vLLM's compile cache is on the scratch disk"
        key = json.loads((tmp_path / "state" / "keys.json").read_text())["keys"][0]["key"]
        reply = requests.post("https://127.0.0.1:18600/v1/completions", timeout=60,
                              verify=str(tmp_path / "state" / "tls" / "self-signed.crt"),
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


def test_a_model_baked_into_the_image_boots_without_the_hub(hub: Hub, tmp_path: Path) -> None:
    profiles = profiles_with_a_hub_model(tmp_path / "profiles")
    baked = subprocess.run([KILN, "--profiles-dir", str(profiles), "models", "bake", "--profile", "tiny-hub",
                            "--machine", "cpu-only", "--state-dir", str(tmp_path / "state"), "--warm"],
                           capture_output=True, text=True, timeout=600, check=False,
                           env={**os.environ, "HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN})
    assert baked.returncode == 0, baked.stderr
    assert REPO_ID in baked.stdout and "baked for cpu-only: tiny-hub" in baked.stdout
    compiled = tmp_path / "state" / "compile" / "vllm"
    assert "warmed tiny-hub: ready in" in baked.stdout and any(compiled.rglob("*"))
    asked = len(hub.requests)
    # No token at boot: a gated repository that is baked needs none.
    with agent(tmp_path, hub, "profile: tiny-hub\ninstances: 1\n", 18620) as (proc, health):
        status = wait_for(health, {"ready", "failed"}, [], proc, 600)
        assert status.get("phase") == "ready", (tmp_path / "agent.log").read_text()[-3000:]
        download = status["download"]
        assert isinstance(download, dict) and download["state"] == "baked"
        detail = str(download["detail"])
        assert detail.startswith(f"{REPO_ID}: ") and "baked into the image and complete" in detail
        cache = status["cache"]
        assert isinstance(cache, dict) and cache["disk"] == "boot" and "already holds" in cache["reason"]
        servers = [p for p in psutil.Process(proc.pid).children(recursive=True)
                   if "vllm.entrypoints.openai.api_server" in " ".join(p.cmdline())]
        assert servers and all(p.environ().get("HF_HUB_OFFLINE") == "1" for p in servers)
        assert all(p.environ().get("VLLM_CACHE_ROOT") == str(compiled) for p in servers)  # the warmed caches
        startup = status["startup"]
        assert isinstance(startup, dict)
        steps = [s["step"] for s in startup["agent"]["steps"]]
        assert steps == ["start kiln (Python, imports)", "read the choice", "detect and plan", "ask the Hub",
                         "choose the cache disk", "pre-flight", "download", "start the units"]
        timeline = wait_for_timeline(health, "vllm-0")
        assert timeline["ready_s"] > 0 and timeline["phases"][0]["phase"] == "weights loaded"
    assert len(hub.requests) == asked, hub.requests[asked:]  # the boot asked the Hub nothing
    log = (tmp_path / "agent.log").read_text()
    assert "baked into the image and complete: nothing to download" in log
    assert "vllm-0 ready" in log and "agent's own share of the start" in log


def wait_for_timeline(health: str, name: str, timeout_s: float = 30) -> dict[str, Any]:
    """An instance's start-up phases once the agent has read them from its log (it does every few seconds)."""
    deadline = time.monotonic() + timeout_s
    timeline: dict[str, Any] = {}
    while time.monotonic() < deadline:
        timeline = requests.get(f"{health}/status", timeout=5).json()["startup"].get("instances", {}).get(name, {})
        if timeline.get("ready_s") is not None:
            break
        time.sleep(1)
    return timeline
