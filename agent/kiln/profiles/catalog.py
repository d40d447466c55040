"""Load and validate the profile catalog (profiles/*.yaml)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import ConfigError, NotFoundError
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


def parse_profile(text: str, *, where: str, gpu_classes: Iterable[str] = ()) -> Profile:
    data = load_yaml_text(text, where=where)
    if not isinstance(data, Mapping):
        raise ConfigError("a profile must be a YAML mapping", where=where, fix=FIX)
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


def normalize_name(name: str) -> str:
    """Profile names compare without case and with '.' and '_' as '-' (DigitalOcean tags allow no dots)."""
    return name.strip().lower().replace(".", "-").replace("_", "-")


def load_profile_file(path: Path, gpu_classes: Iterable[str] = ()) -> Profile:
    """One profile file, validated, its name matching the file name."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", where=str(path), fix="check the path") from None
    profile = parse_profile(text, where=str(path), gpu_classes=gpu_classes)
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
