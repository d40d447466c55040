"""A predicted cold start: from the agent's start to vLLM serving, part by part. Pure: a start's shape and the
measured constants of data/coldstart.yaml in, seconds out.

Two starts are predicted for every plan: the image carrying the weights and their warm torch.compile cache
(`kiln models bake`), and the weights downloaded from the Hub with torch.compile run cold. The machine's own boot
(firmware, kernel, systemd up to kiln-agent) is not measured here, so it is not in the sum.
"""

from __future__ import annotations

from typing import Any

from kiln.setup.startup import ColdStart, ColdStarts, StartPart, StartShape

GIB = 1 << 30

def goal_seconds(params_b: float, data: dict[str, Any]) -> float | None:
    for goal in data.get("goals", []):
        if goal["max_params_b"] is None or params_b <= goal["max_params_b"]:
            return float(goal["seconds"])
    return None


def _cuda_parts(shape: StartShape, c: dict[str, Any], baked: bool) -> list[StartPart]:
    layers, per_gpu_gib = shape.num_layers, shape.weight_bytes_per_gpu / GIB
    parts = [StartPart("vLLM start", c["vllm_start_s"], "cuda.vllm_start_s")]
    if shape.tensor_parallel_size > 1:
        parts.append(StartPart("TP group start", c["tp_group_start_s"], "cuda.tp_group_start_s"))
    if not baked:
        parts.append(StartPart("download", shape.checkpoint_bytes / GIB / c["hub_gib_per_s"], "cuda.hub_gib_per_s"))
    # Every rank reads its slices of every file, so an instance reads its whole checkpoint from the one disk; other
    # instances on the machine read the same files, from the page cache once read.
    parts.append(StartPart("weights load", per_gpu_gib * shape.tensor_parallel_size / c["load_gib_per_s"],
                           "cuda.load_gib_per_s"))
    if baked:
        parts.append(StartPart("torch.compile", c["compile_warm_s"] + c["compile_warm_per_layer_s"] * layers,
                               "cuda.compile_warm_s"))
    else:
        parts.append(StartPart("torch.compile", c["compile_cold_s"] + c["compile_cold_per_layer_s"] * layers,
                               "cuda.compile_cold_s"))
    parts.append(StartPart("KV-cache profile", c["profile_s"] + c["profile_per_layer_s"] * layers, "cuda.profile_s"))
    graphs = shape.cuda_graphs * layers * c["graph_per_layer_s"]
    parts.append(StartPart("CUDA graphs", graphs, "cuda.graph_per_layer_s"))
    parts.append(StartPart("engine ready", c["server_ready_s"], "cuda.server_ready_s"))
    return parts


def _cpu_parts(shape: StartShape, c: dict[str, Any], baked: bool) -> list[StartPart]:
    parts = [StartPart("vLLM start", c["vllm_start_s"], "cpu.vllm_start_s")]
    # The CPU build's compile is measured cold only: a warm cache is not predicted lighter than that.
    parts += [StartPart("weights load", c["load_s"], "cpu.load_s"),
              StartPart("compile and warm-up", c["compile_cold_s"], "cpu.compile_cold_s"),
              StartPart("engine ready", c["server_ready_s"], "cpu.server_ready_s")]
    return parts


def predict_cold_start(shape: StartShape, data: dict[str, Any], *, baked: bool,
                       link_gib_per_s: float | None = None) -> ColdStart:
    """One start. `link_gib_per_s`, the machine's own link, caps the Hub's rate when it is slower."""
    parts = [StartPart("kiln agent", data["agent_s"], "agent_s")]
    if shape.device == "cpu":
        parts += _cpu_parts(shape, data["cpu"], baked)
    else:
        c = dict(data["cuda"])
        if link_gib_per_s is not None:
            c["hub_gib_per_s"] = min(c["hub_gib_per_s"], link_gib_per_s)
        parts += _cuda_parts(shape, c, baked)
    goal = goal_seconds(shape.params_b, data) if shape.device == "cuda" else None  # the goals are a droplet's
    return ColdStart("baked" if baked else "download", tuple(parts), goal)


def predict_cold_starts(shape: StartShape, data: dict[str, Any],
                        link_gib_per_s: float | None = None) -> ColdStarts:
    return ColdStarts(predict_cold_start(shape, data, baked=True, link_gib_per_s=link_gib_per_s),
                      predict_cold_start(shape, data, baked=False, link_gib_per_s=link_gib_per_s))
