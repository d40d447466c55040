"""Each family's published config.json (tests/data/hub/<org>/<name>/, each with a SOURCE note) read and sized as vLLM
lays out its cache. The expected figures are worked out here by hand from the config's numbers:

KV bytes per token (vllm/v1/kv_cache_interface.py): full attention, FullAttentionSpec: 2 (K, V) x KV heads x head_dim
x dtype bytes, per full-attention layer; MLA, MLAAttentionSpec: (kv_lora_rank + qk_rope_head_dim) x dtype bytes per
layer, or 656 bytes with the fp8_ds_mla layout that only sparse MLA (DeepSeek V3.2) stores an FP8 cache in; DeepSeek
V3.2's indexer cache: index_head_dim FP8 bytes + 4 bytes of scale per 128 values; linear attention, MambaSpec: nothing
per token, a fixed state per sequence.
Weights: parameters counted from the config, 2 bytes each in bf16; quantized checkpoints keep embeddings and the LM
head in bf16.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kiln.errors import ConfigError
from kiln.profiles.hf_config import profile_from_model_dir
from kiln.profiles.schema import Profile
from kiln.setup.capacity import kv_cache_tokens, kv_layout, linear_state_bytes, weight_bytes

HUB = Path(__file__).resolve().parents[1] / "data" / "hub"


def read(repo: str) -> Profile:
    return profile_from_model_dir(HUB / repo)


def only_precision(profile: Profile) -> str:
    (precision,) = profile.checkpoints
    return precision


def test_llama_3_dense() -> None:
    p = read("meta-llama/Llama-3.3-70B-Instruct")
    # 80 layers, hidden 8192, 64 heads / 8 KV heads of 128, MLP 28672, vocab 128256 untied, bf16.
    attention = 8192 * 64 * 128 + 2 * 8192 * 8 * 128 + 64 * 128 * 8192
    layer = attention + 3 * 8192 * 28672 + 2 * 8192
    total = 128256 * 8192 * 2 + 80 * layer + 8192
    assert p.architecture.params_total == total == 70_553_706_496
    assert weight_bytes(p, only_precision(p)) == 2 * total
    assert kv_layout(p.architecture, 1, "auto").bytes_per_token_instance == 80 * 2 * 8 * 128 * 2 == 327_680
    assert kv_layout(p.architecture, 8, "fp8").bytes_per_token_per_gpu == 80 * 2 * 1 * 128 * 1  # one KV head per GPU
    assert p.serving.max_model_len == 131072 and p.serving.tool_call_parser is None  # no parser in its recipe


def test_qwen3_dense_and_moe() -> None:
    dense = read("Qwen/Qwen3-32B")
    assert kv_layout(dense.architecture, 1, "auto").bytes_per_token_instance == 64 * 2 * 8 * 128 * 2
    moe = read("Qwen/Qwen3-235B-A22B-FP8")
    a = moe.architecture
    assert only_precision(moe) == "fp8" and a.moe is not None
    assert (a.moe.num_experts, a.moe.experts_per_token, a.moe.moe_intermediate_size) == (128, 8, 1536)
    # 94 layers x 2 x 4 KV heads x 128 x 2 bytes.
    assert kv_layout(a, 1, "auto").bytes_per_token_instance == 94 * 2 * 4 * 128 * 2 == 192_512
    attention = 4096 * 64 * 128 + 2 * 4096 * 4 * 128 + 64 * 128 * 4096
    layer = attention + 128 * 3 * 4096 * 1536 + 4096 * 128 + 2 * 4096
    embeddings = 151936 * 4096 * 2
    total = embeddings + 94 * layer + 4096
    assert a.params_total == total
    # FP8 block quantization: 1 byte a weight and one float32 scale per 128 x 128 block; embeddings in bf16.
    body = total - embeddings
    assert weight_bytes(moe, "fp8") == int(2 * embeddings + body * (1 + 4 / (128 * 128)))


def test_qwen3_5_hybrid_moe_keeps_kv_in_one_layer_of_four() -> None:
    p = read("Qwen/Qwen3.5-397B-A17B")
    a = p.architecture
    # text_config: 60 layers, full_attention_interval 4 -> 15 full-attention layers, 45 Gated DeltaNet layers.
    assert a.linear_attention is not None and a.linear_attention.layers == 45
    # Per token only the 15 full layers: 2 x 2 KV heads x head_dim 256 x 2 bytes (not 60 layers: 4x less).
    assert kv_layout(a, 1, "auto").bytes_per_token_instance == 15 * 2 * 2 * 256 * 2 == 30_720
    # Per sequence and linear layer: conv state (kernel 4 - 1) x (2 x 16 key heads x 128 + 64 value heads x 128) in
    # bf16, recurrent state 64 x 128 x 128 in float32 (mamba_ssm_dtype).
    assert linear_state_bytes(a, 1) == 3 * (2 * 16 * 128 + 64 * 128) * 2 + 64 * 128 * 128 * 4 == 4_268_032
    embeddings = 248320 * 4096 * 2
    full = 4096 * 32 * 256 * 2 + 2 * 4096 * 2 * 256 + 32 * 256 * 4096  # the query doubled by attn_output_gate
    linear = 4096 * (2 * 16 * 128 + 2 * 64 * 128) + 4096 * 2 * 64 + (2 * 16 * 128 + 64 * 128) * 4 + 64 * 128 * 4096
    experts = 60 * 512 * 3 * 4096 * 1024
    fixed = 60 * (4096 * 512 + 3 * 4096 * 1024)  # router and shared expert
    total = embeddings + 15 * full + 45 * linear + experts + fixed + 60 * 2 * 4096 + 4096
    assert a.params_total == total == 396_346_085_376
    assert weight_bytes(p, "bf16") == 2 * total
    assert [s.method for s in p.speculative] == ["mtp"]  # mtp_num_hidden_layers 1, and the recipe's MTP
    nvfp4 = read("nvidia/Qwen3.5-397B-A17B-NVFP4")
    # hf_quant_config.json: NVFP4 experts (4 bits + an FP8 scale per 16), attention and shared experts excluded.
    assert only_precision(nvfp4) == "nvfp4"
    rest = total - embeddings - experts
    assert weight_bytes(nvfp4, "nvfp4") == int(2 * embeddings + experts * (0.5 + 1 / 16) + 2 * rest)


def test_hybrid_capacity_uses_vllm_block_alignment() -> None:
    """Qwen3.5-397B on 8 GPUs: one full layer holds 1 KV head x 256 x 2 x 2 = 1024 bytes a token on each GPU; a
    linear layer's state is 4,268,032 / 8 = 533,504 bytes; vLLM raises the block to 16 x ceil(533504 / (16 x 1024))
    = 528 tokens so one page holds a state. 15 full and 45 linear layers make groups of 15: each block of the pool is
    15 pages, and a request of 262,144 tokens takes ceil(262144 / 528) = 497 blocks for the full group and 2 for each
    of the 3 linear groups (prefix caching's align mode)."""
    p = read("Qwen/Qwen3.5-397B-A17B")
    layout = kv_layout(p.architecture, 8, "auto")
    kv_bytes = 100 * 2**30
    blocks = kv_bytes // (528 * 1024 * 15)
    concurrency = blocks / (math.ceil(262144 / 528) + 3 * 2)
    assert kv_cache_tokens(kv_bytes, layout, 262144, 16, 8192) == (int(concurrency * 262144), concurrency)


def test_mixtral_moe_without_a_recipe_gets_safe_defaults() -> None:
    p = read("mistralai/Mixtral-8x7B-v0.1")
    assert (p.serving.tool_call_parser, p.serving.reasoning_parser, p.speculative) == (None, None, ())
    assert "no vLLM recipe" in p.description
    a = p.architecture
    assert a.moe is not None and (a.moe.num_experts, a.moe.experts_per_token) == (8, 2)
    assert kv_layout(a, 1, "auto").bytes_per_token_instance == 32 * 2 * 8 * 128 * 2
    layer = 4096 * 32 * 128 * 2 + 2 * 4096 * 8 * 128 + 8 * 3 * 4096 * 14336 + 4096 * 8 + 2 * 4096
    assert a.params_total == 32000 * 4096 * 2 + 32 * layer + 4096 == 46_702_792_704


def test_gpt_oss_sliding_window_and_mxfp4() -> None:
    p = read("openai/gpt-oss-120b")
    a = p.architecture
    assert only_precision(p) == "mxfp4"
    # layer_types: 18 sliding-window (128 tokens) and 18 full layers, 8 KV heads of 64.
    assert a.sliding_window is not None and (a.sliding_window.layers, a.sliding_window.window) == (18, 128)
    assert kv_layout(a, 1, "auto").bytes_per_token_instance == 18 * 2 * 8 * 64 * 2 == 36_864


def test_minimax_m2_fp8_moe() -> None:
    p = read("MiniMaxAI/MiniMax-M2.5")
    a = p.architecture
    assert only_precision(p) == "fp8" and a.mtp_layers == 3  # use_mtp with num_mtp_modules 3
    assert kv_layout(a, 1, "auto").bytes_per_token_instance == 62 * 2 * 8 * 128 * 2 == 253_952
    layer = 3072 * 48 * 128 + 2 * 3072 * 8 * 128 + 48 * 128 * 3072 + 256 * 3 * 3072 * 1536 + 3072 * 256 + 2 * 3072
    assert a.params_total == 200064 * 3072 * 2 + 62 * layer + 3072
    assert p.serving.tool_call_parser == "minimax_m2" and not p.serving.trust_remote_code  # the owner says so
    assert "trust_remote_code: true" in p.description


def test_glm_4_moe_with_dense_first_layers() -> None:
    a = read("zai-org/GLM-4.7-FP8").architecture
    assert a.moe is not None and a.moe.layers == 92 - 3  # first_k_dense_replace 3
    assert kv_layout(a, 1, "auto").bytes_per_token_instance == 92 * 2 * 8 * 128 * 2


def test_llama_4_nested_text_config_sizes_every_layer_full() -> None:
    """Llama 4's chunked local attention layers are sized as full layers: vLLM turns its hybrid KV-cache manager off
    for chunked local attention by default (vllm/config/vllm.py, VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE)."""
    a = read("meta-llama/Llama-4-Scout-17B-16E-Instruct").architecture
    assert a.num_layers == 48 and a.moe is not None and (a.moe.num_experts, a.moe.experts_per_token) == (16, 1)
    assert kv_layout(a, 1, "auto").bytes_per_token_instance == 48 * 2 * 8 * 128 * 2 == 196_608
    layer = (5120 * 40 * 128 + 2 * 5120 * 8 * 128 + 40 * 128 * 5120 + 16 * 3 * 5120 * 8192
             + 5120 * 16 + 3 * 5120 * 8192 + 2 * 5120)  # 16 experts, router, one shared expert
    assert a.params_total == 202048 * 5120 * 2 + 48 * layer + 5120
    assert a.max_position_embeddings == 10_485_760


def test_deepseek_v3_mla() -> None:
    p = read("deepseek-ai/DeepSeek-V3")
    a = p.architecture
    assert only_precision(p) == "fp8" and a.mla is not None and a.mtp_layers == 1
    # One latent of kv_lora_rank 512 + qk_rope_head_dim 64 per layer, the same on every GPU.
    assert kv_layout(a, 8, "auto").bytes_per_token_per_gpu == 61 * (512 + 64) * 2 == 70_272
    # Dense MLA's FP8 cache is the same latent at one byte a value: vLLM keeps kv_cache_dtype fp8 for its dense MLA
    # backends and turns it into fp8_ds_mla only for sparse ones (mla_attention.py,
    # _canonicalize_sparse_mla_kv_cache_dtype), so MLAAttentionSpec's page is head_size 576 x 1 byte.
    assert kv_layout(a, 8, "fp8").bytes_per_token_per_gpu == 61 * (512 + 64) == 35_136
    attention = (7168 * 1536 + 1536 * 128 * (128 + 64) + 7168 * (512 + 64) + 512 * 128 * (128 + 128)
                 + 128 * 128 * 7168)
    dense = 3 * 3 * 7168 * 18432  # first_k_dense_replace 3
    moe = 58 * (256 * 3 * 7168 * 2048 + 7168 * 256 + 3 * 7168 * 2048)  # routed, router, one shared expert
    embeddings = 129280 * 7168 * 2
    total = embeddings + 61 * attention + dense + moe + 61 * 2 * 7168 + 7168
    assert a.params_total == total == 671_026_279_424
    assert weight_bytes(p, "fp8") == int(2 * embeddings + (total - embeddings) * (1 + 4 / (128 * 128)))


def test_deepseek_v3_2_adds_the_indexer_cache() -> None:
    a = read("deepseek-ai/DeepSeek-V3.2").architecture
    assert a.sparse_attention is not None
    # DeepseekV32IndexerCache: 128 FP8 bytes + 128 / 128 x 4 bytes of scale = 132 bytes a layer.
    assert kv_layout(a, 8, "auto").bytes_per_token_per_gpu == 61 * ((512 + 64) * 2 + 132) == 78_324
    assert kv_layout(a, 8, "fp8").bytes_per_token_per_gpu == 61 * (656 + 132) == 48_068


def test_kimi_k2_5_nested_mla_int4_experts() -> None:
    p = read("moonshotai/Kimi-K2.5")
    a = p.architecture
    assert a.mla is not None and only_precision(p) == "int4"
    assert kv_layout(a, 8, "auto").bytes_per_token_per_gpu == 61 * (512 + 64) * 2 == 70_272  # not 64 heads of K/V
    assert kv_layout(a, 8, "fp8").bytes_per_token_per_gpu == 61 * (512 + 64) == 35_136  # dense MLA: not fp8_ds_mla
    attention = (7168 * 1536 + 1536 * 64 * 192 + 7168 * 576 + 512 * 64 * 256 + 64 * 128 * 7168)
    experts = 60 * 384 * 3 * 7168 * 2048
    embeddings = 163840 * 7168 * 2
    total = (embeddings + 61 * attention + 3 * 7168 * 18432 + experts + 60 * (7168 * 384 + 3 * 7168 * 2048)
             + 61 * 2 * 7168 + 7168)
    assert a.params_total == total == 1_026_408_084_480
    # compressed-tensors: routed experts int4 in groups of 32 with a bf16 scale (symmetric); attention, shared
    # experts and the dense MLP are in its ignore list and stay bf16.
    rest = total - embeddings - experts
    assert weight_bytes(p, "int4") == int(2 * embeddings + experts * (0.5 + 2 / 32) + 2 * rest)
    assert p.serving.tool_call_parser == "kimi_k2" and p.serving.reasoning_parser == "kimi_k2"


def test_qwen3_5_dense_hybrid() -> None:
    a = read("Qwen/Qwen3.5-27B").architecture
    assert a.linear_attention is not None and a.linear_attention.layers == 48
    assert kv_layout(a, 1, "auto").bytes_per_token_instance == 16 * 2 * 4 * 256 * 2 == 65_536


def test_an_architecture_kiln_cannot_size_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"architectures": ["RwkvForCausalLM"], "model_type": "rwkv"}')
    with pytest.raises(ConfigError) as raised:
        profile_from_model_dir(tmp_path)
    assert "RwkvForCausalLM" in raised.value.what and "rwkv" in raised.value.what
    assert "Qwen3.5" in raised.value.fix and "DeepSeek" in raised.value.fix


def test_deepseek_v4_compressed_cache_and_fp4_experts() -> None:
    """DeepSeek-V4-Flash's cache as vLLM 0.32 declares it on NVIDIA GPUs (fp8_ds_mla rows of 584 bytes, pages rounded
    up to 576 bytes, 256-token blocks; vllm/models/deepseek_v4/attention.py, compressor.py, sparse_swa.py).
    compress_ratios for the 43 layers: 0, 0, then 4 and 128 alternating, the last layer 4: 21 layers of ratio 4,
    20 of ratio 128, 2 with the window only.
    Per 256-token block: a ratio-4 layer keeps 64 states x 584 = 37,376 -> 37,440 bytes and 64 indexer keys of
    128 + 4 = 132 bytes = 8,448 -> 8,640; a ratio-128 layer 2 x 584 = 1,168 -> 1,728. 21 x (37,440 + 8,640) +
    20 x 1,728 = 1,002,240 bytes a block, 3,915 bytes a token, the same on every GPU (one KV head, max_tp_shards 1).
    Per request, windowed: every layer a 128-token window in 64-token blocks of 64 x 584 -> 37,440 bytes; a ratio-4
    layer its compressor's float32 state (2 x 2 x 512 values, 8,192 bytes a token) over 8 tokens in 4-token blocks,
    4 x 8,192 = 32,768 -> 32,832 bytes, and its indexer's (2 x 2 x 128 x 4 = 2,048 bytes) 4 x 2,048 = 8,192 ->
    8,640; a ratio-128 layer its state (2 x 512 x 4 = 4,096 bytes) over 128 tokens in 8-token blocks, 32,768 ->
    32,832. A windowed cache reserves ceil((window - 1 + batched tokens) / block) + 1 blocks."""
    p = read("deepseek-ai/DeepSeek-V4-Flash")
    a = p.architecture
    assert a.compressed_attention is not None and a.mla is None
    assert (a.compressed_attention.ratios.count(4), a.compressed_attention.ratios.count(128)) == (21, 20)
    layout = kv_layout(a, 8, "auto")
    assert layout.block_bytes_per_gpu == 21 * (37_440 + 8_640) + 20 * 1_728 == 1_002_240
    assert layout.bytes_per_token_per_gpu == kv_layout(a, 1, "fp8").bytes_per_token_per_gpu == 3_915
    length, batched = 1_048_576, 8192
    windows = (43 * (math.ceil((127 + batched) / 64) + 1) * 37_440 + 21 * (math.ceil((7 + batched) / 4) + 1)
               * (32_832 + 8_640) + 20 * (math.ceil((127 + batched) / 8) + 1) * 32_832)
    per_request = length // 256 * 1_002_240 + windows
    kv_bytes = 100 * 2**30
    assert kv_cache_tokens(kv_bytes, layout, length, 16, batched) == (
        int(kv_bytes / per_request * length), kv_bytes / per_request)
    # Parameters, per layer as vLLM builds the modules (hidden 4096, 64 heads of 512, q_lora and o_lora 1024,
    # 8 output groups, indexer 64 heads of 128, 256 experts of 2048 top-6 + 1 shared, hyper-connections x 4).
    fp8 = 4096 * (1024 + 512) + 1024 * 64 * 512 + 64 * 512 * 1024 + 8 * 1024 * 4096 + 3 * 4096 * 2048
    bf16 = 1024 + 512 + 2 * 4096 + 4096 * 256
    fp32 = 64 + 2 * 24 * (4 * 4096 + 1) + 6
    c4_bf16, c4_fp32 = 4096 * 2 * 2 * 512 + 512 + 4096 * 64 + 4096 * 2 * 2 * 128 + 128, 4 * 2 * 512 + 4 * 2 * 128
    c128_bf16, c128_fp32 = 4096 * 2 * 512 + 512, 128 * 512
    fp8_total = 43 * fp8 + 21 * 1024 * 64 * 128  # the ratio-4 layers' indexer wq_b
    bf16_total = 43 * bf16 + 21 * c4_bf16 + 20 * c128_bf16 + 4096  # and the final norm
    fp32_total = 43 * fp32 + 3 * 129280 * 6 + 40 * 256 + 21 * c4_fp32 + 20 * c128_fp32  # 3 hash layers
    experts = 43 * 256 * 3 * 4096 * 2048
    embeddings = 2 * 129280 * 4096
    assert a.params_total == embeddings + fp8_total + bf16_total + fp32_total + experts == 284_334_501_970
    assert a.moe is not None and a.moe.params_active == a.params_total - experts + 43 * 6 * 3 * 4096 * 2048
    # expert_dtype fp4: MXFP4 experts (4 bits + an E8M0 byte per 32); FP8 linears with an E8M0 byte per 128 x 128.
    assert only_precision(p) == "fp8"
    assert weight_bytes(p, "fp8") == int(2 * (embeddings + bf16_total) + 4 * fp32_total + experts * (0.5 + 1 / 32)
                                         + fp8_total * (1 + 1 / (128 * 128))) == 156_006_127_816
    assert [s.method for s in p.speculative] == ["mtp"] and p.serving.tool_call_parser == "deepseek_v4"


def test_gemma_3_reads_its_sliding_layers_and_transformers_defaults(tmp_path: Path) -> None:
    """gemma-3-27b-it's text model (profiles/configs/google--gemma-3-27b-it.config.json, whose sources its profile
    names), as a text-only checkpoint writes it: vocab_size, max_position_embeddings and the 1-in-6 pattern are left
    to transformers' Gemma3TextConfig defaults."""
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Gemma3ForCausalLM"], "head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
        "model_type": "gemma3_text", "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
        "query_pre_attn_scalar": 168, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024, "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0"}))
    a = profile_from_model_dir(tmp_path).architecture
    # Layer i slides unless (i + 1) % 6 == 0: 10 full layers, 52 sliding over 1024 tokens.
    assert a.sliding_window is not None and (a.sliding_window.layers, a.sliding_window.window) == (52, 1024)
    assert kv_layout(a, 1, "auto").bytes_per_token_instance == 10 * 2 * 16 * 128 * 2 == 81_920
    assert (a.vocab_size, a.max_position_embeddings, a.tie_word_embeddings) == (262208, 131072, True)
    layer = 5376 * 32 * 128 + 2 * 5376 * 16 * 128 + 32 * 128 * 5376 + 3 * 5376 * 21504 + 2 * 5376
    assert a.params_total == 262208 * 5376 + 62 * layer + 5376  # about 27B: the text model, embeddings tied


def test_a_deepseek_v4_whose_cache_kiln_cannot_size_is_refused_where_it_is_read(tmp_path: Path) -> None:
    """A DeepSeek-V4 config with another head_dim validates as JSON but has no fp8_ds_mla layout: the boundary says
    so with the file it read, and no later step raises."""
    config = json.loads((HUB / "deepseek-ai/DeepSeek-V4-Flash/config.json").read_text())
    config["head_dim"] = 256
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as refused:
        profile_from_model_dir(tmp_path)
    assert "head_dim 256" in str(refused.value) and "config.json" in refused.value.where
