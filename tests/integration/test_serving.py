"""`kiln up` for real: two CPU vLLM instances of the tiny model behind vllm-router and the nginx front.

One stack serves the whole module; the tests run in file order and the last one stops it with Ctrl-C.
Measured times (routing exit after kill -9, restart, hang detection) are printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import requests
from openai import BadRequestError, OpenAI
from prometheus_client.parser import text_string_to_metric_families

from kiln.cli.keys import RELOAD_WAIT_S
from kiln.processes import interrupt

PUBLIC, HEALTH, ROUTER, ROUTER_METRICS = 18000, 18090, 18001, 18002
PRICE_PER_HOUR = 1.57
STARTUP_TIMEOUT_S = 480
# Each new instance compiles afresh (max_model_len is part of vLLM's compile hash) beside 16 busy clients.
ROLLING_TIMEOUT_S = 1800
KILN = str(Path(sys.executable).parent / "kiln")


@dataclass
class Stack:
    proc: subprocess.Popen[bytes]
    state_dir: Path
    log: Path
    key: str = ""
    measured: dict[str, float] = field(default_factory=dict)
    http: requests.Session = field(default_factory=requests.Session)  # pins the stack's own certificate

    @property
    def certificate(self) -> Path:
        return self.state_dir / "tls" / "self-signed.crt"

    def pinned(self) -> ssl.SSLContext:
        """What a client of a self-signed endpoint does: trust that one certificate, and only it."""
        return ssl.create_default_context(cafile=str(self.certificate))

    base = f"https://127.0.0.1:{PUBLIC}"
    health = f"http://127.0.0.1:{HEALTH}"
    router = f"http://127.0.0.1:{ROUTER}"

    def status(self) -> dict[str, Any]:
        reply = requests.get(f"{self.health}/status", timeout=10)
        reply.raise_for_status()
        data: dict[str, Any] = reply.json()
        return data

    def instance(self, name: str) -> dict[str, Any]:
        return next(i for i in self.status()["instances"] if i["name"] == name)

    def routed_urls(self) -> list[str]:
        return list(requests.get(f"{self.router}/list_workers", timeout=5).json()["urls"])

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def wait_for(self, what: str, check: Any, timeout_s: float, every_s: float = 0.1) -> float:
        """Seconds until check() is true."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            assert self.proc.poll() is None, f"kiln up exited:\n{self.log.read_text()[-3000:]}"
            try:
                if check():
                    return time.monotonic() - start
            except requests.RequestException:
                pass
            time.sleep(every_s)
        pytest.fail(f"{what} not within {timeout_s} s:\n{self.log.read_text()[-3000:]}")


def report(capsys: pytest.CaptureFixture[str], text: str) -> None:
    with capsys.disabled():
        print(f"\n  measured: {text}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    state = tmp_path_factory.mktemp("kiln-up")
    log = state / "kiln-up.log"
    argv = [KILN, "up", "--state-dir", str(state), "--host", "0.0.0.0", "--port", str(PUBLIC),
            "--health-port", str(HEALTH), "--router-port", str(ROUTER), "--router-metrics-port", str(ROUTER_METRICS),
            "--price-per-hour", str(PRICE_PER_HOUR), "--config", str(state / "kiln.yaml")]
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    s = Stack(proc, state, log)
    try:
        s.wait_for("phase ready", lambda: s.status()["phase"] == "ready", STARTUP_TIMEOUT_S, every_s=2)
        s.key = json.loads((state / "keys.json").read_text())["keys"][0]["key"]
        s.http.verify = str(s.certificate)
        # One kept-alive TLS connection per streaming client: a new handshake per request would load the machine.
        s.http.mount("https://", requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=64))
        s.http.trust_env = False  # REQUESTS_CA_BUNDLE, where set, would override the pinned certificate
        yield s
    finally:
        interrupt(proc, 60)


def test_completion_and_streamed_chat_through_the_public_endpoint(stack: Stack) -> None:
    reply = stack.http.post(f"{stack.base}/v1/completions", headers=stack.auth(), timeout=60, json={
        "model": "tiny-cpu", "prompt": "kiln bakes", "max_tokens": 16, "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 16

    chunks: list[dict[str, Any]] = []
    with stack.http.post(f"{stack.base}/v1/chat/completions", headers=stack.auth(), stream=True, timeout=60, json={
            "model": "tiny-cpu", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 12,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == b"data: [DONE]"
    chunks = [json.loads(line.removeprefix(b"data: ")) for line in lines[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    # Dummy weights emit random tokens, many of which decode to no text and get no event of their own.
    events = [c["choices"][0] for c in chunks if c["choices"]]
    assert events[0]["delta"]["role"] == "assistant"
    assert events[-1]["finish_reason"] == "length"

    models = stack.http.get(f"{stack.base}/v1/models", headers=stack.auth(), timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["tiny-cpu"]


def test_n_is_bounded_and_every_error_is_openai_shaped(stack: Stack) -> None:
    huge = stack.http.post(f"{stack.base}/v1/completions", headers=stack.auth(), timeout=60, json={
        "model": "tiny-cpu", "prompt": "x", "max_tokens": 4, "n": 10000})
    assert huge.status_code == 400 and huge.json()["error"]["code"] == "too_many_sequences", huge.text
    assert stack.http.post(f"{stack.base}/v1/completions", headers=stack.auth(), timeout=60, json={
        "model": "tiny-cpu", "prompt": "x", "max_tokens": 4, "n": 2}).status_code == 200
    models = stack.http.get(f"{stack.base}/v1/models", headers=stack.auth(), timeout=10).json()
    assert [m["root"] for m in models["data"]] == ["tiny-cpu"]  # not the model's folder on the server
    replies = {"not json": stack.http.post(f"{stack.base}/v1/completions", headers=stack.auth(), data=b"{not json",
                                           timeout=10),
               "wrong method": stack.http.delete(f"{stack.base}/v1/completions", headers=stack.auth(), timeout=10),
               "wrong field type": stack.http.post(f"{stack.base}/v1/completions", headers=stack.auth(), timeout=10,
                                                   json={"model": "tiny-cpu", "prompt": "x", "max_tokens": "many"}),
               "a message without its role": stack.http.post(
                   f"{stack.base}/v1/chat/completions", headers=stack.auth(), timeout=10,
                   json={"model": "tiny-cpu", "messages": [{"content": "x"}]})}
    for what, reply in replies.items():
        assert reply.status_code >= 400, what
        assert reply.headers.get("Content-Type", "").startswith("application/json"), (what, reply.status_code,
                                                                                      reply.text[:300])
        error = reply.json()["error"]
        assert error["message"] and error["type"] and "code" in error, (what, reply.text)
        assert reply.headers["Strict-Transport-Security"].startswith("max-age="), what
    # The router refuses these (422, in plain text); an instance's vLLM names the field.
    for what, named in (("wrong field type", "max_tokens"), ("a message without its role", "role")):
        assert replies[what].status_code == 400 and named in replies[what].json()["error"]["message"], (
            what, replies[what].text)


@pytest.mark.parametrize("path", ["/v1/models", "/v1/completions", "/v1/chat/completions", "/metrics", "/", "/x"])
def test_every_path_needs_the_api_key(stack: Stack, path: str) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong-key-000000000000"}, {"Authorization": stack.key}):
        reply = stack.http.post(f"{stack.base}{path}", headers=headers, json={"model": "tiny-cpu"}, timeout=10)
        assert reply.status_code == 401, (path, headers, reply.text)
        assert reply.headers["WWW-Authenticate"].startswith("Bearer")
        assert reply.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("path", [
    "/tokenize", "/detokenize", "/invocations", "/metrics", "/pause", "/resume", "/is_paused", "/load",
    "/health/public", "/ping", "/version", "/server_info", "/reset_prefix_cache", "/sleep", "/wake_up",
    "/collective_rpc", "/scale",
    "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/add_worker", "/remove_worker", "/list_workers",
    "/flush_cache", "/get_loads", "/v1/completions/../../tokenize", "/v1/models/../../pause"])
def test_internal_paths_are_not_served_publicly(stack: Stack, path: str) -> None:
    for method in ("GET", "POST"):
        reply = stack.http.request(method, f"{stack.base}{path}", headers=stack.auth(), json={}, timeout=10)
        assert reply.status_code == 404, (method, path, reply.status_code, reply.text[:200])


def test_the_official_openai_sdk_through_the_public_endpoint(stack: Stack) -> None:
    """What a user's code does, over TLS with the machine's certificate pinned: models, chat, a stream, completions,
    the Responses API, and a tool call, which must reach vLLM intact: vLLM takes a tool_choice naming one of the
    tools, and refuses one naming none of them."""
    client = OpenAI(base_url=f"{stack.base}/v1", api_key=stack.key, max_retries=0, timeout=120,
                    http_client=httpx.Client(verify=stack.pinned()))
    assert [m.id for m in client.models.list()] == ["tiny-cpu"]
    hello = [{"role": "user", "content": "kiln"}]
    chat = client.chat.completions.create(model="tiny-cpu", messages=hello, max_tokens=8)
    assert chat.usage is not None and chat.usage.completion_tokens > 0
    chunks = list(client.chat.completions.create(model="tiny-cpu", messages=hello, max_tokens=8,
                                                 stream=True))
    assert len(chunks) > 1 and chunks[0].id.startswith("chatcmpl")
    completion = client.completions.create(model="tiny-cpu", prompt="kiln", max_tokens=8)
    assert completion.choices[0].text is not None
    response = client.responses.create(model="tiny-cpu", input="kiln", max_output_tokens=16)
    assert response.status in ("completed", "incomplete") and response.output
    weather = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                 "parameters": {"type": "object", "properties": {
                                                     "city": {"type": "string"}}, "required": ["city"]}}}
    called = client.chat.completions.create(
        model="tiny-cpu", messages=hello, max_tokens=16, tools=[weather],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert called.choices[0].finish_reason is not None
    with pytest.raises(BadRequestError, match="does not match any of the specified `tools`"):
        client.chat.completions.create(model="tiny-cpu", messages=hello, max_tokens=16, tools=[weather],
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})


def test_the_public_health_check_needs_no_key_and_says_nothing_more(stack: Stack) -> None:
    reply = stack.http.get(f"{stack.base}/health", timeout=10)
    assert reply.status_code == 200 and reply.json() == {"status": "ok"}
    assert "Server" not in reply.headers or reply.headers["Server"] == "nginx"
    assert stack.http.post(f"{stack.base}/health", timeout=10).status_code == 405


def test_only_the_public_endpoint_listens_beyond_localhost(stack: Stack) -> None:
    root = psutil.Process(stack.proc.pid)
    listening: set[tuple[str, int]] = set()
    for p in [root, *root.children(recursive=True)]:
        try:
            listening |= {(c.laddr.ip, c.laddr.port) for c in p.net_connections("inet") if c.status == "LISTEN"}
        except psutil.NoSuchProcess:
            continue
    public = {addr for addr in listening if not addr[0].startswith("127.") and addr[0] != "::1"}
    assert public == {("0.0.0.0", PUBLIC)}, listening
    ports = {port for _, port in listening}
    assert {PUBLIC, HEALTH, ROUTER, ROUTER_METRICS, 8100, 8101} <= ports


def test_status_reports_the_instances_without_the_key(stack: Stack) -> None:
    out = subprocess.run([KILN, "status", "--json", "--health", stack.health], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    assert stack.key not in out
    status = json.loads(out)
    assert status["phase"] == "ready"
    assert status["endpoint"].startswith("https://") and status["endpoint"].endswith(f":{PUBLIC}")
    assert status["health"] == stack.health
    assert status["keys_file"] == str(stack.state_dir / "keys.json")
    assert oct(os.stat(status["keys_file"]).st_mode & 0o777) == "0o600"
    assert status["keys"] == [{"name": "default", "requests_per_minute": None, "origin": "generated", "models": None}]
    assert status["tls"]["mode"] == "self-signed" and "127.0.0.1" in status["tls"]["names"]
    assert [(i["name"], i["port"], i["state"], i["restarts"]) for i in status["instances"]] == [
        ("vllm-0", 8100, "ready", 0), ("vllm-1", 8101, "ready", 0)]
    assert all(psutil.pid_exists(i["pid"]) for i in status["instances"])
    assert status["plan"]["profile"] == "tiny-cpu" and status["explanation"]
    assert requests.get(f"{stack.health}/ready", timeout=5).status_code == 200

    text = subprocess.run([KILN, "status", "--health", stack.health], capture_output=True, text=True, timeout=30,
                          check=True).stdout
    assert stack.key not in text  # only names; `kiln keys show` prints a key
    assert "vllm-0" in text and "ready" in text and status["tls"]["sha256"] in text
    pem = subprocess.run([KILN, "status", "--certificate", "--health", stack.health], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    assert pem == stack.certificate.read_text() and pem.startswith("-----BEGIN CERTIFICATE-----")
    shown = subprocess.run([KILN, "keys", "show", "default", "--state-dir", str(stack.state_dir)],
                           capture_output=True, text=True, timeout=30, check=True).stdout
    assert shown.strip() == stack.key


def test_the_boot_self_check_is_on_status_beside_the_prediction(stack: Stack) -> None:
    stack.wait_for("the self-check", lambda: (stack.status()["self_check"] or {}).get("state") == "done", 300, 1)
    check = stack.status()["self_check"]
    assert check["measured"]["output_tokens_per_s"] > 0 and check["measured"]["failed"] == 0
    assert check["measured"]["ttft_ms_p50"] > 0 and check["measured"]["tpot_ms_p50"] > 0
    assert check["predicted"]["output_tokens_per_s"] > 0
    assert check["degraded"] is False and "not judged on the CPU backend" in check["verdict"]
    assert stack.status()["phase"] == "ready"


@contextlib.contextmanager
def engines_frozen(stack: Stack) -> Iterator[None]:
    """SIGSTOP every instance's engine processes; their API servers keep answering health checks."""
    engines = [child for i in stack.status()["instances"]
               for child in psutil.Process(i["pid"]).children(recursive=True) if child.name().startswith("VLLM::")]
    assert engines, "no vLLM engine processes found"
    for p in engines:
        p.suspend()
    try:
        yield
    finally:
        for p in engines:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.resume()


def test_overload_beyond_the_queue_gets_429_with_retry_after(stack: Stack) -> None:
    cap = 2 * 16 * 2  # the front admits 2 x max_num_seqs (16) x 2 instances in flight
    body = {"model": "tiny-cpu", "prompt": "kiln", "max_tokens": 1500, "ignore_eos": True, "stream": True}

    def open_stream(_: int) -> requests.Response:
        return stack.http.post(f"{stack.base}/v1/completions", headers=stack.auth(), json=body, stream=True, timeout=60)

    # Frozen engines generate nothing, so all the streams stay in flight however fast the tiny model is;
    # vLLM still answers each with its headers.
    with engines_frozen(stack), ThreadPoolExecutor(cap) as pool:
        held = list(pool.map(open_stream, range(cap)))  # each returns once its headers are in
        try:
            assert [r.status_code for r in held] == [200] * cap
            extra = [open_stream(i) for i in range(8)]
            assert [r.status_code for r in extra] == [429] * 8
            assert all(r.headers["Retry-After"] == "2" for r in extra)
            assert extra[0].json()["error"]["code"] == "overloaded"
            waits = [r.elapsed.total_seconds() for r in extra]
            assert max(waits) < 5  # refused at once, not queued behind the held streams
        finally:
            for r in held:
                r.close()
    stack.wait_for("both instances routed again", lambda: len(stack.routed_urls()) == 2, 60, 0.5)
    stack.wait_for("the front admitting again", lambda: stack.http.post(
        f"{stack.base}/v1/completions", headers=stack.auth(), timeout=30,
        json={"model": "tiny-cpu", "prompt": "kiln", "max_tokens": 2}).status_code == 200, 30, every_s=0.5)


def _stream_until(stop: threading.Event, stack: Stack, outcomes: list[str]) -> None:
    """One client streaming requests back to back; 'before-headers' is a request that failed without a response."""
    while not stop.is_set():
        got_headers = False
        try:
            with stack.http.post(f"{stack.base}/v1/chat/completions", headers=stack.auth(), stream=True,
                                 timeout=(5, 60), json={
                    "model": "tiny-cpu", "messages": [{"role": "user", "content": "kiln"}], "max_tokens": 48,
                    "ignore_eos": True, "stream": True}) as r:
                got_headers = True
                if r.status_code != 200:
                    outcomes.append(f"before-headers: HTTP {r.status_code}")
                    continue
                done = any(line == b"data: [DONE]" for line in r.iter_lines())
                outcomes.append("ok" if done else "cut-after-headers")
        except requests.RequestException as exc:
            outcomes.append("cut-after-headers" if got_headers else f"before-headers: {exc!r}")


@contextlib.contextmanager
def streaming_clients(stack: Stack, count: int) -> Iterator[list[str]]:
    """`count` clients streaming back to back until the block ends; yields their outcomes as they come."""
    stop = threading.Event()
    outcomes: list[str] = []
    clients = [threading.Thread(target=_stream_until, args=(stop, stack, outcomes))
               for _ in range(count)]
    for c in clients:
        c.start()
    try:
        yield outcomes
    finally:
        stop.set()
        for c in clients:
            c.join(timeout=90)


def test_kill_9_of_an_instance_under_16_streams(stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    victim = stack.instance("vllm-1")
    victim_url = "http://127.0.0.1:8101"
    with streaming_clients(stack, 16) as outcomes:
        time.sleep(4)
        killed_at = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        stack.wait_for("leaving routing", lambda: victim_url not in stack.routed_urls(), 10, every_s=0.05)
        left = time.monotonic() - killed_at
        stack.wait_for("a restart", lambda: stack.instance("vllm-1")["pid"] not in (None, victim["pid"]), 30)
        restarted = time.monotonic() - killed_at
        time.sleep(8)  # the clients go on against the one instance left
    stack.wait_for("the instance back in routing",
                   lambda: victim_url in stack.routed_urls() and stack.instance("vllm-1")["state"] == "ready",
                   STARTUP_TIMEOUT_S, every_s=1)
    back = time.monotonic() - killed_at
    failed = [o for o in outcomes if o.startswith("before-headers")]
    report(capsys, f"kill -9: out of routing after {left:.2f} s, restarted after {restarted:.2f} s, "
                   f"back in routing {back:.0f} s after the kill; {len(outcomes)} streams: "
                   f"{outcomes.count('ok')} complete, {outcomes.count('cut-after-headers')} cut after headers, "
                   f"{len(failed)} failed before headers")
    assert not failed, failed
    assert left < 5
    assert outcomes.count("ok") >= 16
    assert stack.instance("vllm-1")["restarts"] == 1


def test_key_changes_apply_within_a_second_under_16_streams(stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    """`kiln keys add`, then `rotate`, while 16 clients stream over TLS: nothing restarts and no request fails."""
    def keys(*args: str) -> dict[str, Any]:
        out = subprocess.run([KILN, "keys", *args, "--state-dir", str(stack.state_dir), "--health", stack.health,
                              "--json"], capture_output=True, text=True, timeout=120, check=True).stdout
        return dict(json.loads(out))

    def works(key: str) -> bool:
        return stack.http.get(f"{stack.base}/v1/models", headers={"Authorization": f"Bearer {key}"},
                              timeout=10).status_code == 200

    pids = {m["name"]: m["pid"] for m in [*stack.status()["instances"], *stack.status()["services"]]}
    added = keys("add", "ci")
    assert added["applied"] and works(added["key"])
    with streaming_clients(stack, 16) as outcomes:
        time.sleep(4)
        started = time.monotonic()
        rotated = keys("rotate", "ci")
        command_s = time.monotonic() - started
        applied = rotated["applied_s"]
        assert rotated["applied"] and works(rotated["key"]) and not works(added["key"])
        time.sleep(4)
    failed = [o for o in outcomes if o != "ok"]
    report(capsys, f"key rotation under 16 TLS streams: applied {applied:.2f} s after the signal (the command "
                   f"took {command_s:.1f} s, Python's start on a loaded machine included); "
                   f"{len(outcomes)} streams, {outcomes.count('ok')} complete, {len(failed)} failed")
    assert not failed, failed
    assert applied < 1.5  # the agent acts within 0.2 s; the rest is a loaded machine's scheduling
    assert pids == {m["name"]: m["pid"] for m in [*stack.status()["instances"], *stack.status()["services"]]}
    assert [k["name"] for k in keys("list")["keys"]] == ["ci", "default"]
    revoked = keys("revoke", "ci")
    assert revoked["applied"] and not works(rotated["key"])


def test_metrics_report_the_rate_and_the_cost(stack: Stack) -> None:
    with streaming_clients(stack, 8):
        time.sleep(12)  # two meter samples (every 5 s) with tokens between them
        text = requests.get(f"{stack.health}/metrics", timeout=10).text
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    values = {s.name: s.value for s in samples if not s.labels}
    rate = values["kiln_output_tokens_per_second"]
    assert rate > 0
    cost = values["kiln_usd_per_million_output_tokens"]
    assert cost == pytest.approx(PRICE_PER_HOUR / (rate * 3600) * 1e6, rel=0.01)
    assert any(s.name == "kiln_phase" and s.labels == {"phase": "ready"} and s.value == 1 for s in samples)
    assert any(s.name == "vllm:generation_tokens_total" and s.labels.get("kiln_instance") == "vllm-0" and s.value
               for s in samples)
    assert any(s.name.startswith("vllm_router_") for s in samples)
    # Per key name, counted inside each vLLM server (the streams asked for no usage; kiln asked vLLM for it).
    keyed = {s.name: s for s in samples if s.labels.get("key") == "default" and s.labels.get("kiln_instance")}
    assert keyed["kiln_key_requests_total"].value > 0 and keyed["kiln_key_generation_tokens_total"].value > 0
    assert not any(stack.key in str(s.labels) for s in samples)


def test_a_hung_instance_leaves_routing(stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    victim = stack.instance("vllm-0")
    victim_url = "http://127.0.0.1:8100"
    os.killpg(victim["pid"], signal.SIGSTOP)
    try:
        left = stack.wait_for("a hung instance leaving routing", lambda: victim_url not in stack.routed_urls(), 30)
        assert stack.instance("vllm-0")["state"] == "unresponsive"
        reply = stack.http.post(f"{stack.base}/v1/completions", headers=stack.auth(), timeout=30, json={
            "model": "tiny-cpu", "prompt": "kiln", "max_tokens": 4})
        assert reply.status_code == 200  # served by the other instance
        ready = requests.get(f"{stack.health}/ready", timeout=5)
        assert ready.status_code == 200 and stack.status()["phase"] == "degraded"
    finally:
        os.killpg(victim["pid"], signal.SIGCONT)
    back = stack.wait_for("the instance back", lambda: victim_url in stack.routed_urls(), 30)
    report(capsys, f"SIGSTOP: out of routing after {left:.2f} s; after SIGCONT back in {back:.2f} s")
    assert stack.instance("vllm-0")["restarts"] == 0


def test_a_rolling_change_of_2_instances_under_16_streams(stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    """A new plan through `kiln reload`: one instance at a time leaves routing, drains, restarts with the new plan
    and comes back, while 16 clients stream over TLS; none of their requests fails."""
    assert stack.status()["plan"]["max_model_len"] == 2048
    # A bad setting is left out and said on /status; the reload that follows with good settings clears it.
    (stack.state_dir / "kiln.yaml").write_text("max_model_len: lots\n")
    subprocess.run([KILN, "reload", "--state-dir", str(stack.state_dir), "--health", stack.health, "--json"],
                   capture_output=True, text=True, timeout=RELOAD_WAIT_S + 30, check=False)
    fault = stack.status()["last_error"]
    assert fault and fault["error"].startswith("reload: ") and "max_model_len" in fault["error"], fault
    (stack.state_dir / "kiln.yaml").write_text("max_model_len: 1024\n")
    with streaming_clients(stack, 16) as outcomes:
        time.sleep(3)
        # `kiln reload` itself gives up after RELOAD_WAIT_S (and exits 1) when the agent does not report.
        reload = subprocess.run([KILN, "reload", "--state-dir", str(stack.state_dir), "--health", stack.health,
                                 "--json"], capture_output=True, text=True, timeout=RELOAD_WAIT_S + 30, check=True)
        reloaded = json.loads(reload.stdout)["reload"]
        assert "plan" in reloaded["changed"], reload.stdout
        took = stack.wait_for("the rolling change", lambda: (stack.status()["reload"]["rolling"] or {}).get(
            "state") not in (None, "running"), ROLLING_TIMEOUT_S, every_s=1)
        served_during = len(outcomes)
        time.sleep(3)
    rolling = stack.status()["reload"]["rolling"]
    failed = [o for o in outcomes if o != "ok"]
    report(capsys, f"kiln reload under 16 TLS streams: keys applied {reloaded['applied_s']:.2f} s after the "
                   f"signal, planned in {reloaded['seconds']:.2f} s; "
                   f"rolling change of 2 instances: {took:.0f} s; {len(outcomes)} streams "
                   f"({served_during} during the change), {outcomes.count('ok')} complete, {len(failed)} failed")
    assert rolling["state"] == "done", rolling
    assert not failed, failed
    status = stack.status()
    assert status["plan"]["max_model_len"] == 1024
    assert not (status["last_error"] or {}).get("error", "").startswith("reload: "), status["last_error"]
    assert [(i["name"], i["state"], i["routed"]) for i in status["instances"]] == [
        ("vllm-0", "ready", True), ("vllm-1", "ready", True)]
    for instance in status["instances"]:
        argv = psutil.Process(instance["pid"]).cmdline()
        assert argv[argv.index("--max-model-len") + 1] == "1024"


def test_ctrl_c_stops_everything(stack: Stack) -> None:
    processes = [psutil.Process(stack.proc.pid), *psutil.Process(stack.proc.pid).children(recursive=True)]
    assert len(processes) >= 5  # kiln, nginx (2+), the router, two vLLM servers and their engines
    stack.proc.send_signal(signal.SIGINT)
    assert stack.proc.wait(timeout=60) == 0
    _, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive, [p.info if hasattr(p, "info") else p.pid for p in alive]
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{stack.health}/health", timeout=2)
