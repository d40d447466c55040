"""kiln's KV-cache model against real vLLM start-up logs (tests/data/kv_cache_observations.yaml)."""

from __future__ import annotations

import pytest
from benchmarks.kv_capacity_vs_logs import Row, compare_all

from kiln.wiring import Kiln

# Share of the logs whose KV capacity kiln predicts within ±10% with its non-torch constants refitted without
# the log's own source (python -m benchmarks.kv_capacity_vs_logs: 21 of 24).
HELD_OUT_SHARE = 0.80


@pytest.fixture(scope="module")
def rows(kiln: Kiln) -> list[Row]:
    return [row for _, row in compare_all(kiln)]


@pytest.fixture(scope="module")
def versioned(kiln: Kiln) -> list[Row]:
    """Observations whose vLLM version is known, so its memory accounting can be modelled."""
    return [row for obs, row in compare_all(kiln) if obs.get("vllm_version")]


def test_enough_observations_are_compared(rows: list[Row]) -> None:
    assert sum(1 for r in rows if r.logged_tokens and not r.hybrid) >= 5


def test_bytes_to_tokens_matches_vllm_exactly_for_uniform_models(rows: list[Row]) -> None:
    """Given vLLM's own available memory, kiln's per-token size and block rounding give vLLM's token count."""
    for r in rows:
        if r.logged_tokens and r.tokens_from_logged_memory and not r.hybrid:
            error = Row.error(r.tokens_from_logged_memory, r.logged_tokens)
            assert error is not None and abs(error) < 0.01, (r.id, r.tokens_from_logged_memory, r.logged_tokens)


def test_predicted_kv_memory_is_close_to_vllm(versioned: list[Row]) -> None:
    """From the GPU and the profile alone, a dense model's available KV memory lands within 4% of vLLM's."""
    checked = 0
    for r in versioned:
        if r.logged_available_gib and r.logged_available_gib > 10 and not r.moe:
            error = Row.error(r.predicted_available_gib, r.logged_available_gib)
            assert error is not None and abs(error) < 0.04, (r.id, r.predicted_available_gib, r.logged_available_gib)
            checked += 1
    assert checked >= 5


def test_predicted_weights_are_close_to_vllm(rows: list[Row]) -> None:
    for r in rows:
        if r.logged_weights_gib:
            error = Row.error(r.predicted_weights_gib, r.logged_weights_gib)
            assert error is not None and abs(error) < 0.05, (r.id, r.predicted_weights_gib, r.logged_weights_gib)



def test_cudagraph_estimate_matches_the_logs_it_was_fitted_on(kiln: Kiln) -> None:
    """On one H100, dense models: the reserve is within 0.25 GiB of vLLM's logged "Estimated CUDA graph memory"
    (0.84 GiB for most; the W8A8 Mistral logs 1.04)."""
    checked = 0
    for obs, r in compare_all(kiln):
        if r.logged_graphs_gib and r.tp == 1 and not r.moe and "H100" in str(obs["gpu"]):
            assert r.predicted_graphs_gib == pytest.approx(r.logged_graphs_gib, abs=0.25), r.id
            checked += 1
    assert checked >= 5
