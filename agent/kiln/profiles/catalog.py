"""Load and validate the profile catalog (profiles/*.yaml)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.errors import ConfigError, NotFoundError
from kiln.profiles import hf_config
from kiln.profiles.names import normalize_name
from kiln.profiles.schema import GPU_KEYS, Profile
from kiln.validation import load_yaml_text, validate

FIX = "compare with profiles/llama-3.1-8b-instruct.yaml; the schema is kiln/profiles/schema.py"


def default_profile_dirs() -> list[Path]:
    """Where profiles are looked for, first match wins."""
    dirs = []
    if env := os.environ.get("KILN_PROFILES_DIR"):
        dirs.append(Path(env))
    dirs += [
        Path("/etc/kiln/profiles"),
        Path(sys.prefix) / "share" / "kiln" / "profiles",
        Path("/usr/share/kiln/profiles"),
        Path(__file__).resolve().parents[3] / "profiles",  # a source checkout
    ]
    return dirs


def find_profile_dir(dirs: Iterable[Path] | None = None) -> Path:
    candidates = list(dirs) if dirs is not None else default_profile_dirs()
    for d in candidates:
        if d.is_dir() and any(d.glob("*.yaml")):
            return d
    raise NotFoundError(
        "no profile catalog found",
        where=", ".join(str(d) for d in candidates),
        fix="set KILN_PROFILES_DIR to the folder holding the profile YAML files",
    )


def parse_profile(text: str, *, where: str, gpu_classes: Iterable[str] = (), base: Path | None = None) -> Profile:
    """A profile from its YAML; `config: FILE` (relative to `base`, the profile's folder) names the model's published
    config.json, from which the architecture is read instead of being written out."""
    data = load_yaml_text(text, where=where)
    if not isinstance(data, Mapping):
        raise ConfigError("a profile must be a YAML mapping", where=where, fix=FIX)
    if "config" in data:
        data = with_architecture_from_config(dict(data), (base or Path(".")) / str(data["config"]), where)
    profile = validate(Profile, data, where=where, fix=FIX)
    allowed = GPU_KEYS | set(gpu_classes)
    for key in profile.gpu_overrides:
        if key not in allowed:
            raise ConfigError(
                f"gpu_overrides.{key}: unknown GPU class or architecture",
                where=where,
                fix=f"use one of: {', '.join(sorted(allowed))}",
            )
    return profile


@dataclass(frozen=True)
class Catalog:
    profiles: Mapping[str, Profile]
    directory: Path

    def names(self) -> list[str]:
        return sorted(self.profiles)

    def get(self, name: str) -> Profile:
        wanted = normalize_name(name)
        for key, profile in self.profiles.items():
            if normalize_name(key) == wanted:
                return profile
        raise NotFoundError(
            f"unknown profile {name!r}",
            where="profile",
            fix=f"choose one of: {', '.join(self.names())} (`kiln profiles list`), or give a model path",
        )


def with_architecture_from_config(data: dict[str, Any], config: Path, where: str) -> dict[str, Any]:
    """The profile's data with `architecture` read from the config file, and the native checkpoint's size estimated
    from it where the profile records none."""
    if "architecture" in data:
        raise ConfigError("give either architecture or config, not both", where=f"{where}: config",
                          fix="drop the architecture block: it is read from the config file")
    try:
        raw = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read the model's config: {exc}", where=f"{where}: config",
                          fix="name a config.json copy in the profiles folder, e.g. configs/ORG--NAME.json") from None
    quant_file = config.with_name(config.name.replace("config.json", "hf_quant_config.json"))  # ModelOpt's, beside it
    hf_quant = json.loads(quant_file.read_text(encoding="utf-8")) if quant_file.is_file() else None
    family = hf_config.family_of(raw, where)
    raw = family.filled(raw)
    try:
        params = hf_config.count_params(raw, family.key)
        architecture = hf_config.read_architecture(raw, family, params)
        quant = raw.get("quantization_config") or hf_config.text_config(raw).get("quantization_config")
        native = hf_config.checkpoint_precision(quant, hf_quant)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"the model's config lacks or mangles a field kiln needs: {exc}", where=str(config),
                          fix="copy the repository's config.json unchanged") from None
    out = {k: v for k, v in data.items() if k != "config"}
    out["architecture"] = architecture
    checkpoints = {k: dict(v) for k, v in (out.get("checkpoints") or {}).items()}
    if native in checkpoints and "weight_bytes" not in checkpoints[native]:
        estimate = hf_config.estimated_weight_bytes(params, native, quant, hf_quant)
        if estimate:
            checkpoints[native]["weight_bytes"] = estimate
    out["checkpoints"] = checkpoints
    return out


def load_profile_file(path: Path, gpu_classes: Iterable[str] = ()) -> Profile:
    """One profile file, validated, its name matching the file name."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", where=str(path), fix="check the path") from None
    profile = parse_profile(text, where=str(path), gpu_classes=gpu_classes, base=path.parent)
    if profile.name != path.stem:
        raise ConfigError(
            f"name {profile.name!r} does not match the file name",
            where=f"{path}: name",
            fix=f"rename the file to {profile.name}.yaml or set name: {path.stem}",
        )
    return profile


def load_catalog(directory: Path, gpu_classes: Iterable[str] = ()) -> Catalog:
    """Every profile in a folder; any invalid file is an error naming it."""
    classes = list(gpu_classes)
    profiles = {}
    for path in sorted(directory.glob("*.yaml")):
        profile = load_profile_file(path, classes)
        profiles[profile.name] = profile
    return Catalog(profiles=profiles, directory=directory)


def validate_paths(paths: Iterable[Path], gpu_classes: Iterable[str] = ()) -> list[ConfigError]:
    """Every problem in the given profile files (or folders), without stopping at the first."""
    classes = list(gpu_classes)
    files: list[Path] = []
    for p in paths:
        files.extend(sorted(p.glob("*.yaml")) if p.is_dir() else [p])
    errors: list[ConfigError] = []
    for f in files:
        try:
            load_profile_file(f, classes)
        except ConfigError as exc:
            errors.append(exc)
    return errors
