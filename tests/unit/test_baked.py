"""Weights baked into an image: `kiln models bake` records what it downloaded, and the boot's check finds it whole
(downloading nothing) or names what changed. The Hub is the local stand-in of tests/hub_server.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.hub_server import Hub, Repo, serve

from kiln.hub.baked import REHASH_BELOW, Manifest, check_repo, read_manifest, record_local, record_repo
from kiln.hub.client import HubClient

KILN = str(Path(sys.executable).parent / "kiln")
WEIGHTS = b"w" * (REHASH_BELOW + 1)  # large enough to be checked by its blob's name, not hashed again
FILES = {"config.json": b'{"architectures": ["LlamaForCausalLM"]}', "tokenizer.json": b"{}",
         "model.safetensors": WEIGHTS}


@pytest.fixture
def hub() -> Iterator[Hub]:
    with serve(Hub({"org/model": Repo(dict(FILES))})) as running:
        yield running


@pytest.fixture
def cache(hub: Hub, tmp_path: Path) -> Path:
    client = HubClient(tmp_path / "hub", None, endpoint=hub.url)
    client.download(client.check("org/model", "main"), lambda _: None)
    return tmp_path / "hub"


def _snapshot(cache: Path) -> Path:
    return next((cache / "models--org--model" / "snapshots").iterdir())


def test_a_baked_repository_is_recorded_and_found_whole(cache: Path, tmp_path: Path) -> None:
    baked = record_repo(cache, "org/model", "main", sorted(FILES))
    assert baked.bytes == sum(len(b) for b in FILES.values()) and len(baked.commit) == 40
    assert check_repo(baked, cache, tmp_path / "models") is None
    manifest = Manifest("h100x1").with_profile("p", [baked])
    (tmp_path / "baked.json").write_text(manifest.as_json())
    assert read_manifest(tmp_path / "baked.json") == manifest
    assert manifest.find("org/model", "main") == baked and manifest.find("org/model", "v2") is None


def test_a_truncated_weight_file_is_named(cache: Path, tmp_path: Path) -> None:
    baked = record_repo(cache, "org/model", "main", sorted(FILES))
    blob = (_snapshot(cache) / "model.safetensors").resolve()
    os.truncate(blob, REHASH_BELOW)
    assert check_repo(baked, cache, tmp_path) == (f"org/model: model.safetensors has {REHASH_BELOW} bytes, "
                                                  f"{len(WEIGHTS)} were baked")


def test_a_changed_small_file_of_the_same_size_is_found_by_its_hash(cache: Path, tmp_path: Path) -> None:
    baked = record_repo(cache, "org/model", "main", sorted(FILES))
    (_snapshot(cache) / "tokenizer.json").resolve().write_bytes(b"[]")
    assert check_repo(baked, cache, tmp_path) == "org/model: tokenizer.json does not have the baked SHA-256"


def test_a_missing_snapshot_or_manifest(cache: Path, tmp_path: Path) -> None:
    baked = record_repo(cache, "org/model", "main", sorted(FILES))
    assert "is not in" in str(check_repo(baked, tmp_path / "elsewhere", tmp_path))
    assert read_manifest(tmp_path / "absent.json") is None
    (tmp_path / "broken.json").write_text("{")
    assert read_manifest(tmp_path / "broken.json") is None


def test_baking_again_replaces_a_repository_and_keeps_the_others(cache: Path, tmp_path: Path) -> None:
    models = tmp_path / "models"
    (models / "tiny").mkdir(parents=True)
    (models / "tiny" / "config.json").write_text("{}")
    local = record_local(models, "tiny")
    first = Manifest("cpu-only").with_profile("a", [local]).with_profile("b", [record_repo(cache, "org/model", "main",
                                                                                            ["config.json"])])
    again = first.with_profile("b", [record_repo(cache, "org/model", "main", sorted(FILES))])
    assert again.profiles == ("a", "b") and [len(r.files) for r in again.repos] == [1, 3]
    assert check_repo(local, cache, models) is None
    (models / "tiny" / "config.json").write_text("[]")
    assert check_repo(local, cache, models) == "tiny: config.json does not have the baked SHA-256"


def test_kiln_models_bake_makes_the_tiny_model_and_its_manifest(tmp_path: Path) -> None:
    proc = subprocess.run([KILN, "models", "bake", "--profile", "tiny-cpu", "--machine", "cpu-only", "--state-dir",
                           str(tmp_path), "--json"], capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["profiles"] == ["tiny-cpu"] and shown["machine"] == "cpu-only"
    manifest = read_manifest(tmp_path / "baked.json")
    assert manifest is not None and manifest.repos[0].local
    assert {f.name for f in manifest.repos[0].files} >= {"config.json", "tokenizer.json"}
    assert (tmp_path / "baked.json").stat().st_mode & 0o077 == 0


def test_kiln_models_bake_refuses_a_plan_that_does_not_fit(tmp_path: Path) -> None:
    proc = subprocess.run([KILN, "models", "bake", "--profile", "llama-3.3-70b-instruct", "--machine", "h100x1",
                           "--state-dir", str(tmp_path)], capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 2 and "does not fit on h100x1" in proc.stderr and "fix: " in proc.stderr
    assert not (tmp_path / "baked.json").exists()
