from __future__ import annotations

from pathlib import Path

import pytest

from kiln.wiring import Kiln

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "profiles"
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def kiln() -> Kiln:
    return Kiln.create(PROFILES)
