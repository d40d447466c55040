"""A model named by its Hub id (ORG/NAME): the small files planning reads, fetched through the one Hub adapter, then
the same profile a local directory's config.json gives."""

from __future__ import annotations

import dataclasses
import re

from kiln.errors import ConfigError
from kiln.hub.client import HubClient
from kiln.hub.preflight import refusal
from kiln.profiles.hf_config import PLANNING_FILES, profile_from_files, read_model_dir
from kiln.profiles.schema import Profile

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]*/[A-Za-z0-9][A-Za-z0-9._\-]*$")


def is_hub_id(model: str) -> bool:
    """ORG/NAME, as the Hub spells repositories; a path starts with / or . (or names an existing folder)."""
    return bool(HUB_ID.match(model)) and not model.startswith(".")


def profile_from_hub(client: HubClient, repo: str, revision: str = "main") -> Profile:
    """The repository's profile, read from its config files; a gated, missing or unreadable repository, or an
    architecture kiln cannot size, is refused before any weight is downloaded."""
    check, folder = client.planning_files(repo, revision, PLANNING_FILES)
    if folder is None:
        raise refusal(check, client.token is not None)
    if not (folder / "config.json").is_file():
        raise ConfigError("the repository has no config.json", where=f"model {repo}",
                          fix="name a Hugging Face Transformers model repository (it holds config.json)")
    weights = sum(f.size for f in check.files if f.name.endswith(".safetensors"))
    files = read_model_dir(folder, hf_id=repo, revision=revision, local=False)
    return profile_from_files(dataclasses.replace(files, safetensors_bytes=weights or None))
