"""The CPU path's predicted cold start against `kiln up --profile tiny-cpu`'s own measured timeline on /status.

The CPU constants of data/coldstart.yaml come from one recorded start on an idle machine
(tests/data/startup/cpu-0.32-cold-quiet.log); this start is another, with a fresh state folder (so a cold
torch.compile, as predicted). Every part is CPU-bound (imports, the compile, the warm-up) on a 2-core machine, so a
start runs up to half again slower or faster with the load beside it: TOLERANCE is that, and a prediction off by more
is wrong, not unlucky.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

KILN = str(Path(sys.executable).parent / "kiln")
TOLERANCE = 0.5
HEALTH = 18791


def _status(proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> dict[str, Any]:
    deadline, status = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        with contextlib.suppress(requests.RequestException):
            status = requests.get(f"http://127.0.0.1:{HEALTH}/status", timeout=2).json()
            timeline = (status.get("startup") or {}).get("instances", {}).get("vllm-0", {})
            if status.get("phase") == "ready" and timeline.get("ready_s") is not None:
                return dict(status)
        time.sleep(2)
    raise AssertionError(f"not ready in {timeout_s} s: {status.get('phase')}\n{log.read_text()[-3000:]}")


def test_the_cpu_prediction_matches_kiln_ups_own_timeline(tmp_path: Path) -> None:
    log = tmp_path / "up.log"
    with log.open("w") as out:
        proc = subprocess.Popen([KILN, "up", "--profile", "tiny-cpu", "--instances", "1", "--tls", "off",
                                 "--state-dir", str(tmp_path / "state"), "--port", "18790",
                                 "--health-port", str(HEALTH), "--router-port", "18792",
                                 "--router-metrics-port", "18793", "--no-self-check"],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        status = _status(proc, log, 600)
    finally:
        proc.terminate()
        proc.wait(60)
    startup = status["startup"]
    predicted = startup["predicted"]["baked"]
    timeline = startup["instances"]["vllm-0"]
    agent_s = startup["agent"]["own_s"]
    measured = agent_s + timeline["ready_s"]
    parts = {p["part"]: p["seconds"] for p in predicted["parts"]}
    phases = {p["phase"]: p["seconds"] for p in timeline["phases"]}
    print(f"\npredicted {predicted['total_s']:.1f} s: {parts}\nmeasured  {measured:.1f} s: agent {agent_s:.1f} s, "
          f"vLLM ready {timeline['ready_s']:.1f} s, {phases}, compile cache {timeline['compile_cache']}")
    assert timeline["compile_cache"] == "cold"  # a fresh state folder: the start the prediction is for
    assert predicted["goal_s"] is None  # the droplet goals are not the CPU path's
    assert abs(predicted["total_s"] - measured) <= TOLERANCE * measured, (predicted, measured)
    assert abs(parts["compile and warm-up"] - phases["compile and warm-up"]) <= TOLERANCE * phases[
        "compile and warm-up"]
