"""The catalog's late-2026 entries: their architecture is read from the published config.json shipped beside them
(profiles/configs/), and each plans on the 8-GPU machines or is refused with the machine that fits."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.choice.schema import Choice
from kiln.planner.search import make_plan
from kiln.profiles.hf_config import profile_from_model_dir
from kiln.setup.capacity import kv_layout
from kiln.setup.types import Plan, Refusal
from kiln.wiring import Kiln

HUB = Path(__file__).resolve().parents[1] / "data" / "hub"

READ_FROM_CONFIG = {  # profile: (layers, KV bytes per token in bf16 for the whole instance)
    "minimax-m2.5": (62, 62 * 2 * 8 * 128 * 2),
    "qwen3.5-397b-a17b": (60, 15 * 2 * 2 * 256 * 2),  # one layer in four keeps K/V
    "kimi-k2.5": (61, 61 * (512 + 64) * 2),  # MLA latent
    "qwen3-235b-a22b-instruct-2507": (94, 94 * 2 * 4 * 128 * 2),
    "glm-4.7": (92, 92 * 2 * 8 * 128 * 2),
    "llama-4-scout-17b-16e-instruct": (48, 48 * 2 * 8 * 128 * 2),
}


@pytest.mark.parametrize("name", sorted(READ_FROM_CONFIG))
def test_architecture_is_read_from_the_shipped_config(kiln: Kiln, name: str) -> None:
    profile = kiln.catalog().get(name)
    layers, kv = READ_FROM_CONFIG[name]
    assert profile.architecture.num_layers == layers
    assert kv_layout(profile.architecture, 1, "auto").bytes_per_token_instance == kv
    assert any(s.startswith("https://github.com/vllm-project/recipes/") for s in profile.sources)


@pytest.mark.parametrize("name", sorted(READ_FROM_CONFIG))
def test_plans_on_b300x8_with_the_nvfp4_checkpoint(kiln: Kiln, name: str) -> None:
    profile = kiln.catalog().get(name)
    plan = make_plan(kiln.machine("b300x8"), profile, Choice(), kiln.constants)
    assert isinstance(plan, Plan), plan
    assert plan.quantization == "nvfp4" and plan.engine.model == profile.checkpoints["nvfp4"].hf_id


def test_kimi_k2_5_is_refused_on_h100x8_naming_the_machine_that_fits(kiln: Kiln) -> None:
    alternatives = sorted(kiln.fixtures(), key=lambda m: sum(g.memory_bytes for g in m.gpus))
    refused = make_plan(kiln.machine("h100x8"), kiln.catalog().get("kimi-k2.5"), Choice(), kiln.constants,
                        alternatives)
    assert isinstance(refused, Refusal)
    assert any("h200x8" in s for s in refused.suggestions)
    on_h200 = make_plan(kiln.machine("h200x8"), kiln.catalog().get("kimi-k2.5"), Choice(), kiln.constants)
    assert isinstance(on_h200, Plan) and on_h200.quantization == "int4"


def test_deepseek_v4_profiles_read_their_compressed_cache_and_plan_on_the_8_gpu_machines(kiln: Kiln) -> None:
    """Flash (43 layers: 21 of ratio 4, 20 of ratio 128) keeps 3,915 bytes a token; Pro (61 layers: 30 of ratio 4,
    31 of ratio 128) 30 x (37,440 + 8,640) + 31 x 1,728 = 1,435,968 bytes a 256-token block, 5,609.25 bytes a token
    (test_hf_families.py works the pages out). Pro's ~792 GiB of weights need the H200s or B300s; on Hopper the
    recipe caps its context at 800,000 tokens."""
    flash, pro = kiln.catalog().get("deepseek-v4-flash"), kiln.catalog().get("deepseek-v4-pro")
    assert kv_layout(flash.architecture, 8, "fp8").bytes_per_token_per_gpu == 3_915
    assert kv_layout(pro.architecture, 8, "fp8").block_bytes_per_gpu == 30 * (37_440 + 8_640) + 31 * 1_728
    for profile, repo in ((flash, "DeepSeek-V4-Flash"), (pro, "DeepSeek-V4-Pro")):
        # The MTP draft is sized as a Hub model's is: one (average) decoder layer and its input projection.
        hub = profile_from_model_dir(HUB / "deepseek-ai" / repo)
        assert [s.draft_params for s in profile.speculative] == [s.draft_params for s in hub.speculative]
        assert profile.checkpoints["fp8"].weight_bytes == hub.checkpoints["fp8"].weight_bytes
    for machine in ("h100x8", "h200x8", "b300x8"):
        plan = make_plan(kiln.machine(machine), flash, Choice(), kiln.constants)
        assert isinstance(plan, Plan) and plan.quantization == "fp8", plan
        assert plan.engine.max_model_len == 1_048_576
    alternatives = sorted(kiln.fixtures(), key=lambda m: sum(g.memory_bytes for g in m.gpus))
    refused = make_plan(kiln.machine("h100x8"), pro, Choice(), kiln.constants, alternatives)
    assert isinstance(refused, Refusal) and any("h200x8" in s for s in refused.suggestions)
    on_h200 = make_plan(kiln.machine("h200x8"), pro, Choice(), kiln.constants)
    assert isinstance(on_h200, Plan) and on_h200.engine.max_model_len == 800_000
    on_b300 = make_plan(kiln.machine("b300x8"), pro, Choice(), kiln.constants)
    assert isinstance(on_b300, Plan) and on_b300.engine.max_model_len == 1_048_576


def test_glm_4_7_names_the_recipes_mtp_speculator_sized_as_one_mtp_layer(kiln: Kiln) -> None:
    """vLLM's GLM-4.7 recipe serves MTP with one speculative token; the draft is one MTP layer of this config: GQA
    attention (5120 x 96 x 128 + 2 x 5120 x 8 x 128 + 96 x 128 x 5120), 160 experts and one shared expert of 1536
    (3 x 5120 x 1536 each), the router (5120 x 160) and the input projection (2 x 5120 x 5120)."""
    (mtp,) = kiln.catalog().get("glm-4.7").speculative
    attention = 5120 * 96 * 128 + 2 * 5120 * 8 * 128 + 96 * 128 * 5120
    layer = attention + 161 * 3 * 5120 * 1536 + 5120 * 160 + 2 * 5120 * 5120
    assert (mtp.method, mtp.num_speculative_tokens, mtp.draft_params) == ("mtp", 1, layer)
    for machine in ("h100x8", "h200x8", "b300x8"):
        assert isinstance(make_plan(kiln.machine(machine), kiln.catalog().get("glm-4.7"), Choice(), kiln.constants),
                          Plan)
