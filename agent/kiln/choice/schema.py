"""What a user may choose, field by field, so one bad field never spoils the rest."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kiln.choice.items import MAX_MODELS, MODEL_HINTS, SERVED_NAME, LoraAdapter, ModelItem, ModelSettings
from kiln.perf.workload import WorkloadSpec
from kiln.validation import message

KEY_NAME = r"^[a-z0-9][a-z0-9_-]{0,31}$"
KEY_SECRET = r"^[A-Za-z0-9._~+\-]+$"
HOST_NAME = r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$"


class NamedKey(BaseModel):
    """One of `api_keys`: the key, and optionally a rate limit for it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(min_length=16, max_length=256, pattern=KEY_SECRET)
    requests_per_minute: int | None = Field(default=None, ge=1, le=1_000_000)
    # The served names (models and LoRA adapters) this key may ask for; absent: every model on the machine.
    models: tuple[Annotated[str, Field(pattern=SERVED_NAME)], ...] | None = Field(default=None, min_length=1,
                                                                                  max_length=64)


class TlsCertificate(BaseModel):
    """The user's own certificate (the leaf first, then its chain) and unencrypted private key, as PEM."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    certificate: str = Field(min_length=64, max_length=65536)
    private_key: str = Field(min_length=64, max_length=16384)


class TlsAcme(BaseModel):
    """A certificate from an ACME CA (Let's Encrypt by default) for a name that resolves to this machine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    domain: str = Field(max_length=253, pattern=HOST_NAME)
    email: str | None = Field(default=None, max_length=254, pattern=r"^[^@\s]+@[^@\s]+$")
    directory: str = Field(default="https://acme-v02.api.letsencrypt.org/directory", pattern=r"^https://\S+$")
    renew_before_days: int = Field(default=30, ge=1, le=3650)


TlsSetting = Literal["off", "self-signed"] | TlsCertificate | TlsAcme
IPV4 = r"^((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)$"


class ClusterSetting(BaseModel):
    """One model across `nodes` machines. The head and this node's rank are given, or found by the DigitalOcean
    tag `kiln-cluster:NAME` (with `do_token`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=48, pattern=r"^[a-z0-9][a-z0-9-]*$")
    nodes: int = Field(ge=2, le=64)
    head: str | None = Field(default=None, pattern=IPV4)  # the head's private address
    rank: int | None = Field(default=None, ge=0, le=63)
    address: str | None = Field(default=None, pattern=IPV4)  # this node's private address (else found)

    @field_validator("rank")
    @classmethod
    def _rank_in_range(cls, value: int | None, info: Any) -> int | None:
        nodes = info.data.get("nodes")
        if value is not None and nodes is not None and value >= nodes:
            raise ValueError(f"rank {value} is not below nodes ({nodes}): ranks are 0 to {nodes - 1}")
        return value

    @model_validator(mode="after")
    def _head_with_rank(self) -> ClusterSetting:
        if (self.head is None) != (self.rank is None):
            raise ValueError("give head and rank together, or neither (then the nodes are found by tag)")
        return self

    @property
    def tag(self) -> str:
        return f"kiln-cluster:{self.name}"

    @property
    def explicit(self) -> bool:
        return self.head is not None and self.rank is not None


class Choice(ModelSettings):
    """The user's settings; every field optional, None meaning 'kiln decides'. The model's own settings are those
    of ModelSettings; `models:` lists several models instead, each with its own."""

    api_key: str | None = Field(default=None, min_length=16, max_length=256, pattern=r"^[A-Za-z0-9._~+\-]+$")
    hf_token: str | None = Field(default=None, min_length=8, max_length=256, pattern=r"^[A-Za-z0-9_\-]+$")
    price_per_hour: float | None = Field(default=None, ge=0, le=10_000)
    api_keys: dict[str, NamedKey] | None = Field(default=None, max_length=256)
    tls: TlsSetting | None = None
    cluster: ClusterSetting | None = None
    do_token: str | None = Field(default=None, min_length=16, max_length=256, pattern=r"^[A-Za-z0-9_\-]+$")
    models: tuple[ModelItem, ...] | None = Field(default=None, min_length=1, max_length=MAX_MODELS)

    def with_item(self, item: ModelItem) -> Choice:
        """The settings one item of `models:` is served with: its own over the top-level ones, as validated
        values (a workload stays a WorkloadSpec)."""
        return self.model_copy(update={**item.model_settings(), "models": None})

    @field_validator("api_keys", mode="before")
    @classmethod
    def _named_keys(cls, value: Any) -> Any:
        """`name: KEY` is short for `name: {key: KEY}`; names are lowercase words."""
        if not isinstance(value, Mapping):
            return value
        out: dict[str, Any] = {}
        for name, spec in value.items():
            text = str(name)
            if not re.fullmatch(KEY_NAME, text):  # `$` alone would match before a final newline
                raise ValueError(f"key name {text[:40]!r} must be 1 to 32 lowercase letters, digits, - or _")
            out[text] = {"key": spec} if isinstance(spec, str) else spec
        return out

    @field_validator("tls", mode="before")
    @classmethod
    def _tls_switch(cls, value: Any) -> Any:
        """YAML reads `tls: off` as false and `tls: on` as true."""
        if value is False:
            return "off"
        if value is True:
            return "self-signed"
        return value


def tls_summary(tls: TlsSetting | None) -> str:
    """The TLS setting without its secrets: what reports show."""
    if isinstance(tls, TlsCertificate):
        return "certificate (given)"
    if isinstance(tls, TlsAcme):
        return f"acme ({tls.domain})"
    return tls or "self-signed"


FIELDS = tuple(Choice.model_fields)
# Never shown: not in problems, reports, the journal or the MOTD; only whether they are set.
SECRET_FIELDS = frozenset({"api_key", "hf_token", "api_keys", "tls", "do_token"})
HINTS: dict[str, str] = {
    "profile": "a profile name from `kiln profiles list`, e.g. llama-3.1-8b-instruct",
    "model": "a Hugging Face repository ORG/NAME, or an absolute path to a local model directory holding config.json",
    "revision": "the model repository's branch, tag or commit, e.g. main",
    "objective": "throughput or latency",
    "max_model_len": "an integer number of tokens, at least 256, e.g. 32768",
    "instances": "an integer from 1 to 64",
    "tensor_parallel_size": "an integer: 1, 2, 4 or 8",
    "quantization": "auto, bf16, fp8, nvfp4 or mxfp4",
    "kv_cache_dtype": "auto or fp8",
    "speculative_decoding": "true or false",
    "gpu_memory_utilization": "a fraction above 0 and at most 0.98, e.g. 0.9",
    "api_key": "16 to 256 characters of letters, digits and ._~+-",
    "hf_token": "a Hugging Face access token (hf_...) from https://huggingface.co/settings/tokens",
    "price_per_hour": "the machine's USD price per hour, e.g. 3.39",
    "api_keys": "a mapping of key names to keys, e.g. `api_keys: {ci: KEY}` or `{ci: {key: KEY, "
                "requests_per_minute: 60, models: [NAME, ...]}}`",
    "tls": "off, self-signed, {certificate: PEM, private_key: PEM} or {domain: NAME, email: ADDRESS}",
    "data_parallel_size": "a number of data-parallel engine ranks in one server, e.g. 8",
    "expert_parallel": "true or false (MoE models: spread the experts over every GPU of the server)",
    "workload": "a preset (serve, batch, chat, rag, agent) and/or {input_len, output_len, concurrency or request_rate, "
                "ttft_ms, tpot_ms}, e.g. `workload: {preset: chat, concurrency: 32}`",
    "cluster": "{name: NAME, nodes: N} on every node (peers found by the tag kiln-cluster:NAME with do_token), "
               "or {name: NAME, nodes: N, head: HEAD_PRIVATE_IP, rank: R}",
    "do_token": "a read-only DigitalOcean API token (droplet:read), to find the cluster's nodes by tag",
    "trust_remote_code": "true to run the model repository's own code (vLLM's --trust-remote-code); only the owner may",
    **MODEL_HINTS,
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
        if key == "models":
            items, item_problems = validate_models(value, source=source)
            problems.extend(item_problems)
            if items:
                values[key] = items
            continue
        try:
            one = Choice.model_validate({key: value})
            values[key] = getattr(one, key)
        except ValidationError as exc:
            msg = message(exc.errors()[0])
            got = "a value of this length, hidden" if key in SECRET_FIELDS else _shown(value)
            problems.append(Problem(source, key, f"{msg} (got {got})", f"use {HINTS[key]}"))
    if values.get("profile") and values.get("model"):
        problems.append(Problem(source, "model", "both profile and model are set; profile is used",
                                "set only one of profile or model"))
        values.pop("model")
    if values.get("models") and (values.get("profile") or values.get("model")):
        single = "profile" if values.get("profile") else "model"
        problems.append(Problem(source, single, f"both models and {single} are set; models is used",
                                f"list the {single} as an item of models, or remove models"))
        values.pop(single)
    problems.extend(drop_shared_keys(values, lambda _: source))
    return Layer(source, values, tuple(problems))


ITEM_FIELDS = frozenset({*ModelItem.model_fields, *LoraAdapter.model_fields, *WorkloadSpec.model_fields})


def validate_models(data: Any, *, source: str) -> tuple[tuple[ModelItem, ...], list[Problem]]:
    """Each valid item of `models:`; each bad one reported on its own, so the others are still served."""
    if not isinstance(data, (list, tuple)):
        return (), [Problem(source, "models", f"expected a list of models, got {type(data).__name__}",
                            f"use {MODEL_HINTS['models']}")]
    if not data:
        return (), [Problem(source, "models", "the list is empty; no model is served from it",
                            "list at least one model, or remove models and set profile")]
    items: list[ModelItem] = []
    problems: list[Problem] = []
    for n, given in enumerate(data[:MAX_MODELS]):
        where = f"models[{n}]"
        raw = {"profile": given} if isinstance(given, str) else given  # `- qwen3-8b` names a profile
        if isinstance(raw, Mapping):
            raw = {str(k).strip().replace("-", "_"): v for k, v in raw.items() if v is not None}
            unknown = [k for k in raw if k not in ModelItem.model_fields]
            if unknown:
                close = difflib.get_close_matches(unknown[0], ModelItem.model_fields, n=1)
                problems.append(Problem(source, f"{where}.{unknown[0][:64]}", "unknown key; this model is not served",
                                        f"did you mean `{close[0]}`?" if close else
                                        f"known keys: {', '.join(ModelItem.model_fields)}"))
                continue
        try:
            items.append(ModelItem.model_validate(raw))
        except ValidationError as exc:
            first = exc.errors()[0]
            inner = ".".join(str(part) for part in first["loc"] if isinstance(part, int) or part in ITEM_FIELDS)
            field = f"{where}.{inner}" if inner else where
            problems.append(Problem(source, field, f"{message(first)} (got {_shown(first.get('input'))}); this model "
                                    "is not served",
                                    "fix this item; the other models are served without it"))
    if len(data) > MAX_MODELS:
        problems.append(Problem(source, "models", f"{len(data)} models listed; kiln serves at most {MAX_MODELS} "
                                "on one machine, and the rest are not served", "list fewer models"))
    return tuple(items), problems


def drop_shared_keys(values: dict[str, Any], source_of: Callable[[str], str]) -> list[Problem]:
    """Each key is one name's: a key given under two names (`api_key` is the name default) keeps its first name,
    in `values`, and the others are dropped with a problem. The key store refuses such a pair at use."""
    problems: list[Problem] = []
    named: dict[str, NamedKey] = dict(values.get("api_keys") or {})
    holder: dict[str, str] = {}
    for name, spec in sorted(named.items()):
        if spec.key in holder:
            del named[name]
            problems.append(Problem(source_of("api_keys"), "api_keys", f"{name} has the same key as "
                                    f"{holder[spec.key]}; {name} is ignored", "give each name a key of its own"))
        else:
            holder[spec.key] = name
    if "api_keys" in values:
        values["api_keys"] = named
    api_key = values.get("api_key")
    if api_key and "default" not in named and api_key in holder:
        del values["api_key"]
        problems.append(Problem(source_of("api_key"), "api_key", f"the same key as api_keys' {holder[api_key]}; "
                                "api_key (the key named default) is ignored",
                                f"give api_key a key of its own, or remove it and use the key as {holder[api_key]}"))
    return problems
