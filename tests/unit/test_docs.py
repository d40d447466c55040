"""The README and docs/ say what kiln does: every documented user-data and kiln.yaml is read by kiln without a
problem, every machine file loads, every `kiln` command line parses, and the ones that need no GPU, network or
root run here and succeed. (tests/integration/test_cloud_init_schema.py checks the user-data with cloud-init.)"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import yaml
from tests.documented import Block, blocks, kiln_argv, shell_commands, user_data

from kiln.choice.schema import validate_fields
from kiln.choice.userdata import extract_settings
from kiln.cli.main import build_parser, main
from kiln.hardware.machine_file import machine_from_file
from kiln.wiring import Kiln

# Commands that read only kiln's data and fixtures: the documentation's examples of them are run.
RUNNABLE = {"plan", "predict", "detect", "profiles", "doctor"}
# The docs' placeholders for secrets, as the user fills them in.
SECRETS = {"hf_...": "hf_" + "k" * 34, "dop_v1_...": "dop_v1_" + "0" * 64}


def filled(text: str) -> str:
    for placeholder, value in SECRETS.items():
        text = text.replace(placeholder, value)
    return text


def documented_commands() -> list[tuple[str, list[str]]]:
    found = []
    for block in blocks("sh"):
        for command in shell_commands(block):
            argv = kiln_argv(command)
            if argv is not None:
                found.append((block.page, argv))
    return found


def runnable(argv: list[str]) -> bool:
    """An example that runs here: a pure command on a named machine (or none needed), no placeholders."""
    if not argv or argv[0] not in RUNNABLE or any(w.startswith("<") or w.isupper() for w in argv):
        return False
    return argv[0] in {"profiles"} or "--list" in argv or any(w.startswith("--machine") for w in argv)


def test_the_docs_show_commands_and_the_runnable_ones_are_found() -> None:
    commands = documented_commands()
    assert len(commands) >= 20
    assert sum(runnable(argv) for _, argv in commands) >= 5


@pytest.mark.parametrize(("page", "argv"), documented_commands(), ids=lambda v: " ".join(v) if isinstance(v, list)
                         else v)
def test_every_documented_kiln_command_parses(page: str, argv: list[str]) -> None:
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{page}: `kiln {' '.join(argv)}` does not parse (exit {exc.code})")


@pytest.mark.parametrize(("page", "argv"), [c for c in documented_commands() if runnable(c[1])],
                         ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_documented_examples_run(page: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, f"{page}: `kiln {' '.join(argv)}` exited {code}: {err}"
    assert out.strip()


@pytest.mark.parametrize("block", user_data(), ids=lambda b: b.page)
def test_documented_user_data_is_read_without_a_problem(block: Block, kiln: Kiln) -> None:
    extracted = extract_settings(filled(block.text).encode())
    assert not extracted.problems, extracted.problems
    layer = validate_fields(extracted.settings, source="user-data")
    assert not layer.problems, [p.text() for p in layer.problems]
    profile = layer.values.get("profile")
    if profile is not None:
        kiln.catalog().get(profile)  # raises for a profile the catalog does not have


def kiln_yaml_blocks() -> list[Block]:
    return [b for b in blocks("yaml") if b.text.startswith("# /etc/kiln/kiln.yaml")]


def machine_file_blocks() -> list[Block]:
    return [b for b in blocks("yaml") if b.text.startswith("gpus:")]


def test_the_docs_show_a_kiln_yaml_and_a_machine_file() -> None:
    assert kiln_yaml_blocks() and machine_file_blocks()


@pytest.mark.parametrize("block", kiln_yaml_blocks(), ids=lambda b: b.page)
def test_documented_kiln_yaml_is_valid(block: Block) -> None:
    layer = validate_fields(yaml.safe_load(filled(block.text)), source="/etc/kiln/kiln.yaml")
    assert layer.values and not layer.problems, [p.text() for p in layer.problems]


@pytest.mark.parametrize("block", machine_file_blocks(), ids=lambda b: b.page)
def test_documented_machine_file_loads_and_plans(block: Block, kiln: Kiln,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "machine.yaml"
        path.write_text(block.text)
        machine = machine_from_file(path, kiln.gpus)
        assert machine.gpu_count > 0
        assert main(["plan", "--machine", str(path), "--profile", "llama-3.1-8b-instruct", "--json"]) == 0
    capsys.readouterr()
