"""A LoRA adapter's files, read once: where they are and what vLLM must be started with to serve it (its rank).

PEFT's adapter_config.json names the rank (`r`) and the modules it adapts; vLLM refuses DoRA, a trained bias and
modules it cannot save (vllm/lora/peft_helper.py), so those are refused here, before any engine starts.
"""

from __future__ import annotations

import json
from pathlib import Path

from kiln.errors import ConfigError
from kiln.hub.client import HubClient
from kiln.hub.preflight import refusal
from kiln.setup.types import LoraModule

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
SAVABLE = ("classifier", "score")  # the only modules_to_save vLLM loads (peft_helper.py)


def read_adapter_dir(name: str, folder: Path, source: str) -> LoraModule:
    where = f"adapter {name} ({source})"
    try:
        config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError("it has no adapter_config.json", where=where,
                          fix="name a PEFT LoRA adapter (its folder holds adapter_config.json)") from exc
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"its adapter_config.json cannot be read: {exc}", where=where,
                          fix="fix or replace the adapter's files") from exc
    rank = config.get("r") if isinstance(config, dict) else None
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= 512:
        raise ConfigError("its adapter_config.json gives no rank `r` from 1 to 512 (vLLM's largest)", where=where,
                          fix="name a LoRA adapter that vLLM serves")
    if config.get("use_dora"):
        raise ConfigError("it is a DoRA adapter, which vLLM does not serve", where=where,
                          fix="merge it into its base model and serve that as a model of its own")
    if config.get("bias", "none") != "none":
        raise ConfigError(f"it trains a bias ({config.get('bias')}), which vLLM does not load", where=where,
                          fix="retrain it with bias=none, or merge it into its base model")
    saved = [m for m in config.get("modules_to_save") or () if m not in SAVABLE]
    if saved:
        raise ConfigError(f"it saves whole modules ({', '.join(map(str, saved))}), which vLLM does not load",
                          where=where, fix="retrain it without modules_to_save, or merge it into its base model")
    if not any((folder / f).is_file() for f in ADAPTER_FILES[1:]):
        raise ConfigError("it has no adapter_model.safetensors", where=where, fix="give the adapter's weights too")
    return LoraModule(name, str(folder), rank)


def read_adapter(name: str, source: str, revision: str | None, client: HubClient | None) -> LoraModule:
    """An adapter from an absolute path, or from the Hub (its files downloaded into the client's cache)."""
    if source.startswith("/"):
        return read_adapter_dir(name, Path(source), source)
    if client is None:
        raise ConfigError("the Hub cannot be asked here", where=f"adapter {name} ({source})",
                          fix="give the adapter's folder as an absolute path")
    check, folder = client.planning_files(source, revision or "main", ADAPTER_FILES)
    if folder is None:
        raise refusal(check, client.token is not None)
    return read_adapter_dir(name, folder, source)
