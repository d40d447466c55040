"""FlashInfer's precompiled kernels: present, and for the FlashInfer installed, or vLLM downloads and compiles them at
its first start, on the path to first token. Pure: the installed packages in, a check out.

The rule is vLLM 0.32's own (vllm/utils/flashinfer.py, warn_if_flashinfer_kernels_missing): flashinfer-cubin, and
from CUDA 12.9 flashinfer-jit-cache, at flashinfer-python's public version.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from kiln.doctor.facts import InstalledStack
from kiln.doctor.report import PASS, SKIP, WARN, Check
from kiln.doctor.stack import version_key
from kiln.hardware.model import Machine

JIT_CACHE_FROM_CUDA = (12, 9)  # vllm/utils/flashinfer.py, has_flashinfer_jit_cache_wheels


def _public(version: str) -> str:
    try:
        return Version(version).public
    except InvalidVersion:
        return version


def kernel_packages(torch_cuda: str | None) -> tuple[str, ...]:
    """The kernel packages vLLM expects beside FlashInfer for torch's CUDA release."""
    jit = torch_cuda is not None and version_key(torch_cuda)[:2] >= JIT_CACHE_FROM_CUDA
    return ("flashinfer-cubin", "flashinfer-jit-cache") if jit else ("flashinfer-cubin",)


def check_flashinfer_kernels(machine: Machine, installed: InstalledStack | None) -> Check:
    if not machine.gpus:
        return Check("flashinfer kernels", SKIP, "no NVIDIA GPU: FlashInfer is not used")
    if installed is None or installed.vllm is None:
        return Check("flashinfer kernels", SKIP, "no vLLM installation was read")
    if installed.flashinfer is None:
        return Check("flashinfer kernels", SKIP, f"FlashInfer is not installed in {installed.where}")
    flashinfer = _public(installed.flashinfer)
    found = {name: _public(version) for name, version in installed.flashinfer_kernels}
    wanted = kernel_packages(installed.torch_cuda)
    wrong = [f"{n} {found.get(n, 'not installed')}" for n in wanted if found.get(n) != flashinfer]
    if wrong:
        return Check("flashinfer kernels", WARN,
                     f"FlashInfer {flashinfer}'s precompiled kernels are missing or of another version "
                     f"({', '.join(wrong)}): vLLM downloads and compiles them at its first start, minutes before "
                     "the first token",
                     f"{installed.where}/bin/vllm download-kernels (as root; kiln's image build runs it), then "
                     "systemctl restart kiln-agent")
    return Check("flashinfer kernels", PASS, f"FlashInfer {flashinfer} with " + ", ".join(
        f"{n} {found[n]}" for n in wanted))
