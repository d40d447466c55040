"""What a user may choose, field by field, so one bad field never spoils the rest."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Objective = Literal["throughput", "latency"]
Quantization = Literal["auto", "bf16", "fp8", "nvfp4", "mxfp4"]
KvCacheDtype = Literal["auto", "fp8"]


class Choice(BaseModel):
    """The user's settings; every field optional, None meaning 'kiln decides'."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str | None = Field(default=None, min_length=1, max_length=128)
    model: str | None = Field(default=None, min_length=1, max_length=4096)
    objective: Objective | None = None
    max_model_len: int | None = Field(default=None, ge=256, le=10_000_000)
    instances: int | None = Field(default=None, ge=1, le=64)
    tensor_parallel_size: int | None = Field(default=None, ge=1, le=64)
    quantization: Quantization | None = None
    kv_cache_dtype: KvCacheDtype | None = None
    speculative_decoding: bool | None = None
    gpu_memory_utilization: float | None = Field(default=None, ge=0.3, le=0.98)
    api_key: str | None = Field(default=None, min_length=16, max_length=256, pattern=r"^[A-Za-z0-9._~+\-]+$")
    hf_token: str | None = Field(default=None, min_length=8, max_length=256, pattern=r"^[A-Za-z0-9_\-]+$")
    price_per_hour: float | None = Field(default=None, ge=0, le=10_000)


FIELDS = tuple(Choice.model_fields)
# Never shown: not in problems, reports, the journal or the MOTD; only whether they are set.
SECRET_FIELDS = frozenset({"api_key", "hf_token"})
HINTS: dict[str, str] = {
    "profile": "a profile name from `kiln profiles list`, e.g. llama-3.1-8b-instruct",
    "model": "an absolute path to a local model directory holding config.json",
    "objective": "throughput or latency",
    "max_model_len": "an integer number of tokens, at least 256, e.g. 32768",
    "instances": "an integer from 1 to 64",
    "tensor_parallel_size": "an integer: 1, 2, 4 or 8",
    "quantization": "auto, bf16, fp8, nvfp4 or mxfp4",
    "kv_cache_dtype": "auto or fp8",
    "speculative_decoding": "true or false",
    "gpu_memory_utilization": "a fraction between 0.3 and 0.98, e.g. 0.9",
    "api_key": "16 to 256 characters of letters, digits and ._~+-",
    "hf_token": "a Hugging Face access token (hf_...) from https://huggingface.co/settings/tokens",
    "price_per_hour": "the machine's USD price per hour, e.g. 3.39",
}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the user's input, with the fix."""

    source: str
    field: str
    what: str
    fix: str

    def text(self) -> str:
        where = f"{self.source}: {self.field}" if self.field else self.source
        return f"{where}: {self.what} (fix: {self.fix})"

    def as_dict(self) -> dict[str, str]:
        return {"source": self.source, "field": self.field, "error": self.what, "fix": self.fix}


@dataclass(frozen=True)
class Layer:
    """The valid fields one source gave, and what was wrong with the rest."""

    source: str
    values: Mapping[str, Any] = field(default_factory=dict)
    problems: tuple[Problem, ...] = ()


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def validate_fields(data: Any, *, source: str) -> Layer:
    """Keep each valid field; report each invalid or unknown one."""
    if data is None:
        return Layer(source)
    if not isinstance(data, Mapping):
        return Layer(source, problems=(Problem(
            source, "", f"expected a mapping of settings, got {type(data).__name__}",
            "write settings as `key: value` lines, e.g. `profile: llama-3.1-8b-instruct`"),))
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    for raw_key, value in data.items():
        key = str(raw_key).strip().replace("-", "_")
        if key not in FIELDS:
            close = difflib.get_close_matches(key, FIELDS, n=1)
            fix = f"did you mean `{close[0]}`?" if close else f"known keys: {', '.join(FIELDS)}"
            problems.append(Problem(source, str(raw_key)[:64], "unknown key", fix))
            continue
        if value is None:
            continue
        try:
            one = Choice.model_validate({key: value})
            values[key] = getattr(one, key)
        except ValidationError as exc:
            msg = exc.errors()[0]["msg"]
            got = "a value of this length, hidden" if key in SECRET_FIELDS else _shown(value)
            problems.append(Problem(source, key, f"{msg} (got {got})", f"use {HINTS[key]}"))
    if values.get("profile") and values.get("model"):
        problems.append(Problem(source, "model", "both profile and model are set; profile is used",
                                "set only one of profile or model"))
        values.pop("model")
    return Layer(source, values, tuple(problems))
