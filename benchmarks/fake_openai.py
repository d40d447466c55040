"""A fast fake OpenAI backend: answers like vLLM's server (completions, chat, streaming) without a model.

It stands in for vLLM where the cost of the proxy path, not of inference, is measured.
    python -m benchmarks.fake_openai --port 18100 [--tokens-per-s 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from aiohttp import web

WORD = "kiln"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _prompt_tokens(body: dict[str, Any]) -> int:
    if "messages" in body:
        return sum(len(str(m.get("content", "")).split()) for m in body["messages"])
    return len(str(body.get("prompt", "")).split())


class FakeBackend:
    def __init__(self, model: str, delay_per_token_s: float) -> None:
        self.model = model
        self.delay = delay_per_token_s

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": int(time.time()), "owned_by": "kiln"}]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        body = await request.json()
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        kind = "chat.completion" if chat else "text_completion"
        base = {"id": f"fake-{time.monotonic_ns()}", "created": int(time.time()), "model": self.model}
        if not body.get("stream"):
            if self.delay:
                await asyncio.sleep(self.delay * n)
            text = " ".join([WORD] * n)
            choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text},
                                       "finish_reason": "length"} if chat else
                                      {"index": 0, "text": text, "finish_reason": "length"})
            return web.json_response({**base, "object": kind, "choices": [choice],
                                      "usage": _usage(_prompt_tokens(body), n)})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for i in range(n):
            if self.delay:
                await asyncio.sleep(self.delay)
            delta: dict[str, Any] = ({"index": 0, "delta": {"content": f" {WORD}"}, "finish_reason": None}
                                     if chat else {"index": 0, "text": f" {WORD}", "finish_reason": None})
            if i == n - 1:
                delta["finish_reason"] = "length"
            chunk = {**base, "object": f"{kind}.chunk" if chat else kind, "choices": [delta]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {**base, "object": kind, "choices": [], "usage": _usage(_prompt_tokens(body), n)}
            await response.write(f"data: {json.dumps(usage)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def make_app(model: str = "fake", delay_per_token_s: float = 0.0) -> web.Application:
    backend = FakeBackend(model, delay_per_token_s)
    app = web.Application()
    app.router.add_get("/health", backend.health)
    app.router.add_get("/v1/models", backend.models)
    app.router.add_post("/v1/completions", backend.completions)
    app.router.add_post("/v1/chat/completions", backend.chat)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18100)
    parser.add_argument("--model", default="fake")
    parser.add_argument("--tokens-per-s", type=float, default=0.0, help="0: as fast as possible")
    args = parser.parse_args()
    delay = 1.0 / args.tokens_per_s if args.tokens_per_s else 0.0
    web.run_app(make_app(args.model, delay), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
