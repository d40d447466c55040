"""Where kiln's parts are put together: data files, adapters and the catalog, built once per command."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kiln import datafiles
from kiln.errors import ConfigError
from kiln.hardware.detect import detect_fixture, gpu_catalog
from kiln.hardware.fixtures import fixture_names, load_fixture
from kiln.hardware.machine_file import machine_from_file
from kiln.hardware.model import Machine
from kiln.hardware.specs import GpuCatalog
from kiln.profiles.catalog import Catalog, find_profile_dir, load_catalog
from kiln.profiles.schema import Profile
from kiln.setup.types import Constants, LoraModule

if TYPE_CHECKING:
    from kiln.doctor.facts import Needs
    from kiln.doctor.report import Report
    from kiln.doctor.stack import GpuStack
    from kiln.hardware.disks import Mount
    from kiln.perf.aiconfigurator import AiConfigurator
    from kiln.planner.cluster import Network

# Each method imports the adapter it wires (the Hub client, NVML, the doctor's probes, AIConfigurator) when it is
# first called, so that a command loads only the parts it uses.


@dataclass(frozen=True)
class Kiln:
    gpus: GpuCatalog
    constants: Constants
    profile_dir: Path | None = None

    @classmethod
    def create(cls, profile_dir: Path | None = None) -> Kiln:
        return cls(gpus=gpu_catalog(), constants=Constants(
            {**datafiles.read_yaml("planner.yaml"), "cold_start": datafiles.read_yaml("coldstart.yaml")}),
                   profile_dir=profile_dir)

    @property
    def stack(self) -> GpuStack:
        """The versions of the GPU stack that agree (data/gpu_stack.yaml), for the doctor."""
        from kiln.doctor.stack import GpuStack

        return GpuStack.model_validate(datafiles.read_yaml("gpu_stack.yaml"))

    def aiconfigurator(self) -> AiConfigurator | None:
        """NVIDIA AIConfigurator in its own virtualenv, when installed (bash ci/aiconfigurator.sh)."""
        from kiln.perf.aiconfigurator import find

        return find(Path(__file__).resolve().parents[2])

    def network(self, name: str | None = None, gbps: float | None = None) -> Network:
        """A link between droplets (data/network.yaml); `gbps` replaces its bandwidth (a fabric's contract)."""
        from kiln.planner.cluster import Network

        data = datafiles.read_yaml("network.yaml")
        name = name or data["default"]
        if name not in data["networks"]:
            raise ConfigError(f"unknown network {name!r}", fix=f"use one of: {', '.join(data['networks'])}")
        link = data["networks"][name]
        speed = gbps or link["gbps"]
        if not speed:
            raise ConfigError(f"DigitalOcean publishes no bandwidth for the {name} network",
                              fix="give the figure your contract states with --inter-node-gbps")
        return Network(name=name, gbps=float(speed), latency_us=float(link["latency_us"]),
                       source=" ".join(str(link["source"]).split()[:1]))

    def catalog(self) -> Catalog:
        return load_catalog(self.profile_dir or find_profile_dir(), self.gpus.specs)

    def machine(self, spec: str | None) -> Machine:
        """This machine (None), a named fixture, or a machine file."""
        if spec is None:
            from kiln.hardware.live import detect_live

            return detect_live(self.gpus)
        path = Path(spec)
        if spec not in fixture_names() and (path.suffix in (".yaml", ".yml", ".json") or path.exists()):
            return machine_from_file(path, self.gpus)
        return detect_fixture(spec, self.gpus)

    def _recording(self, spec: str) -> dict[str, Any] | None:
        """A fixture's or recorded machine file's data (NVML answers and all); None for a plain machine file."""
        if spec in fixture_names():
            return load_fixture(spec)
        data = yaml.safe_load(Path(spec).read_text(encoding="utf-8"))
        return data if isinstance(data, dict) and "nvml" in data else None

    def doctor(self, spec: str | None, cache_dir: Path, needs: Needs | None = None,
               vllm_python: str | None = None) -> tuple[Machine, Report]:
        """The pre-flight report for this machine (None) or a recorded one, against what the plan needs and, on this
        machine, the vLLM installed beside `vllm_python`."""
        import pynvml

        from kiln.doctor.checks import diagnose
        from kiln.doctor.facts import NvmlHealth
        from kiln.doctor.installed import read_installed
        from kiln.doctor.probe import read_health
        from kiln.hardware.detect import detect_recorded
        from kiln.hardware.fixtures import RecordedNvml
        from kiln.hardware.live import detect_live
        from kiln.hardware.system import LiveSystem, RecordedSystem, SystemFacts

        model = needs.model if needs and needs.model_bytes is not None else None
        recording = None if spec is None else self._recording(spec)
        installed = None
        if spec is None:
            machine, health = detect_live(self.gpus), read_health(pynvml)
            system = LiveSystem().facts(cache_dir, model)
            installed = read_installed(vllm_python) if vllm_python else None
        elif recording is not None:
            machine, health = detect_recorded(recording, self.gpus), read_health(RecordedNvml(recording.get("nvml")))
            system = RecordedSystem(recording).facts(cache_dir, model)
        else:
            machine, health = self.machine(spec), NvmlHealth()
            system = SystemFacts(cache_dir=str(cache_dir), described=False)
        return machine, diagnose(machine, health, system, self.stack, needs, installed)

    def mounts(self) -> list[Mount]:
        """The filesystems mounted here, for the cache disk: always this machine's, whatever GPUs it is told of."""
        from kiln.hardware.system import LiveSystem

        return LiveSystem().mounts()

    def record(self, spec: str | None, name: str, description: str) -> dict[str, Any]:
        """This machine's answers (None), or a recorded machine's replayed, as a machine file."""
        import pynvml

        from kiln.hardware.fixtures import RecordedNvml
        from kiln.hardware.host import RecordedHost
        from kiln.hardware.live import LiveHost
        from kiln.hardware.record import record_machine
        from kiln.hardware.system import LiveSystem, RecordedSystem

        if spec is None:
            return record_machine(name, description, pynvml, LiveHost(), LiveSystem())
        recording = self._recording(spec)
        if recording is None:
            raise ConfigError("a hand-written machine file holds no NVML answers to record", where=spec,
                              fix="record this machine (no --machine), or a fixture")
        return record_machine(name, description, RecordedNvml(recording.get("nvml")), RecordedHost(recording),
                              RecordedSystem(recording))

    def fixtures(self) -> list[Machine]:
        return [detect_fixture(name, self.gpus) for name in fixture_names()]

    def adapter(self, name: str, source: str, revision: str | None, hf_token: str | None = None,
                hub_cache: Path | None = None) -> LoraModule:
        """A LoRA adapter's rank and folder, from an absolute path or the Hub (downloaded into `hub_cache`)."""
        from kiln.hub.adapter import read_adapter

        client = None
        if not source.startswith("/"):
            from huggingface_hub.constants import HF_HUB_CACHE

            from kiln.hub.client import HubClient

            client = HubClient(hub_cache or Path(HF_HUB_CACHE), hf_token or os.environ.get("HF_TOKEN") or None,
                               endpoint=os.environ.get("HF_ENDPOINT") or None)
        return read_adapter(name, source, revision, client)

    def profile(self, name: str | None, model: str | None, hf_token: str | None = None,
                revision: str | None = None, hub_cache: Path | None = None) -> Profile:
        """A catalog profile by name, or a model by local directory or Hub id (ORG/NAME, read from the Hub with
        `hf_token`, its files kept in `hub_cache`, by default huggingface_hub's own cache)."""
        if model:
            from kiln.hub.model import is_hub_id
            from kiln.profiles.hf_config import profile_from_model_dir

            if is_hub_id(model) and not Path(model).is_dir():
                from huggingface_hub.constants import HF_HUB_CACHE

                from kiln.hub.client import HubClient
                from kiln.hub.model import profile_from_hub

                client = HubClient(hub_cache or Path(HF_HUB_CACHE), hf_token or os.environ.get("HF_TOKEN") or None,
                                   endpoint=os.environ.get("HF_ENDPOINT") or None)
                return profile_from_hub(client, model, revision or "main")
            return profile_from_model_dir(Path(model))
        assert name is not None
        return self.catalog().get(name)
