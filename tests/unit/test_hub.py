"""The model step at boot, against a local stand-in of the Hugging Face Hub (tests/hub_server.py): which files vLLM
loads, who may read a gated repository (with the Hub's own error texts), one download with progress that keeps what
was complete when it was killed, and re-planning when a repository cannot be read."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import REPO
from tests.hub_server import Hub, Repo, serve

from kiln.choice.items import ModelItem
from kiln.choice.resolve import ResolvedChoice
from kiln.choice.schema import Choice
from kiln.hardware.system import repo_folder
from kiln.hub.client import GATED, MISSING, OK, UNREACHABLE, HubClient, Progress
from kiln.hub.files import Needed, RepoFile, files_vllm_loads
from kiln.hub.preflight import HubVerdict
from kiln.render.vllm import Runtime
from kiln.serve.decide import decide
from kiln.serve.models import Milestones, ModelStep
from kiln.wiring import Kiln

CONFIG = b'{"architectures": ["LlamaForCausalLM"]}'
GOOD, OTHER = "hf_goodTokenAbCdEfGh0123456789", "hf_otherTokenAbCdEfGh0123456789"
MODEL = "nvidia/Llama-3.1-8B-Instruct-FP8"  # llama-3.1-8b-instruct's FP8 checkpoint, as planned on h100x1
SPECULATOR = "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3"


@pytest.fixture
def hub() -> Iterator[Hub]:
    repos = {
        "org/open": Repo({"config.json": CONFIG, "tokenizer.json": b"{}", "model.safetensors": b"w" * 1000,
                          "original/consolidated.00.pth": b"p" * 500, "README.md": b"# model"}),
        "org/gated": Repo({"config.json": CONFIG, "model.safetensors": b"w" * 1000}, gated=True, readers={GOOD}),
        MODEL: Repo({"config.json": CONFIG, "model.safetensors": b"w" * 2000}, gated=True, readers={GOOD}),
    }
    with serve(Hub(repos)) as running:
        yield running


def test_vllm_loads_one_weight_format_and_the_top_level_config() -> None:
    files = [RepoFile(n, 1) for n in ("config.json", "model-00001.safetensors", "model.safetensors.index.json",
                                      "pytorch_model.bin", "original/consolidated.00.pth", "tokenizer.model",
                                      "README.md", "onnx/model.onnx", "chat_template.jinja")]
    assert [f.name for f in files_vllm_loads(files)] == [
        "chat_template.jinja", "config.json", "model-00001.safetensors", "model.safetensors.index.json",
        "tokenizer.model"]
    bins = [RepoFile("config.json", 1), RepoFile("pytorch_model.bin", 5)]
    assert [f.name for f in files_vllm_loads(bins)] == ["config.json", "pytorch_model.bin"]


def test_who_may_read_a_gated_repository(hub: Hub, tmp_path: Path) -> None:
    def check(token: str | None, repo: str) -> tuple[str, int | None, str]:
        found = HubClient(tmp_path, token, endpoint=hub.url).check(repo, "main")
        return found.status, found.http_status, found.message

    assert check(None, "org/open")[0] == OK
    assert check(None, "org/gated") == (GATED, 401, "Access to model org/gated is restricted. You must have access "
                                                     "to it and be authenticated to access it. Please log in.")
    assert check(OTHER, "org/gated") == (GATED, 403, "Access to model org/gated is restricted and you are not in the "
                                                      "authorized list. Visit https://huggingface.co/org/gated to ask "
                                                      "for access.")
    assert check(GOOD, "org/gated")[0] == OK
    assert check(GOOD, "org/nothing")[:2] == (MISSING, 401)
    opened = HubClient(tmp_path, None, endpoint=hub.url).check("org/open", "main")
    assert [f.name for f in opened.files] == ["config.json", "model.safetensors", "tokenizer.json"]
    assert opened.bytes == len(CONFIG) + 1000 + 2


def test_the_problems_say_what_to_do(hub: Hub, tmp_path: Path) -> None:
    need = Needed("org/gated", "main", "model")
    none = HubVerdict(((need, HubClient(tmp_path, None, endpoint=hub.url).check("org/gated", "main")),))
    [problem] = none.problems(token_set=False)
    assert "org/gated is gated and no hf_token is set" in problem.what
    assert problem.fix == ("accept the licence at https://huggingface.co/org/gated, then set hf_token in user-data "
                           "(or the file /etc/kiln/hf_token)")
    other = HubVerdict(((need, HubClient(tmp_path, OTHER, endpoint=hub.url).check("org/gated", "main")),))
    assert "may not read it" in other.problems(token_set=True)[0].what
    assert other.refused("model") and not other.refused("speculator")


def test_one_download_with_progress(hub: Hub, tmp_path: Path) -> None:
    big = os.urandom(3 << 20) * 8  # 24 MiB: huggingface_hub writes in 10 MiB chunks, so progress shows between
    hub.repos["org/big"] = Repo({"config.json": CONFIG, "model.safetensors": big})
    hub.bytes_per_s = 12 << 20
    client = HubClient(tmp_path / "hub", None, endpoint=hub.url)
    check = client.check("org/big", "main")
    seen: list[dict[str, object]] = []
    logged = Milestones()

    def progress(p: Progress) -> None:
        seen.append(p.as_dict())
        logged(p)

    path = client.download(check, progress, every_s=0.2)
    assert (path / "model.safetensors").read_bytes() == big
    middle = [s for s in seen if 0 < int(str(s["bytes_done"])) < check.bytes]
    assert any(int(str(s["rate_bytes_per_s"])) > 0 and s["eta_s"] is not None for s in middle), seen
    assert seen[-1]["bytes_done"] == check.bytes and seen[-1]["eta_s"] == 0.0
    assert logged.logged["org/big"] == 10


DOWNLOAD = """
import sys
from pathlib import Path
sys.path.insert(0, {agent!r})
from kiln.hub.client import HubClient
client = HubClient(Path({cache!r}), None, endpoint={url!r})
client.download(client.check("org/shards", "main"), lambda p: None)
"""


def test_a_killed_download_keeps_the_complete_files(hub: Hub, tmp_path: Path) -> None:
    # Fetched side by side, each at the server's pace: the small shard is complete long before the big ones.
    shards = {f"model-0000{i}-of-00003.safetensors": os.urandom(size) for i, size in
              ((1, 256 << 10), (2, 16 << 20), (3, 24 << 20))}
    hub.repos["org/shards"] = Repo({"config.json": CONFIG, **shards})
    hub.bytes_per_s = 2 << 20
    cache = tmp_path / "hub"
    script = DOWNLOAD.format(agent=str(REPO / "agent"), cache=str(cache), url=hub.url)
    first = subprocess.Popen([sys.executable, "-c", script])
    blobs = repo_folder(cache, "org/shards") / "blobs"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len([b for b in blobs.glob("*") if not b.name.endswith(".incomplete")]) < 2:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    kept = {b.name for b in blobs.glob("*") if not b.name.endswith(".incomplete")}
    assert 2 <= len(kept) < 4, kept  # config.json and at least one shard, not everything
    fetched_before = [p for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p]
    hub.bytes_per_s = None
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    fetched_after = [p for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p][len(fetched_before):]
    done = {p.rsplit("/", 1)[-1] for p in fetched_before} - {p.rsplit("/", 1)[-1] for p in fetched_after}
    assert {"config.json", "model-00001-of-00003.safetensors"} <= done  # what was complete was not fetched again
    snapshot = next((repo_folder(cache, "org/shards") / "snapshots").iterdir())
    assert all((snapshot / name).read_bytes() == data for name, data in shards.items())


def _step(kiln: Kiln, hub: Hub, tmp_path: Path, machine: str) -> tuple[ModelStep, Runtime]:
    runtime = Runtime(hf_home=str(tmp_path / "hf"))
    step = ModelStep(client=lambda token: HubClient(tmp_path / "hf" / "hub", token, endpoint=hub.url),
                     replan=lambda choice: decide(kiln, machine, choice, runtime), stopping=threading.Event())
    return step, runtime


def test_an_unreadable_speculator_turns_speculative_decoding_off(kiln: Kiln, hub: Hub, tmp_path: Path) -> None:
    step, runtime = _step(kiln, hub, tmp_path, "h100x1")
    resolved = ResolvedChoice(Choice(profile="llama-3.1-8b-instruct", objective="latency", hf_token=GOOD))
    first = decide(kiln, "h100x1", resolved, runtime)
    assert first.plan and first.plan.engine.speculative_config  # EAGLE-3 was planned
    decision, verdict = step.check(first, resolved)
    assert decision.plan and decision.plan.engine.speculative_config is None and not decision.failure
    assert verdict and [c.repo for c in verdict.readable] == [MODEL]
    problem = next(p for p in decision.problems if p.field == "speculator")
    assert SPECULATOR in problem.what and "speculative decoding is off" in problem.what


def test_an_unreadable_model_falls_back_to_the_default_profile(kiln: Kiln, hub: Hub, tmp_path: Path) -> None:
    step, runtime = _step(kiln, hub, tmp_path, "h100x1")
    resolved = ResolvedChoice(Choice(profile="llama-3.1-8b-instruct", speculative_decoding=False))  # no token
    decision, _ = step.check(decide(kiln, "h100x1", resolved, runtime), resolved)
    assert decision.profile and decision.profile.name == "qwen3-8b"
    assert any(f"{MODEL} is gated and no hf_token is set" in p.what for p in decision.problems)


def test_only_a_network_failure_reads_as_the_hub_unreachable(hub: Hub, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert HubClient(tmp_path, None, endpoint=closed, timeout_s=2).check("org/open", "main").status == UNREACHABLE
    with pytest.raises(ValueError):  # a bad call from kiln itself is a bug to see, not a network fault
        HubClient(tmp_path, None, endpoint=hub.url).check("org/not a repo id!", "main")


def test_several_models_ask_the_hub_for_every_models_repository(kiln: Kiln, hub: Hub, tmp_path: Path) -> None:
    step, runtime = _step(kiln, hub, tmp_path, "h100x8")
    models = (ModelItem(profile="llama-3.1-8b-instruct", speculative_decoding=False, quantization="fp8"),
              ModelItem(profile="qwen3-8b"))
    resolved = ResolvedChoice(Choice(models=models, hf_token=GOOD))
    first = decide(kiln, "h100x8", resolved, runtime)
    assert [m.name for m in first.models] == ["llama-3.1-8b-instruct", "qwen3-8b"]
    decision, verdict = step.check(first, resolved)
    assert [m.name for m in decision.models] == ["llama-3.1-8b-instruct", "qwen3-8b"]  # no re-plan
    assert verdict and [c.repo for c in verdict.readable] == [MODEL]
    qwen = first.models[1].plan.engine.model
    assert any(qwen in p.what for p in decision.problems)  # the fake Hub has no such repository
