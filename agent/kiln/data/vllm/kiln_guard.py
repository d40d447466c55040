"""Bounds inside each vLLM server that nginx cannot see (loaded with `--middleware kiln_guard.RequestGuard`;
self-contained, as vLLM's Python imports it apart from kiln).

- `n` and `best_of` per request, as vLLM reads them (16.0 and "16" are 16): at most KILN_MAX_N sequences (a 400
  beyond, shaped as OpenAI's errors), so one request cannot queue thousands of sequences in front of everyone else's.
- Sequences in flight: nginx bounds requests; a request of p prompts asking for n sequences weighs p x n here; beyond
  KILN_MAX_SEQUENCES in this server the request is refused with 429 and Retry-After, as nginx refuses requests, and
  one that alone exceeds it with 400.
- `tools`: at most 128 per request, OpenAI's own bound (5,000 tools with tool_choice: required held an instance for
  59 s).
- `/v1/models` names a model by its id in `root` too, never by its folder on the server.
- vLLM's refusals (400) and failures (500) go to the router as 520 and 521, with their body in X-Kiln-Error: the
  router retries a 500 on other workers and nginx asked again for a 400's body, so a request vLLM answered with an
  error ran up to four times. The router passes 520 and 521 on as they are; nginx answers the client the original
  status with that body.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from pydantic import TypeAdapter, ValidationError  # vLLM's own request models are pydantic's

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

GENERATING = ("/v1/completions", "/v1/chat/completions")
FRONT_CODES = {400: 520, 500: 521}  # kiln.serve.front.proxy answers 520 as 400 and 521 as 500
MAX_TOOLS = 128  # OpenAI's API: "A max of 128 functions are supported"
MAX_ERROR_MESSAGE = 2000  # the header must fit nginx's proxy_buffer_size
MAX_BODY = 64 * 2**20  # nginx's client_max_body_size
RETRY_AFTER_S = 2


_AS_INT = TypeAdapter(int)


def _as_vllm_reads(value: object) -> int | None:
    """An integer field as vLLM's request model reads it: pydantic's lax mode takes 16.0, "16" and " 1_6 " as 16.
    None: vLLM refuses the value itself."""
    try:
        return _AS_INT.validate_python(value)
    except ValidationError:
        return None


def _request(body: bytes) -> dict[str, Any]:
    """The request's JSON object; {} when unreadable (vLLM itself answers a body it cannot read)."""
    try:
        request = json.loads(body)
    except ValueError:
        return {}
    return request if isinstance(request, dict) else {}


def _per_prompt(request: dict[str, Any]) -> int:
    """The sequences one prompt asks for: the larger of n and best_of."""
    asked = [_as_vllm_reads(request[field]) for field in ("n", "best_of") if request.get(field) is not None]
    return max([1, *(v for v in asked if v is not None)])


def _prompts(request: dict[str, Any]) -> int:
    """A completion's prompts: a list of texts or of token-id lists is one prompt each; one list of ids is one."""
    prompt = request.get("prompt")
    if isinstance(prompt, list) and not all(isinstance(p, int) for p in prompt):
        return max(1, len(prompt))
    return 1


def sequences_asked(body: bytes) -> int:
    """How many sequences a request's body asks for: its prompts times the larger of n and best_of."""
    request = _request(body)
    return _prompts(request) * _per_prompt(request)


def error_body(message: str, kind: str, code: str, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}}).encode()


def models_by_id(body: bytes) -> bytes:
    """vLLM's model list with a model's `root`, when it is its folder on the server, replaced by its id."""
    try:
        listing = json.loads(body)
    except ValueError:
        return body
    if not isinstance(listing, dict) or not isinstance(listing.get("data"), list):
        return body
    for card in listing["data"]:
        if isinstance(card, dict) and str(card.get("root", "")).startswith("/"):  # a Hub id says nothing private
            card["root"] = card.get("id")
    return json.dumps(listing).encode()


class RequestGuard:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.max_n = int(os.environ.get("KILN_MAX_N", "16"))
        self.max_sequences = int(os.environ.get("KILN_MAX_SEQUENCES", "0"))  # 0: not counted
        self.in_flight = 0  # sequences of the requests this server is answering (one event loop: no lock)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        if scope.get("method") == "POST":
            send = _errors_for_the_front(send)
        if scope.get("method") == "GET" and path == "/v1/models":
            await self.app(scope, receive, _models_rewritten(send))
        elif scope.get("method") == "POST" and path in GENERATING:
            await self._generate(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _generate(self, scope: Scope, receive: Receive, send: Send) -> None:
        body, more, messages = b"", True, []
        while more and len(body) <= MAX_BODY:
            message = await receive()
            messages.append(message)
            body += message.get("body", b"")
            more = message.get("more_body", False) and message.get("type") == "http.request"
        request = _request(body)
        per_prompt = _per_prompt(request)
        asked = _prompts(request) * per_prompt
        if per_prompt > self.max_n:
            await _answer(send, 400, error_body(
                f"n and best_of may be at most {self.max_n} on this server (asked: {per_prompt})",
                "invalid_request_error", "too_many_sequences", "n"))
            return
        tools = request.get("tools")
        if isinstance(tools, list) and len(tools) > MAX_TOOLS:
            await _answer(send, 400, error_body(
                f"a request may carry at most {MAX_TOOLS} tools (asked: {len(tools)})", "invalid_request_error",
                "too_many_tools", "tools"))
            return
        if self.max_sequences and asked > self.max_sequences:  # would hold the server alone, ahead of everyone
            await _answer(send, 400, error_body(
                f"a request may ask for at most {self.max_sequences} sequences on this server, its prompts times n "
                f"(asked: {asked}); send the prompts in smaller lists", "invalid_request_error",
                "too_many_sequences", "prompt"))
            return
        if self.max_sequences and self.in_flight + asked > self.max_sequences and self.in_flight > 0:
            await _answer(send, 429, error_body(
                f"the server is at capacity ({self.max_sequences} sequences in flight); retry later",
                "server_error", "overloaded"), [(b"retry-after", str(RETRY_AFTER_S).encode())])
            return
        self.in_flight += asked
        try:
            await self.app(scope, _replay(messages, receive), send)
        finally:
            self.in_flight -= asked


def error_header(body: bytes, status: int) -> bytes:
    """An error answer as one header line of OpenAI's JSON shape: vLLM's own, or its text wrapped."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    if not isinstance(error, dict):
        error = {"message": body.decode("utf-8", errors="replace"),
                 "type": "invalid_request_error" if status < 500 else "server_error", "code": status}
    error = {**error, "message": str(error.get("message", ""))[:MAX_ERROR_MESSAGE]}
    return json.dumps({"error": error}, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def _errors_for_the_front(send: Send) -> Send:
    held: list[Message] = []
    chunks: list[bytes] = []

    async def marked(message: Message) -> None:
        if message["type"] == "http.response.start" and message.get("status") in FRONT_CODES:
            held.append(message)
            return
        if not held or message["type"] != "http.response.body":
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return
        head, body = held[0], b"".join(chunks)
        headers = [(k, v) for k, v in head.get("headers", ()) if k.lower() != b"content-length"]
        await send({**head, "status": FRONT_CODES[head["status"]],
                    "headers": [*headers, (b"x-kiln-error", error_header(body, head["status"])),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return marked


def _models_rewritten(send: Send) -> Send:
    start: list[Message] = []
    chunks: list[bytes] = []

    async def rewritten(message: Message) -> None:
        if message["type"] == "http.response.start":
            start.append(message)
            return
        if message["type"] != "http.response.body" or not start:
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return
        body = models_by_id(b"".join(chunks))
        head = start[0]
        headers = [(k, v) for k, v in head.get("headers", ()) if k.lower() != b"content-length"]
        await send({**head, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return rewritten


async def _answer(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed
