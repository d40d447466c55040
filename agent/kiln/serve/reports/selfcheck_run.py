"""The self-check's run: vLLM's benchmark client against the router, judged against the engine's forecast for the
same load (kiln.serve.reports.selfcheck judges)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kiln.bench.client import Target, VllmBench
from kiln.errors import KilnError
from kiln.perf.predict import forecast, kiln_steps
from kiln.serve.decide import Decision
from kiln.serve.reports.selfcheck import SelfCheckSettings, self_check_result
from kiln.setup.types import Constants


def run_self_check(decision: Decision, settings: SelfCheckSettings, constants: Constants, router_url: str,
                   python: str, log_file: Path, env: dict[str, str]) -> dict[str, Any]:
    """The verdict for /status; a failure to run is one too, never an exception."""
    assert decision.plan is not None and decision.machine is not None and decision.profile is not None
    first = decision.rendered[0]
    target = Target(router_url, decision.plan.engine.served_model_names[0],
                    first.argv[first.argv.index("--model") + 1])
    try:
        raw = VllmBench(python, log_file).run(target, settings.spec().workload(settings.concurrency), env)
        expected = forecast(decision.plan, settings.workload(),
                            kiln_steps(decision.plan, decision.machine, decision.profile, constants), constants)
        return self_check_result(raw, expected, decision.plan.engine.device, settings)
    except (KilnError, OSError) as exc:
        return {"state": "failed", "degraded": False, "verdict": f"the self-check could not run: {exc}"}
