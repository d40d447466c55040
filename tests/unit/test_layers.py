"""Imports run one way, down the layers, and never in a cycle: the import contracts in pyproject.toml
([tool.importlinter]), which `lint-imports` checks in ci/test.sh, run here too so that the fast tier fails on them."""

from __future__ import annotations

import copy
import re

import grimp
import pytest
from importlinter import configuration
from importlinter.application import use_cases
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.contracts.layers import LayersContract
from importlinter.domain.contract import Contract
from tests.conftest import REPO

PYPROJECT = REPO / "pyproject.toml"
TYPES: dict[str, type[Contract]] = {"layers": LayersContract, "acyclic_siblings": AcyclicSiblingsContract}

configuration.configure()


def contracts() -> dict[str, Contract]:
    """The contracts of pyproject.toml by id, as lint-imports reads them."""
    options = use_cases.read_user_options(str(PYPROJECT))
    return {c["id"]: TYPES[c["type"]](name=c["name"], session_options=options.session_options, contract_options=c)
            for c in options.contracts_options}


def layer_names(contract_id: str) -> set[str]:
    """The modules a layers contract places, without the `|`, `:` and the parentheses of optional layers."""
    options = next(c for c in use_cases.read_user_options(str(PYPROJECT)).contracts_options if c["id"] == contract_id)
    return {name.strip().strip("()") for layer in options["layers"] for name in re.split(r"[|:]", layer)}


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("kiln", cache_dir=None)


def test_the_import_contracts_are_kept() -> None:
    """lint-imports' own run; on a failure its report (the offending imports) is in the captured output."""
    assert use_cases.lint_imports(config_filename=str(PYPROJECT), no_logo=True, cache_dir=None)


@pytest.mark.parametrize(("contract_id", "package"), [("kiln", "kiln"), ("serve", "kiln.serve")])
def test_every_part_of_kiln_has_a_layer(contract_id: str, package: str) -> None:
    folder = REPO / "agent" / package.replace(".", "/")
    parts = {p.name if p.is_dir() else p.stem for p in folder.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    assert parts == layer_names(contract_id), f"add every part of {package} to the contract {contract_id!r}"


@pytest.mark.parametrize(("importer", "imported", "broken"), [
    ("kiln.errors", "kiln.cli.main", {"kiln", "acyclic"}),  # up the layers, and a cycle through cli
    ("kiln.serve.layout", "kiln.image.smoke", {"acyclic"}),  # serve and image share a layer: only the cycle
    ("kiln.serve.front.tls", "kiln.serve.reports.state", {"serve", "acyclic"}),  # front below reports
    ("kiln.serve.processes.supervisor", "kiln.serve.processes.assembly", {"acyclic"}),  # inside a sub-package
    ("kiln.serve.endpoint", "kiln.serve.drain", {"serve"}),  # independent siblings
])
def test_the_contracts_see_a_wrong_import(graph: grimp.ImportGraph, importer: str, imported: str,
                                          broken: set[str]) -> None:
    changed = copy.deepcopy(graph)
    changed.add_import(importer=importer, imported=imported)
    assert {i for i, c in contracts().items() if not c.check(copy.deepcopy(changed), verbose=False).kept} == broken
