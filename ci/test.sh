#!/usr/bin/env bash
# kiln's tests, in two tiers (docs/testing.md):
#   bash ci/test.sh --fast   ruff, mypy, the import contracts and the unit tests: a couple of minutes, nothing
#                            started but kiln itself
#   bash ci/test.sh          every tier, CI's command (.ci/run): ruff, mypy, the import contracts, the integration
#                            tests (real vLLM on the CPU, nginx, Pebble, QEMU, network namespaces) one at a time,
#                            then the sweeps and the unit tests on both cores
# Extra arguments go to pytest, e.g. `bash ci/test.sh --fast -k planner`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KILN_VENV:-.venv}
PY="$VENV/bin/python"

tier=all
if [ "${1:-}" = "--fast" ]; then tier=fast; shift; fi

# The full tier sets the machine up first (CI starts from a clean clone); the fast tier only when nothing is there.
if [ "$tier" = all ] || [ ! -x "$VENV/bin/kiln" ]; then
  bash ci/setup.sh
fi

started=$(date +%s)
echo "==> ruff"
"$PY" -m ruff check agent tests benchmarks roles
echo "==> mypy"
"$PY" -m mypy
echo "==> import contracts"
"$VENV/bin/lint-imports" --no-logo
if [ "$tier" = fast ]; then
  echo "==> unit tests"
  "$PY" -m pytest -q -m "not integration" -n "${KILN_TEST_WORKERS:-auto}" --dist loadgroup --durations=10 "$@"
elif [ "$#" -gt 0 ]; then
  "$PY" -m pytest -v --durations=25 "$@"
else
  echo "==> the integration tests, one at a time (the 25 slowest are listed at the end)"
  "$PY" -m pytest -v tests/integration --durations=25
  # The sweeps are pure computation (every profile on every machine, the public cases), so they share the cores.
  echo "==> the sweeps and the unit tests, on both cores"
  "$PY" -m pytest -q --ignore=tests/integration -n "${KILN_TEST_WORKERS:-auto}" --dist loadgroup --durations=10
fi
echo "==> $tier tier: $(( $(date +%s) - started )) s"
