"""The rendered plan for tiny-cpu, started as real vLLM on the CPU: it serves, and its KV cache is as predicted."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from kiln.choice.schema import Choice
from kiln.planner.search import make_plan
from kiln.render.vllm import MODULE_VLLM, Runtime, render_instances
from kiln.setup.types import Plan
from kiln.tinymodel import make_tiny_model
from kiln.wiring import Kiln

STARTUP_TIMEOUT_S = 400


def test_rendered_tiny_cpu_instance_serves_and_matches_the_kv_prediction(kiln: Kiln, tmp_path: Path) -> None:
    profile = kiln.catalog().get("tiny-cpu")
    make_tiny_model(profile, tmp_path / "models" / "tiny-llama")
    plan = make_plan(kiln.machine("cpu-only"), profile, Choice(instances=1), kiln.constants)
    assert isinstance(plan, Plan)
    runtime = Runtime(vllm_command=(sys.executable, *MODULE_VLLM), models_dir=str(tmp_path / "models"),
                      hf_home=str(tmp_path / "hf"), extra_env=(("HF_HUB_OFFLINE", "1"),))
    instance = render_instances(plan, runtime, local_model=True)[0]
    # This machine's cores, not the fixture's: bind the engine to the first one.
    env = {**os.environ, **instance.env, "VLLM_CPU_OMP_THREADS_BIND": "0"}
    log_path = tmp_path / "vllm.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(list(instance.argv), env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        base = f"http://127.0.0.1:{instance.port}"
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()[-4000:]
            try:
                if requests.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(2)
        else:
            pytest.fail("vLLM did not become healthy:\n" + log_path.read_text()[-4000:])

        reply = requests.post(f"{base}/v1/completions", timeout=60, json={
            "model": "tiny-cpu", "prompt": "kiln bakes", "max_tokens": 16, "ignore_eos": True})
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 16

        logged = re.search(r"KV cache size: ([\d,]+) tokens", log_path.read_text())
        assert logged, "vLLM did not log its KV cache size"
        logged_tokens = int(logged.group(1).replace(",", ""))
        predicted = plan.predicted.kv_cache_tokens_per_instance
        print(f"\nKV cache tokens: vLLM logged {logged_tokens:,}, kiln predicted {predicted:,}")
        assert abs(predicted - logged_tokens) / logged_tokens < 0.05
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
