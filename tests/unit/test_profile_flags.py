"""A profile's extra_args may not set what kiln plans: vLLM takes the later of two values, and kiln's flags come
first, so the plan's prediction would be for settings vLLM does not run."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kiln.profiles.schema import Serving, ServingOverride


@pytest.mark.parametrize("extra", [
    ["--max-num-batched-tokens", "8192"],
    ["--max_num_batched_tokens=8192"],
    ["--compilation-config.max_cudagraph_capture_size", "2048"],
    ["-tp", "2"],
    ["--max-num-seqs\n", "64"],
])
def test_extra_args_that_set_a_planned_flag_are_refused_in_any_spelling(extra: list[str]) -> None:
    with pytest.raises(ValidationError, match="kiln plans itself"):
        Serving(max_model_len=4096, extra_args=tuple(extra))
    with pytest.raises(ValidationError, match="kiln plans itself"):
        ServingOverride(extra_args=tuple(extra))


def test_flags_kiln_does_not_plan_pass() -> None:
    serving = Serving(max_model_len=4096, extra_args=("--tokenizer-mode", "deepseek_v32", "--block-size", "256"))
    assert serving.extra_args[-1] == "256"
