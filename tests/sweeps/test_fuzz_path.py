"""The boundary's fuzzing (tests/unit/test_fuzz_boundary.py) on five times as many inputs: every source through the
choice, the plan, its command lines, the front and nginx, and sequences of reloads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.test_fuzz_boundary import SLOW, check_reloads, check_sources, fuzz_kiln, settings_docs

from kiln.wiring import Kiln

__all__ = ["fuzz_kiln"]  # the fixture, shared


@settings(SLOW, max_examples=100)
@given(user_data=settings_docs, local=settings_docs, tags=settings_docs, as_file=st.booleans())
def test_user_data_tags_and_the_local_file_through_plan_render_and_front(
        fuzz_kiln: Kiln, tmp_path: Path, user_data: dict[str, Any], local: dict[str, Any], tags: dict[str, Any],
        as_file: bool) -> None:
    check_sources(fuzz_kiln, tmp_path, user_data, local, tags, as_file)


@settings(SLOW, max_examples=30)
@given(st.lists(settings_docs, min_size=2, max_size=4))
def test_a_sequence_of_reloads_never_leaves_the_front_broken(fuzz_kiln: Kiln, tmp_path: Path,
                                                            docs: list[dict[str, Any]]) -> None:
    check_reloads(fuzz_kiln, tmp_path, docs)
