"""The middleware kiln loads into vLLM (kiln/data/vllm/kiln_key_usage.py), driven as vLLM's ASGI server drives it:
the request body as it arrives, the answer as vLLM sends it (one JSON body, or server-sent events)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from prometheus_client import REGISTRY
from tests.conftest import load_script

from kiln import datafiles

Message = MutableMapping[str, Any]


@pytest.fixture(scope="module")
def usage() -> ModuleType:
    return load_script("kiln_key_usage", Path(datafiles.data_dir("vllm")) / "kiln_key_usage.py")


def sample(name: str, key: str, model: str | None = None) -> float:
    """The counter for a key (and a model, where it is counted per model; summed over models without one)."""
    if name == "kiln_key_requests_total":
        return REGISTRY.get_sample_value(name, {"key": key}) or 0.0
    return sum(s.value for metric in REGISTRY.collect() for s in metric.samples
               if s.name == name and s.labels.get("key") == key and model in (None, s.labels.get("model")))


def drive(usage: ModuleType, key: str | None, body: dict[str, Any], answer: list[bytes], streaming: bool
          ) -> tuple[dict[str, Any], list[bytes]]:
    """One request through KeyUsage around an app that records the body it read and sends `answer`."""
    seen: dict[str, Any] = {}

    async def app(scope: Message, receive: Any, send: Any) -> None:
        body, more = b"", True
        while more:
            got = await receive()
            body, more = body + got["body"], got["more_body"]
        seen.update(json.loads(body))
        kind = b"text/event-stream" if streaming else b"application/json"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
        for i, chunk in enumerate(answer):
            await send({"type": "http.response.body", "body": chunk, "more_body": i < len(answer) - 1})

    raw = json.dumps(body).encode()
    parts = [raw[:10], raw[10:]]

    async def receive() -> Message:
        part = parts.pop(0)
        return {"type": "http.request", "body": part, "more_body": bool(parts)}

    sent: list[bytes] = []

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    if key:
        headers.append((b"x-kiln-key", key.encode()))
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
    asyncio.run(usage.KeyUsage(app)(scope, receive, send))
    return seen, sent


def test_a_json_answer_counts_the_request_and_its_tokens(usage: ModuleType) -> None:
    before = sample("kiln_key_generation_tokens_total", "ci"), sample("kiln_key_requests_total", "ci")
    answer = json.dumps({"model": "m", "choices": [{"text": "x"}],
                         "usage": {"prompt_tokens": 7, "completion_tokens": 5}}).encode()
    seen, sent = drive(usage, "ci", {"model": "m", "messages": []}, [answer], streaming=False)
    assert seen == {"model": "m", "messages": []} and sent == [answer]  # untouched both ways
    assert sample("kiln_key_generation_tokens_total", "ci") - before[0] == 5
    assert sample("kiln_key_generation_tokens_total", "ci", "m") >= 5  # per model too
    assert sample("kiln_key_prompt_tokens_total", "ci") >= 7
    assert sample("kiln_key_requests_total", "ci") - before[1] == 1


def test_a_stream_is_counted_and_the_client_sees_only_what_it_asked_for(usage: ModuleType) -> None:
    chunk = b'data: {"choices": [{"delta": {"content": "x"}}], "usage": null}\n\n'
    final = b'data: {"model": "adapter", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}}\n\n'
    before = sample("kiln_key_generation_tokens_total", "team")
    seen, sent = drive(usage, "team", {"model": "m", "stream": True}, [chunk, final, b"data: [DONE]\n\n"], True)
    assert seen["stream_options"] == {"include_usage": True}  # asked of vLLM for the count
    assert b"".join(sent) == chunk + b"data: [DONE]\n\n"  # and not passed on: the client did not ask
    assert sample("kiln_key_generation_tokens_total", "team") - before == 9

    seen, sent = drive(usage, "team", {"model": "m", "stream": True, "stream_options": {"include_usage": True}},
                       [chunk, final, b"data: [DONE]\n\n"], True)
    assert b"".join(sent) == chunk + final + b"data: [DONE]\n\n"  # asked for: kept
    assert sample("kiln_key_generation_tokens_total", "team") - before == 18
    assert sample("kiln_key_generation_tokens_total", "team", "adapter") >= 18


def test_a_request_without_a_key_name_passes_untouched(usage: ModuleType) -> None:
    seen, sent = drive(usage, None, {"model": "m", "stream": True}, [b"data: [DONE]\n\n"], True)
    assert "stream_options" not in seen and sent == [b"data: [DONE]\n\n"]
