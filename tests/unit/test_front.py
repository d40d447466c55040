"""The public front's keys and certificate: the pure parts, then real nginx with the rendered configuration before a
small upstream standing in for the router, over TLS with the certificate pinned."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import requests

from kiln.bench.client import discover
from kiln.choice.resolve import ResolvedChoice
from kiln.choice.schema import Choice, NamedKey, TlsAcme, validate_fields
from kiln.cli.bench import local_endpoint
from kiln.cli.main import main
from kiln.errors import KilnError
from kiln.processes import children_of
from kiln.serve.endpoint import Endpoint
from kiln.serve.front.acme import Issued
from kiln.serve.front.front import Front, FrontConfigError
from kiln.serve.front.keys import KeyChangeError, KeyStore, redact
from kiln.serve.front.nginx_workers import serving_workers, wait_in_force
from kiln.serve.front.proxy import ProxySettings, TlsFiles, nginx_argv
from kiln.serve.front.secretfiles import KeyStoreError, save_keys
from kiln.serve.front.tls import CertificateError, check_pair, covers, inspect, make_self_signed
from kiln.serve.layout import ServeLayout
from kiln.serve.reports.health import HealthServer
from kiln.serve.reports.state import AgentState

NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.timezone.utc)


# -- the pure parts --------------------------------------------------------------------------------------------
def test_a_self_signed_certificate_names_the_machine_and_is_ecdsa() -> None:
    cert, key = make_self_signed(["203.0.113.7", "2001:db8::7", "kiln-1"], NOW)
    info = check_pair(cert, key, NOW)
    assert set(info.names) == {"203.0.113.7", "2001:db8::7", "kiln-1"} and info.self_signed
    assert len(info.sha256.split(":")) == 32
    assert "BEGIN PRIVATE KEY" in key and info.not_after - NOW > dt.timedelta(days=800)
    assert covers(info, ["203.0.113.7", "2001:DB8:0000::7"]) and not covers(info, ["198.51.100.1"])
    assert not info.due(NOW) and info.due(info.not_after - dt.timedelta(days=29))


def test_a_given_certificate_is_checked_before_nginx_gets_it() -> None:
    cert, key = make_self_signed(["a.example"], NOW)
    _, other_key = make_self_signed(["a.example"], NOW)
    with pytest.raises(CertificateError, match="does not belong"):
        check_pair(cert, other_key, NOW)
    with pytest.raises(CertificateError, match="expired"):
        check_pair(cert, key, NOW + dt.timedelta(days=900))
    with pytest.raises(CertificateError, match="not PEM"):
        inspect("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")


def test_tls_and_named_keys_in_user_data() -> None:
    layer = validate_fields({"tls": False, "api_keys": {"ci": "kiln-ci-key-0123456789",
                                                        "team": {"key": "kiln-team-key-0123456789",
                                                                 "requests_per_minute": 60}}}, source="user-data")
    assert not layer.problems and layer.values["tls"] == "off"
    assert layer.values["api_keys"]["team"].requests_per_minute == 60
    acme = validate_fields({"tls": {"domain": "llm.example.com", "email": "ops@example.com"}}, source="u")
    assert isinstance(acme.values["tls"], TlsAcme) and acme.values["tls"].renew_before_days == 30
    bad = validate_fields({"tls": {"domain": "not a name"}, "api_keys": {"Bad Name": "kiln-x-0123456789abcdef"}},
                          source="user-data")
    assert {p.field for p in bad.problems} == {"tls", "api_keys"}
    assert all("kiln-x-0123456789abcdef" not in p.what for p in bad.problems)  # keys never echoed


def test_key_changes_on_the_machine_outlast_user_data() -> None:
    declared = {"ci": NamedKey(key="kiln-ci-from-user-data-01")}
    store = KeyStore().with_declared(declared).with_default()
    assert store.names() == ["ci"]  # a declared key: no default is made
    rotated = store.rotate("ci")
    assert rotated.get("ci") != store.get("ci")
    assert rotated.with_declared(declared) == rotated  # the next reload keeps the rotated key
    revoked = rotated.revoke("ci")
    assert revoked.with_declared(declared).names() == [] and revoked.with_default().names() == []
    changed = store.with_declared({"ci": NamedKey(key="kiln-ci-new-in-user-data-1")})
    assert changed.get("ci").secret == "kiln-ci-new-in-user-data-1"  # type: ignore[union-attr]
    with pytest.raises(KeyChangeError, match="exists"):
        store.add("ci")
    with pytest.raises(KeyChangeError, match="another name"):
        store.add("other", "kiln-ci-from-user-data-01")
    assert KeyStore.from_json(store.add("x", requests_per_minute=5).to_json()).get("x").requests_per_minute == 5  # type: ignore[union-attr]


# -- real nginx ------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Upstream(BaseHTTPRequestHandler):
    """The router's stand-in: /v1/models echoes the key name nginx passed on; /v1/completions streams slowly."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        answer = self.headers.get("X-Answer")
        if answer:
            self._answer(answer)
            return
        body = json.dumps({"key": self.headers.get("X-Kiln-Key"), "auth": self.headers.get("Authorization"),
                           "data": [{"id": "tiny", "root": "tiny"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _answer(self, answer: str, received: int = 0) -> None:
        """The router's own answers: plain text, an empty 405, a dropped connection; and vLLM's errors as its guard
        hands them on (kiln_guard.py: a 400 as 520, a 500 as 521, the JSON also in X-Kiln-Error)."""
        if answer == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        code = int(answer.removesuffix("json"))
        body = (json.dumps({"error": {"message": f"vLLM says why ({received} bytes)", "type": "BadRequestError",
                                      "code": code}})
                if answer.endswith("json") else ("" if code == 405 else "No available workers")).encode()
        self.send_response({400: 520, 500: 521}[code] if answer.endswith("json") else code)
        if answer.endswith("json"):
            self.send_header("X-Kiln-Error", body.decode())
        self.send_header("Content-Type", "application/json" if answer.endswith("json") else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    posts: ClassVar[list[str]] = []  # every POST that reached the router, across the test's servers

    def do_POST(self) -> None:
        Upstream.posts.append(self.path)
        received = len(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self.headers.get("X-Answer"):
            self._answer(self.headers["X-Answer"], received)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(15):
            data = f"data: {i}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
            time.sleep(0.2)
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: object) -> None:
        pass


class Instance(Upstream):
    """A vLLM instance's stand-in, asked only what the router refused as malformed: vLLM's 400 as kiln_guard hands
    it on, or (X-Instance-Answer) any other of Upstream's answers."""

    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        Instance.asked.append(self.path)
        self._answer(self.headers.get("X-Instance-Answer", "400json"))

    def do_POST(self) -> None:
        Instance.asked.append(self.path)
        received = len(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self._answer(self.headers.get("X-Instance-Answer", "400json"), received)


@dataclass
class Running:
    front: Front
    nginx: subprocess.Popen[bytes]
    cert: str
    log: Path  # nginx's stderr: its error log

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.front.layout.public_port}"

    def get(self, key: str, path: str = "/v1/models") -> requests.Response:
        return requests.get(f"{self.base}{path}", headers={"Authorization": f"Bearer {key}"}, verify=self.cert,
                            timeout=5)

    def apply(self) -> None:
        """What the agent's reload does: the configuration, SIGHUP, and the wait until no worker answers with the
        configuration before."""
        self.front.write_config()
        assert self.hup(), "nginx did not put the new configuration in force"

    def hup(self, timeout_s: float = 5.0) -> bool:
        before = serving_workers(children_of(self.nginx.pid))
        self.nginx.send_signal(1)
        return wait_in_force(lambda: children_of(self.nginx.pid), before, timeout_s)


@pytest.fixture
def running(traversable_tmp: Path) -> Iterator[Running]:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        pytest.skip("nginx is not installed (ci/setup.sh installs it)")
    layout = ServeLayout(state_dir=traversable_tmp, public_host="127.0.0.1", public_port=_free_port(),
                         http_port=_free_port(), router_port=_free_port(), health_port=_free_port())
    upstream = ThreadingHTTPServer(("127.0.0.1", layout.router_port), Upstream)
    upstream.daemon_threads = True
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    instance = ThreadingHTTPServer(("127.0.0.1", 0), Instance)
    instance.daemon_threads = True
    threading.Thread(target=instance.serve_forever, daemon=True).start()
    front = Front(layout, ProxySettings(max_in_flight=64, max_body_bytes=2**20,
                                        instance_ports=(instance.server_address[1],)), nginx=nginx)
    front.load_keys("kiln-default-key-0123456789", {"ci": NamedKey(key="kiln-ci-key-0123456789",
                                                                    requests_per_minute=6)})
    tls = front.choose_tls("self-signed", ["127.0.0.1", "localhost"])
    front.write_config()
    assert tls.files is not None
    log = traversable_tmp / "nginx.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(list(nginx_argv(nginx, layout)), stderr=err)
    run = Running(front, proc, str(tls.files.certificate), log)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                run.get("x")
                break
            except requests.ConnectionError:
                time.sleep(0.1)
        yield run
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        for server in (upstream, instance):
            server.shutdown()
            server.server_close()


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion:DeprecationWarning")
def test_https_with_the_certificate_pinned_and_port_80_redirects(running: Running) -> None:
    reply = running.get("kiln-default-key-0123456789")
    assert reply.status_code == 200 and reply.json()["key"] == "default"
    assert reply.json()["auth"] is None  # the key goes no further
    assert reply.headers["Strict-Transport-Security"].startswith("max-age=")
    with pytest.raises(requests.exceptions.SSLError):  # an unpinned client refuses the self-signed certificate
        requests.get(f"{running.base}/v1/models", timeout=5)
    plain = f"http://127.0.0.1:{running.front.layout.http_port}"
    moved = requests.get(f"{plain}/v1/models", allow_redirects=False, timeout=5)
    assert moved.status_code == 301 and moved.headers["Location"].startswith("https://127.0.0.1:")
    token = running.front.layout.acme_webroot / ".well-known" / "acme-challenge" / "tok3n"
    token.parent.mkdir(parents=True)
    token.write_text("tok3n.thumbprint")
    assert requests.get(f"{plain}/.well-known/acme-challenge/tok3n", timeout=5).text == "tok3n.thumbprint"
    assert requests.get(f"{plain}/.well-known/acme-challenge/other", timeout=5).status_code == 404
    for version in (ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1):
        context = ssl.create_default_context(cafile=running.cert)
        context.minimum_version = context.maximum_version = version
        context.set_ciphers("ALL:@SECLEVEL=0")
        with (socket.create_connection(("127.0.0.1", running.front.layout.public_port), timeout=5) as raw,
              pytest.raises(ssl.SSLError)):
            context.wrap_socket(raw, server_hostname="127.0.0.1")


def test_each_key_is_known_by_its_name_and_a_forged_name_is_replaced(running: Running) -> None:
    reply = requests.get(f"{running.base}/v1/models", verify=running.cert, timeout=5,
                         headers={"Authorization": "Bearer kiln-ci-key-0123456789", "X-Kiln-Key": "default"})
    assert reply.json()["key"] == "ci"
    assert running.get("kiln-unknown-key-0123456789").status_code == 401


def test_a_keys_rate_limit_answers_429_with_retry_after(running: Running) -> None:
    codes = [running.get("kiln-ci-key-0123456789").status_code for _ in range(3)]
    assert codes == [200, 200, 429]  # 6 a minute: one now, one of burst, then wait
    limited = running.get("kiln-ci-key-0123456789")
    assert limited.headers["Retry-After"] == "60"
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert running.get("kiln-default-key-0123456789").status_code == 200  # other keys are not limited


def test_rotating_a_key_applies_within_a_second_and_keeps_the_stream_in_flight(running: Running) -> None:
    old = "kiln-default-key-0123456789"
    chunks: list[bytes] = []

    def stream() -> None:
        with requests.post(f"{running.base}/v1/completions", headers={"Authorization": f"Bearer {old}"}, json={},
                           verify=running.cert, stream=True, timeout=30) as r:
            chunks.extend(line for line in r.iter_lines() if line)

    reader = threading.Thread(target=stream)
    reader.start()
    time.sleep(0.5)
    running.front.keys = running.front.keys.rotate("default", "kiln-rotated-key-0123456789")
    started = time.monotonic()
    running.apply()
    assert time.monotonic() - started < 1.0, "the rotated key was not in force within a second"
    # From the moment apply returns, every new connection meets the new keys: no old worker accepts any more.
    assert [running.get(old).status_code for _ in range(10)] == [401] * 10
    assert running.get("kiln-rotated-key-0123456789").status_code == 200
    reader.join(timeout=30)
    assert chunks == [f"data: {i}".encode() for i in range(15)]  # the stream begun with the old key finished


def test_an_acme_certificate_waits_behind_the_self_signed_one(tmp_path: Path) -> None:
    front = Front(ServeLayout(state_dir=tmp_path), ProxySettings(max_in_flight=8), clock=lambda: NOW)
    tls = front.choose_tls(TlsAcme(domain="llm.example.com"), ["203.0.113.7"])
    assert tls.mode == "self-signed" and tls.acme is not None and front.acme_due()
    assert Choice(tls="off").tls == "off"


def test_a_renewal_window_longer_than_the_certificate_never_loops(tmp_path: Path) -> None:
    now = [NOW]
    front = Front(ServeLayout(state_dir=tmp_path), ProxySettings(max_in_flight=8), clock=lambda: now[0])
    front.choose_tls(TlsAcme(domain="llm.example.com", renew_before_days=3650), ["203.0.113.7"])
    cert, key = make_self_signed(["llm.example.com"], NOW, days=90)
    info = inspect(cert)
    tls = front.acme_issued(Issued(cert, key, info.not_after))
    assert tls.mode == "acme" and not front.acme_due()  # just issued: not again at once
    now[0] = info.not_after - dt.timedelta(days=29)  # within the last third of its 90 days
    assert front.acme_due()


def test_a_key_compares_exactly_and_a_key_differing_in_case_is_another_key(running: Running) -> None:
    key = "kiln-default-key-0123456789"
    assert running.get(key).status_code == 200
    for other in (key.upper(), key.swapcase(), key.capitalize()):
        assert running.get(other).status_code == 401
    running.front.keys = running.front.keys.add("clash", key.swapcase())
    running.apply()  # nginx takes it: a key with its case swapped is another key, not a conflicting one
    assert running.get(key.swapcase()).json()["key"] == "clash" and running.get(key).json()["key"] == "default"


def test_a_configuration_nginx_refuses_never_replaces_the_live_one(running: Running) -> None:
    live = running.front.layout.proxy_config
    before = live.read_text()
    good_tls = running.front.tls
    assert good_tls.files is not None
    running.front.keys = running.front.keys.add("new", "kiln-new-key-0123456789")
    running.front.tls = dataclasses.replace(good_tls, files=TlsFiles(good_tls.files.certificate,
                                                                     live.parent / "missing.key"))
    with pytest.raises(FrontConfigError, match="nginx refuses") as refused:
        running.front.write_config()
    assert live.read_text() == before and not list(live.parent.glob("*.new*"))
    said = refused.value.message()
    assert all(k.secret.lower() not in said.lower() for k in running.front.keys.keys)
    assert running.hup()
    assert running.get("kiln-default-key-0123456789").status_code == 200  # still the old configuration


def test_a_reload_nginx_refuses_is_seen_as_not_in_force(running: Running) -> None:
    """A configuration broken on disk behind kiln's back: nginx's master keeps its old workers, and the wait says
    the change is not in force instead of reporting it applied."""
    live = running.front.layout.proxy_config
    live.write_text(live.read_text() + "\nbroken;\n")
    started = time.monotonic()
    assert not running.hup(timeout_s=1.0)
    assert time.monotonic() - started < 2.0
    assert running.get("kiln-default-key-0123456789").status_code == 200  # the old workers still serve


def test_no_key_reaches_an_error_message_in_any_case() -> None:
    store = KeyStore().add("a", "kiln-Secret-key-0123456789")
    line = 'nginx: [emerg] conflicting parameter "bearer kiln-secret-key-0123456789" in nginx.conf:31'
    assert "secret-key" not in store.redact(line).lower() and "[a key]" in store.redact(line)
    assert "zzz-token" not in redact("Authorization: Bearer zzz-token-that-is-unknown", [])


def test_a_corrupt_key_store_is_kept_and_stops_every_reader(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    layout = ServeLayout(state_dir=tmp_path)
    layout.keys_file.parent.mkdir(parents=True, exist_ok=True)
    layout.keys_file.write_text('{"keys": [{"name": "ci", "key": "kiln-')
    front = Front(layout, ProxySettings(max_in_flight=8))
    with pytest.raises(KeyStoreError, match="cannot be read") as refused:
        front.load_keys("kiln-user-data-key-0123456789", None)
    assert "mv " in refused.value.fix
    assert layout.keys_file.read_text() == '{"keys": [{"name": "ci", "key": "kiln-'  # kept as it was
    assert main(["keys", "list", "--state-dir", str(tmp_path)]) != 0
    assert "cannot be read" in capsys.readouterr().err


def test_every_https_answer_carries_hsts(running: Running) -> None:
    answers = [running.get("kiln-wrong-key-0123456789"), running.get("kiln-default-key-0123456789", "/other")]
    answers += [running.get("kiln-ci-key-0123456789") for _ in range(3)]  # the third is rate limited
    assert [a.status_code for a in answers] == [401, 404, 200, 200, 429]
    assert all(a.headers.get("Strict-Transport-Security", "").startswith("max-age=") for a in answers)


def test_every_error_of_the_endpoint_is_openai_shaped_json(running: Running) -> None:
    key = {"Authorization": "Bearer kiln-default-key-0123456789"}
    replies = {f"router {answer}": requests.get(f"{running.base}/v1/models", headers={**key, "X-Answer": answer},
                                                verify=running.cert, timeout=10)
               for answer in ("400", "405", "422", "503", "drop")}
    replies["body too large"] = requests.post(f"{running.base}/v1/completions", headers=key, data=b"x" * 2**21,
                                              verify=running.cert, timeout=10)
    replies["uri too long"] = requests.get(f"{running.base}/v1/models?{'a' * 9000}", headers=key,
                                           verify=running.cert, timeout=10)
    replies["bad header"] = requests.get(f"{running.base}/v1/models", headers={**key, "Host": "a b"},
                                         verify=running.cert, timeout=10)
    assert {what: r.status_code for what, r in replies.items()} == {
        "router 400": 400, "router 405": 405, "router 422": 400, "router 503": 503, "router drop": 502,
        "body too large": 413,
        "uri too long": 414, "bad header": 400}
    for what, reply in replies.items():
        error = reply.json()["error"]
        assert set(error) == {"message", "type", "code"} and error["message"], what
        assert reply.headers["Strict-Transport-Security"].startswith("max-age="), what
    vllm = requests.get(f"{running.base}/v1/models", headers={**key, "X-Answer": "400json"}, verify=running.cert,
                        timeout=10)
    assert vllm.status_code == 400 and vllm.json()["error"]["message"] == "vLLM says why (0 bytes)"
    posted = requests.post(f"{running.base}/v1/completions", headers={**key, "X-Answer": "400json"},
                           json={"prompt": "abc"}, verify=running.cert, timeout=10)
    assert posted.json()["error"]["message"] == "vLLM says why (17 bytes)"  # vLLM's own words, for the whole body
    inside = requests.get(f"{running.base}/.kiln-error/502", headers=key, verify=running.cert, timeout=10)
    assert inside.status_code == 404 and inside.json()["error"]["code"] == "not_found"


def test_a_failure_after_an_acme_order_backs_off(tmp_path: Path) -> None:
    front = Front(ServeLayout(state_dir=tmp_path), ProxySettings(max_in_flight=8))
    front.load_keys("kiln-default-key-0123456789", None)
    front.choose_tls(TlsAcme(domain="llm.example.com"), ["203.0.113.7"])
    orders: list[str] = []

    def issue(directory: str, domain: str, *args: object, **kwargs: object) -> Issued:
        orders.append(domain)  # what the CA answers: a certificate for the domain, with its key
        cert, key = make_self_signed([domain], dt.datetime.now(dt.timezone.utc), days=90)
        return Issued(cert, key, inspect(cert).not_after)

    (front.layout.tls_dir / "acme-llm.example.com.crt").mkdir(parents=True)  # the certificate cannot be written
    state = AgentState(endpoint="", health="", keys_file="")
    endpoint = Endpoint(front, state, "127.0.0.1", (), motd=lambda text: None, reload_proxy=lambda: None,
                        issue=issue)
    for _ in range(5):  # the agent's loop calls it every 0.2 s
        endpoint.renew()
        if endpoint._acme:
            endpoint._acme.join(timeout=10)
    assert orders == ["llm.example.com"]
    assert state.last_error is not None and "cannot be put in place" in state.last_error.what
    assert "retries in 10 minutes" in state.last_error.fix


def test_status_names_the_acme_certificate_only_once_the_endpoint_presents_it(tmp_path: Path) -> None:
    front = Front(ServeLayout(state_dir=tmp_path), ProxySettings(max_in_flight=8))
    front.load_keys("kiln-default-key-0123456789", None)
    front.choose_tls(TlsAcme(domain="llm.example.com"), ["203.0.113.7"])
    old = front.tls.info
    assert old is not None
    cert, key = make_self_signed(["llm.example.com"], dt.datetime.now(dt.timezone.utc), days=90)
    state = AgentState(endpoint="", health="", keys_file="")
    seen: list[tuple[str, object]] = []

    def served() -> str | None:  # nginx's old workers answer three more times before the new ones do
        seen.append(("probe", (state.tls or {}).get("sha256")))
        return old.sha256 if len(seen) <= 3 else inspect(cert).sha256

    endpoint = Endpoint(front, state, "127.0.0.1", (), motd=lambda text: None, reload_proxy=lambda: None,
                        issue=lambda *args, **kwargs: Issued(cert, key, inspect(cert).not_after), served_sha256=served)
    endpoint.renew()
    assert endpoint._acme is not None
    endpoint._acme.join(timeout=10)
    assert len(seen) == 4 and all(sha != inspect(cert).sha256 for _, sha in seen)
    assert state.tls is not None and state.tls["mode"] == "acme" and state.tls["sha256"] == inspect(cert).sha256


def test_kilns_tools_pin_kilns_own_certificate(running: Running, tmp_path: Path) -> None:
    key = "kiln-default-key-0123456789"
    with pytest.raises(KilnError, match="not trusted") as refused:
        discover(running.base, key)
    assert "--cacert" in refused.value.fix
    assert discover(running.base, key, running.cert).model == "tiny"
    layout = running.front.layout  # this machine's agent: its certificate and its model's folder are found
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    layout.runtime_file.write_text(json.dumps({"processes": [{"name": "vllm-0", "argv": ["vllm", "--model",
                                                                                       str(model)]}]}))
    assert local_endpoint(running.base, layout.state_dir) == (running.cert, str(model))
    assert local_endpoint("https://203.0.113.7:8000", layout.state_dir) == (None, None)


def test_kiln_status_finds_the_agent_of_a_state_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    layout = ServeLayout(state_dir=tmp_path, health_port=port)
    state = AgentState(endpoint="https://127.0.0.1:1", health=layout.health_url, keys_file="", state_dir=str(tmp_path))
    server = HealthServer(state, "127.0.0.1", port, lambda: b"")
    server.start()
    try:
        layout.agent_health_file.write_text(layout.health_url + "\n")
        assert main(["status", "--state-dir", str(tmp_path), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["endpoint"] == "https://127.0.0.1:1"
    finally:
        server.stop()


def test_a_key_change_that_cannot_be_made_is_reported_and_the_endpoint_keeps_serving(tmp_path: Path) -> None:
    layout = ServeLayout(state_dir=tmp_path)
    shared = "kiln-shared-key-0123456789"
    save_keys(layout.keys_file, KeyStore().add("ops", shared))  # `kiln keys add ops --key ...` on the machine
    front = Front(layout, ProxySettings(max_in_flight=8))
    state = AgentState(endpoint="", health="", keys_file="")
    endpoint = Endpoint(front, state, "127.0.0.1", (), motd=lambda text: None, reload_proxy=lambda: None)
    resolved = ResolvedChoice(Choice(tls="off", api_key="kiln-new-default-0123456789",
                                     api_keys={"ci": NamedKey(key=shared)}))
    endpoint.configure(resolved)  # at boot: the rest of the keys apply
    assert front.keys.names() == ["default", "ops"] and [k["name"] for k in state.keys] == ["default", "ops"]
    assert state.last_error is not None and "ci" in state.last_error.what and state.last_error.fix
    assert shared not in state.last_error.what + state.last_error.fix
    state.last_error = None
    assert endpoint.reload(resolved) == []  # on `kiln reload`: the same, and nothing else changes
    assert state.last_error is not None and "ci" in state.last_error.what


def test_a_key_ending_in_a_newline_is_refused() -> None:
    for name, secret in (("ci", "kiln-ci-key-0123456789\n"), ("ci\n", "kiln-ci-key-0123456789")):
        with pytest.raises(KeyChangeError):
            KeyStore().add(name, secret)
    layer = validate_fields({"api_keys": {"ci\n": "kiln-ci-key-0123456789"}, "api_key": "kiln-key-0123456789\n"},
                            source="user-data")
    assert not layer.values and {p.field for p in layer.problems} == {"api_keys", "api_key"}


def test_a_bad_entry_of_a_hand_edited_key_store_is_dropped_and_reported(tmp_path: Path) -> None:
    layout = ServeLayout(state_dir=tmp_path)
    good = {"name": "default", "key": "kiln-default-key-0123456789", "requests_per_minute": None, "origin": "generated"}
    entries: list[object] = [good, {"name": "short", "key": "kiln-abc"},
                             {"name": "newline", "key": "kiln-newline-key-0123456789\n"},
                             {"name": "Bad Name", "key": "kiln-bad-name-0123456789"},
                             {"name": "copy", "key": good["key"]}, {**good, "key": "kiln-again-key-0123456789"},
                             {"name": "rate", "key": "kiln-rate-key-0123456789", "requests_per_minute": "many"},
                             {"name": 5, "key": 6}, "ci", None]
    layout.keys_file.parent.mkdir(parents=True, exist_ok=True)
    layout.keys_file.write_text(json.dumps({"keys": entries, "revoked": ["old"]}))
    front = Front(layout, ProxySettings(max_in_flight=8))
    assert front.load_keys(None, None).names() == ["default"] and front.keys.revoked == {"old"}
    assert len(front.key_problems) == len(entries) - 1
    assert all(p.fix and str(layout.keys_file) == p.source for p in front.key_problems)
    assert all("kiln-" not in p.text() for p in front.key_problems)  # no key is shown, good or bad
    front.write_config()  # nginx's configuration is written with the good key
    state = AgentState(endpoint="", health="", keys_file="")
    Endpoint(front, state, "127.0.0.1", (), motd=lambda text: None, reload_proxy=lambda: None).configure(
        ResolvedChoice(Choice(tls="off")))
    assert state.last_error is not None and "keys.json" in state.last_error.what


def test_a_full_endpoint_still_answers_its_health_check(running: Running) -> None:
    running.front.settings = dataclasses.replace(running.front.settings, max_in_flight=1)
    running.apply()
    time.sleep(0.5)
    key = "kiln-default-key-0123456789"
    reader = threading.Thread(target=lambda: requests.post(
        f"{running.base}/v1/completions", headers={"Authorization": f"Bearer {key}"}, json={}, verify=running.cert,
        timeout=30).content)
    reader.start()
    time.sleep(0.5)
    try:
        assert running.get(key).status_code == 429  # the endpoint is full
        health = requests.get(f"{running.base}/health", verify=running.cert, timeout=5)
        assert health.status_code == 503 and health.json() == {"status": "unavailable"}  # no agent here, not 429
    finally:
        reader.join(timeout=30)


def test_the_bearer_scheme_is_case_insensitive_and_the_key_is_not(running: Running) -> None:
    key = "kiln-default-key-0123456789"
    for scheme in ("bearer", "BEARER", "bEaReR"):
        reply = requests.get(f"{running.base}/v1/models", headers={"Authorization": f"{scheme} {key}"},
                             verify=running.cert, timeout=5)
        assert reply.status_code == 200 and reply.json()["key"] == "default", scheme
    assert running.get(key.upper()).status_code == 401
    for other in (f"Basic {key}", f"Bearer{key}", f"xBearer {key}"):
        assert requests.get(f"{running.base}/v1/models", headers={"Authorization": other}, verify=running.cert,
                            timeout=5).status_code == 401, other


def test_a_key_over_its_rate_gets_429s_and_writes_no_error_lines(running: Running) -> None:
    """Each refusal was an [error] line: one key over its rate wrote about 2 MB/s to the proxy's log."""
    codes = [running.get("kiln-ci-key-0123456789").status_code for _ in range(40)]
    assert codes.count(429) >= 30
    assert "limiting requests" not in running.log.read_text(errors="replace")


def test_a_request_vllm_answers_with_an_error_runs_once_and_its_words_reach_the_client(running: Running) -> None:
    """A 500 ran four times (nginx passed it on to the router thrice, then asked again for vLLM's body)."""
    key = {"Authorization": "Bearer kiln-default-key-0123456789"}
    Upstream.posts.clear()
    reply = requests.post(f"{running.base}/v1/completions", headers={**key, "X-Answer": "500json"},
                          json={"prompt": "abc"}, verify=running.cert, timeout=10)
    assert reply.status_code == 500 and reply.json()["error"]["message"] == "vLLM says why (17 bytes)"
    assert Upstream.posts == ["/v1/completions"]


def test_a_request_the_router_refuses_as_malformed_gets_vllms_words_from_one_instance(running: Running) -> None:
    """The router's 422 is plain text naming the field for no one; the request goes once to an instance, whose
    vLLM says what is wrong. With no instance answering, nginx's own 422 page."""
    key = {"Authorization": "Bearer kiln-default-key-0123456789", "X-Answer": "422"}
    body = {"model": "tiny", "messages": [{"content": "x"}]}
    Upstream.posts.clear()
    Instance.asked.clear()
    reply = requests.post(f"{running.base}/v1/chat/completions", headers=key, json=body, verify=running.cert,
                          timeout=10)
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == f"vLLM says why ({len(json.dumps(body))} bytes)"  # the body, whole
    assert Upstream.posts == Instance.asked == ["/v1/chat/completions"]
    gone = requests.post(f"{running.base}/v1/chat/completions", headers={**key, "X-Instance-Answer": "drop"},
                         json=body, verify=running.cert, timeout=10)
    assert gone.status_code == 422 and gone.json()["error"]["code"] == "invalid_request", gone.text
    assert gone.headers["Strict-Transport-Security"].startswith("max-age=")


def _raw(running: Running, request: bytes, tls: bool = True) -> tuple[int, str, bytes]:
    """What nginx answers a request written by hand: its status, Content-Type and body."""
    port = running.front.layout.public_port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
        conn: socket.socket = plain
        if tls:
            context = ssl.create_default_context(cafile=running.cert)
            conn = context.wrap_socket(plain, server_hostname="127.0.0.1")
        conn.sendall(request)
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), headers.get("Content-Type", ""), body


def test_malformed_http_gets_openai_shaped_json_not_nginx_html(running: Running) -> None:
    """Plain HTTP on the TLS port, headers too large, a transfer coding nginx does not know, an HTTP version it
    does not speak: each was nginx's HTML page."""
    cases = {"plain HTTP on the TLS port": (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", False),
             "headers too large": (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000
                                   + b"\r\nConnection: close\r\n\r\n", True),
             "unknown transfer coding": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: br\r\n"
                                         b"Connection: close\r\n\r\n", True),
             "unknown HTTP version": (b"GET /v1/models HTTP/3.0\r\nHost: x\r\nConnection: close\r\n\r\n", True)}
    for what, (request, tls) in cases.items():
        status, content_type, body = _raw(running, request, tls)
        assert 400 <= status < 600 and content_type == "application/json", (what, status, body[:200])
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "code"} and error["message"], what
