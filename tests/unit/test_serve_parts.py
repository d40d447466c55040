"""The serving runtime's parts: API key file, nginx front (checked by nginx itself), cost, metrics, decisions."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from kiln import datafiles
from kiln.choice.resolve import ResolvedChoice
from kiln.choice.schema import Choice, NamedKey
from kiln.errors import KilnError
from kiln.pricing import hourly_price, usd_per_million_tokens
from kiln.processes import LocalProcesses, ProcessSpec
from kiln.render.vllm import Runtime
from kiln.serve.caches import Caches
from kiln.serve.decide import NOT_OVERRIDES, OVERRIDES, Decision, decide
from kiln.serve.front.front import Front
from kiln.serve.front.keys import ApiKey, KeyStore
from kiln.serve.front.proxy import PUBLIC_PATHS, ProxySettings, TlsFiles, nginx_argv, nginx_config
from kiln.serve.front.secretfiles import KeyStoreError, write_private
from kiln.serve.layout import ServeLayout
from kiln.serve.processes.assembly import Assembly
from kiln.serve.processes.ownership import give_to_user, keep_for_root, share_with_group
from kiln.serve.processes.router import RouterClient, RouterSettings, find_router, router_argv
from kiln.serve.processes.supervisor import Member
from kiln.serve.processes.systemd_units import SystemdUnits, Unit
from kiln.serve.reports import metrics as prom
from kiln.serve.reports.health import HealthServer
from kiln.serve.reports.meter import TokenMeter
from kiln.serve.reports.state import AgentState
from kiln.wiring import Kiln

NOBODY = 65534


def _front(state: Path, **layout: Any) -> Front:
    return Front(ServeLayout(state_dir=state, **layout), ProxySettings(max_in_flight=8))


def test_the_default_key_is_generated_once_kept_private_and_overridable(tmp_path: Path) -> None:
    state = tmp_path / "state"
    keys = _front(state).load_keys(None, None)
    key = keys.get("default")
    assert key is not None and key.secret.startswith("kiln-") and len(key.secret) > 40
    path = ServeLayout(state_dir=state).keys_file
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _front(state).load_keys(None, None) == keys  # the next boot keeps it
    given = _front(state).load_keys("user-chosen-key-0123456789", None).get("default")
    assert given is not None and given.secret == "user-chosen-key-0123456789"  # user-data's api_key wins
    assert "user-chosen-key-0123456789" in path.read_text() and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_an_earlier_single_key_file_becomes_the_default_key(tmp_path: Path) -> None:
    layout = ServeLayout(state_dir=tmp_path)
    write_private(layout.api_key_file, "kiln-kept-from-an-earlier-boot-0123\n")
    keys = _front(tmp_path).load_keys(None, None)
    assert [(k.name, k.secret) for k in keys.keys] == [("default", "kiln-kept-from-an-earlier-boot-0123")]
    assert not layout.api_key_file.exists()


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plain"])
def test_nginx_accepts_the_rendered_front(tmp_path: Path, tls: bool) -> None:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        pytest.skip("nginx is not installed (ci/setup.sh installs it)")
    front = _front(tmp_path, http_port=_free_port())
    front.load_keys("kiln-Abc_def-0123456789", {"ci": NamedKey(key="kiln-ci-key-0123456789", requests_per_minute=60)})
    front.choose_tls("self-signed" if tls else "off", ["127.0.0.1"])
    front.write_config()
    config = front.layout.proxy_config.read_text()
    argv = [*nginx_argv(nginx, front.layout)[:-2], "-t"]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert '"~^(?i:bearer) +kiln-Abc_def-0123456789$" default;' in config
    assert '"~^(?i:bearer) +kiln-ci-key-0123456789$" ci;' in config
    assert "rate=60r/m" in config
    assert "limit_conn kiln_in_flight 8;" in config
    assert all(p.removeprefix("/v1/") in config for p in PUBLIC_PATHS)
    assert ("ssl_protocols TLSv1.2 TLSv1.3;" in config) is tls
    assert stat.S_IMODE(front.layout.proxy_config.stat().st_mode) == 0o600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_public_health_check_answers_a_load_balancer_without_a_key(tmp_path: Path) -> None:
    """Real nginx with the rendered front, before the agent's health endpoint: ok, unavailable, and an agent that
    does not answer at all, each as 200 or 503 with one word, and every other path still behind the key."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        pytest.skip("nginx is not installed (ci/setup.sh installs it)")
    layout = ServeLayout(state_dir=tmp_path, public_host="127.0.0.1", public_port=_free_port(), http_port=None,
                         health_port=_free_port())
    state = AgentState(endpoint="", health="", keys_file="")
    (layout.proxy_config.parent / "tmp").mkdir(parents=True)
    keys = KeyStore((ApiKey("default", "kiln-key-0123456789"),))
    layout.proxy_config.write_text(nginx_config(layout, ProxySettings(max_in_flight=8), keys, None))
    front = subprocess.Popen(list(nginx_argv(nginx, layout)), stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{layout.public_port}"
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                down = requests.get(f"{base}/health", timeout=2)
                break
            except requests.ConnectionError:
                time.sleep(0.1)
        assert down.status_code == 503 and down.json() == {"status": "unavailable"}  # no agent behind it
        server = HealthServer(state, "127.0.0.1", layout.health_port, lambda: b"")
        server.start()
        try:
            starting = requests.get(f"{base}/health", timeout=5)
            assert starting.status_code == 503 and starting.json() == {"status": "unavailable"}
            state.readiness = lambda: (True, "ready")  # type: ignore[method-assign]
            ready = requests.get(f"{base}/health", timeout=5)
            assert ready.status_code == 200 and ready.json() == {"status": "ok"}
            assert "kiln" not in ready.headers.get("Server", "")
        finally:
            server.stop()
        assert requests.post(f"{base}/health", timeout=5).status_code == 405
        assert requests.get(f"{base}/status", timeout=5).status_code == 401
        assert requests.get(f"{base}/v1/models", timeout=5).status_code == 401
    finally:
        front.terminate()
        front.wait(timeout=10)


def _enclosing_blocks(config: str, directive: str) -> list[str]:
    """The header of the innermost block around each line of nginx's configuration that starts with `directive`."""
    stack: list[str] = []
    found: list[str] = []
    for line in config.splitlines():
        text = line.split("#", 1)[0].strip()
        if text.endswith("{"):
            stack.append(text.removesuffix("{").strip())
        elif text == "}":
            stack.pop()
        elif text.startswith(directive + " "):
            found.append(stack[-1] if stack else "")
    return found


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plain"])
def test_only_the_api_counts_against_the_bound_on_requests_in_flight(tmp_path: Path, tls: bool) -> None:
    """A full endpoint still answers its load balancer's /health, and the ACME challenge with `tls: off`."""
    keys = KeyStore((ApiKey("default", "kiln-key-0123456789"),))
    files = TlsFiles(tmp_path / "c.crt", tmp_path / "c.key") if tls else None
    config = nginx_config(ServeLayout(state_dir=tmp_path, http_port=8080), ProxySettings(max_in_flight=8), keys,
                          files)
    assert "location = /health" in config and "location ^~ /.well-known/acme-challenge/" in config
    [where] = _enclosing_blocks(config, "limit_conn")
    assert where.startswith("location ~ ^/v1/(")
    assert _enclosing_blocks(config, "limit_conn_status") == [where]


@pytest.mark.parametrize("key", ["", "has space", "quote'd", "semi;colon", "dollar$var", "brace{"])
def test_keys_nginx_cannot_hold_literally_are_refused(key: str) -> None:
    with pytest.raises(ValueError):
        nginx_config(ServeLayout(), ProxySettings(max_in_flight=8), KeyStore((ApiKey("default", key),)), None)


def test_router_listens_on_localhost_with_a_short_health_check() -> None:
    argv = router_argv("vllm-router", ServeLayout(), RouterSettings())
    pairs = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert pairs["--host"] == "127.0.0.1" and pairs["--prometheus-host"] == "127.0.0.1"
    assert int(pairs["--health-check-interval-secs"]) <= 5
    assert "--worker-urls" not in argv


def test_cost_per_million_tokens() -> None:
    # $23.92/h at 2,000 tokens/s: 7.2 M tokens an hour -> $3.3222 per million.
    assert usd_per_million_tokens(23.92, 2000) == pytest.approx(3.32222, rel=1e-5)
    assert usd_per_million_tokens(1.57, 0) is None


def test_hourly_price_comes_from_the_droplet_sizes(kiln: Kiln) -> None:
    droplets = datafiles.read_yaml("droplets.yaml")
    assert hourly_price(kiln.machine("h100x8"), droplets) == 23.92
    assert hourly_price(kiln.machine("l40s"), droplets) == 1.57
    assert hourly_price(kiln.machine("cpu-only"), droplets) is None


def test_token_meter_rate_survives_an_instance_restart() -> None:
    meter = TokenMeter(window_s=60)
    meter.observe(0, {"a": 1000, "b": 500})  # baselines: tokens from before the agent looked
    meter.observe(10, {"a": 1500, "b": 1000})
    assert meter.tokens_per_s() == pytest.approx(100)
    meter.observe(20, {"a": 2000, "b": 200})  # b restarted: its counter began again
    assert meter.tokens_per_s() == pytest.approx((1000 + 700) / 20)


def test_instance_metrics_merge_into_one_valid_exposition() -> None:
    one = ('# HELP vllm:generation_tokens_total Generated tokens.\n# TYPE vllm:generation_tokens_total counter\n'
           'vllm:generation_tokens_total{engine="0",model_name="m"} 40.0\n')
    two = one.replace("40.0", "2.0")
    assert prom.generation_tokens(one) == 40
    families = prom.merge_labelled({"vllm-0": one, "vllm-1": two}, "kiln_instance")
    state = AgentState(endpoint="http://h:8000", health="http://127.0.0.1:8090", keys_file="/k")
    families += prom.kiln_families(state.status(with_telemetry=False), [
        {"index": 0, "utilization_percent": 87, "memory_used_bytes": 2**30, "temperature_c": 61, "power_w": 512.5}])
    text = prom.exposition(families).decode()
    parsed = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples
              if s.name != "vllm:generation_tokens_total"}
    tokens = [s for f in text_string_to_metric_families(text) for s in f.samples
              if s.name == "vllm:generation_tokens_total"]
    assert sorted((s.labels["kiln_instance"], s.value) for s in tokens) == [("vllm-0", 40), ("vllm-1", 2)]
    assert text.count("# TYPE vllm:generation_tokens_total counter") == 1
    assert parsed["kiln_gpu_power_watts"].value == 512.5
    assert parsed["kiln_phase"].labels == {"phase": "detecting"}


def test_metrics_export_the_load_against_the_plans_capacity() -> None:
    """For an autoscaler: requests in flight (vLLM's running and waiting, all instances) over the capacity's
    streams; unknown when an instance's gauges are missing, and absent without a capacity."""
    gauges = ('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 30.0\n'
              '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine="0"} 2.0\n')
    plan = {"predicted": {"capacity": {"streams": 128, "requests_per_s": 4.5}}}
    text = prom.exposition(prom.capacity_families(plan, {"vllm-0": gauges, "vllm-1": gauges})).decode()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert values == {"kiln_capacity_streams": 128, "kiln_capacity_requests_per_second": 4.5,
                      "kiln_requests_in_flight": 64, "kiln_load_vs_capacity": 0.5}
    partial = prom.capacity_families(plan, {"vllm-0": gauges, "vllm-1": "not metrics"})
    assert [f.name for f in partial] == ["kiln_capacity_streams", "kiln_capacity_requests_per_second"]
    assert prom.capacity_families({"predicted": {}}, {"vllm-0": gauges}) == []


def _decide(kiln: Kiln, machine: str, **choice: object) -> Decision:
    resolved = ResolvedChoice(Choice.model_validate(choice), dict.fromkeys(choice, "user-data"))
    return decide(kiln, machine, resolved, Runtime())


def test_a_model_too_large_falls_back_with_the_reason(kiln: Kiln) -> None:
    d = _decide(kiln, "h100x1", profile="llama-3.3-70b-instruct")
    assert d.plan is not None and d.plan.profile == "qwen3-8b"
    [problem] = d.problems
    assert "does not fit" in problem.what and "fallback" in problem.what and "h200x1" in problem.fix


def test_a_bad_override_is_dropped_before_the_profile_is(kiln: Kiln) -> None:
    d = _decide(kiln, "h100x8", profile="llama-3.1-8b-instruct", tensor_parallel_size=3)
    assert d.plan is not None and d.plan.profile == "llama-3.1-8b-instruct"
    assert "without the overrides" in d.problems[0].what


def test_the_fallback_can_drop_every_user_setting(kiln: Kiln) -> None:
    # Each field of the choice is a setting the fallback drops, or says what to serve and how to reach it.
    assert set(OVERRIDES) | set(NOT_OVERRIDES) == set(Choice.model_fields) and not set(OVERRIDES) & set(NOT_OVERRIDES)
    wide = _decide(kiln, "h100x8", profile="llama-3.1-8b-instruct", data_parallel_size=16)
    assert wide.plan is not None and wide.plan.profile == "llama-3.1-8b-instruct", wide.failure
    assert "without the overrides" in wide.problems[0].what
    split = _decide(kiln, "h100x8", profile="llama-3.3-70b-instruct", data_parallel_size=8, tensor_parallel_size=2,
                    expert_parallel=True)
    assert split.plan is not None and split.plan.profile == "llama-3.3-70b-instruct", split.problems


def test_nothing_to_serve_is_a_failure_with_a_fix_not_an_exception(kiln: Kiln) -> None:
    d = _decide(kiln, "cpu-only", profile="llama-3.3-70b-instruct")
    assert d.plan is None and d.failure is not None
    report = d.choice_report()
    assert report["profile"] == "qwen3-8b" and len(report["problems"]) == 1


def test_systemd_launcher_starts_units_with_their_dropins(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def systemctl(argv: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        out = "ActiveState=failed\nMainPID=0\nExecMainStatus=137\nNRestarts=5\n" if argv[0] == "show" else ""
        return subprocess.CompletedProcess(argv, 0, out, "")

    launcher = SystemdUnits({"vllm-0": "[Service]\nCPUAffinity=0-7\n"}, run=systemctl, unit_dir=tmp_path)
    unit = launcher.start(ProcessSpec("vllm-0", ("vllm",)))
    router = launcher.start(ProcessSpec("router", ("vllm-router",)))
    assert isinstance(unit, Unit) and unit.unit == "kiln-vllm@vllm-0.service"
    assert (tmp_path / "kiln-vllm@vllm-0.service.d" / "50-kiln.conf").read_text().endswith("CPUAffinity=0-7\n")
    assert calls[:3] == [["daemon-reload"], ["reset-failed", "kiln-vllm@vllm-0.service"],
                         ["start", "--no-block", "kiln-vllm@vllm-0.service"]]
    assert ["start", "--no-block", "kiln-router.service"] in calls
    assert router.exit_code() == 137  # systemd gave up on it: the supervisor's backoff takes over


def test_a_unit_reads_only_its_current_run_from_the_journal() -> None:
    asked: list[list[str]] = []

    def systemctl(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, "6f2c0d1e9a\n" if "InvocationID" in argv else "", "")

    def journal(argv: list[str]) -> str:
        asked.append(argv)
        return "INFO 11-23 07:09:30 [api_utils.py:286] non-default args: {}\n"

    lines = Unit("kiln-vllm@vllm-0.service", systemctl, journal).log_lines()
    assert lines == ["INFO 11-23 07:09:30 [api_utils.py:286] non-default args: {}"]
    assert asked == [["-u", "kiln-vllm@vllm-0.service", "_SYSTEMD_INVOCATION_ID=6f2c0d1e9a", "-o", "cat", "-q",
                      "--no-pager"]]


def test_a_local_process_reads_only_what_its_current_start_logged(tmp_path: Path) -> None:
    log = tmp_path / "vllm-0.log"
    log.write_text("the run before\n")
    running = LocalProcesses().start(ProcessSpec("vllm-0", ("sh", "-c", "echo this run"), log_file=log))
    running.finish(time.monotonic() + 10)
    assert running.log_lines() == ["this run"]


def test_a_local_process_and_its_children_keep_to_the_instances_cpus(tmp_path: Path) -> None:
    """As a unit's CPUAffinity= does under systemd: the instance's engine processes inherit its CPUs."""
    last = max(os.sched_getaffinity(0))
    log = tmp_path / "vllm-1.log"
    child = "import os; print(sorted(os.sched_getaffinity(0)))"
    script = f"import os, subprocess, sys; {child}; subprocess.run([sys.executable, '-c', {child!r}])"
    running = LocalProcesses().start(ProcessSpec("vllm-1", (sys.executable, "-c", script), log_file=log,
                                                 cpus=(last,)))
    running.finish(time.monotonic() + 30)
    assert running.log_lines() == [f"[{last}]", f"[{last}]"]
    anywhere = LocalProcesses().start(ProcessSpec("vllm-0", (sys.executable, "-c", child), log_file=tmp_path / "a"))
    anywhere.finish(time.monotonic() + 30)
    assert anywhere.log_lines() == [str(sorted(os.sched_getaffinity(0)))]


def _as_nobody() -> None:
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def test_the_state_folder_is_roots_and_the_instances_user_cannot_plant_in_it(traversable_tmp: Path) -> None:
    """On the image the agent takes its folder back from whoever owns it, and then the instances' user can plant
    nothing there; a folder swapped for a link is refused, with the fix."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to act as another user")
    state = traversable_tmp / "state"
    state.mkdir()
    os.chown(state, NOBODY, NOBODY)
    state.chmod(0o777)
    keep_for_root(state)
    info = state.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0o755)
    planted = subprocess.run(["ln", "-s", "/etc/shadow", str(state / "api_key")], capture_output=True, text=True,
                             check=False, preexec_fn=_as_nobody)
    assert planted.returncode != 0 and "Permission denied" in planted.stderr
    assert not (state / "api_key").exists()
    linked = traversable_tmp / "linked"
    linked.symlink_to(state)
    with pytest.raises(KilnError, match="is not a directory"):
        keep_for_root(linked)
    layout = ServeLayout(state_dir=state)
    write_private(layout.runtime_file, "{}")
    share_with_group("nobody", [layout.runtime_file])
    shared = layout.runtime_file.stat()
    assert (shared.st_uid, shared.st_gid, stat.S_IMODE(shared.st_mode)) == (0, NOBODY, 0o640)


def test_links_the_instances_user_plants_are_refused(traversable_tmp: Path) -> None:
    """Outside the image (`kiln up`) the state folder is the user's; links planted in it must not steer the agent."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to plant the links as another user")
    tmp_path = traversable_tmp
    secret = tmp_path / "root-only"
    secret.write_text("root's secret\n")
    secret.chmod(0o600)
    state = tmp_path / "state"
    (state / "models").mkdir(parents=True)
    for path in (state, state / "models"):
        os.chown(path, NOBODY, NOBODY)
    for link in (state / "keys.json", state / "models" / "config.json"):
        subprocess.run(["ln", "-s", str(secret), str(link)], check=True, preexec_fn=_as_nobody)
        assert link.is_symlink() and link.lstat().st_uid == NOBODY

    # Refused, neither followed nor replaced by a new store (which would drop every key and revocation).
    with pytest.raises(KeyStoreError, match="not a regular file"):
        _front(state).load_keys(None, None)
    assert (state / "keys.json").is_symlink()
    give_to_user("nobody", state, [state / "models"])
    assert secret.stat().st_uid == 0 and secret.read_text() == "root's secret\n"
    assert (state / "models" / "config.json").lstat().st_uid == NOBODY


def test_metrics_that_do_not_parse_are_unknown_not_idle() -> None:
    text = ("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 3.0\n"
            "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\"} 1.0\n")
    assert prom.requests_in_flight(text) == 4
    assert prom.requests_in_flight(text.replace("3.0", "0.0").replace("1.0", "0.0")) == 0
    assert prom.requests_in_flight(text[:-20] + "{broken") is None  # cut mid-answer
    assert prom.requests_in_flight("") is None and prom.requests_in_flight("# TYPE other gauge\nother 0\n") is None


def test_a_running_unit_is_read_from_its_cgroup_and_systemctl_only_on_a_change(tmp_path: Path) -> None:
    """The supervisor asks every unit each tick: systemctl ran once per unit and tick (about 20 a second on an
    8-GPU machine); now the unit's cgroup.events says whether anything changed, and systemctl answers only then."""
    cgroup = "/system.slice/system-kiln\\x2dvllm.slice/kiln-vllm@vllm-0.service"
    events = tmp_path / cgroup.lstrip("/") / "cgroup.events"
    events.parent.mkdir(parents=True)
    events.write_text("populated 1\nfrozen 0\n")
    shown = {"ActiveState": "active", "MainPID": "2211", "ExecMainStatus": "0", "ControlGroup": cgroup}
    calls: list[list[str]] = []

    def systemctl(argv: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "".join(f"{k}={v}\n" for k, v in shown.items()), "")

    unit = Unit("kiln-vllm@vllm-0.service", systemctl, cgroup_root=tmp_path)
    for _ in range(40):  # 20 s of ticks, and /status asking its pid
        assert unit.exit_code() is None and unit.pid == 2211
    assert len(calls) == 1
    events.write_text("populated 0\nfrozen 0\n")  # the kernel's word: its last process ended
    shown.update(ActiveState="failed", MainPID="0", ExecMainStatus="137")
    assert unit.exit_code() == 137 and unit.pid == 0
    assert len(calls) == 2


class _FailingWorker(BaseHTTPRequestHandler):
    """A vLLM server's stand-in behind the real router: healthy, and answering a bad completion with vLLM's 500 as
    kiln's guard hands it on (521, the JSON also in X-Kiln-Error)."""

    protocol_version = "HTTP/1.1"
    completions: ClassVar[list[bytes]] = []

    def do_GET(self) -> None:
        self._json(200, {"status": "ok"} if self.path == "/health" else
                   {"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        _FailingWorker.completions.append(body)
        if b'"bad"' in body:
            self._json(521, {"error": {"message": "grammar failed", "type": "InternalServerError", "code": 500}})
        else:
            self._json(200, {"object": "text_completion", "choices": [{"text": "ok", "index": 0}]})

    def _json(self, code: int, data: object) -> None:
        body = json.dumps(data).encode()
        self.send_response(code)
        if code == 521:
            self.send_header("X-Kiln-Error", body.decode())
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_router_runs_a_failing_request_once_and_clients_cannot_open_its_breaker() -> None:
    """Real vllm-router with kiln's command line: its retries ran a request vLLM answered with 500 four times, and
    four such requests at once opened its circuit breaker on every worker (503 to everyone for 60 s)."""
    binary = find_router()
    if binary is None:
        pytest.skip("vllm-router is not installed (ci/setup.sh installs it)")
    worker = ThreadingHTTPServer(("127.0.0.1", 0), _FailingWorker)
    worker.daemon_threads = True
    threading.Thread(target=worker.serve_forever, daemon=True).start()
    layout = ServeLayout(router_port=_free_port(), router_metrics_port=_free_port())
    router = subprocess.Popen(router_argv(binary, layout, RouterSettings()), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        client = RouterClient(layout.router_url)
        deadline = time.monotonic() + 20
        while not client.ready():
            assert time.monotonic() < deadline and router.poll() is None
            time.sleep(0.1)
        client.add(f"http://127.0.0.1:{worker.server_address[1]}")
        _FailingWorker.completions.clear()

        def complete(prompt: str) -> int:
            return requests.post(f"{layout.router_url}/v1/completions", json={"model": "tiny", "prompt": prompt},
                                 timeout=30).status_code

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            failed = list(pool.map(complete, ["bad"] * 8))
        assert failed == [521] * 8  # passed on as the guard handed them, for nginx to answer 500
        assert len(_FailingWorker.completions) == 8  # each ran once
        assert [complete("good") for _ in range(3)] == [200] * 3  # and the next clients are served
    finally:
        router.terminate()
        router.wait(timeout=10)
        worker.shutdown()


def test_a_rolling_change_writes_each_successors_entry_as_it_starts(tmp_path: Path) -> None:
    """runtime.json held the new plan's argv for every name from the roll's first step: an old instance that
    restarted mid-roll came back with the new plan's settings and GPUs."""
    parts = Assembly(ServeLayout(state_dir=tmp_path), Caches.in_state_dir(tmp_path, "test"))
    old = [Member(ProcessSpec(f"vllm-{i}", ("vllm", "serve", "--tensor-parallel-size", "1"),
                              {"CUDA_VISIBLE_DEVICES": str(i)})) for i in range(2)]
    parts.write_runtime(old)
    successor = Member(ProcessSpec("vllm-0", ("vllm", "serve", "--tensor-parallel-size", "2"),
                                   {"CUDA_VISIBLE_DEVICES": "0,1"}), gpus=(0, 1))
    parts.put_runtime(successor)
    entries = {p["name"]: p for p in json.loads(parts.layout.runtime_file.read_text())["processes"]}
    assert entries["vllm-0"]["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert entries["vllm-1"]["argv"][-1] == "1" and entries["vllm-1"]["env"]["CUDA_VISIBLE_DEVICES"] == "1"


def test_a_runtime_file_changed_outside_kiln_is_written_again_from_the_agents_record(tmp_path: Path) -> None:
    """Every unit's start reads runtime.json: a corrupt one would fail each restart, so the agent writes it again
    (at every reload and every few seconds) and says what it found."""
    layout = ServeLayout(state_dir=tmp_path)
    parts = Assembly(layout, Caches.in_state_dir(tmp_path, "tiny"))
    assert parts.restore_runtime() is None  # nothing written yet: nothing to compare
    spec = ProcessSpec("vllm-0", ("python3", "-m", "vllm"), {"A": "1"})
    parts.runtime_specs = {"vllm-0": spec}
    parts.restore_runtime()
    written = layout.runtime_file.read_text()
    assert json.loads(written)["processes"][0]["name"] == "vllm-0"
    assert parts.restore_runtime() is None
    layout.runtime_file.write_text('{"processes": [')
    assert parts.restore_runtime() == "changed outside kiln"
    assert layout.runtime_file.read_text() == written
    layout.runtime_file.unlink()
    assert parts.restore_runtime() == "missing" and layout.runtime_file.read_text() == written
    layout.runtime_file.write_bytes(b"\xff\xfe")
    assert parts.restore_runtime() == "unreadable (UnicodeDecodeError)"
    assert layout.runtime_file.read_text() == written


def test_a_clean_reload_clears_only_a_reloads_fault() -> None:
    state = AgentState(endpoint="", health="", keys_file="")
    state.fail("reload: kiln.yaml: max_model_len: not a number", "write a number", origin="reload")
    state.recovered("reload")
    assert state.last_error is None
    state.fail("tls: the certificate cannot be read", "check the file")
    state.recovered("reload")
    assert state.last_error is not None and state.last_error.what.startswith("tls: ")
    assert state.status()["last_error"]["error"].startswith("tls: ")
