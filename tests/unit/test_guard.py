"""The request guard kiln loads into vLLM (kiln/data/vllm/kiln_guard.py), driven as vLLM's ASGI server drives it:
`n` bounded, sequences in flight counted, and the model list without the server's paths."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tests.conftest import load_script

from kiln import datafiles

Message = MutableMapping[str, Any]


@pytest.fixture(scope="module")
def guard_module() -> ModuleType:
    return load_script("kiln_guard", Path(datafiles.data_dir("vllm")) / "kiln_guard.py")


class Held:
    """vLLM's stand-in: answers 200 with `answer`, after `release` is set."""

    def __init__(self, answer: bytes = b'{"ok": true}') -> None:
        self.answer = answer
        self.release = asyncio.Event()
        self.served = 0

    async def __call__(self, scope: Message, receive: Any, send: Any) -> None:
        await receive()
        await self.release.wait()
        self.served += 1
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": self.answer, "more_body": False})


TO_CLIENT = {520: 400, 521: 500}  # what nginx answers the client for the guard's 520 and 521 (kiln.serve.front.proxy)


async def call(guard: Any, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """The status and body the client gets: a 520 or 521 is answered by nginx from its X-Kiln-Error header."""
    raw = json.dumps(body or {}).encode()
    got: dict[str, Any] = {"body": b""}

    async def receive() -> Message:
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            got["status"], got["headers"] = message["status"], dict(message.get("headers", ()))
        else:
            got["body"] += message.get("body", b"")

    await guard({"type": "http", "method": method, "path": path, "headers": []}, receive, send)
    if got["status"] in TO_CLIENT:
        header = json.loads(got["headers"][b"x-kiln-error"])
        assert header == json.loads(got["body"])  # the body whole, for nginx to answer with
        return TO_CLIENT[got["status"]], header
    return got["status"], json.loads(got["body"])


def test_n_beyond_the_bound_is_an_openai_shaped_400(guard_module: ModuleType,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_MAX_N", "16")
    app = Held()
    app.release.set()
    guard = guard_module.RequestGuard(app)
    for field in ("n", "best_of"):
        status, body = asyncio.run(call(guard, "POST", "/v1/completions", {"prompt": "x", field: 10000}))
        assert status == 400 and body["error"]["code"] == "too_many_sequences" and "16" in body["error"]["message"]
    assert asyncio.run(call(guard, "POST", "/v1/chat/completions", {"n": 16}))[0] == 200
    assert app.served == 1  # the refused requests never reached vLLM


def test_sequences_not_requests_are_counted_in_flight(guard_module: ModuleType,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_MAX_N", "16")
    monkeypatch.setenv("KILN_MAX_SEQUENCES", "20")

    async def scenario() -> list[int]:
        app = Held()
        guard = guard_module.RequestGuard(app)
        first = asyncio.create_task(call(guard, "POST", "/v1/completions", {"n": 16}))
        await asyncio.sleep(0.01)
        refused = await call(guard, "POST", "/v1/completions", {"n": 8})  # 16 + 8 > 20
        small = asyncio.create_task(call(guard, "POST", "/v1/completions", {"n": 4}))  # 16 + 4 fits
        await asyncio.sleep(0.01)
        app.release.set()
        codes = [refused[0], (await first)[0], (await small)[0]]
        assert refused[1]["error"]["code"] == "overloaded" and guard.in_flight == 0
        return codes

    assert asyncio.run(scenario()) == [429, 200, 200]


def test_the_model_list_names_the_model_not_its_path(guard_module: ModuleType) -> None:
    listing = {"object": "list", "data": [{"id": "tiny", "object": "model", "root": "/var/lib/kiln/models/tiny",
                                           "parent": None},
                                          {"id": "qwen", "object": "model", "root": "Qwen/Qwen3-8B", "parent": None}]}
    app = Held(json.dumps(listing).encode())
    app.release.set()
    status, body = asyncio.run(call(guard_module.RequestGuard(app), "GET", "/v1/models"))
    assert status == 200 and [m["root"] for m in body["data"]] == ["tiny", "Qwen/Qwen3-8B"]


def test_n_is_counted_as_vllm_reads_it(guard_module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_MAX_N", "16")
    app = Held()
    app.release.set()
    guard = guard_module.RequestGuard(app)
    for field in ("n", "best_of"):
        for value in (10000.0, "10000", " 10000 ", "10000.0", "1_0000"):  # each of them 10,000 to vLLM's request
            status, body = asyncio.run(call(guard, "POST", "/v1/completions", {"prompt": "x", field: value}))
            assert status == 400 and body["error"]["code"] == "too_many_sequences", (field, value)
    for value in (16.0, "16", "ten", 1.5, True, None, [20]):  # what vLLM takes as 16 or 1, or answers itself
        assert asyncio.run(call(guard, "POST", "/v1/completions", {"prompt": "x", "n": value}))[0] == 200, value
    assert app.served == 7


def test_each_prompt_of_a_list_counts(guard_module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_MAX_N", "16")
    monkeypatch.setenv("KILN_MAX_SEQUENCES", "20")
    assert guard_module.sequences_asked(json.dumps({"prompt": ["a"] * 1024, "n": 16}).encode()) == 16384
    assert guard_module.sequences_asked(json.dumps({"prompt": [[1, 2], [3]], "n": "3"}).encode()) == 6
    assert guard_module.sequences_asked(json.dumps({"prompt": [1, 2, 3], "n": 4}).encode()) == 4  # one prompt's ids
    assert guard_module.sequences_asked(json.dumps({"messages": [{"role": "user", "content": "x"}] * 3}).encode()) == 1

    async def scenario() -> list[int]:
        app = Held()
        guard = guard_module.RequestGuard(app)
        never = await call(guard, "POST", "/v1/completions", {"prompt": ["a"] * 1024, "n": 16})  # can never fit
        assert never[1]["error"]["code"] == "too_many_sequences" and "prompt" in never[1]["error"]["message"]
        first = asyncio.create_task(call(guard, "POST", "/v1/completions", {"prompt": ["a", "b"], "n": 8}))
        await asyncio.sleep(0.01)
        refused = await call(guard, "POST", "/v1/completions", {"prompt": "c", "n": 8})  # 2 x 8 + 8 > 20
        app.release.set()
        return [never[0], refused[0], (await first)[0]]

    assert asyncio.run(scenario()) == [400, 429, 200]


class Failing:
    """vLLM answering with an error: its JSON, or a plain text."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status, self.body = status, body

    async def __call__(self, scope: Message, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"1")]})
        await send({"type": "http.response.body", "body": self.body, "more_body": False})


async def sent_by(guard: Any) -> list[Message]:
    got: list[Message] = []

    async def send(message: Message) -> None:
        got.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    await guard({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}, receive, send)
    return got


def test_vllms_errors_go_to_the_router_as_520_and_521_with_their_words(guard_module: ModuleType) -> None:
    """The router retries a 500 on every worker, and nginx asked again for a 400's body: a failing request ran up to
    four times. 520 and 521 are neither retried nor passed on; nginx answers the original status from the header."""
    vllm_500 = b'{"error": {"message": "grammar failed", "type": "InternalServerError", "code": 500}}'
    for status, body, front in ((500, vllm_500, 521), (400, b'{"error": {"message": "bad", "code": 400}}', 520),
                                (500, b"Internal Server Error", 521)):
        start, sent = asyncio.run(sent_by(guard_module.RequestGuard(Failing(status, body))))
        headers = dict(start["headers"])
        assert start["status"] == front and sent["body"] == body
        assert headers[b"content-length"] == str(len(body)).encode()
        error = json.loads(headers[b"x-kiln-error"])["error"]
        assert error["message"] in body.decode() and headers[b"x-kiln-error"].isascii()
    ok = guard_module.RequestGuard(Held())
    ok.app.release.set()
    assert asyncio.run(call(ok, "POST", "/v1/completions", {"prompt": "x"}))[0] == 200


def test_more_tools_than_openai_allows_are_refused(guard_module: ModuleType) -> None:
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {}}} for i in range(129)]
    app = Held()
    status, body = asyncio.run(call(guard_module.RequestGuard(app), "POST", "/v1/chat/completions",
                                    {"messages": [], "tools": tools, "tool_choice": "required"}))
    assert status == 400 and body["error"]["code"] == "too_many_tools" and app.served == 0
    app.release.set()
    assert asyncio.run(call(guard_module.RequestGuard(app), "POST", "/v1/chat/completions",
                            {"messages": [], "tools": tools[:128]}))[0] == 200
