from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from kiln.wiring import Kiln

REPO = Path(__file__).resolve().parents[1]
INTEGRATION = Path(__file__).resolve().parent / "integration"
PROFILES = REPO / "profiles"
DATA = Path(__file__).resolve().parent / "data"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The folder decides the tier: everything under tests/integration/ is marked `integration`, so no test there
    can slip into the fast tier (`-m "not integration"`, run by `ci/test.sh --fast`)."""
    for item in items:
        if INTEGRATION in item.path.parents:
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
