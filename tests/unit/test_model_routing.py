"""Routing by model in the real nginx front (its JavaScript module): two models, each behind its own "router" (a
local HTTP server that answers as vllm-router does, naming itself), a key limited to one model."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

from kiln.choice.schema import NamedKey
from kiln.serve.front.front import Front, FrontConfigError
from kiln.serve.front.proxy import ModelRoute, ProxySettings, find_nginx, find_njs_module, nginx_argv
from kiln.serve.layout import ServeLayout

KEY, SCOPED = "kiln-every-model-0123456789", "kiln-only-chat-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _backend(name: str, models: list[str]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send({"object": "list", "data": [{"id": m, "object": "model"} for m in models]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self._send({"served_by": name, "model": body["model"], "path": self.path,
                        "key": self.headers.get("X-Kiln-Key")})

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", _free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def front(tmp_path: Path) -> Iterator[tuple[str, Front]]:
    nginx, njs = find_nginx(), find_njs_module()
    if not (nginx and njs):
        pytest.skip("nginx and its JavaScript module are not installed (ci/setup.sh installs them)")
    chat, embed = _backend("chat-router", ["chat", "chat-lora"]), _backend("embed-router", ["embed"])
    routes = (ModelRoute(("chat", "chat-lora"), chat.server_address[1], (chat.server_address[1],)),
              ModelRoute(("embed",), embed.server_address[1], (embed.server_address[1],)))
    layout = ServeLayout(state_dir=tmp_path, public_host="127.0.0.1", public_port=_free_port(), http_port=None,
                         health_port=_free_port())
    front = Front(layout, ProxySettings(max_in_flight=8, routes=routes, njs_module=njs), nginx=nginx)
    front.load_keys(None, {"all": NamedKey(key=KEY), "chat-only": NamedKey(key=SCOPED, models=("chat", "chat-lora"))})
    front.choose_tls("off", ["127.0.0.1"])
    front.write_config()
    proc = subprocess.Popen(list(nginx_argv(nginx, layout)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{layout.public_port}"
    try:
        for _ in range(100):
            try:
                requests.get(f"{base}/health", timeout=1)
                break
            except requests.ConnectionError:
                threading.Event().wait(0.05)
        yield base, front
    finally:
        proc.terminate()
        proc.wait(10)
        chat.shutdown()
        embed.shutdown()


def _post(base: str, path: str, body: Any, key: str = KEY) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(f"{base}{path}", data=data, timeout=10,
                         headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})


def test_each_request_reaches_the_router_of_its_model(front: tuple[str, Front]) -> None:
    base, _ = front
    assert _post(base, "/v1/chat/completions", {"model": "chat"}).json()["served_by"] == "chat-router"
    assert _post(base, "/v1/chat/completions", {"model": "chat-lora"}).json()["served_by"] == "chat-router"
    embedded = _post(base, "/v1/embeddings", {"model": "embed", "input": "x"}).json()
    assert embedded == {"served_by": "embed-router", "model": "embed", "path": "/v1/embeddings", "key": "all"}
    # rerank and score go to the model's instances themselves (here the same server)
    assert _post(base, "/v1/rerank", {"model": "embed"}).json()["path"] == "/v1/rerank"


def test_an_unknown_or_missing_model_and_a_bad_body_get_openai_errors(front: tuple[str, Front]) -> None:
    base, _ = front
    unknown = _post(base, "/v1/completions", {"model": "gpt-4", "prompt": "x"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert "chat, chat-lora, embed" in unknown.json()["error"]["message"]
    missing = _post(base, "/v1/completions", {"prompt": "x"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"
    assert _post(base, "/v1/completions", b"{not json").json()["error"]["code"] == "invalid_json"
    big = _post(base, "/v1/completions", {"model": "chat", "prompt": "x" * (17 * 2**20)})
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"


def test_a_key_limited_to_some_models_is_refused_the_others(front: tuple[str, Front]) -> None:
    base, _ = front
    assert _post(base, "/v1/chat/completions", {"model": "chat"}, SCOPED).json()["key"] == "chat-only"
    refused = _post(base, "/v1/embeddings", {"model": "embed"}, SCOPED)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "model_not_allowed"
    listed = requests.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {SCOPED}"}, timeout=10).json()
    assert [m["id"] for m in listed["data"]] == ["chat", "chat-lora"]
    every = requests.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).json()
    assert [m["id"] for m in every["data"]] == ["chat", "chat-lora", "embed"]
    assert requests.get(f"{base}/v1/models", timeout=10).status_code == 401


def test_without_the_javascript_module_routing_is_refused_and_the_live_config_kept(tmp_path: Path) -> None:
    layout = ServeLayout(state_dir=tmp_path)
    front = Front(layout, ProxySettings(max_in_flight=8, routes=(ModelRoute(("a",), 9001), ModelRoute(("b",), 9003))))
    front.load_keys(KEY, None)
    with pytest.raises(FrontConfigError) as caught:
        front.write_config()
    assert "libnginx-mod-http-js" in caught.value.what
    assert not layout.proxy_config.exists()
