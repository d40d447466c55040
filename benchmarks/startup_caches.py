"""Time to ready of `tiny-cpu` with cold compile caches against restarts with warm and emptied ones, side by side.

Run: .venv/bin/python -m benchmarks.startup_caches
Each run is `kiln up` on this machine with the same state folder, where kiln keeps the compile caches
(<state>/compile: VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR), and a new $HOME for anything else. The
first starts with them empty; the second finds what the first compiled; the third starts with them emptied again,
the page cache still warm, to tell the caches' share from the operating system's. For each it
prints the wall time
from `kiln up` to ready, vLLM's own time to listen, the phases kiln reads from vLLM's log, the agent's own share,
and vLLM's lines about its compile cache.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from kiln.bench.setups import Ports, kiln_up

CACHE_WORDS = ("AOT compil", "compiled graph", "Compiling a graph", "Compiling model again", "torch.compile",
               "Warming up", "cache directory")


def _startup(health: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """/status's start-up block once every instance's timeline is read (the agent reads logs every few seconds)."""
    deadline = time.monotonic() + timeout_s
    startup: dict[str, Any] = {}
    while time.monotonic() < deadline:
        startup = requests.get(f"{health}/status", timeout=5).json().get("startup") or {}
        instances = startup.get("instances") or {}
        if instances and all(t.get("ready_s") is not None for t in instances.values()):
            break
        time.sleep(1)
    return startup


def one_start(state: Path, label: str) -> dict[str, Any]:
    print(f"{label}: starting kiln up ...", file=sys.stderr, flush=True)
    began = time.monotonic()
    with kiln_up(state, "tiny-cpu", Ports(), instances=1) as up:
        wall = time.monotonic() - began
        startup = _startup(up.health)
    timeline = next(iter((startup.get("instances") or {}).values()), {})
    log = (state / "logs" / "vllm-0.log").read_text(errors="replace").splitlines()
    last = max((i for i, line in enumerate(log) if "non-default args" in line), default=0)
    said = [line.split("] ", 1)[-1] for line in log[last:] if any(w in line for w in CACHE_WORDS)]
    phases = {p["phase"]: p["seconds"] for p in timeline.get("phases", [])}
    return {"run": label, "wall_to_ready_s": round(wall, 1), "vllm_ready_s": timeline.get("ready_s"),
            "compile_cache": timeline.get("compile_cache"), "compile_s": phases.get("compile and warm-up",
                                                                                  phases.get("torch.compile")),
            "weights_s": phases.get("weights loaded"), "agent_own_s": (startup.get("agent") or {}).get("own_s"),
            "said": said}


def _ratio(a: object, b: object) -> str:
    return f"{a / b:.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else ""


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="kiln-startup-") as tmp:
        home = Path(tmp) / "home"  # empty: the first start compiles everything
        os.environ["HOME"] = str(home)
        state = Path(tmp) / "state"
        rows = [one_start(state, "cold"), one_start(state, "warm")]
        # The same start once more with the compile caches emptied: what the caches themselves save, apart from
        # the operating system's page cache, which the second start also found warm.
        shutil.rmtree(state / "compile")
        shutil.rmtree(home, ignore_errors=True)
        rows.append(one_start(state, "emptied"))
    keys = ["wall_to_ready_s", "vllm_ready_s", "compile_cache", "compile_s", "weights_s", "agent_own_s"]
    width = max(len(k) for k in keys)
    print(f"{'':{width}}  {'cold':>10}  {'warm':>10}  {'emptied':>10}  {'warm/cold':>10}  {'warm/emptied':>12}")
    for key in keys:
        cold, warm, emptied = (row[key] for row in rows)
        print(f"{key:{width}}  {cold!s:>10}  {warm!s:>10}  {emptied!s:>10}  {_ratio(warm, cold):>10}  "
              f"{_ratio(warm, emptied):>12}")
    for row in rows:
        print(f"\nvLLM on its compile cache, {row['run']} start:")
        print("\n".join(f"  {line[:400]}" for line in row["said"]) or "  (nothing)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
