"""`kiln` run in the test's own process: the same argv, exit code, stdout and stderr as the console script, without
starting Python again for each command (a second or more each on two cores)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping

from kiln.cli.main import main


@contextlib.contextmanager
def _environment(env: Mapping[str, str] | None) -> Iterator[None]:
    if env is None:
        yield
        return
    before = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


def run_kiln(*args: str, stdin: str | None = None, env: Mapping[str, str] | None = None, check: bool = False
             ) -> subprocess.CompletedProcess[str]:
    """What `subprocess.run([kiln, *args], input=stdin, env=env, capture_output=True, text=True, check=check)`
    returns."""
    out, err = io.StringIO(), io.StringIO()
    saved_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin or "")
    try:
        with _environment(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse's own exits: --help, a bad flag
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.stdin = saved_stdin
    done = subprocess.CompletedProcess(["kiln", *args], code, out.getvalue(), err.getvalue())
    if check:
        done.check_returncode()
    return done
