"""The tiny-cpu model kiln makes matches its profile."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from kiln.profiles.hf_config import count_params, profile_from_model_dir
from kiln.tinymodel import config_json, make_tiny_model
from kiln.wiring import Kiln


def test_profile_params_match_the_config(kiln: Kiln) -> None:
    profile = kiln.catalog().get("tiny-cpu")
    total = count_params(config_json(profile), "llama").total
    assert total == profile.architecture.params_total


def test_made_model_reads_back_as_the_same_architecture(kiln: Kiln, tmp_path: Path) -> None:
    profile = kiln.catalog().get("tiny-cpu")
    target = make_tiny_model(profile, tmp_path / "tiny")
    read = profile_from_model_dir(target)
    assert read.architecture.model_dump(exclude={"hf_architecture"}) == profile.architecture.model_dump(
        exclude={"hf_architecture"})
    tokenizer = Tokenizer.from_file(str(target / "tokenizer.json"))
    assert tokenizer.get_vocab_size() <= profile.architecture.vocab_size
    assert tokenizer.decode(tokenizer.encode("kiln bakes images").ids) == "kiln bakes images"
