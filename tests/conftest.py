from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from kiln.choice.schema import Choice
from kiln.planner.search import make_plan
from kiln.setup.types import Plan, Refusal
from kiln.wiring import Kiln

REPO = Path(__file__).resolve().parents[1]
# The full tier's folders: real vLLM and the other real programs, and the sweeps over every profile, machine and
# public case. Everything else is the fast tier.
FULL_TIER = (Path(__file__).resolve().parent / "integration", Path(__file__).resolve().parent / "sweeps")
PROFILES = REPO / "profiles"
DATA = Path(__file__).resolve().parent / "data"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The folder decides the tier: everything under tests/integration/ and tests/sweeps/ is marked `integration`,
    so no test there can slip into the fast tier (`-m "not integration"`, run by `ci/test.sh --fast`)."""
    for item in items:
        if any(folder in item.path.parents for folder in FULL_TIER):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def kiln() -> Kiln:
    return Kiln.create(PROFILES)


@pytest.fixture
def traversable_tmp() -> Iterator[Path]:
    """A temporary folder another user can pass through (pytest's own are root-only all the way up): nginx's
    workers, when root starts nginx, and the instances' user."""
    path = Path(tempfile.mkdtemp(prefix="kiln-tmp-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path)


def load_script(name: str, path: Path) -> ModuleType:
    """A script that is not in a package (a role's file, a launcher in kiln's data), imported as a module."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Planned = Callable[[str, str, str], Plan | Refusal]


@pytest.fixture(scope="session")
def planned(kiln: Kiln) -> Planned:
    """The catalog's plans by (machine, profile, objective), each made once per test process: several tests check
    every profile on every machine, and each plan runs the engine's search."""
    alternatives = sorted(kiln.fixtures(), key=lambda m: sum(g.memory_bytes for g in m.gpus))
    made: dict[tuple[str, str, str], Plan | Refusal] = {}

    def plan(machine: str, profile: str, objective: str = "throughput") -> Plan | Refusal:
        key = (machine, profile, objective)
        if key not in made:
            made[key] = make_plan(kiln.machine(machine), kiln.catalog().get(profile), Choice(objective=objective),
                                  kiln.constants, alternatives)
        return made[key]

    return plan
