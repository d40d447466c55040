"""A vLLM start that ran out of GPU memory: where in the start it happened, and the setting to lower. Pure: log lines
in, a check out.

Where, from the lines vLLM 0.32 logs before the error: the CUDA-graph capture ("Capturing CUDA graphs", "Profiling
CUDA graph memory", v1/worker/gpu_model_runner.py), the memory profile run (a max_num_batched_tokens dummy forward,
v1/worker/gpu_worker.py determine_available_memory) or the weights (model_loader). vLLM reserves its own estimate of
the graphs' memory before sizing the KV cache (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, on since 0.21), but measures
it against a throwaway KV cache, so the real capture can still run out (vllm-project/vllm#49224, #57475).
"""

from __future__ import annotations

import re

from kiln.doctor.report import FAIL, PASS, SKIP, Check

_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|cudaErrorMemoryAllocation|out of memory", re.IGNORECASE)
_CAPTURE = ("Capturing CUDA graphs", "Profiling CUDA graph memory", "Graph capturing", "cudagraph capture",
            "capture_model")
_PROFILE = ("profile_run", "determine_available_memory", "Memory profiling", "dummy_run")
_WEIGHTS = ("Starting to load model", "Loading safetensors checkpoint shards", "load_weights")
_DONE_LOADING = re.compile(r"Model loading took|Loading weights took")
# vLLM's "non-default args: {...}" line (entrypoints/serve/utils/api_utils.py) or a command line.
_SETTING = re.compile(r"""['"-]*(max[_-]cudagraph[_-]capture[_-]size|gpu[_-]memory[_-]utilization|max[_-]num[_-]seqs|"""
                      r"""max[_-]num[_-]batched[_-]tokens)['"]?[:= ]\s*([\d.]+)""")


def _stage(lines: list[str]) -> str:
    """The last start stage the log reached before its first out-of-memory line."""
    stage = "start"
    for line in lines:
        if _OOM.search(line):
            return stage
        if any(s in line for s in _CAPTURE):
            stage = "capture"
        elif any(s in line for s in _PROFILE) or _DONE_LOADING.search(line):
            stage = "profile"
        elif any(s in line for s in _WEIGHTS) and stage == "start":
            stage = "weights"
    return stage


def _current(lines: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in lines:
        for name, value in _SETTING.findall(line):
            found[name.replace("_", "-")] = value
    return found


def check_start_oom(lines: list[str]) -> Check:
    if not lines:
        return Check("start memory", SKIP, "no vLLM start-up log to read")
    if not any(_OOM.search(line) for line in lines):
        return Check("start memory", PASS, "the last start did not run out of GPU memory")
    stage, now = _stage(lines), _current(lines)

    def was(name: str) -> str:
        return f" (now {now[name]})" if name in now else ""

    if stage == "capture":
        detail = "vLLM ran out of GPU memory capturing CUDA graphs, after sizing its KV cache"
        fix = (f"lower --max-cudagraph-capture-size{was('max-cudagraph-capture-size')} (fewer, smaller graphs), or "
               f"gpu_memory_utilization{was('gpu-memory-utilization')} to leave the capture more room; "
               f"max_num_seqs{was('max-num-seqs')} bounds the decode graphs")
    elif stage == "profile":
        detail = "vLLM ran out of GPU memory in its memory profile run (a max_num_batched_tokens forward pass)"
        fix = (f"lower max_num_batched_tokens{was('max-num-batched-tokens')} or max_num_seqs"
               f"{was('max-num-seqs')}, or gpu_memory_utilization{was('gpu-memory-utilization')} when another "
               "process shares the GPU")
    elif stage == "weights":
        detail = "vLLM ran out of GPU memory loading the weights: they do not fit at this tensor_parallel_size"
        fix = "use a larger tensor_parallel_size, a quantized checkpoint (quantization: fp8), or a larger droplet"
    else:
        detail = "vLLM ran out of GPU memory before loading the model: another process holds the GPU"
        fix = "stop the other process (nvidia-smi lists it), or lower gpu_memory_utilization"
    return Check("start memory", FAIL, detail, fix)
