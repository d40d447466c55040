"""Which files of a repository vLLM loads, and what a plan needs from the Hub. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from kiln.setup.types import Plan

# vLLM loads one weight format, the first a repository has (vllm/model_executor/model_loader/weight_utils.py,
# download_weights_from_hf: "*.safetensors", then "*.bin", then "*.pt"), and skips Meta's `original/` copy.
WEIGHT_FORMATS = (".safetensors", ".bin", ".pt")
SKIPPED_FOLDERS = ("original",)
# Beside the weights: the config, tokenizer and chat template files transformers and vLLM read at the top level.
SIDE_FILES = (".json", ".model", ".tiktoken", ".txt", ".jinja", ".py")


@dataclass(frozen=True)
class RepoFile:
    name: str
    size: int


@dataclass(frozen=True)
class Needed:
    """One repository a plan downloads, and what for."""

    repo: str
    revision: str
    role: str  # "model" or "speculator"


def files_vllm_loads(files: list[RepoFile]) -> list[RepoFile]:
    kept = [f for f in files if PurePosixPath(f.name).parts[0] not in SKIPPED_FOLDERS]
    weights: list[RepoFile] = []
    for suffix in WEIGHT_FORMATS:
        weights = [f for f in kept if f.name.endswith(suffix)]
        if weights:
            break
    side = [f for f in kept if "/" not in f.name and f.name.endswith(SIDE_FILES) and f not in weights]
    return sorted(side + weights, key=lambda f: f.name)


def repos_for(plan: Plan, local_model: bool) -> list[Needed]:
    """The Hub repositories the plan's instances read: the model, and a draft model or EAGLE head."""
    needed: list[Needed] = []
    if not local_model and not plan.engine.model.startswith("/"):
        needed.append(Needed(plan.engine.model, plan.engine.revision, "model"))
    draft = (plan.engine.speculative_config or {}).get("model")
    if isinstance(draft, str) and "/" in draft and not draft.startswith("/"):
        needed.append(Needed(draft, "main", "speculator"))
    return needed
