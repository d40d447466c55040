"""`kiln up --config` with several models, for real: the tiny chat model with a LoRA adapter made here, and the tiny
model as an embedding model, each with its own CPU vLLM instance and router, behind one nginx front that routes by
`model`; driven through the openai SDK.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import yaml
from openai import NotFoundError, OpenAI, PermissionDeniedError
from prometheus_client.parser import text_string_to_metric_families

from kiln.processes import interrupt
from kiln.tinymodel import make_tiny_adapter
from kiln.wiring import Kiln

PUBLIC, HEALTH, ROUTER, ROUTER_METRICS, FIRST_INSTANCE = 18400, 18490, 18401, 18402, 18410
STARTUP_TIMEOUT_S = 600
KILN = str(Path(sys.executable).parent / "kiln")
KEY = "kiln-every-model-0123456789abcdef"
SCOPED_KEY = "kiln-embed-only-0123456789abcdef"


@dataclass
class Stack:
    proc: subprocess.Popen[bytes]
    state_dir: Path
    log: Path
    config: Path
    adapter: Path
    key: str = KEY

    health = f"http://127.0.0.1:{HEALTH}"

    def status(self) -> dict[str, Any]:
        reply = requests.get(f"{self.health}/status", timeout=10)
        reply.raise_for_status()
        data: dict[str, Any] = reply.json()
        return data

    def client(self, key: str | None = None) -> OpenAI:
        verify = str(self.state_dir / "tls" / "self-signed.crt")
        return OpenAI(base_url=f"https://127.0.0.1:{PUBLIC}/v1", api_key=key or self.key, max_retries=0,
                      http_client=httpx.Client(verify=verify, trust_env=False, timeout=60))

    def wait_for(self, what: str, check: Any, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"kiln up exited:\n{self.log.read_text()[-3000:]}"
            try:
                if check():
                    return
            except requests.RequestException:
                pass
            time.sleep(2)
        pytest.fail(f"{what} not within {timeout_s} s:\n{self.log.read_text()[-3000:]}")


def settings(adapter: Path, *more: dict[str, Any]) -> dict[str, Any]:
    # One instance each: `kiln up` gives the tiny model two by default, on this machine's two cores.
    return {"models": [{"profile": "tiny-cpu", "instances": 1, "lora": [{"name": "tiny-lora", "source": str(adapter)}]},
                       {"profile": "tiny-cpu", "name": "tiny-embed", "task": "embed", "instances": 1}, *more],
            "api_keys": {"everything": {"key": KEY}, "embed-only": {"key": SCOPED_KEY, "models": ["tiny-embed"]}}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    state = tmp_path_factory.mktemp("kiln-several")
    adapter = make_tiny_adapter(Kiln.create().catalog().get("tiny-cpu"), state / "adapters" / "tiny-lora")
    config = state / "kiln.yaml"
    config.write_text(yaml.safe_dump(settings(adapter)))
    log = state / "kiln-up.log"
    argv = [KILN, "up", "--state-dir", str(state / "state"), "--port", str(PUBLIC), "--health-port", str(HEALTH),
            "--router-port", str(ROUTER), "--router-metrics-port", str(ROUTER_METRICS), "--instance-port",
            str(FIRST_INSTANCE), "--no-self-check", "--config", str(config)]
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    s = Stack(proc, state / "state", log, config, adapter)
    try:
        s.wait_for("phase ready", lambda: s.status()["phase"] == "ready" and all(
            i["routed"] for i in s.status()["instances"] if i["name"].startswith("vllm")), STARTUP_TIMEOUT_S)
        assert {k["name"] for k in json.loads((s.state_dir / "keys.json").read_text())["keys"]} == {
            "everything", "embed-only"}
        yield s
    finally:
        interrupt(proc, 60)


def _instance_of(stack: Stack, name: str) -> dict[str, Any]:
    return next(i for i in stack.status()["instances"] if i["name"] == name)


def test_the_plan_places_each_model_on_its_own_instance(stack: Stack) -> None:
    plan = stack.status()["plan"]
    models = {m["name"]: m for m in plan["models"]}
    assert set(models) == {"tiny-cpu", "tiny-embed"}
    assert models["tiny-cpu"]["served_names"] == ["tiny-cpu", "tiny-llama", "tiny-lora"]
    chat_argv = models["tiny-cpu"]["plan"]["instances"][0]["argv"]
    assert "--enable-lora" in chat_argv and "--max-lora-rank" in chat_argv
    embed_argv = models["tiny-embed"]["plan"]["instances"][0]["argv"]
    assert embed_argv[embed_argv.index("--runner") + 1] == "pooling"
    names = [i["name"] for i in stack.status()["instances"]]
    assert {"vllm-0", "vllm-1"} <= set(names)
    shown = subprocess.run([KILN, "status", "--state-dir", str(stack.state_dir), "--health", stack.health],
                           capture_output=True, text=True, timeout=120, check=True).stdout
    assert "serving   tiny-cpu, tiny-llama, tiny-lora: chat, CPU, vllm-0" in shown
    assert "serving   tiny-embed: embed, CPU, vllm-1" in shown


def test_models_lists_every_model_and_adapter(stack: Stack) -> None:
    listed = {m.id: m for m in stack.client().models.list().data}
    assert {"tiny-cpu", "tiny-lora", "tiny-embed"} <= set(listed)
    assert listed["tiny-lora"].model_extra and listed["tiny-lora"].model_extra.get("parent") == "tiny-cpu"


def test_chat_on_the_base_and_on_the_adapter_differ(stack: Stack) -> None:
    client = stack.client()
    asked = {"messages": [{"role": "user", "content": "kiln bakes images"}], "max_tokens": 8, "temperature": 0,
             "logprobs": True, "top_logprobs": 5}
    base = client.chat.completions.create(model="tiny-cpu", **asked)  # type: ignore[call-overload]
    tuned = client.chat.completions.create(model="tiny-lora", **asked)  # type: ignore[call-overload]
    assert base.model == "tiny-cpu" and tuned.model == "tiny-lora"

    def first_token(reply: Any) -> list[tuple[str, float]]:
        assert reply.choices[0].logprobs and reply.choices[0].logprobs.content
        return [(t.token, round(t.logprob, 3)) for t in reply.choices[0].logprobs.content[0].top_logprobs]

    # The same prompt and greedy decoding: only the adapter's weights can tell the two answers apart.
    assert first_token(base) != first_token(tuned), (first_token(base), first_token(tuned))


def test_metrics_are_per_model_and_per_key(stack: Stack) -> None:
    stack.client().chat.completions.create(model="tiny-lora", messages=[{"role": "user", "content": "kiln"}],
                                           max_tokens=3)
    samples = [s for family in text_string_to_metric_families(
        requests.get(f"{stack.health}/metrics", timeout=30).text) for s in family.samples]
    assert {s.labels.get("kiln_router") for s in samples if s.name.startswith("vllm_router_")} >= {
        "router", "router-1"}
    tokens = [s for s in samples
              if s.name == "kiln_key_generation_tokens_total" and s.labels.get("key") == "everything"]
    assert any(s.labels.get("model") == "tiny-lora" and s.value >= 3 for s in tokens), tokens


def test_embeddings_have_the_models_size(stack: Stack) -> None:
    reply = stack.client().embeddings.create(model="tiny-embed", input=["kiln", "bakes images"])
    hidden = Kiln.create().catalog().get("tiny-cpu").architecture.hidden_size
    assert [len(d.embedding) for d in reply.data] == [hidden, hidden]


def test_rerank_is_routed_to_the_pooling_model(stack: Stack) -> None:
    reply = requests.post(f"https://127.0.0.1:{PUBLIC}/v1/rerank", timeout=60,
                          verify=str(stack.state_dir / "tls" / "self-signed.crt"),
                          headers={"Authorization": f"Bearer {stack.key}"},
                          json={"model": "tiny-embed", "query": "kiln", "documents": ["bakes", "images", "kiln"]})
    assert reply.status_code == 200, reply.text
    assert sorted(r["index"] for r in reply.json()["results"]) == [0, 1, 2]


def test_an_unknown_model_is_an_openai_404(stack: Stack) -> None:
    with pytest.raises(NotFoundError) as caught:
        stack.client().completions.create(model="no-such-model", prompt="kiln", max_tokens=2)
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "model_not_found"


def test_a_key_scoped_to_one_model_is_refused_the_others(stack: Stack) -> None:
    scoped = stack.client(SCOPED_KEY)
    assert scoped.embeddings.create(model="tiny-embed", input="kiln").data
    with pytest.raises(PermissionDeniedError) as caught:
        scoped.chat.completions.create(model="tiny-cpu", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "model_not_allowed"
    assert [m.id for m in scoped.models.list().data] == ["tiny-embed"]


def test_one_models_instance_killed_leaves_the_others_serving(stack: Stack) -> None:
    embed = _instance_of(stack, "vllm-1")
    assert embed["pid"]
    os.killpg(embed["pid"], signal.SIGKILL)
    stack.wait_for("vllm-1 out of routing", lambda: not _instance_of(stack, "vllm-1")["routed"], 30)
    client = stack.client()
    for _ in range(5):
        reply = client.completions.create(model="tiny-cpu", prompt="kiln", max_tokens=4)
        assert reply.choices[0].text is not None
    stack.wait_for("vllm-1 back in routing", lambda: _instance_of(stack, "vllm-1")["routed"], STARTUP_TIMEOUT_S)
    assert client.embeddings.create(model="tiny-embed", input="kiln").data


def _reload(stack: Stack, *more: dict[str, Any]) -> None:
    stack.config.write_text(yaml.safe_dump(settings(stack.adapter, *more)))
    done = subprocess.run([KILN, "reload", "--state-dir", str(stack.state_dir), "--health", stack.health],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    stack.wait_for("the models' change", lambda: ((stack.status().get("reload") or {}).get("rolling") or {}).get(
        "state") in ("done", "stopped", "refused"), STARTUP_TIMEOUT_S)
    rolling = stack.status()["reload"]["rolling"]
    assert rolling["state"] == "done", rolling


def test_a_model_added_and_removed_by_reload_leaves_the_others_serving(stack: Stack) -> None:
    client = stack.client()
    failures: list[str] = []
    served = [0]
    stop = threading.Event()

    def keep_asking() -> None:  # the kept models, throughout both changes
        while not stop.is_set():
            try:
                client.embeddings.create(model="tiny-embed", input="kiln")
                client.completions.create(model="tiny-cpu", prompt="kiln", max_tokens=2)
                served[0] += 2
            except Exception as exc:
                failures.append(repr(exc))

    before = {i["name"]: i["pid"] for i in stack.status()["instances"]}
    asking = threading.Thread(target=keep_asking, daemon=True)
    asking.start()
    try:
        _reload(stack, {"profile": "tiny-cpu", "name": "tiny-second", "instances": 1})
        assert client.completions.create(model="tiny-second", prompt="kiln", max_tokens=2).model == "tiny-second"
        assert "tiny-second" in {m.id for m in client.models.list().data}
        _reload(stack)
        with pytest.raises(NotFoundError):
            client.completions.create(model="tiny-second", prompt="kiln", max_tokens=2)
    finally:
        stop.set()
        asking.join(60)
    after = {i["name"]: i["pid"] for i in stack.status()["instances"]}
    assert after == before  # the kept models' processes never restarted
    print(f"\n  measured: {served[0]} requests to the kept models during two reloads, {len(failures)} failed")
    assert not failures and served[0] > 0, failures[:3]
