"""The trust table: every source with its level, shown in docs/user-data.md as the code holds it; a public source
(droplet tags) never carries a secret nor lowers security; a repository's code runs only where the owner asked."""

from __future__ import annotations

import re

import pytest
from tests.conftest import REPO

from kiln.choice.resolve import layers_from_inputs, merge
from kiln.choice.schema import FIELDS, SECRET_FIELDS
from kiln.choice.select import select_profile
from kiln.choice.sources import RawInputs
from kiln.choice.trust import PUBLIC, PUBLIC_REFUSED, SOURCES
from kiln.profiles.hf_config import family_of, serving_for
from kiln.profiles.schema import Profile
from kiln.wiring import Kiln

KEY = "kiln-" + "s" * 40
TOKEN = "dop_v1_" + "0" * 64
# A tag for each refused field, with a value the owner's sources would accept.
TAGS = {"api_key": f"kiln-api-key:{KEY}", "api_keys": f"kiln-api-keys:{{ci: {KEY}}}",
        "hf_token": "kiln-hf-token:hf_" + "k" * 34, "do_token": f"kiln-do-token:{TOKEN}", "tls": "kiln-tls:off",
        "trust_remote_code": "kiln-trust-remote-code:true", "models": "kiln-models:[qwen3-8b]"}


def test_the_docs_table_is_the_codes() -> None:
    text = (REPO / "docs" / "user-data.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| ([^|]+?) \| (owner|public|someone else's|a stranger's) \|", text, flags=re.MULTILINE)
    assert rows == [(s.name, s.trust) for s in SOURCES]
    public_row = next(line for line in text.splitlines() if line.startswith("| droplet tags |"))
    for field in PUBLIC_REFUSED:
        assert f"`{field}`" in public_row, field


def test_a_public_source_never_carries_a_secret() -> None:
    assert set(PUBLIC_REFUSED) >= SECRET_FIELDS
    assert set(PUBLIC_REFUSED) <= set(FIELDS)
    assert set(TAGS) == set(PUBLIC_REFUSED)
    assert [s.trust for s in SOURCES if s.name == "droplet tags"] == [PUBLIC]


@pytest.mark.parametrize("field", sorted(PUBLIC_REFUSED))
def test_a_tag_that_would_set_it_is_ignored_with_a_problem_and_the_rest_applies(field: str) -> None:
    owner = b"#cloud-config\nkiln:\n  profile: tiny-cpu\n  tls: self-signed\n"
    resolved = merge(layers_from_inputs(RawInputs(user_data=owner, tags=("kiln-instances:2", TAGS[field]))))
    assert resolved.origins["instances"] == "droplet tags" and resolved.choice.instances == 2
    assert field not in resolved.origins or resolved.origins[field].startswith("user-data")
    assert resolved.choice.tls == "self-signed"  # the owner's, never lowered by a tag
    problems = [p for p in resolved.problems if p.field == field]
    assert len(problems) == 1 and problems[0].source == "droplet tags" and "ignored" in problems[0].what
    for secret in (KEY, TOKEN, "hf_" + "k" * 34):
        assert secret not in problems[0].text()


def test_the_same_fields_from_the_owner_apply() -> None:
    owner = (f"#cloud-config\nkiln:\n  profile: tiny-cpu\n  api_key: {KEY}\n  tls: 'off'\n"
             "  trust_remote_code: true\n").encode()
    resolved = merge(layers_from_inputs(RawInputs(user_data=owner)))
    assert not resolved.problems
    assert resolved.choice.api_key == KEY and resolved.choice.tls == "off" and resolved.choice.trust_remote_code


def test_remote_code_runs_only_where_the_owner_or_the_catalog_says(kiln: Kiln) -> None:
    family_needs_it = family_of({"architectures": ["KimiK25ForConditionalGeneration"]}, "config.json")
    assert family_needs_it.serving.get("trust_remote_code")
    serving, _, origin = serving_for(family_needs_it, 0, 0)
    assert "trust_remote_code" not in serving and "trust_remote_code: true" in origin
    catalog = kiln.catalog()
    hub_model = catalog.get("qwen3-8b").model_copy(update={"name": "hub-model"})
    assert not hub_model.serving.trust_remote_code

    def chosen(setting: str, profile: Profile) -> bool:
        text = f"#cloud-config\nkiln:\n  profile: tiny-cpu\n{setting}".encode()
        choice = merge(layers_from_inputs(RawInputs(user_data=text))).choice
        return select_profile(choice.model_copy(update={"model": "ORG/NAME"}), catalog,
                              lambda _: profile)[0].serving.trust_remote_code

    assert not chosen("", hub_model)
    assert chosen("  trust_remote_code: true\n", hub_model)
    needs = catalog.get("kimi-k2.5")
    assert needs.serving.trust_remote_code and chosen("", needs)  # the catalog names the repository
    assert not chosen("  trust_remote_code: false\n", needs)  # the owner may still refuse it

