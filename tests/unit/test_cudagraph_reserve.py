"""The CUDA-graph memory the fit reserves, as vLLM 0.32's profile_cudagraph_memory sizes it."""

from __future__ import annotations

import pytest

from kiln.setup import capacity as cap
from kiln.setup.types import Constants
from kiln.wiring import Kiln

MIB, GIB = 2**20, 2**30


def _constants(kiln: Kiln, **vllm: object) -> Constants:
    return Constants({**kiln.constants.data, "vllm": {**kiln.constants.data["vllm"], **vllm}})


def test_llama_8b_at_vllm_defaults_reserves_what_its_log_estimates(kiln: Kiln) -> None:
    """max_num_seqs 1024, max_num_batched_tokens 8192: "PIECEWISE=51 (largest=512), FULL=51 (largest=512)" and
    "Estimated CUDA graph memory: 0.84 GiB total" (tests/data/kv_cache_observations.yaml)."""
    piecewise = cap.cudagraph_capture_count(512, 8192)
    full = cap.cudagraph_capture_count(512, 8192, 1024) - piecewise
    assert (piecewise, full) == (51, 51)
    reserve = cap.cudagraph_reserve_bytes(1, piecewise, full, kiln.constants)
    assert reserve == 260 * MIB + 50 * 6 * MIB + 50 * 6 * MIB
    assert reserve / GIB == pytest.approx(0.84, abs=0.01)


def test_each_further_graph_adds_its_cost_and_tensor_parallel_piecewise_graphs_cost_more(kiln: Kiln) -> None:
    c = kiln.constants
    one = cap.cudagraph_reserve_bytes(1, 1, 0, c)
    assert one == c.get("vllm", "cudagraph_first_capture_bytes")
    assert cap.cudagraph_reserve_bytes(1, 2, 0, c) - one == c.get("vllm", "cudagraph_bytes_per_graph")
    assert cap.cudagraph_reserve_bytes(1, 1, 2, c) - one == c.get("vllm", "cudagraph_bytes_per_graph")
    assert cap.cudagraph_reserve_bytes(2, 2, 0, c) - cap.cudagraph_reserve_bytes(2, 1, 0, c) == (
        c.get("vllm", "cudagraph_bytes_per_graph")
        + c.get("vllm", "cudagraph_tensor_parallel_bytes_per_piecewise_graph"))
    assert cap.cudagraph_reserve_bytes(4, 0, 0, c) == 0  # --enforce-eager captures nothing


def test_the_kv_cache_loses_exactly_the_reserve_for_the_captured_sizes(kiln: Kiln) -> None:
    """Fewer sequences mean fewer FULL decode graphs; the KV cache gets back what they would have taken."""
    profile = kiln.catalog().get("llama-3.1-8b-instruct")
    args = dict(precision="bf16", tp=1, gpu_memory_bytes=80 * GIB, utilization=0.92, max_model_len=8192,
                max_num_batched_tokens=8192, kv_dtype="auto")
    on = kiln.constants
    off = _constants(kiln, subtract_cudagraph_estimate=False)
    for seqs in (16, 256, 1024):
        with_graphs = cap.kv_capacity(profile, max_num_seqs=seqs, c=on, **args)  # type: ignore[arg-type]
        without = cap.kv_capacity(profile, max_num_seqs=seqs, c=off, **args)  # type: ignore[arg-type]
        piecewise = cap.cudagraph_capture_count(min(2 * seqs, 512), 8192)
        full = cap.cudagraph_capture_count(min(2 * seqs, 512), 8192, seqs) - piecewise
        assert without.kv_cache_bytes_per_gpu - with_graphs.kv_cache_bytes_per_gpu == (
            cap.cudagraph_reserve_bytes(1, piecewise, full, on))
    small = cap.kv_capacity(profile, max_num_seqs=16, c=on, **args)  # type: ignore[arg-type]
    large = cap.kv_capacity(profile, max_num_seqs=1024, c=on, **args)  # type: ignore[arg-type]
    assert small.overhead_bytes_per_gpu < large.overhead_bytes_per_gpu


def test_a_small_batch_limit_cuts_the_piecewise_graphs(kiln: Kiln) -> None:
    """Capture sizes stop at max_num_batched_tokens, which is itself captured (VllmConfig._set_cudagraph_sizes)."""
    assert cap.cudagraph_capture_count(512, 100) == len([1, 2, 4, *range(8, 100, 8), 100])
    assert cap.cudagraph_reserve_bytes(1, cap.cudagraph_capture_count(512, 100), 0, kiln.constants) < (
        cap.cudagraph_reserve_bytes(1, cap.cudagraph_capture_count(512, 8192), 0, kiln.constants))


def test_utilization_leaves_room_for_the_capture_to_overrun_its_estimate(kiln: Kiln) -> None:
    """vllm#57475: on a 24 GB GPU (22.36 GiB to CUDA) capture ran out of memory at 0.98 and started at 0.97."""
    laptop = cap.max_utilization_for_capture(int(22.36 * GIB), kiln.constants)
    assert 0.97 <= laptop < 0.98
    assert cap.max_utilization_for_capture(int(79.19 * GIB), kiln.constants) > 0.99
    assert kiln.constants.get("vllm", "default_gpu_memory_utilization") < laptop
