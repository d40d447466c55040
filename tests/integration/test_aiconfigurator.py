"""AIConfigurator through kiln's subprocess boundary (kiln/perf/aiconfigurator.py -> data/aiconfigurator/estimate.py),
run for real in .venv-aic (ci/aiconfigurator.sh makes it; skipped without it). The reference: its CLI,
`aiconfigurator cli estimate --model-path meta-llama/Meta-Llama-3.1-70B --system h100_sxm --backend vllm --isl 1024
--osl 1024 --batch-size 128 --tp-size 2 --gemm-quant-mode fp8 --kvcache-quant-mode fp8`, says 3,258 output tok/s
(and 57.8 tok/s/user at batch 1) with aiconfigurator 0.12.0 and its h100_sxm/vllm/0.24.0 database."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.conftest import REPO

from kiln.perf.aiconfigurator import PYTHON_ENV, AicEstimate, AiConfigurator, AicRequest, find_python


def engine() -> AiConfigurator:
    python = find_python(REPO)
    if python is None:
        pytest.skip(f"no AIConfigurator: {REPO / '.venv-aic'} is missing (bash ci/aiconfigurator.sh makes it), "
                    f"and ${PYTHON_ENV} names no python")
    return AiConfigurator(python)


def llama70b(batch_size: int, model: str = "meta-llama/Meta-Llama-3.1-70B") -> AicRequest:
    return AicRequest(model=model, system="h100_sxm", isl=1024, osl=1024, batch_size=batch_size, tp=2,
                      gemm_quant="fp8", kvcache_quant="fp8")


def test_llama_70b_on_two_h100s_and_an_unknown_model() -> None:
    single, full, unknown = engine().estimate([llama70b(1), llama70b(128), llama70b(1, "nobody/no-such-model")])

    assert isinstance(single, AicEstimate), single
    assert 30 < single.tokens_per_s_per_user < 100
    assert single.ttft_ms > 0 and single.tpot_ms > 0
    assert single.database.startswith("h100_sxm/vllm/")
    assert single.concurrency == 1 and single.gpus == 2

    assert isinstance(full, AicEstimate), full
    assert 2000 < full.output_tokens_per_s < 5000
    assert full.tokens_per_s_per_user < single.tokens_per_s_per_user
    assert full.concurrency == 128

    assert isinstance(unknown, str)
    assert "nobody/no-such-model" in unknown


def test_a_run_that_cannot_start_gives_reasons(tmp_path: Path) -> None:
    missing = AiConfigurator(tmp_path / "no-python")
    assert all(isinstance(answer, str) for answer in missing.estimate([llama70b(1), llama70b(2)]))
    assert missing.estimate([]) == []
