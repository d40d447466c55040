"""Workloads, `kiln predict`'s contract, and the planner's choice from predictions."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError
from tests.cli import run_kiln

from kiln.choice.resolve import ResolvedChoice
from kiln.choice.schema import Choice, validate_fields
from kiln.perf.predict import forecast, hardware, kiln_steps, lockstep_ranks
from kiln.perf.setup import machine_of
from kiln.perf.steps import RooflineSteps, Step, expected_max_normal
from kiln.perf.workload import DEFAULT_PRESET, PRESETS, Workload, WorkloadSpec, resolve, spread_lengths
from kiln.planner.plan import fit_plans
from kiln.planner.search import OUTPUT_TIE, Choosing, choose
from kiln.render.vllm import Runtime
from kiln.serve.decide import decide
from kiln.setup import capacity as cap
from kiln.setup.types import Refusal
from kiln.wiring import Kiln

CONTRACT = {"output_tokens_per_s", "total_tokens_per_s", "requests_per_s", "tokens_per_s_per_user", "ttft_ms",
            "tpot_ms", "itl_ms", "engine", "notes"}


def test_the_default_workload_finds_the_most_load_within_a_latency_budget(kiln: Kiln) -> None:
    default = resolve(None)
    assert DEFAULT_PRESET == "serve" and default.preset == "serve"
    planning = kiln.constants.get("planning")
    assert (default.input_len, default.output_len) == (planning["typical_prompt_tokens"],
                                                       planning["typical_output_tokens"])
    assert default.finds_capacity and default.concurrency is None and default.request_rate is None
    assert default.tpot_budget_ms is not None and 40 <= default.tpot_budget_ms <= 200  # MLPerf's server TPOT bounds
    assert default.ttft_ms == 500  # NVIDIA Dynamo's SLA planner default, near MLPerf's interactive 450 ms
    # Every preset with a budget finds its load; batch keeps every request at once and the most output.
    assert [n for n, p in PRESETS.items() if p.workload.finds_capacity] == ["serve", "chat", "rag", "agent"]
    assert PRESETS["batch"].workload.request_rate == math.inf and not PRESETS["batch"].workload.has_budget
    assert all(p.why for p in PRESETS.values())


def test_fields_override_a_preset_and_conflicts_are_refused() -> None:
    chat = resolve(WorkloadSpec(preset="chat", concurrency=64))
    assert (chat.dataset, chat.concurrency, chat.ttft_ms) == ("sharegpt", 64, 500)
    rated = resolve(WorkloadSpec(preset="chat", request_rate=2.5))
    assert rated.concurrency is None and rated.request_rate == 2.5
    own = resolve(WorkloadSpec(preset="chat", input_len=3000))
    assert own.dataset is None and own.input_len == 3000 and own.output_len == PRESETS["chat"].workload.output_len
    with pytest.raises(ValidationError, match="concurrency or request_rate"):
        WorkloadSpec(concurrency=4, request_rate=1.0)
    with pytest.raises(ValidationError, match="prefix_len"):
        WorkloadSpec(input_len=100, prefix_len=100)
    assert Workload(1000, 100, tpot_ms=40, min_tokens_per_s_per_user=50).tpot_budget_ms == 20


def test_user_data_takes_a_workload_and_reports_a_bad_one() -> None:
    good = validate_fields({"workload": "agent"}, source="user-data")
    assert not good.problems and good.values["workload"] == WorkloadSpec(preset="agent")
    both = validate_fields({"workload": {"preset": "rag", "ttft_ms": 800}, "profile": "qwen3-8b"}, source="u")
    assert both.values["workload"].ttft_ms == 800
    bad = validate_fields({"workload": {"concurrency": 0}, "profile": "qwen3-8b"}, source="user-data")
    assert [p.field for p in bad.problems] == ["workload"] and bad.values == {"profile": "qwen3-8b"}
    assert "workload: {preset: chat" in bad.problems[0].fix


def test_predict_json_is_the_contract_and_covers_every_instance(kiln: Kiln) -> None:
    done = run_kiln("predict", "--machine", "h100x8", "--profile", "llama-3.3-70b-instruct", "--tp", "2",
                           "--speculative", "off", "--input-len", "1024", "--output-len", "1024", "--concurrency",
                           "256", "--num-prompts", "512", "--engine", "kiln", "--json", check=True)
    out = json.loads(done.stdout)
    assert set(out) >= CONTRACT
    assert set(out["ttft_ms"]) == {"p50", "p90", "p99"} and set(out["tpot_ms"]) == {"p50", "p90"}
    assert out["setup"]["instances"] == 4 and out["setup"]["speculative_config"] is None
    one = run_kiln("predict", "--machine", "h100x8", "--profile", "llama-3.3-70b-instruct", "--tp", "2",
                          "--instances", "1", "--speculative", "off", "--input-len", "1024", "--output-len", "1024",
                          "--concurrency", "64", "--num-prompts", "128", "--engine", "kiln", "--json", check=True)
    # Four instances at 64 each deliver about four times one instance at 64.
    assert out["output_tokens_per_s"] == pytest.approx(4 * json.loads(one.stdout)["output_tokens_per_s"], rel=0.1)


def test_predict_exits_2_with_the_reason_when_the_setup_does_not_fit() -> None:
    done = run_kiln("predict", "--machine", "h100x1", "--profile", "llama-3.3-70b-instruct",
                           "--quantization", "bf16", "--workload", "chat")
    assert done.returncode == 2 and "does not fit" in done.stderr


def test_speculative_decodings_gain_shrinks_as_the_batch_fills(kiln: Kiln) -> None:
    machine, profile = kiln.machine("h100x8"), kiln.profile("llama-3.3-70b-instruct", None)

    def output(spec: bool, concurrency: int) -> float:
        fitted = fit_plans(machine, profile, Choice(tensor_parallel_size=2, speculative_decoding=spec), kiln.constants)
        assert not isinstance(fitted, Refusal)
        plan = fitted[0]  # the memory fit alone: the profile's draft length and the full batch limit
        work = Workload(1024, 512, concurrency=concurrency, num_prompts=4 * concurrency)
        return forecast(plan, work, kiln_steps(plan, machine, profile, kiln.constants), kiln.constants
                        ).output_tokens_per_s

    light, full = output(True, 4) / output(False, 4), output(True, 512) / output(False, 512)
    assert light > 1.5 and full < light / 1.5  # verifying drafts costs tensor-core time that a full batch lacks


def _roofline(kiln: Kiln, machine_name: str, profile_name: str, choice: Choice) -> RooflineSteps:
    """kiln's engine for the first plan that fits `choice`."""
    machine, profile = kiln.machine(machine_name), kiln.profile(profile_name, None)
    fitted = fit_plans(machine, profile, choice, kiln.constants)
    assert not isinstance(fitted, Refusal)
    steps = kiln_steps(fitted[0], machine, profile, kiln.constants)
    assert isinstance(steps, RooflineSteps)
    return steps


def test_only_full_attention_layers_attend_to_the_whole_context(kiln: Kiln) -> None:
    """gpt-oss alternates 128-token windows with full attention: prefilling a long prompt costs the full layers'
    quadratic attention, not all layers'. Linear-attention layers attend to no context."""
    steps = _roofline(kiln, "h100x1", "gpt-oss-20b", Choice(speculative_decoding=False))
    profile = steps.profile
    arch = profile.architecture
    assert arch.sliding_window is not None and arch.sliding_window.layers == arch.num_layers // 2
    unwindowed = replace(steps, profile=profile.model_copy(update={
        "architecture": arch.model_copy(update={"sliding_window": None})}))
    chunk = Step(0, 0.0, prefill_tokens=8192, prefill_context=8192 * 28_000.0)  # a chunk deep in a 32K prompt
    short = Step(0, 0.0, prefill_tokens=8192, prefill_context=8192 * 64.0)  # inside every window
    assert sum(steps._attention_parts(chunk)) == pytest.approx(sum(unwindowed._attention_parts(chunk)) / 2, rel=0.01)
    assert sum(steps._attention_parts(short)) == pytest.approx(sum(unwindowed._attention_parts(short)))
    assert steps.seconds(chunk) < unwindowed.seconds(chunk)

    # Qwen3.5's Gated DeltaNet layers keep a fixed state: only its full-attention layers attend to the context.
    steps = _roofline(kiln, "h200x8", "qwen3.5-397b-a17b", Choice(tensor_parallel_size=8, speculative_decoding=False))
    hybrid = steps.profile
    linear = hybrid.architecture.linear_attention
    assert linear is not None
    all_full = replace(steps, profile=hybrid.model_copy(update={
        "architecture": hybrid.architecture.model_copy(update={"linear_attention": None})}))
    full_share = (hybrid.architecture.num_layers - linear.layers) / hybrid.architecture.num_layers
    assert sum(steps._attention_parts(chunk)) == pytest.approx(sum(all_full._attention_parts(chunk)) * full_share)


def test_attention_runs_in_bf16_at_its_kernels_share_of_peak_by_length(kiln: Kiln) -> None:
    """Attention is priced at the BF16 peak whatever the weights' precision, at the share attention kernels reach
    at the sequence's length (planner.yaml `attention_efficiency_by_length`); MLA prefills in multi-head form, so a
    prompt chunk of DeepSeek-V3.2-shaped dense MLA costs (192 + 128) / (2 x 512 + 64) of the absorbed FLOPs."""
    bf16, fp8 = (_roofline(kiln, "h100x1", "llama-3.1-8b-instruct",
                           Choice(quantization=precision, speculative_decoding=False)) for precision in ("bf16", "fp8"))
    peak = kiln.machine("h100x1").gpus[0].spec.tflops("bf16") * 1e12
    assert bf16.hardware.attention_flops == fp8.hardware.attention_flops == pytest.approx(peak)
    deep = Step(0, 0.0, prefill_tokens=8192, prefill_context=8192 * 12_000.0, prefill_seqs=1)  # 24K long: 0.6
    short = Step(0, 0.0, prefill_tokens=8192, prefill_context=8192 * 256.0, prefill_seqs=16)  # 512 long: 0.3
    roof = bf16._roof()
    assert bf16._attention_seconds(deep, roof) == pytest.approx(sum(bf16._attention_parts(deep)) / (0.6 * peak))
    assert bf16._attention_seconds(short, roof) == pytest.approx(sum(bf16._attention_parts(short)) / (0.3 * peak))
    assert fp8._attention_seconds(deep, fp8._roof()) == pytest.approx(bf16._attention_seconds(deep, roof))

    sparse = _roofline(kiln, "h200x8", "deepseek-v3.2", Choice(tensor_parallel_size=8, speculative_decoding=False))
    dsv3 = sparse.profile
    dense_mla = replace(sparse, profile=dsv3.model_copy(update={
        "architecture": dsv3.architecture.model_copy(update={"sparse_attention": None})}))
    chunk = Step(0, 0.0, prefill_tokens=2048, prefill_context=2048 * 1024.0, prefill_seqs=1)
    decode = Step(64, 64 * 1024.0)
    per_query_prefill = dense_mla._attention_parts(chunk)[0] / chunk.prefill_context
    per_query_decode = dense_mla._attention_parts(decode)[1] / decode.decode_context
    assert per_query_prefill / per_query_decode == pytest.approx((192 + 128) / (2 * 512 + 64))


def test_sparse_mla_runs_as_vllm_runs_it_padded_replicated_and_by_release(kiln: Kiln) -> None:
    """DeepSeek-V3.2's attention: absorbed in prefill too, the prefill kernel padded to 64 heads per GPU on Hopper
    and 128 on Blackwell, the indexer replicated on every rank; releases before 0.25 computed every one of the
    2,048 top-k keys per query, and with a BF16 cache ran decoding tokens through the prefill kernel."""
    def attention(machine: str, choice: Choice, release: tuple[int, int] | None, step: Step) -> tuple[float, float]:
        m, profile = kiln.machine(machine), kiln.profile("deepseek-v3.2", None)
        fitted = fit_plans(m, profile, choice, kiln.constants)
        assert not isinstance(fitted, Refusal)
        steps = kiln_steps(fitted[0], m, profile, kiln.constants, release)
        assert isinstance(steps, RooflineSteps)
        return steps._attention_parts(step)

    arch = kiln.profile("deepseek-v3.2", None).architecture
    assert arch.mla is not None and arch.sparse_attention is not None
    layers, absorbed = arch.num_layers, 2 * arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim
    indexer = 2 * layers * arch.sparse_attention.index_n_heads * arch.sparse_attention.index_head_dim
    short = Step(0, 0.0, prefill_tokens=1024, prefill_context=1024 * 512.0, prefill_seqs=1)  # keys: 512 each
    tp8 = Choice(tensor_parallel_size=8, speculative_decoding=False, kv_cache_dtype="auto")
    prefill, _ = attention("h200x8", tp8, None, short)
    assert prefill == pytest.approx(2 * layers * 64 * absorbed * 1024 * 512 + indexer * 1024 * 512)
    blackwell, _ = attention("b300x8", tp8, None, short)
    assert blackwell == pytest.approx(2 * layers * 128 * absorbed * 1024 * 512 + indexer * 1024 * 512)
    old, _ = attention("h200x8", tp8, (0, 14), short)
    assert old == pytest.approx(2 * layers * 64 * absorbed * 1024 * 2048 + indexer * 1024 * 512)

    decode = Step(32, 32 * 300.0)
    _, bf16_cache = attention("h200x8", tp8, (0, 14), decode)
    _, fp8_cache = attention("h200x8", tp8.model_copy(update={"kv_cache_dtype": "fp8"}), (0, 14), decode)
    _, today = attention("h200x8", tp8, None, decode)
    assert bf16_cache == pytest.approx(2 * layers * 64 * absorbed * 32 * 2048 + indexer * 32 * 300)
    assert fp8_cache == pytest.approx(today)
    assert today == pytest.approx(2 * layers * 64 * absorbed * 32 * 300 + indexer * 32 * 300)


def test_expert_parallelism_exchanges_tokens_as_vllms_default_backend_does(kiln: Kiln) -> None:
    """vLLM's allgather_reducescatter backend: across data-parallel ranks each MoE layer gathers the other ranks'
    hidden states (FP8 where the experts take FP8) and reduce-scatters the bf16 outputs; with one data-parallel
    rank (TP + EP) there is no exchange, the outputs meet in tensor parallelism's all-reduce."""
    def exchange(choice: Choice) -> float:
        steps = _roofline(kiln, "h200x8", "qwen3-235b-a22b-instruct-2507", choice)
        return steps._all_to_all_seconds(7 * 1024, steps._roof())

    base = Choice(speculative_decoding=False, quantization="fp8")
    assert exchange(base.model_copy(update={"tensor_parallel_size": 8, "expert_parallel": True})) == 0.0
    dp8 = _roofline(kiln, "h200x8", "qwen3-235b-a22b-instruct-2507",
                    base.model_copy(update={"data_parallel_size": 8, "expert_parallel": True}))
    roof, arch = dp8._roof(), dp8.profile.architecture
    others = 1024 * arch.hidden_size * 7
    assert dp8._all_to_all_seconds(7 * 1024, roof) == pytest.approx(
        arch.num_layers * (2 * roof.allreduce_latency_s + (others * 1 + others * 2) / roof.link_bytes_s))


def test_with_expert_parallelism_each_ranks_experts_see_every_ranks_tokens(kiln: Kiln) -> None:
    """Data-parallel ranks of a MoE model step together: a rank decoding a small batch while another prefills runs
    its experts on its share of both, and gathers the other's tokens. By default the other ranks bring as many
    tokens as this one. Dense models' ranks step alone."""
    base = Choice(speculative_decoding=False, quantization="fp8")
    dp8 = _roofline(kiln, "h200x8", "qwen3-235b-a22b-instruct-2507",
                    base.model_copy(update={"data_parallel_size": 8, "expert_parallel": True}))
    decode = Step(16, 16 * 1000.0)
    assert dp8.seconds(decode) == pytest.approx(dp8.seconds(replace(decode, ranks_tokens=16 * 8)))
    held_up = replace(decode, ranks_tokens=16 * 8 + 8192)
    assert dp8.seconds(held_up) > 1.5 * dp8.seconds(decode)
    machine = kiln.machine("h200x8")
    moe = fit_plans(machine, kiln.profile("qwen3-235b-a22b-instruct-2507", None),
                    base.model_copy(update={"data_parallel_size": 8, "expert_parallel": True}), kiln.constants)
    dense = fit_plans(machine, kiln.profile("qwen3-32b", None),
                      base.model_copy(update={"data_parallel_size": 8}), kiln.constants)
    assert not isinstance(moe, Refusal) and not isinstance(dense, Refusal)
    assert lockstep_ranks(moe[0]) == 8 and lockstep_ranks(dense[0]) == 1


def test_with_expert_parallelism_the_gpu_whose_experts_are_hit_most_sets_the_pace(kiln: Kiln) -> None:
    """Each GPU holds whole experts: one token's 8 of 128 experts land on 8 GPUs unevenly, so the busiest GPU reads
    about 2.4 experts, not 1; thousands of tokens hit every expert and spread their routes within a few percent.
    Under tensor parallelism every GPU holds a slice of every expert, and nothing is uneven."""
    assert expected_max_normal(8) == pytest.approx(1.4236, abs=1e-3)
    base = Choice(speculative_decoding=False, quantization="fp8")
    dp8 = _roofline(kiln, "h200x8", "qwen3-235b-a22b-instruct-2507",
                    base.model_copy(update={"data_parallel_size": 8, "expert_parallel": True}))
    reads, computes = dp8._busiest(1)
    hit = 8 / 128  # of the 16 experts each GPU holds, each is hit with this chance
    assert reads == pytest.approx((16 * hit + expected_max_normal(8) * math.sqrt(16 * hit * (1 - hit))) / (16 * hit))
    assert 2.2 < reads < 2.6 and computes > 2
    assert dp8._busiest(8000)[0] == pytest.approx(1.0, abs=1e-6) and dp8._busiest(8000)[1] < 1.02
    tp8 = _roofline(kiln, "h200x8", "qwen3-235b-a22b-instruct-2507",
                    base.model_copy(update={"tensor_parallel_size": 8}))
    assert tp8._busiest(1) == (1.0, 1.0)


def test_the_vocabulary_costs_a_lookup_per_token_and_the_lm_head_only_where_logits_are_sampled(kiln: Kiln) -> None:
    """Of two models with the same parameters, the one with more of them in its vocabulary prefills faster: the
    input embedding is a gather and the LM head runs on each prompt's last token; decoding, where every token is
    sampled, reads a separate input table row by row, not whole."""
    steps = _roofline(kiln, "h100x1", "llama-3.1-8b-instruct", Choice(quantization="bf16", speculative_decoding=False))
    profile = steps.profile
    assert not profile.architecture.tie_word_embeddings
    arch = profile.architecture
    wide = replace(steps, profile=profile.model_copy(update={
        "architecture": arch.model_copy(update={"vocab_size": 4 * arch.vocab_size})}))
    prompt = Step(0, 0.0, prefill_tokens=8192, prefill_context=8192 * 4096.0, prefill_seqs=1)
    # The wide model has 3 x 2 x vocab x hidden = 45% of the narrow one's matmul parameters fewer per prompt token.
    assert wide.seconds(prompt) < 0.75 * steps.seconds(prompt)
    assert Step(4, 400.0, prefill_tokens=300, prefill_seqs=3, tokens_per_seq=3).sampled == 4 * 3 + 3
    decode = Step(1, 1000.0)
    read = cap.weight_bytes(profile, "bf16") - arch.vocab_size * arch.hidden_size * 2
    assert steps.seconds(decode) > read / (steps.hardware.bandwidth_bytes_s * steps.efficiency.memory)
    assert steps.seconds(decode) < (read + arch.vocab_size * arch.hidden_size) / (
        steps.hardware.bandwidth_bytes_s * steps.efficiency.memory) + 0.003


def test_fp8_experts_run_as_the_vllm_release_measured_them(kiln: Kiln) -> None:
    """vLLM's block-scaled FP8 MoE kernel took 1.1 times BF16's time on Hopper in 0.19 and 0.7 of it in 0.24
    (AIConfigurator's tables); FP8 dense layers keep FP8's peak, and GPUs without FP8 tensor cores compute at
    BF16's."""
    h100 = kiln.machine("h100x8")
    bf16_peak = h100.gpus[0].spec.tflops("bf16") * 1e12
    kilns_own = hardware(h100, "fp8", 8, 1, kiln.constants)
    assert kilns_own.flops == pytest.approx(2 * bf16_peak, rel=0.01)
    assert kilns_own.expert_flops == pytest.approx(bf16_peak / 0.7)
    assert hardware(h100, "fp8", 8, 1, kiln.constants, (0, 11)).expert_flops == pytest.approx(bf16_peak / 1.1)
    assert hardware(h100, "fp8", 8, 1, kiln.constants, (0, 26)).expert_flops == pytest.approx(bf16_peak / 0.7)
    assert hardware(h100, "bf16", 8, 1, kiln.constants).expert_flops == pytest.approx(bf16_peak)
    b300 = kiln.machine("b300x8")  # Blackwell: no table kiln trusts, so FP8's peak
    assert hardware(b300, "fp8", 8, 1, kiln.constants).expert_flops == pytest.approx(
        b300.gpus[0].spec.tflops("fp8") * 1e12)
    l40s = kiln.machine("l40s")
    assert hardware(l40s, "fp8", 1, 1, kiln.constants).expert_flops == pytest.approx(
        l40s.gpus[0].spec.tflops("bf16") * 1e12 / 0.75)
    assert hardware(b300, "nvfp4", 8, 1, kiln.constants).expert_flops == pytest.approx(
        b300.gpus[0].spec.tflops("fp4") * 1e12)
    a100 = hardware(machine_of(kiln.gpus.specs["a100-80gb"], 8, 80), "fp8", 8, 1, kiln.constants)
    assert a100.expert_flops == a100.flops  # no FP8 tensor cores: FP8 weights, BF16 math


def test_async_scheduling_hides_the_ranks_hand_over_under_the_gpus_time(kiln: Kiln) -> None:
    """From vLLM 0.14 the next step is handed to the tensor-parallel ranks while the GPUs run this one: the per-rank
    cost lengthens a step only where it outlasts the GPUs' time. Older releases, the CPU backend and speculative
    methods vLLM does not schedule asynchronously pay it on every step; the per-step cost stays on top throughout."""
    machine, profile = kiln.machine("h100x8"), kiln.profile("llama-3.3-70b-instruct", None)
    fitted = fit_plans(machine, profile, Choice(tensor_parallel_size=8, speculative_decoding=False), kiln.constants)
    assert not isinstance(fitted, Refusal)
    plan = fitted[0]
    kilns_own = kiln_steps(plan, machine, profile, kiln.constants)
    old = kiln_steps(plan, machine, profile, kiln.constants, (0, 11))
    assert isinstance(kilns_own, RooflineSteps) and isinstance(old, RooflineSteps)
    assert kilns_own.async_scheduling and not old.async_scheduling
    assert kiln_steps(plan, machine, profile, kiln.constants, (0, 14)).async_scheduling  # type: ignore[attr-defined]
    e = kilns_own.efficiency
    ranks = e.overhead_per_rank_s * 7
    assert ranks > 0
    free = replace(kilns_own, efficiency=replace(e, overhead_per_rank_s=0.0))
    light, heavy = Step(1, 1000.0), Step(0, 0.0, prefill_tokens=8192, prefill_context=8192 * 4096.0, prefill_seqs=2)
    for step in (light, heavy):  # the older release adds the ranks' cost to whatever the GPUs take
        assert old.seconds(step) == pytest.approx(free.seconds(step) + ranks)
    fixed = e.step_overhead_s + e.overhead_per_seq_s  # one sequence or one prompt chunk
    assert free.seconds(light) - fixed < ranks  # a light step's GPU time is shorter than the hand-over...
    assert kilns_own.seconds(light) == pytest.approx(ranks + fixed)  # ...so the hand-over sets it
    assert free.seconds(heavy) - fixed > ranks  # a long prompt chunk hides it
    assert kilns_own.seconds(heavy) == pytest.approx(free.seconds(heavy))

    ngram = replace(plan, engine=replace(plan.engine, speculative_config={"method": "ngram",
                                                                          "num_speculative_tokens": 2}))
    assert not kiln_steps(ngram, machine, profile, kiln.constants).async_scheduling  # type: ignore[attr-defined]
    cpu = replace(plan, engine=replace(plan.engine, device="cpu"))
    assert not kiln_steps(cpu, kiln.machine("cpu-only"), profile, kiln.constants).async_scheduling  # type: ignore[attr-defined]


def test_the_search_meets_the_budget_and_explains_with_predictions(kiln: Kiln) -> None:
    """A workload with its own load (16 chats at a time): the most output that meets the budget there."""
    machine, profile = kiln.machine("h100x8"), kiln.profile("llama-3.3-70b-instruct", None)
    work = resolve(WorkloadSpec(preset="chat", concurrency=16))
    found = choose(machine, profile, Choice(), work, kiln.constants,
                   lambda p: kiln_steps(p, machine, profile, kiln.constants))
    assert isinstance(found, Choosing) and found.chosen.forecast.meets(work)
    assert found.alternatives and all(
        found.chosen.forecast.output_tokens_per_s >= o.forecast.output_tokens_per_s * (1 - OUTPUT_TIE)
        for o in found.alternatives if o.forecast.meets(work))
    text = "\n".join(found.explanation)
    assert "Speculative decoding" in text and "x the output" in text and "Beaten:" in text


def test_an_impossible_budget_is_refused_with_the_closest_setup_and_what_would_meet_it(kiln: Kiln) -> None:
    machine, profile = kiln.machine("h100x1"), kiln.profile("llama-3.1-8b-instruct", None)
    work = Workload(16_000, 256, concurrency=64, ttft_ms=300, num_prompts=128)
    found = choose(machine, profile, Choice(), work, kiln.constants,
                   lambda p: kiln_steps(p, machine, profile, kiln.constants), kiln.fixtures())
    assert isinstance(found, Refusal)
    assert "the closest" in found.reason and "TTFT p90" in found.reason
    assert any(s.startswith("a looser budget") for s in found.suggestions)


def test_the_boot_plans_for_the_user_data_workload(kiln: Kiln) -> None:
    runtime = Runtime()
    plain = decide(kiln, "h100x8", ResolvedChoice(Choice(profile="llama-3.3-70b-instruct"), {}), runtime)
    chat = decide(kiln, "h100x8", ResolvedChoice(Choice(profile="llama-3.3-70b-instruct",
                                                        workload=WorkloadSpec(preset="chat")), {}), runtime)
    assert plain.plan is not None and chat.plan is not None and not chat.problems
    assert any(line.startswith("Workload: sharegpt") for line in chat.plan.explanation)
    impossible = decide(kiln, "h100x1", ResolvedChoice(Choice(
        profile="llama-3.1-8b-instruct", workload=WorkloadSpec(input_len=4_000, output_len=64, concurrency=8,
                                                               ttft_ms=20)), {}), runtime)
    assert impossible.plan is not None  # served anyway, with the throughput plan
    assert [p.field for p in impossible.problems] == ["workload"]
    assert "serving the plan with the most output instead" in impossible.problems[0].what


def test_plan_for_a_workload_lists_what_it_beat_and_draws_them(tmp_path: Path) -> None:
    png = tmp_path / "front.png"
    done = run_kiln("plan", "--machine", "h200x8", "--profile", "deepseek-v3.2", "--workload", "batch",
                           "--engine", "kiln", "--plot", str(png), "--json", check=True)
    out = json.loads(done.stdout)
    assert out["workload"]["preset"] == "batch" and set(out["predicted_for_workload"]) >= CONTRACT
    assert out["alternatives"] and all(set(a["predicted"]) >= CONTRACT for a in out["alternatives"])
    chosen = out["predicted_for_workload"]["output_tokens_per_s"]
    assert all(a["predicted"]["output_tokens_per_s"] <= chosen / (1 - OUTPUT_TIE) for a in out["alternatives"])
    # DeepSeek-V3.2 as its recipe serves it: data parallel over the 8 GPUs with the experts spread over all.
    assert any(a["data_parallel_size"] == 8 and a["enable_expert_parallel"] for a in
               [*out["alternatives"], {"data_parallel_size": out["instances"][0]["data_parallel_size"],
                                       "enable_expert_parallel": "--enable-expert-parallel" in
                                       out["instances"][0]["argv"]}])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_boot_plan_and_status_carry_the_engines_figures_and_band(kiln: Kiln) -> None:
    """The default boot plan is the engine's, for the named default workload, with its band, as /status shows."""
    decision = decide(kiln, "h100x8", ResolvedChoice(Choice(profile="llama-3.3-70b-instruct"), {}), Runtime())
    assert decision.plan is not None
    report = decision.plan_report()
    assert report is not None
    assert report["workload"]["preset"] == DEFAULT_PRESET
    predicted = report["predicted"]
    capacity = predicted["capacity"]
    assert predicted["engine"] == "kiln" and capacity["output_tokens_per_s"] > 0 and capacity["requests_per_s"] > 0
    band = capacity["band"]
    assert band is not None and band["source"]
    assert band["requests_per_s"][0] < capacity["requests_per_s"] < band["requests_per_s"][1]


def test_a_band_comes_from_the_most_specific_class_with_enough_cases(kiln: Kiln) -> None:
    from kiln.planner.bands import MIN_CASES, band_for  # noqa: PLC0415
    from kiln.setup.types import Constants  # noqa: PLC0415

    machine, profile = kiln.machine("h100x1"), kiln.profile("qwen3-8b", None)
    fitted = fit_plans(machine, profile, Choice(speculative_decoding=False), kiln.constants)
    assert not isinstance(fitted, Refusal)

    def band(classes: dict[str, dict[str, float]], concurrency: int, families: tuple[str, ...] = ("qwen3",),
             new_family: dict[str, dict[str, float]] | None = None) -> tuple[float, float, str] | None:
        bands = {"families": list(families), "classes": classes, "new_family": new_family or {}}
        found = band_for(fitted[0], profile, Workload(1000, 200, concurrency=concurrency), 100.0,
                         Constants({**kiln.constants.data, "bands": bands}), "hopper")
        return None if found is None else (found.low, found.high, found.source)

    few = {"low": 1.2, "high": 1.3, "cases": MIN_CASES - 1}
    enough = {"low": 0.8, "high": 1.5, "cases": MIN_CASES, "held": 8, "judged": 10}
    assert band({"hopper/dense/low": few, "hopper/dense": enough}, 4) == pytest.approx(
        (80.0, 150.0, f"hopper/dense: {MIN_CASES} public cases predicted out of sample; held for 8 of 10 public "
                      "runs whose source it was fitted without"))
    specific = band({"hopper/dense/low": {**few, "cases": MIN_CASES}}, 4)
    assert specific is not None and specific[:2] == pytest.approx((120.0, 130.0))
    assert band({"hopper/dense/low": few, "hopper/dense": enough}, 64) == band({"hopper/dense": enough}, 64)
    assert band({"hopper/dense/low": few}, 4) is None
    # A model of a family the corpus lacks takes the bands judged leaving out whole families.
    unknown = band({"hopper/dense": enough}, 4, families=("llama",), new_family={"hopper/dense": {
        "low": 0.5, "high": 2.0, "cases": MIN_CASES, "held": 14, "judged": 20}})
    assert unknown is not None and unknown[:2] == pytest.approx((50.0, 200.0))
    assert "held for 14 of 20 public runs whose model family it was fitted without" in unknown[2]
    assert band({"hopper/dense": enough}, 4, families=("llama",)) is None


def test_a_datasets_outputs_spread_as_its_own_do_and_its_tail_sets_an_all_at_once_run(kiln: Kiln) -> None:
    quantiles = kiln.constants.get("datasets", "sharegpt", "output_len_quantiles")
    lengths = spread_lengths(200, 1000, quantiles)
    assert len(lengths) == 1000 and sum(lengths) / 1000 == pytest.approx(200, rel=0.005)
    assert sorted(lengths)[500] == pytest.approx(0.898 * 200, rel=0.02)  # ShareGPT's median is 0.9x its mean
    assert 3.2 * 200 < max(lengths) < 5.2 * 200  # and its longest first reply 5.1x
    assert lengths == spread_lengths(200, 1000, quantiles) and lengths != tuple(sorted(lengths))

    machine, profile = kiln.machine("h100x8"), kiln.profile("qwen3-8b", None)
    fitted = fit_plans(machine, profile, Choice(tensor_parallel_size=1), kiln.constants)
    assert not isinstance(fitted, Refusal)
    plan = fitted[0]
    steps = kiln_steps(plan, machine, profile, kiln.constants)
    at_once = forecast(plan, Workload(230, 200, request_rate=math.inf, dataset="sharegpt"), steps, kiln.constants)
    means = forecast(plan, Workload(230, 200, request_rate=math.inf), steps, kiln.constants)
    # Every request at once: the run lasts until the longest reply ends, with few left to batch by then.
    assert at_once.output_tokens_per_s < 0.9 * means.output_tokens_per_s
    assert any("outputs spread as the dataset's" in note for note in at_once.notes)
