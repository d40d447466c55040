"""What one model's settings are: the fields one-model settings give at the top level, and the items of `models:`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kiln.perf.workload import WorkloadSpec
from kiln.profiles.schema import Task

Objective = Literal["throughput", "latency"]
Quantization = Literal["auto", "bf16", "fp8", "nvfp4", "mxfp4"]
KvCacheDtype = Literal["auto", "fp8"]

# A served model name: what clients put in `model`. vLLM takes any string; kiln keeps it to what fits a URL, a
# metric label and a log line unquoted.
SERVED_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/\-]{0,127}$"
HUB_ID_OR_PATH = r"^(/[^\x00\n]{1,4095}|[A-Za-z0-9][A-Za-z0-9._\-]*/[A-Za-z0-9][A-Za-z0-9._\-]*)$"
REVISION = r"^[A-Za-z0-9._\-/]+$"
MAX_MODELS = 16
MAX_ADAPTERS = 64


class ModelSettings(BaseModel):
    """The settings of one model: what to serve and how. None means 'kiln decides'."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str | None = Field(default=None, min_length=1, max_length=128)
    model: str | None = Field(default=None, min_length=1, max_length=4096)
    revision: str | None = Field(default=None, min_length=1, max_length=256, pattern=REVISION)
    objective: Objective | None = None
    max_model_len: int | None = Field(default=None, ge=256, le=10_000_000)
    instances: int | None = Field(default=None, ge=1, le=64)
    tensor_parallel_size: int | None = Field(default=None, ge=1, le=64)
    data_parallel_size: int | None = Field(default=None, ge=1, le=64)
    expert_parallel: bool | None = None
    quantization: Quantization | None = None
    kv_cache_dtype: KvCacheDtype | None = None
    speculative_decoding: bool | None = None
    # vLLM takes any fraction in (0, 1] (vllm/config/cache.py, gt=0): a small one shares a GPU between processes.
    # Whether the weights and a cache fit in it is the planner's to say, with its reason.
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=0.98)
    workload: WorkloadSpec | None = None
    trust_remote_code: bool | None = None  # run the model repository's own code; None: as the catalog's profile says

    @field_validator("workload", mode="before")
    @classmethod
    def _workload_preset(cls, value: Any) -> Any:
        """`workload: chat` names a preset."""
        return {"preset": value} if isinstance(value, str) else value

    def model_settings(self) -> dict[str, Any]:
        """The one-model settings given, as validated values (a workload stays a WorkloadSpec, where model_dump
        would make it a dict)."""
        return {k: getattr(self, k) for k in ModelSettings.model_fields if getattr(self, k) is not None}


class LoraAdapter(BaseModel):
    """One LoRA adapter of a model: the name clients ask for, and where its files are."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=SERVED_NAME)
    source: str = Field(max_length=4096, pattern=HUB_ID_OR_PATH)  # a Hub repository ORG/NAME, or an absolute path
    revision: str | None = Field(default=None, min_length=1, max_length=256, pattern=REVISION)


class ModelItem(ModelSettings):
    """One item of `models:`: a model, and where and how it is served beside the others."""

    name: str | None = Field(default=None, pattern=SERVED_NAME)  # the served name; None: the profile's
    # Whole GPUs: how many, or which (NVML's indexes). None: the planner places the model, sharing a GPU
    # with others where it is small.
    gpus: int | tuple[int, ...] | None = None
    task: Task | None = None  # None: the profile's, or what the repository's files say
    lora: tuple[LoraAdapter, ...] = Field(default=(), max_length=MAX_ADAPTERS)

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: int | tuple[int, ...] | None) -> int | tuple[int, ...] | None:
        if isinstance(value, int) and not 1 <= value <= 64:
            raise ValueError("a GPU count is 1 to 64")
        if isinstance(value, tuple):
            if not value:
                raise ValueError("list at least one GPU")
            if any(not 0 <= g <= 63 for g in value):
                raise ValueError("GPU indexes are 0 to 63")
            if len(set(value)) != len(value):
                raise ValueError("a GPU is listed twice")
            return tuple(sorted(value))
        return value

    @field_validator("lora")
    @classmethod
    def _adapter_names(cls, value: tuple[LoraAdapter, ...]) -> tuple[LoraAdapter, ...]:
        names = [a.name for a in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"adapter name {twice[0]!r} is given twice")
        return value

    @model_validator(mode="after")
    def _one_model(self) -> ModelItem:
        if (self.profile is None) == (self.model is None):
            raise ValueError("give exactly one of profile or model")
        if self.lora and self.task not in (None, "chat"):
            raise ValueError(f"LoRA adapters serve chat models; this item's task is {self.task}")
        return self


MODEL_HINTS = {
    "models": "a list of models, each `{profile: NAME}` or `{model: ORG/NAME}` with optionally name, gpus, task "
              "(chat, embed, rerank), lora ([{name, source}]) and any one-model setting, e.g. "
              "`models: [{profile: llama-3.3-70b-instruct}, {profile: qwen3-embedding-8b}]`",
}
