"""The Hugging Face token: read from user-data or /etc/kiln/hf_token, validated without ever being shown, and handed
to the instances through a root-only environment file."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kiln.choice.resolve import layers_from_inputs, resolve_choice
from kiln.choice.schema import validate_fields
from kiln.choice.sources import RawInputs, SourceReader
from kiln.processes import LocalProcesses, ProcessSpec, read_env_file
from kiln.serve.front.secretfiles import write_private
from kiln.serve.layout import ServeLayout

TOKEN = "hf_kilnUnitTokenAbCdEfGhIjKlMnOpQrSt"
KILN = str(Path(sys.executable).parent / "kiln")


def machine(tmp_path: Path, kiln_yaml: str = "profile: tiny-cpu\n", token_file: str | None = None) -> Path:
    root = tmp_path / "root"
    (root / "etc" / "kiln").mkdir(parents=True)
    (root / "etc" / "kiln" / "kiln.yaml").write_text(kiln_yaml)
    if token_file is not None:
        (root / "etc" / "kiln" / "hf_token").write_text(token_file)
    return root


def test_a_token_comes_from_the_settings_or_its_own_file(tmp_path: Path) -> None:
    from_settings = resolve_choice(SourceReader(root=machine(tmp_path / "a", f"hf_token: {TOKEN}\n")).read())
    assert from_settings.choice.hf_token == TOKEN and not from_settings.problems
    from_file = resolve_choice(SourceReader(root=machine(tmp_path / "b", token_file=TOKEN + "\n")).read())
    assert from_file.choice.hf_token == TOKEN and from_file.origins["hf_token"] == "/etc/kiln/hf_token"


def test_a_bad_token_is_reported_without_being_shown() -> None:
    bad = "hf_has spaces and $ymbols"
    layer = validate_fields({"hf_token": bad}, source="user-data")
    assert not layer.values and len(layer.problems) == 1
    problem = layer.problems[0]
    assert problem.field == "hf_token" and "huggingface.co/settings/tokens" in problem.fix
    assert bad not in problem.text() and "hidden" in problem.what


def test_a_token_in_a_droplet_tag_is_refused() -> None:
    layers = layers_from_inputs(RawInputs(tags=("kiln-profile:tiny-cpu", f"kiln-hf-token:{TOKEN}")))
    assert layers[0].values == {"profile": "tiny-cpu"}
    assert [p.field for p in layers[0].problems] == ["hf_token"] and TOKEN not in layers[0].problems[0].text()


def test_kiln_choice_says_a_token_is_set_and_never_shows_it(tmp_path: Path) -> None:
    root = machine(tmp_path, f"profile: tiny-cpu\nhf_token: {TOKEN}\n")
    text = subprocess.run([KILN, "choice", "--root", str(root)], capture_output=True, text=True, timeout=60,
                          check=True).stdout
    data = json.loads(subprocess.run([KILN, "choice", "--root", str(root), "--json"], capture_output=True, text=True,
                                     timeout=60, check=True).stdout)
    assert TOKEN not in text and "hf_token  (set, hidden)" in text
    assert TOKEN not in json.dumps(data) and data["hf_token_set"] is True


def test_the_token_file_lives_outside_the_state_the_instances_own() -> None:
    assert ServeLayout().hf_token_env == Path("/run/kiln/hf_token.env")
    assert ServeLayout(state_dir=Path("/tmp/k")).hf_token_env == Path("/tmp/k/secrets/hf_token.env")


def test_a_started_process_gets_the_env_file_and_runtime_json_only_its_path(tmp_path: Path) -> None:
    env_file = tmp_path / "secrets" / "hf_token.env"
    write_private(env_file, f"# kiln\nHF_TOKEN={TOKEN}\n")
    assert read_env_file(env_file) == {"HF_TOKEN": TOKEN} and read_env_file(tmp_path / "none") == {}
    out = tmp_path / "seen"
    spec = ProcessSpec("probe", ("/bin/sh", "-c", f'printf %s "$HF_TOKEN" > {out}'), env_files=(env_file,))
    running = LocalProcesses().start(spec)
    deadline = time.monotonic() + 10
    while running.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert out.read_text() == TOKEN
    assert TOKEN not in json.dumps(spec.as_dict()) and str(env_file) in spec.as_dict()["env_files"]  # type: ignore[operator]


def test_write_private_never_follows_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    target = tmp_path / "secrets" / "hf_token.env"
    target.parent.mkdir()
    os.symlink(victim, target.with_name(".hf_token.env.tmp"))  # at the temporary name
    write_private(target, "HF_TOKEN=x\n")
    assert victim.read_text() == "untouched\n" and target.read_text() == "HF_TOKEN=x\n"
    target.unlink()
    os.symlink(victim, target)  # at the name itself: replaced, not followed
    write_private(target, "HF_TOKEN=y\n")
    assert victim.read_text() == "untouched\n" and not target.is_symlink()


def test_write_private_is_durable_and_concurrent_writers_never_collide(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "keys.json"
    other = target.with_name(".keys.json.tmp")  # another writer's file, half written
    other.write_text("someone else's\n")
    synced: list[bool] = []  # each fsync: of a folder or not
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_private(target, "one\n")
    assert other.read_text() == "someone else's\n" and target.read_text() == "one\n"
    assert synced == [False, True]  # the file's data, then the folder's entry for it
    failed: list[BaseException] = []

    def writer(n: int) -> None:
        for _ in range(40):
            try:
                write_private(target, f"{n}\n")
            except OSError as exc:
                failed.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failed and target.read_text() in {f"{n}\n" for n in range(6)}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".keys.json.tmp", "keys.json"]  # no temporary file left
