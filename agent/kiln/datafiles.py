"""Read kiln's bundled data files (hardware facts, machine fixtures, prices)."""

from __future__ import annotations

from importlib import resources
from typing import Any

from kiln.validation import parse_yaml


def read_text(relative: str) -> str:
    """A text file shipped in the package's data/ folder (a template, a unit)."""
    return resources.files("kiln").joinpath("data").joinpath(relative).read_text(encoding="utf-8")


def read_yaml(relative: str) -> Any:
    """Parse a YAML file shipped in the package's data/ folder."""
    text = resources.files("kiln").joinpath("data").joinpath(relative).read_text(encoding="utf-8")
    return parse_yaml(text)


def list_names(folder: str) -> list[str]:
    """Names (without .yaml) of the data files in a data/ sub-folder."""
    root = resources.files("kiln").joinpath("data").joinpath(folder)
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


def data_dir(folder: str) -> str:
    """A data/ sub-folder on disk (the package is installed as files, never zipped): what another process reads."""
    return str(resources.files("kiln").joinpath("data").joinpath(folder))


def vllm_serve_launcher() -> str:
    """kiln's launcher of vLLM's serve command (data/vllm/kiln_vllm_serve.py), run by the vLLM virtualenv's Python."""
    return f"{data_dir('vllm')}/kiln_vllm_serve.py"
