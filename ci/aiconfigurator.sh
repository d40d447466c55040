#!/usr/bin/env bash
# Install NVIDIA AIConfigurator (kernel timing databases for vLLM on H100/H200/B200/B300/GB200/GB300/L40S/A100...)
# into a virtualenv of its own, .venv-aic: kiln runs it only as a subprocess
# (agent/kiln/data/aiconfigurator/estimate.py, driven by kiln/perf/aiconfigurator.py), so its pins never meet
# vLLM's in .venv. Needs PyPI once (about 850 MB installed); works offline afterwards.
# Safe to run again: it does nothing when the pinned version is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
AIC_VENV=${KILN_AIC_VENV:-.venv-aic}
AIC_VERSION=0.12.0  # aiconfigurator pins aiconfigurator-core (the databases and model configs) to the same version

# The interpreter .venv was made with, so both venvs run the same Python; else python3 (AIC wants 3.11 to 3.13).
PYTHON=python3
if [ -f .venv/pyvenv.cfg ]; then
  home=$(sed -n 's/^home *= *//p' .venv/pyvenv.cfg)
  version=$(sed -n 's/^version *= *//p' .venv/pyvenv.cfg)
  for candidate in "$home/python${version%.*}" "$home/python3"; do
    if [ -x "$candidate" ]; then PYTHON=$candidate; break; fi
  done
fi

installed() {
  [ -x "$AIC_VENV/bin/python" ] &&
    [ "$("$AIC_VENV/bin/python" -m pip show aiconfigurator 2>/dev/null | sed -n 's/^Version: //p')" = "$AIC_VERSION" ]
}

if installed; then
  echo "==> aiconfigurator $AIC_VERSION already in $AIC_VENV"
  exit 0
fi
if [ ! -x "$AIC_VENV/bin/python" ]; then
  echo "==> creating $AIC_VENV with $PYTHON ($("$PYTHON" --version 2>&1))"
  "$PYTHON" -m venv "$AIC_VENV"
fi
echo "==> installing aiconfigurator==$AIC_VERSION into $AIC_VENV (about 100 MB download, a minute)"
"$AIC_VENV/bin/python" -m pip install -q --upgrade pip
"$AIC_VENV/bin/python" -m pip install -q -c ci/constraints-aic.txt "aiconfigurator==$AIC_VERSION" "aiconfigurator-core==$AIC_VERSION"
installed || { echo "aiconfigurator $AIC_VERSION did not install into $AIC_VENV" >&2; exit 1; }
echo "==> ready: $AIC_VENV/bin/python agent/kiln/data/aiconfigurator/estimate.py --list"
