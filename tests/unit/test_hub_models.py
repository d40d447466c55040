"""A model named by its Hub id (`model: ORG/NAME`), end to end against the stand-in Hub (tests/hub_server.py) serving
the published config files of tests/data/hub: user-data, the Hub, the plan, and the rendered command line through
vLLM's own argument parser. The Hub's refusals (gated without a token, no such repository) and an architecture kiln
cannot size are refused before any weight is downloaded."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.hub_server import Hub, Repo, serve
from tests.unit.test_render import parse

from kiln.choice.resolve import resolve_choice
from kiln.choice.sources import RawInputs
from kiln.cli.main import main
from kiln.errors import KilnError
from kiln.render.vllm import Runtime
from kiln.serve.decide import decide
from kiln.wiring import Kiln

HUB_DATA = Path(__file__).resolve().parents[1] / "data" / "hub"
TOKEN = "hf_readerTokenAbCdEfGh0123456789"
GATED = "meta-llama/Llama-3.3-70B-Instruct"
UNKNOWN = "someorg/rwkv-7-world"
WEIGHTS = b"w" * 4096  # a stand-in weight file: what must never be fetched to plan


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    repos: dict[str, Repo] = {}
    for folder in sorted(HUB_DATA.glob("*/*")):
        repo = f"{folder.parent.name}/{folder.name}"
        files = {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "SOURCE"}
        files["tokenizer_config.json"] = json.dumps({"chat_template": "{{ messages }}"}).encode()
        if repo in (GATED, UNKNOWN):  # weights that must not be fetched; elsewhere no stand-in weights, whose
            files["model-00001-of-00001.safetensors"] = WEIGHTS  # listed size would be taken for the checkpoint's
        repos[repo] = Repo(files, gated=repo == GATED, readers={TOKEN})
    repos[UNKNOWN] = Repo({"config.json": b'{"architectures": ["RwkvForCausalLM"], "model_type": "rwkv"}',
                           "model.safetensors": WEIGHTS})
    with serve(Hub(repos)) as running:
        monkeypatch.setenv("HF_ENDPOINT", running.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield running


def user_data(settings: str) -> bytes:
    body = "".join(f"      {line}\n" for line in settings.splitlines())
    return f"#cloud-config\nwrite_files:\n  - path: /etc/kiln/kiln.yaml\n    content: |\n{body}".encode()


def weights_fetched(hub: Hub) -> list[str]:
    return [path for method, path, _ in hub.requests if method == "GET" and path.endswith(".safetensors")]


def test_user_data_model_is_read_from_the_hub_planned_and_rendered(hub: Hub, kiln: Kiln, tmp_path: Path) -> None:
    resolved = resolve_choice(RawInputs(user_data=user_data("model: Qwen/Qwen3-235B-A22B-FP8\nrevision: main")))
    decision = decide(kiln, "h100x8", resolved, Runtime(hf_home=str(tmp_path)))
    assert decision.failure is None and decision.plan is not None and decision.profile is not None, decision.problems
    assert decision.profile.name == "qwen3-235b-a22b-fp8" and not decision.problems
    assert decision.plan.engine.model == "Qwen/Qwen3-235B-A22B-FP8" and decision.plan.quantization == "fp8"
    # No index or weight file listed: the weights are counted from the config (235B parameters, FP8).
    # Every GPU of the instance holds its share: a tensor-parallel slice, or with expert parallelism its experts.
    engine = decision.plan.engine
    gpus = engine.tensor_parallel_size * engine.data_parallel_size
    assert decision.plan.predicted.weight_bytes_per_gpu * gpus > 230e9
    for instance in decision.rendered:
        args = parse(list(instance.argv))
        assert args.model == "Qwen/Qwen3-235B-A22B-FP8" and args.revision in (None, "main")  # main is the default
        assert args.tool_call_parser == "hermes" and args.reasoning_parser == "qwen3"  # the Qwen3 MoE recipe's
        assert args.max_model_len <= 40960  # the model's own context, from its config
    fetched = {path.rsplit("/", 1)[-1] for method, path, _ in hub.requests if "/resolve/" in path}
    assert fetched == {"config.json", "tokenizer_config.json"} and not weights_fetched(hub)


def test_plan_command_names_a_hub_model(hub: Hub, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--machine", "b300x8", "--model", "moonshotai/Kimi-K2.5", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    argv = plan["instances"][0]["argv"]
    # A Hub repository's code runs only where its owner says so: the plan says how.
    assert parse(argv).model == "moonshotai/Kimi-K2.5" and "--trust-remote-code" not in argv
    assert "recipes/blob/main/models/moonshotai/Kimi-K2.5.yaml" in plan["model_settings"]
    assert "trust_remote_code: true" in plan["model_settings"]
    assert not weights_fetched(hub)


def test_gated_repository_without_a_token_is_refused(hub: Hub, kiln: Kiln, tmp_path: Path) -> None:
    with pytest.raises(KilnError) as refused:
        kiln.profile(None, GATED, hub_cache=tmp_path)
    assert "gated and no hf_token is set" in refused.value.what and "Please log in" in refused.value.what
    assert f"https://huggingface.co/{GATED}" in refused.value.fix
    assert kiln.profile(None, GATED, TOKEN, hub_cache=tmp_path).architecture.num_layers == 80
    assert not weights_fetched(hub)


def test_missing_repository_is_refused(hub: Hub, kiln: Kiln, tmp_path: Path) -> None:
    with pytest.raises(KilnError) as refused:
        kiln.profile(None, "nobody/no-such-model", hub_cache=tmp_path)
    assert "no such repository" in refused.value.what and "check the name" in refused.value.fix


def test_unknown_architecture_is_refused_before_the_weights(hub: Hub, kiln: Kiln, tmp_path: Path) -> None:
    with pytest.raises(KilnError) as refused:
        kiln.profile(None, UNKNOWN, hub_cache=tmp_path)
    assert "RwkvForCausalLM" in refused.value.what and "Kimi K2" in refused.value.fix
    assert not weights_fetched(hub)


def test_a_refused_hub_model_falls_back_with_the_reason(hub: Hub, kiln: Kiln, tmp_path: Path) -> None:
    resolved = resolve_choice(RawInputs(user_data=user_data(f"model: {GATED}")))
    decision = decide(kiln, "h100x1", resolved, Runtime(hf_home=str(tmp_path)))
    assert decision.profile is not None and decision.profile.name == "qwen3-8b"
    assert any("gated" in p.what and p.field == "model" for p in decision.problems)


def test_models_bake_names_a_hub_model(hub: Hub, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "bake", "--model", "Qwen/Qwen3-32B", "--machine", "h100x8", "--state-dir", str(tmp_path),
                 "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["profiles"] == ["Qwen/Qwen3-32B"] and shown["repos"][0]["repo"] == "Qwen/Qwen3-32B"
