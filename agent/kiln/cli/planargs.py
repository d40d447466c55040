"""The options `kiln plan` and `kiln predict` share: the serving settings a user may fix, and the workload."""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from kiln.choice.schema import Choice, validate_fields
from kiln.cli.output import print_json
from kiln.errors import KilnError
from kiln.perf.workload import DEFAULT_PRESET, PRESETS, Workload, WorkloadSpec, resolve
from kiln.render.vllm import IMAGE_VLLM, MODULE_VLLM, Runtime
from kiln.setup.types import Refusal
from kiln.validation import message

EXIT_REFUSED = 2


def add_target_options(p: argparse.ArgumentParser, config: bool = False) -> None:
    p.add_argument("--machine", help="a fixture name or a YAML/JSON machine file (default: this machine)")
    which = p.add_mutually_exclusive_group(required=True)
    if config:
        which.add_argument("--config", metavar="FILE", help="a settings file (as /etc/kiln/kiln.yaml): plan it as "
                                                            "the agent would at boot, one model or several")
    which.add_argument("--profile", help="a profile name (`kiln profiles list`)")
    which.add_argument("--model", help="a Hugging Face repository ORG/NAME (read with HF_TOKEN), or a local model "
                                       "directory with config.json")
    p.add_argument("--revision", help="with --model ORG/NAME: the repository's branch, tag or commit (default main)")


def add_setting_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--objective", choices=["throughput", "latency"])
    p.add_argument("--tp", type=int, dest="tensor_parallel_size", help="tensor-parallel size")
    p.add_argument("--instances", type=int)
    p.add_argument("--dp", type=int, dest="data_parallel_size", help="data-parallel engine ranks in each server")
    p.add_argument("--expert-parallel", action="store_true", default=None,
                   help="MoE: spread the experts over every GPU of the server (with --dp, or DP over all GPUs)")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--gpu-memory-utilization", type=float)
    p.add_argument("--kv-cache-dtype", choices=["auto", "fp8"])
    p.add_argument("--quantization", choices=["auto", "bf16", "fp8", "nvfp4", "mxfp4"])
    p.add_argument("--speculative", choices=["on", "off"], help="speculative decoding (default: kiln decides)")


def add_workload_options(p: argparse.ArgumentParser) -> None:
    default = PRESETS[DEFAULT_PRESET].workload
    w = p.add_argument_group("workload", f"the requests to plan for (default: the {DEFAULT_PRESET} preset, "
                                         f"{default.shape()}, {default.budget()})")
    w.add_argument("--workload", choices=sorted(PRESETS), help="a named workload: " + "; ".join(
        f"{name}: {preset.workload.shape()}, {preset.workload.budget()}" for name, preset in PRESETS.items()))
    w.add_argument("--input-len", type=int, help="mean prompt tokens")
    w.add_argument("--output-len", type=int, help="mean generated tokens")
    w.add_argument("--dataset", choices=["sharegpt"], help="a benchmark dataset's lengths instead")
    w.add_argument("--prefix-len", type=int, help="leading prompt tokens every request shares")
    load = w.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, help="requests in flight at once (closed loop)")
    load.add_argument("--request-rate", help="requests per second (Poisson), or inf: all at once")
    w.add_argument("--num-prompts", type=int, help="requests in all (default 1000, as vllm bench serve)")
    w.add_argument("--ttft-ms", type=float, help="budget: time to first token, p90")
    w.add_argument("--tpot-ms", type=float, help="budget: time per output token, p90")
    w.add_argument("--min-tokens-per-s-per-user", type=float, help="budget: decode speed each user sees")


WORKLOAD_FIELDS = ("input_len", "output_len", "dataset", "prefix_len", "concurrency", "request_rate", "num_prompts",
                   "ttft_ms", "tpot_ms", "min_tokens_per_s_per_user")


def workload_given(args: argparse.Namespace) -> bool:
    return bool(args.workload) or any(getattr(args, name, None) is not None for name in WORKLOAD_FIELDS)


def workload_spec(args: argparse.Namespace) -> WorkloadSpec:
    """The command line's workload: a preset (`--workload`) and the fields given over it, which must agree with each
    other as user-data's must."""
    given: dict[str, object] = {"preset": args.workload} if args.workload else {}
    for name in WORKLOAD_FIELDS:
        value = getattr(args, name, None)
        if value is None:
            continue
        if name == "request_rate":
            value = "inf" if str(value).lower() == "inf" else _rate(str(value))
        given[name] = value
    try:
        return WorkloadSpec.model_validate(given)
    except ValidationError as exc:
        first = exc.errors()[0]
        # A check across fields has no location: it is about the flags together, not about --workload.
        where = "--" + str(first["loc"][0]).replace("_", "-") if first["loc"] else "workload flags"
        raise KilnError(message(first), where=where, fix="see `kiln predict --help`") from exc


def workload_from(args: argparse.Namespace) -> Workload:
    try:
        return resolve(workload_spec(args))
    except ValueError as exc:
        raise KilnError(f"workload: {exc}", fix="see `kiln predict --help`") from exc


def _rate(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise KilnError(f"--request-rate must be a number or inf, not {text!r}", fix="e.g. --request-rate 4") from None


SETTING_FIELDS = ("objective", "tensor_parallel_size", "instances", "max_model_len", "gpu_memory_utilization",
                  "kv_cache_dtype", "quantization", "data_parallel_size", "expert_parallel")


def plan_choice(args: argparse.Namespace) -> Choice:
    given = {k: getattr(args, k) for k in SETTING_FIELDS}
    if args.speculative:
        given["speculative_decoding"] = args.speculative == "on"
    layer = validate_fields({k: v for k, v in given.items() if v is not None}, source="command line")
    if layer.problems:
        first = layer.problems[0]
        raise KilnError(first.what, where=f"--{first.field.replace('_', '-')}", fix=first.fix)
    return Choice(**layer.values)


def refused(args: argparse.Namespace, refusal: Refusal, verb: str = "plan") -> int:
    """Why nothing fits and what would, on stderr (and as JSON with --json); the exit status says so."""
    if args.json:
        print_json({"error": refusal.reason, "suggestions": list(refusal.suggestions)})
    print(f"kiln: cannot {verb}: {refusal.text()}", file=sys.stderr)
    return EXIT_REFUSED


def runtime_for(args: argparse.Namespace) -> Runtime:
    """Where rendered command lines find vLLM: the image's `vllm serve`, or `python -m` beside this kiln."""
    launcher = (sys.executable, *MODULE_VLLM) if args.launcher == "module" else IMAGE_VLLM
    return Runtime(vllm_command=launcher, models_dir=args.models_dir)


HEAD_PLACEHOLDER = "HEAD_PRIVATE_IP"


def add_cluster_options(p: argparse.ArgumentParser) -> None:
    """`kiln plan --nodes N` (kiln.cli.cluster)."""
    p.add_argument("--nodes", type=int, help="plan across this many machines of --machine's kind (2 to 16)")
    p.add_argument("--network", choices=["vpc", "fabric"], help="the link between nodes (default: the VPC)")
    p.add_argument("--inter-node-gbps", type=float, metavar="GBPS",
                   help="the link's bandwidth per node, instead of DigitalOcean's published figure")
    p.add_argument("--head-address", default=HEAD_PLACEHOLDER,
                   help="the head node's private address in the rendered command lines")
