"""How fast `kiln` starts: the wall time of each command (median of several runs), for this checkout beside
another one, e.g. an earlier commit's (`git worktree add /tmp/kiln-before HEAD~1`):

    python -m benchmarks.cli_start [--baseline /tmp/kiln-before] [--runs 7]

Each command runs as a new Python process with the checkout's agent/ first on its path, so both checkouts use
the same virtualenv. "planning alone" is `kiln plan` called again in one process, its imports already done: what
the command costs beyond starting."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kiln.cli.output import table

REPO = Path(__file__).resolve().parents[1]
PLAN = ["plan", "--machine", "h100x8", "--profile", "llama-3.3-70b-instruct"]
RUN = "import sys; from kiln.cli.main import main; sys.exit(main(sys.argv[1:]))"
PLANNING = ("import contextlib, io, sys, time; from kiln.cli.main import main\n"
            "argv = sys.argv[1:]\n"
            "with contextlib.redirect_stdout(io.StringIO()): main(argv)\n"
            "t = time.perf_counter()\n"
            "with contextlib.redirect_stdout(io.StringIO()): main(argv)\n"
            "print(time.perf_counter() - t)")


def _env(checkout: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(checkout / "agent"), "PATH": "/usr/bin:/bin", "HOME": tempfile.gettempdir()}


def wall_s(checkout: Path, argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", RUN, *argv], env=_env(checkout), capture_output=True, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def planning_s(checkout: Path, runs: int) -> float:
    return statistics.median(float(subprocess.run([sys.executable, "-c", PLANNING, *PLAN], env=_env(checkout),
                                                  capture_output=True, text=True, check=True).stdout)
                             for _ in range(runs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="another kiln checkout to time beside this one")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    checkouts = [("this checkout", REPO)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    with tempfile.TemporaryDirectory() as empty:
        commands = [("kiln --version", ["--version"]), ("kiln plan (h100x8, Llama 3.3 70B)", PLAN),
                    ("kiln status (no agent)", ["status", "--health", "http://127.0.0.1:9"]),
                    ("kiln keys list (empty folder)", ["keys", "list", "--state-dir", empty,
                                                       "--health", "http://127.0.0.1:9"])]
        rows = []
        for label, argv in commands:
            figures = [wall_s(path, argv, args.runs) for _, path in checkouts]
            rows.append([label, *(f"{f:.2f}" for f in figures),
                         *([f"{figures[1] / figures[0]:.1f}x"] if len(figures) == 2 else [])])
        figures = [planning_s(path, max(3, args.runs // 2)) for _, path in checkouts]
        rows.append(["  of which planning alone", *(f"{f:.2f}" for f in figures),
                     *(["-"] if len(figures) == 2 else [])])
    heads = [f"{name} (s)" for name, _ in checkouts] + (["baseline / this"] if args.baseline else [])
    print(f"median wall time of {args.runs} runs each, {sys.executable}")
    print(table(["command", *heads], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
