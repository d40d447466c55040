"""Requests and tokens per API key name, counted inside each vLLM server (loaded with `--middleware
kiln_key_usage.KeyUsage`; self-contained, as vLLM's Python imports it apart from kiln).

nginx sends the name of the key a request came with as X-Kiln-Key. The usage vLLM reports is read from the
answer: a JSON body's `usage`, or a stream's usage chunk, which is asked for on every stream
(`stream_options.include_usage`) and dropped again when the client had not asked for it. The counters join vLLM's
own on its /metrics, which the kiln agent merges per instance.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import Counter

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

HEADER = b"x-kiln-key"
STREAMED = ("/v1/completions", "/v1/chat/completions")
MAX_BODY = 64 * 2**20  # nginx's client_max_body_size
REQUESTS = Counter("kiln_key_requests", "Requests per API key name", ["key"])
# Tokens per key and per model: the served name (a model or a LoRA adapter) the answer names.
PROMPT_TOKENS = Counter("kiln_key_prompt_tokens", "Prompt tokens per API key name and model", ["key", "model"])
GENERATION_TOKENS = Counter("kiln_key_generation_tokens", "Generated tokens per API key name and model",
                            ["key", "model"])


def count_usage(key: str, answer: Any) -> None:
    """The usage of one answer (a JSON body or a stream's usage chunk), under the model it names."""
    if not isinstance(answer, dict) or not isinstance(answer.get("usage"), dict):
        return
    usage, model = answer["usage"], str(answer.get("model") or "")[:128]
    PROMPT_TOKENS.labels(key, model).inc(max(int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0), 0))
    GENERATION_TOKENS.labels(key, model).inc(
        max(int(usage.get("completion_tokens") or usage.get("output_tokens") or 0), 0))


def with_usage_asked(body: bytes) -> tuple[bytes, bool]:
    """A streaming request's body with include_usage set, and whether the client had asked for it itself."""
    try:
        request = json.loads(body)
    except ValueError:
        return body, True
    if not isinstance(request, dict) or not request.get("stream"):
        return body, True
    options = request.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        return body, True
    request["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    return json.dumps(request).encode(), False


def usage_events(chunk: bytes) -> tuple[list[Any], bytes]:
    """The events of a chunk that carry a usage, and the chunk without the usage-only events."""
    found: list[Any] = []
    kept: list[bytes] = []
    for event in chunk.split(b"\n\n"):
        data = event.removeprefix(b"data: ")
        if b'"usage"' in data and data.startswith(b"{"):
            try:
                parsed = json.loads(data)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict) and parsed.get("usage"):
                found.append(parsed)
                if not parsed.get("choices"):
                    continue  # the usage-only chunk
        kept.append(event)
    return found, b"\n\n".join(kept)


class KeyUsage:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == HEADER), "")
        if scope.get("type") != "http" or not key or not str(scope.get("path", "")).startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        REQUESTS.labels(key).inc()
        asked = True
        if scope.get("method") == "POST" and scope.get("path") in STREAMED:
            body, more, messages = b"", True, []
            while more and len(body) <= MAX_BODY:
                message = await receive()
                messages.append(message)
                body += message.get("body", b"")
                more = message.get("more_body", False) and message.get("type") == "http.request"
            if not more:
                body, asked = with_usage_asked(body)
                scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-length"] + [
                    (b"content-length", str(len(body)).encode())]
                messages = [{"type": "http.request", "body": body, "more_body": False}]
            receive = _replay(messages, receive)
        streaming = False

        async def counted(message: Message) -> None:
            nonlocal streaming
            if message["type"] == "http.response.start":
                streaming = any(k == b"content-type" and v.startswith(b"text/event-stream")
                                for k, v in message.get("headers", ()))
            elif message["type"] == "http.response.body" and b'"usage"' in message.get("body", b""):
                body = message["body"]
                if streaming:
                    found, stripped = usage_events(body)
                    for event in found:
                        count_usage(key, event)
                    if not asked:
                        message = {**message, "body": stripped}
                else:
                    with contextlib.suppress(ValueError, AttributeError):
                        count_usage(key, json.loads(body))
            await send(message)

        await self.app(scope, receive, counted)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
