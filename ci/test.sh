#!/usr/bin/env bash
# Run every test tier: unit tests (with ruff and mypy) and the integration tests with real vLLM on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
exec "${KILN_VENV:-.venv}/bin/python" -m pytest -v "$@"
