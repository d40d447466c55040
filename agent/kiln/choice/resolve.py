"""Merge the sources into one choice, with where each setting came from. Pure functions.

Precedence, lowest to highest: cloud-init user-data, then DigitalOcean droplet tags, then the
local file /etc/kiln/kiln.yaml. The later a source can still be changed, the more it weighs:
user-data is fixed when the droplet is created, tags can be edited from the control panel,
the local file on the machine itself. The local file counts as the user-data's own copy (lowest
layer) while it still holds exactly what user-data's write_files put there.
"""

from __future__ import annotations

import dataclasses
import errno
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.choice.schema import Choice, Layer, Problem, drop_shared_keys, validate_fields
from kiln.choice.sources import HF_TOKEN_FILE, MAX_READ_BYTES, RawInputs, read_head
from kiln.choice.trust import refused_from_public
from kiln.choice.userdata import KILN_FILE, extract_settings
from kiln.validation import YamlError, parse_yaml

TAG_PREFIX = "kiln-"
WHAT_TO_SERVE = ("profile", "model", "models")
TAG_ALIASES = {"tp": "tensor_parallel_size", "speculative": "speculative_decoding", "kv_cache": "kv_cache_dtype"}


@dataclass(frozen=True)
class ResolvedChoice:
    choice: Choice
    origins: Mapping[str, str] = field(default_factory=dict)  # field -> source
    problems: tuple[Problem, ...] = ()
    addresses: tuple[str, ...] = ()  # the machine's public addresses as its metadata gives them (for TLS)

    def summary(self) -> str:
        if not self.origins:
            return "no user choice found; image defaults"
        by_source: dict[str, list[str]] = {}
        for key, source in self.origins.items():
            by_source.setdefault(source, []).append(key)
        return "; ".join(f"{', '.join(keys)} from {src}" for src, keys in by_source.items())


def tags_to_settings(tags: Sequence[str]) -> dict[str, Any]:
    """`kiln-profile:llama-3-1-8b-instruct` -> {"profile": "llama-3-1-8b-instruct"}; other tags ignored."""
    settings: dict[str, Any] = {}
    for tag in tags:
        if not tag.startswith(TAG_PREFIX) or ":" not in tag:
            continue
        key, _, value = tag[len(TAG_PREFIX):].partition(":")
        key = key.replace("-", "_")
        key = TAG_ALIASES.get(key, key)
        try:
            parsed = parse_yaml(value) if value else None
        except YamlError:
            parsed = value
        settings[key] = value if isinstance(parsed, (dict, list)) or key == "profile" else parsed
    return settings


def layers_from_inputs(raw: RawInputs) -> list[Layer]:
    """One validated layer per source, lowest precedence first."""
    layers: list[Layer] = []
    user_file_copy: str | None = None
    if raw.user_data is not None:
        extracted = extract_settings(raw.user_data)
        user_file_copy = extracted.file_content
        source = f"user-data ({raw.user_data_origin})" if raw.user_data_origin else "user-data"
        layer = validate_fields(extracted.settings, source=source)
        layers.append(Layer(layer.source, layer.values, extracted.problems + layer.problems))
    if raw.tags:
        tagged = tags_to_settings(raw.tags)
        hidden = [Problem("droplet tags", key, f"{why}; it is ignored",
                          f"put {key} in user-data or /etc/kiln/kiln.yaml, and delete the tag")
                  for key in sorted(tagged) if (why := refused_from_public(key)) is not None]
        for problem in hidden:
            tagged.pop(problem.field)
        layer = validate_fields(tagged, source="droplet tags")
        layers.append(Layer(layer.source, layer.values, (*hidden, *layer.problems)))
    if raw.local_file is not None and raw.local_file != user_file_copy:
        try:
            data = parse_yaml(raw.local_file)
        except YamlError as exc:
            layers.append(Layer(KILN_FILE, problems=(Problem(
                KILN_FILE, "", str(exc), "fix the file, then `systemctl restart kiln-agent`"),)))
        else:
            layers.append(validate_fields(data, source=KILN_FILE))
    if raw.hf_token_file:
        layers.append(validate_fields({"hf_token": raw.hf_token_file}, source=HF_TOKEN_FILE))
    return layers


def settings_file_layer(path: Path, fix: str) -> Layer:
    """A settings file given on the command line (`kiln up --config`, `kiln plan --config`), validated as
    /etc/kiln/kiln.yaml is; a file that cannot be read or parsed is the layer's one problem, with `fix`."""
    source = str(path)
    try:
        data = read_head(path, MAX_READ_BYTES)
        if len(data) > MAX_READ_BYTES:
            raise OSError(errno.EFBIG, f"larger than {MAX_READ_BYTES:,} bytes")
        return validate_fields(parse_yaml(data.decode("utf-8")), source=source)
    except OSError as exc:
        what = f"cannot read: {exc.strerror or exc}"
    except UnicodeDecodeError:
        what = "not UTF-8 text"
    except YamlError as exc:
        what = str(exc)
    return Layer(source, problems=(Problem(source, "", what, fix),))


def merge(layers: Sequence[Layer], read_problems: Sequence[Problem] = ()) -> ResolvedChoice:
    """Later layers override earlier ones field by field. Setting `profile`, `model` or `models` clears the
    others an earlier layer set."""
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    problems: list[Problem] = list(read_problems)
    for layer in layers:
        problems.extend(layer.problems)
        for key, value in layer.values.items():
            if key in WHAT_TO_SERVE:  # a later source's model replaces, never mixes with, an earlier one's
                for other in WHAT_TO_SERVE:
                    if other != key:
                        values.pop(other, None)
                        origins.pop(other, None)
            values[key] = value
            origins[key] = layer.source
    for problem in drop_shared_keys(values, lambda key: origins.get(key, "")):  # one key from two sources
        if problem.field not in values:
            origins.pop(problem.field, None)
        problems.append(problem)
    return ResolvedChoice(Choice(**values), origins, tuple(problems))


def resolve_choice(raw: RawInputs) -> ResolvedChoice:
    return dataclasses.replace(merge(layers_from_inputs(raw), raw.problems), addresses=raw.addresses)
