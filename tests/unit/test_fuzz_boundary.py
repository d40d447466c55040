"""Every source of settings fuzzed at the boundary and through the agent's whole path: the choice, the plan and its
command lines, the front's keys, certificate and nginx configuration (checked by nginx itself), and reloads.

The strategies are built from the settings' own JSON schema (Choice.model_json_schema()), so a new field is fuzzed
without a new test; each field gets values the schema allows, values of any other shape, and the catalog's names.
Asserted for every input: no exception escapes but kiln's own errors with a fix; every field given is applied or
reported with its fix; the rest applies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kiln.choice.resolve import ResolvedChoice, layers_from_inputs, merge
from kiln.choice.schema import FIELDS, Choice, Layer
from kiln.choice.sources import RawInputs
from kiln.errors import KilnError
from kiln.hub.model import is_hub_id
from kiln.perf.workload import WorkloadSpec, resolve
from kiln.render.vllm import Runtime
from kiln.serve.decide import decide
from kiln.serve.endpoint import Endpoint
from kiln.serve.front.front import Front
from kiln.serve.front.keys import KeyStore
from kiln.serve.front.proxy import ProxySettings
from kiln.serve.layout import ServeLayout
from kiln.serve.reports.state import AgentState
from kiln.wiring import Kiln

SCHEMA = Choice.model_json_schema()
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
PROFILES = ("qwen3-8b", "llama-3.1-8b-instruct", "llama-3.3-70b-instruct", "gpt-oss-20b", "tiny-cpu", "no-such")
JUNK = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**9), st.floats(allow_nan=True),
                 st.text(max_size=30), st.lists(st.integers(), max_size=3),
                 st.dictionaries(st.text(max_size=6), st.integers(), max_size=2))


def _node(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    return SCHEMA["$defs"][ref.rsplit("/", 1)[-1]] if ref else node


def allowed(node: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values the schema allows (validators in code may still refuse some: that is what is tested)."""
    node = _node(node)
    if "anyOf" in node:
        return st.one_of(*(allowed(n) for n in node["anyOf"] if n.get("type") != "null"))
    if "enum" in node:
        return st.sampled_from(node["enum"])
    if "const" in node:
        return st.just(node["const"])
    kind = node.get("type")
    if kind == "string":
        low, high = node.get("minLength", 0), min(node.get("maxLength", 40), 60)
        if "pattern" in node:
            return st.from_regex(node["pattern"], fullmatch=True).filter(lambda s: low <= len(s) <= high)
        return st.text(min_size=low, max_size=max(low, high))
    if kind == "integer":
        return st.integers(node.get("minimum", -10**6), min(node.get("maximum", 10**7), 10**7))
    if kind == "number":
        low = node.get("minimum", node.get("exclusiveMinimum", -1e6))
        return st.floats(low, node.get("maximum", 1e6), exclude_min="exclusiveMinimum" in node, allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        return st.lists(allowed(node.get("items", {})), max_size=3)
    if kind == "object":
        if "properties" in node:
            required = set(node.get("required", ()))
            props = node["properties"]
            return st.fixed_dictionaries({k: allowed(v) for k, v in props.items() if k in required},
                                         optional={k: allowed(v) for k, v in props.items() if k not in required})
        return st.dictionaries(st.from_regex(r"[a-z0-9_-]{1,12}", fullmatch=True) | st.text(max_size=4),
                               allowed(node.get("additionalProperties", {})), max_size=3)
    return JUNK


def field_values(name: str) -> st.SearchStrategy[Any]:
    values = st.one_of(allowed(SCHEMA["properties"][name]), JUNK)
    if name == "profile":
        values = st.one_of(st.sampled_from(PROFILES), values)
    if name in ("model", "revision"):  # never a Hub id: the Hub cannot be reached from a test
        values = values.filter(lambda v: not (isinstance(v, str) and (is_hub_id(v) or Path(v).exists())))
    return values


settings_docs = st.fixed_dictionaries({}, optional={**{name: field_values(name) for name in FIELDS},
                                                    "profle": st.sampled_from(PROFILES), "bogus": JUNK})


def _every_field_applied_or_reported(given_doc: dict[str, Any], layer: Layer) -> None:
    reported = {p.field.split("[")[0] for p in layer.problems}  # `models[2].gpus` reports `models`
    for problem in layer.problems:
        assert problem.what and problem.fix, problem
    whole = "" in reported  # a problem with the document itself
    for key in (k for k, v in given_doc.items() if v is not None):  # null leaves a setting to kiln
        assert key in layer.values or key in reported or whole, f"{key} neither applied nor reported"


@pytest.fixture(scope="module")
def fuzz_kiln() -> Kiln:
    return Kiln.create()


def _front(tmp: Path) -> Front:
    return Front(ServeLayout(state_dir=tmp, public_host="127.0.0.1", public_port=18443, http_port=18080),
                 ProxySettings(max_in_flight=8), nginx=NGINX if Path(NGINX).exists() else None)


def _through(fuzz_kiln: Kiln, resolved: ResolvedChoice, endpoint: Endpoint) -> None:
    """The agent's path: plan and render, then the front's keys, certificate and nginx configuration."""
    decision = decide(fuzz_kiln, "h100x8", resolved, Runtime())
    assert decision.plan is not None or decision.failure is not None
    if decision.plan is not None:
        decision.render(Runtime())
        assert decision.rendered and all(r.argv for r in decision.rendered)
    try:
        endpoint.reload(resolved)
    except KilnError as exc:  # refused with its fix; the front keeps what it had
        assert exc.what and exc.fix


# Each example plans and checks nginx's configuration: no shrinking, which would take minutes; a failure is reported
# as found.
SLOW = settings(deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def check_sources(fuzz_kiln: Kiln, tmp_path: Path, user_data: dict[str, Any], local: dict[str, Any],
                  tags: dict[str, Any], as_file: bool) -> None:
    """User-data (as `kiln:` or as the file it writes), tags and the local file, through the whole path."""
    text = yaml.safe_dump(user_data, sort_keys=False)
    cloud = ({"write_files": [{"path": "/etc/kiln/kiln.yaml", "content": text}]} if as_file else {"kiln": user_data})
    raw = RawInputs(user_data=("#cloud-config\n" + yaml.safe_dump(cloud)).encode(),
                    tags=tuple(f"kiln-{k.replace('_', '-')}:{json.dumps(v, separators=(',', ':'))}"
                               for k, v in tags.items()),
                    local_file=yaml.safe_dump(local))
    layers = layers_from_inputs(raw)
    _every_field_applied_or_reported(user_data, layers[0])
    _every_field_applied_or_reported(local, layers[-1])
    resolved = merge(layers)
    for problem in resolved.problems:
        assert problem.what and problem.fix
    state = AgentState(endpoint="", health="", keys_file="")
    endpoint = Endpoint(_front(tmp_path / "state"), state, "127.0.0.1", (), motd=lambda _: None,
                        reload_proxy=lambda: None)
    _through(fuzz_kiln, resolved, endpoint)


def check_reloads(fuzz_kiln: Kiln, tmp_path: Path, docs: list[dict[str, Any]]) -> None:
    """One agent's front through a sequence of reloads of /etc/kiln/kiln.yaml."""
    state = AgentState(endpoint="", health="", keys_file="")
    front = _front(tmp_path / "state")
    endpoint = Endpoint(front, state, "127.0.0.1", (), motd=lambda _: None, reload_proxy=lambda: None)
    for doc in docs:
        resolved = merge(layers_from_inputs(RawInputs(local_file=yaml.safe_dump(doc))))
        _through(fuzz_kiln, resolved, endpoint)
        assert front.keys.keys, "the endpoint always has a key"
        assert front.layout.proxy_config.exists()


@settings(SLOW, max_examples=20)
@given(user_data=settings_docs, local=settings_docs, tags=settings_docs, as_file=st.booleans())
def test_user_data_tags_and_the_local_file_through_plan_render_and_front(
        fuzz_kiln: Kiln, tmp_path: Path, user_data: dict[str, Any], local: dict[str, Any], tags: dict[str, Any],
        as_file: bool) -> None:
    check_sources(fuzz_kiln, tmp_path, user_data, local, tags, as_file)


@settings(SLOW, max_examples=6)
@given(st.lists(settings_docs, min_size=2, max_size=4))
def test_a_sequence_of_reloads_never_leaves_the_front_broken(fuzz_kiln: Kiln, tmp_path: Path,
                                                            docs: list[dict[str, Any]]) -> None:
    check_reloads(fuzz_kiln, tmp_path, docs)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), st.builds(json.dumps, st.dictionaries(
    st.sampled_from(["keys", "revoked", "other"]),
    st.one_of(JUNK, st.lists(st.one_of(JUNK, st.fixed_dictionaries({}, optional={
        "name": st.one_of(st.from_regex(r"[a-z0-9_-]{1,12}", fullmatch=True), JUNK),
        "key": st.one_of(st.from_regex(r"kiln-[A-Za-z0-9_-]{16,40}", fullmatch=True), JUNK),
        "requests_per_minute": st.one_of(st.integers(-5, 10**6), JUNK),
        "origin": JUNK})), max_size=5)), max_size=3))))
def test_a_hand_edited_key_store_is_read_or_refused_whole(text: str) -> None:
    try:
        store, dropped = KeyStore.read_json(text)
    except (ValueError, KeyError, TypeError, AttributeError):
        return  # refused whole: the agent keeps the store as it is and says so (KeyStoreError)
    assert all(isinstance(what, str) and what for what in dropped)
    assert len(set(store.names())) == len(store.names())
    assert len({k.secret for k in store.keys}) == len(store.keys)


workload_docs = st.one_of(st.sampled_from(["chat", "rag", "batch", "serve", "agent", "nope"]), JUNK,
                          allowed(SCHEMA["$defs"]["WorkloadSpec"]))


@settings(max_examples=300, deadline=None)
@given(workload_docs)
def test_a_workload_validates_whole_or_is_reported_and_resolves(doc: Any) -> None:
    layer = merge(layers_from_inputs(RawInputs(
        user_data=("#cloud-config\n" + yaml.safe_dump({"kiln": {"workload": doc}})).encode())))
    spec = layer.choice.workload
    if spec is None:
        assert any(p.field == "workload" for p in layer.problems) or doc is None
        return
    assert isinstance(spec, WorkloadSpec)
    workload = resolve(spec)  # what validated must resolve: no check left for later
    assert workload.input_len > (workload.prefix_len or 0)
