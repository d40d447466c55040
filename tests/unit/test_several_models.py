"""Several models on one machine: `models:` validated item by item, placed on whole GPUs or shares of one, planned
each for itself, rendered as command lines vLLM's parser accepts, and planned from a file by `kiln plan --config`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from benchmarks import several_models
from tests.unit.test_render import parse

from kiln.choice.resolve import layers_from_inputs, merge
from kiln.choice.schema import Choice, validate_fields
from kiln.choice.sources import MAX_READ_BYTES, RawInputs
from kiln.cli.main import main
from kiln.planner.placement import Placement
from kiln.processes import ProcessSpec
from kiln.profiles.hf_config import profile_from_model_dir
from kiln.render.vllm import Runtime, render_instances
from kiln.serve.agent import one_after_another
from kiln.serve.decide import decide, plan_settings
from kiln.serve.processes.supervisor import Member
from kiln.tinymodel import make_tiny_adapter
from kiln.wiring import Kiln

RAG = {"models": [{"profile": "llama-3.3-70b-instruct"}, {"profile": "qwen3-embedding-8b"},
                  {"profile": "qwen3-reranker-8b"}]}
TWO_CHATS = {"models": ["qwen3-8b", "gpt-oss-20b"]}


def placed(kiln: Kiln, machine: str, settings: dict[str, object]) -> Placement:
    layer = validate_fields(settings, source="test")
    assert not layer.problems, layer.problems
    return plan_settings(kiln, kiln.machine(machine), Choice(**layer.values)).placement


def check_consistent(kiln: Kiln, placement: Placement) -> None:
    """No GPU given whole twice, shares of a GPU within what vLLM may take, ports and names once each, and
    every command line accepted by vLLM's parser."""
    memory = min(g.memory_bytes for g in placement.machine.gpus)
    ceiling = kiln.constants.get("vllm", "default_gpu_memory_utilization")
    for gpu, on in placement.gpu_map().items():
        shares = [share for _, share in on]
        assert len(on) <= 1 or all(s is not None for s in shares), (gpu, on)
        if len(on) > 1:
            assert sum(s or 0 for s in shares) <= ceiling, (gpu, on)
    for p in placement.placed:
        if p.share is not None:
            assert p.plan.engine.gpu_memory_utilization == p.share
            used = p.plan.predicted.weight_bytes_per_gpu + p.plan.predicted.kv_cache_bytes_per_gpu
            assert used < p.share * memory
    instances = [inst for p in placement.placed for inst in p.plan.instances]
    assert len({i.port for i in instances}) == len(instances)
    assert len({i.name for i in instances}) == len(instances)
    names = [n for p in placement.placed for n in p.plan.engine.served_model_names]
    assert len(set(names)) == len(names)
    for p in placement.placed:
        for rendered in render_instances(p.plan, Runtime(), local_model=p.wanted.profile.local_model):
            args = parse(list(rendered.argv))
            assert args.served_model_name == list(p.wanted.served_names)
            assert (args.runner == "pooling") == (p.wanted.profile.task != "chat")


def test_a_bad_item_is_reported_alone_and_the_others_kept() -> None:
    layer = validate_fields({"models": [{"profile": "qwen3-8b", "gpus": [1, 1]}, "gpt-oss-20b",
                                        {"profile": "qwen3-8b", "gpu": 2}, {"profile": "a", "model": "b/c"},
                                        {"model": "org/base", "lora": [{"name": "x", "source": "org/x"},
                                                                       {"name": "x", "source": "/adapters/x"}]}]},
                            source="user-data")
    assert [item.profile for item in layer.values["models"]] == ["gpt-oss-20b"]
    fields = [p.field for p in layer.problems]
    assert fields == ["models[0].gpus", "models[2].gpu", "models[3]", "models[4].lora"]
    assert "did you mean `gpus`" in layer.problems[1].fix
    assert all("not served" in p.what for p in layer.problems)


def test_models_replaces_profile_in_one_source_and_across_sources() -> None:
    layer = validate_fields({"profile": "qwen3-8b", **TWO_CHATS}, source="user-data")
    assert "profile" not in layer.values and layer.problems[0].field == "profile"
    owner = b"#cloud-config\nkiln:\n  models: [qwen3-8b, gpt-oss-20b]\n"
    later = merge(layers_from_inputs(RawInputs(user_data=owner, local_file="profile: qwen3-32b\n")))
    assert later.choice.profile == "qwen3-32b" and later.choice.models is None
    assert not merge(layers_from_inputs(RawInputs(user_data=b"#cloud-config\nkiln:\n  models: []\n"))).choice.models


def test_rag_on_h100x8_a_chat_model_on_whole_gpus_and_the_pooling_models_beside_it(kiln: Kiln) -> None:
    placement = placed(kiln, "h100x8", RAG)
    check_consistent(kiln, placement)
    chat, embed, rerank = placement.placed
    assert not placement.refused
    assert chat.share is None and len(chat.gpus) >= 4 and chat.plan.predicted.capacity is not None
    assert {embed.wanted.profile.task, rerank.wanted.profile.task} == {"embed", "rerank"}
    assert not set(chat.gpus) & (set(embed.gpus) | set(rerank.gpus))
    assert embed.plan.predicted.output_tokens_per_s is None  # the engine models generation, and says so
    assert any("predicts no throughput" in line for line in embed.plan.explanation)


def test_two_chat_models_share_the_one_gpu_of_h200x1_by_memory_budgets(kiln: Kiln) -> None:
    placement = placed(kiln, "h200x1", TWO_CHATS)
    check_consistent(kiln, placement)
    assert [p.gpus for p in placement.placed] == [(0,), (0,)]
    assert all(p.share is not None and p.shares_with for p in placement.placed)
    assert all(p.plan.predicted.capacity is not None for p in placement.placed)


def test_named_gpus_are_honoured_and_a_clash_or_a_missing_gpu_refused_alone(kiln: Kiln) -> None:
    placement = placed(kiln, "h100x8", {"models": [
        {"profile": "qwen3-8b", "gpus": [6, 7]}, {"profile": "llama-3.1-8b-instruct", "gpus": [7]},
        {"profile": "gpt-oss-20b", "gpus": [9]}, {"profile": "qwen3-32b", "gpus": 2}]})
    check_consistent(kiln, placement)
    assert [(p.wanted.position, p.gpus) for p in placement.placed][:1] == [(0, (6, 7))]
    refused = {u.wanted.position: u.reason for u in placement.refused}
    assert "already given" in refused[1] and "does not exist" in refused[2]
    assert [len(p.gpus) for p in placement.placed if p.wanted.position == 3] == [2]


def test_a_name_served_twice_and_a_model_too_large_are_refused_and_the_rest_placed(kiln: Kiln) -> None:
    placement = placed(kiln, "h100x1", {"models": [
        {"profile": "qwen3-8b", "name": "chat"}, {"profile": "gpt-oss-20b", "name": "chat"},
        {"profile": "deepseek-v3.2"}]})
    assert [p.wanted.name for p in placement.placed] == ["chat"]
    reasons = [u.reason for u in placement.refused]
    assert "already served" in reasons[0] and "does not fit" in reasons[1]


def test_kiln_plan_config_prints_the_gpu_map_and_each_models_plan(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "kiln.yaml"
    config.write_text(json.dumps(TWO_CHATS))
    assert main(["plan", "--machine", "h200x1", "--config", str(config)]) == 0
    text = capsys.readouterr().out
    assert "qwen3-8b (0." in text and "gpt-oss-20b (0." in text and "carries" in text
    assert main(["plan", "--machine", "h200x1", "--config", str(config), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in document["models"]] == ["qwen3-8b", "gpt-oss-20b"]
    assert [len(g["models"]) for g in document["gpus"]] == [2]
    config.write_text("models: [{profile: deepseek-v3.2}]\n")
    assert main(["plan", "--machine", "h100x1", "--config", str(config)]) == 2
    refused = capsys.readouterr()
    assert "does not fit" in refused.err and not refused.out  # nothing to serve: said where errors go


def test_the_agent_serves_every_placed_model_as_kiln_plan_places_it(kiln: Kiln) -> None:
    user_data = b"#cloud-config\nkiln:\n  models: [qwen3-8b, {profile: gpt-oss-20b, name: oss}]\n"
    decision = decide(kiln, "h200x1", merge(layers_from_inputs(RawInputs(user_data=user_data))), Runtime())
    assert [m.name for m in decision.models] == ["qwen3-8b", "oss"]
    assert decision.profile is not None and decision.profile.name == "qwen3-8b"
    ports = [r.port for r in decision.all_rendered]
    assert len(ports) == len(set(ports)) == 2
    planned = placed(kiln, "h200x1", {"models": ["qwen3-8b", {"profile": "gpt-oss-20b", "name": "oss"}]})
    assert [p.plan.engine.gpu_memory_utilization for p in planned.placed] == [
        m.plan.engine.gpu_memory_utilization for m in decision.models]
    report = decision.plan_report()
    assert report is not None and [m["name"] for m in report["models"]] == ["qwen3-8b", "oss"]


def test_adapters_are_read_once_and_served_and_a_bad_one_is_reported(kiln: Kiln, tmp_path: Path) -> None:
    tiny = kiln.catalog().get("tiny-cpu")
    good = make_tiny_adapter(tiny, tmp_path / "good", rank=12)
    dora = make_tiny_adapter(tiny, tmp_path / "dora")
    config = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    layer = validate_fields({"models": [{"profile": "tiny-cpu", "lora": [
        {"name": "good", "source": str(good)}, {"name": "dora", "source": str(dora)}]}]}, source="test")
    several = plan_settings(kiln, kiln.machine("cpu-only"), Choice(**layer.values))
    engine = several.placement.placed[0].plan.engine
    assert [(m.name, m.rank) for m in engine.lora_modules] == [("good", 12)]
    assert engine.max_lora_rank == 16  # the next rank vLLM takes
    problem = next(p for p in several.problems if p.field == "models[0].lora[1]")
    assert "DoRA" in problem.what and "served without it" in problem.what
    argv = list(render_instances(several.placement.placed[0].plan, Runtime())[0].argv)
    args = parse(argv)  # vLLM's own parser
    assert args.enable_lora and args.max_lora_rank == 16 and args.max_loras == 1
    assert [(m.name, m.path) for m in args.lora_modules] == [("good", str(good))]


def test_an_adapter_name_clashing_with_a_model_refuses_the_later_item(kiln: Kiln, tmp_path: Path) -> None:
    adapter = make_tiny_adapter(kiln.catalog().get("tiny-cpu"), tmp_path / "a")
    placement = placed(kiln, "cpu-only", {"models": [
        {"profile": "tiny-cpu", "lora": [{"name": "embed", "source": str(adapter)}]},
        {"profile": "tiny-cpu", "name": "embed", "task": "embed"}]})
    assert [p.wanted.name for p in placement.placed] == ["tiny-cpu"]
    assert "embed is already served" in placement.refused[0].reason


def test_on_the_cpu_each_model_gets_its_own_cores_and_ports(kiln: Kiln) -> None:
    placement = placed(kiln, "cpu-only", {"models": ["tiny-cpu", {"profile": "tiny-cpu", "name": "e",
                                                                   "task": "embed"}]})
    instances = [i for p in placement.placed for i in p.plan.instances]
    assert [i.cpus for i in instances] == [(0, 1), (2, 3)]
    assert len({i.port for i in instances}) == 2
    assert placement.placed[1].plan.engine.task == "embed"


def test_a_setting_flag_beside_config_is_refused_not_dropped(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "kiln.yaml"
    config.write_text(json.dumps(TWO_CHATS))
    assert main(["plan", "--machine", "h200x1", "--config", str(config), "--tp", "2", "--workload", "chat"]) != 0
    err = capsys.readouterr().err
    assert "--tp, --workload cannot be given" in err


def test_an_items_own_workload_plans_it_in_kiln_plan_and_at_boot(kiln: Kiln) -> None:
    placement = placed(kiln, "h200x1", {"models": [{"profile": "qwen3-8b", "workload": "chat"},
                                                   {"profile": "gpt-oss-20b", "workload": {"preset": "rag"}}]})
    assert [(p.plan.workload or {}).get("preset") for p in placement.placed] == ["chat", "rag"]
    user_data = b"#cloud-config\nkiln:\n  models: [{profile: qwen3-8b, workload: chat}]\n"
    decision = decide(kiln, "h100x1", merge(layers_from_inputs(RawInputs(user_data=user_data))), Runtime())
    assert decision.plan is not None and (decision.plan.workload or {}).get("preset") == "chat"


def test_instances_on_gpus_past_the_first_keep_the_machines_device_numbers(kiln: Kiln) -> None:
    placement = placed(kiln, "h100x8", {"models": [{"profile": "qwen3-8b", "gpus": [5, 6]}]})
    machine = placement.machine
    for inst in placement.placed[0].plan.instances:
        expected = tuple(machine.gpus[g].minor_number if machine.gpus[g].minor_number is not None else g
                         for g in inst.gpus)
        assert inst.gpus[0] >= 5 and inst.device_minors == expected


@pytest.mark.parametrize("kind", ["fifo", "directory", "binary", "too large", "absent"])
def test_a_config_that_cannot_be_read_is_refused_with_its_reason(kind: str, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "kiln.yaml"
    if kind == "fifo":
        os.mkfifo(config)
    elif kind == "directory":
        config.mkdir()
    elif kind == "binary":
        config.write_bytes(b"\xff\xfe\x00")
    elif kind == "too large":
        config.write_text("#" * (MAX_READ_BYTES + 1))
    assert main(["plan", "--machine", "h200x1", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    reason = {"fifo": "not a regular file", "directory": "Is a directory", "binary": "not UTF-8",
              "too large": "larger than", "absent": "No such file"}[kind]
    assert "cannot plan" in err and reason in err


def test_the_benchmark_prints_each_models_capacity_in_the_mix_beside_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert several_models.main(["--mixes", "two-chats"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("two-chats  h200x1")]
    assert [row[2] for row in rows] == ["qwen3-8b", "gpt-oss-20b"]
    for row in rows:  # the mix's requests/s, the model's alone on the whole machine, and their ratio
        in_mix, alone, ratio = float(row[-3]), float(row[-2]), float(row[-1])
        assert ratio == pytest.approx(in_mix / alone, abs=0.01)


def test_instances_sharing_a_gpu_startone_after_another() -> None:
    def member(name: str, gpus: tuple[int, ...]) -> Member:
        return Member(ProcessSpec(name, ("true",)), gpus=gpus)

    big, first, second, cpu = member("a", (0, 1)), member("b", (2,)), member("c", (2,)), member("d", ())
    waiting = one_after_another([big, first, second, cpu])
    assert [(m.name, before.name) for m, before in waiting] == [("c", "b")]
    assert second.held and not (big.held or first.held or cpu.held)


def test_the_task_is_read_from_the_repository(tmp_path: Path) -> None:
    source = Path(__file__).resolve().parents[1] / "data" / "hub" / "Qwen" / "Qwen3-32B" / "config.json"
    config = json.loads(source.read_text())
    for name, files, archs, task in (("chat", {}, config["architectures"], "chat"),
                                     ("embedder", {"modules.json": "[]"}, config["architectures"], "embed"),
                                     ("scorer", {}, ["Qwen3ForSequenceClassification"], "rerank")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**config, "architectures": archs}))
        for file, text in files.items():
            (folder / file).write_text(text)
        profile = profile_from_model_dir(folder)
        assert profile.task == task, name
        assert task == "chat" or not profile.speculative
