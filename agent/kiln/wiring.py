"""Where kiln's parts are put together: data files, adapters and the catalog, built once per command."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kiln import datafiles
from kiln.hardware.detect import detect_fixture, detect_live, gpu_catalog
from kiln.hardware.fixtures import fixture_names
from kiln.hardware.machine_file import machine_from_file
from kiln.hardware.model import Machine
from kiln.hardware.specs import GpuCatalog
from kiln.planner.types import Constants
from kiln.profiles.catalog import Catalog, find_profile_dir, load_catalog
from kiln.profiles.hf_config import profile_from_model_dir
from kiln.profiles.schema import Profile


@dataclass(frozen=True)
class Kiln:
    gpus: GpuCatalog
    constants: Constants
    profile_dir: Path | None = None

    @classmethod
    def create(cls, profile_dir: Path | None = None) -> Kiln:
        return cls(gpus=gpu_catalog(), constants=Constants(datafiles.read_yaml("planner.yaml")),
                   profile_dir=profile_dir)

    def catalog(self) -> Catalog:
        return load_catalog(self.profile_dir or find_profile_dir(), self.gpus.specs)

    def machine(self, spec: str | None) -> Machine:
        """This machine (None), a named fixture, or a machine file."""
        if spec is None:
            return detect_live(self.gpus)
        path = Path(spec)
        if spec not in fixture_names() and (path.suffix in (".yaml", ".yml", ".json") or path.exists()):
            return machine_from_file(path, self.gpus)
        return detect_fixture(spec, self.gpus)

    def fixtures(self) -> list[Machine]:
        return [detect_fixture(name, self.gpus) for name in fixture_names()]

    def profile(self, name: str | None, model_path: str | None) -> Profile:
        if model_path:
            return profile_from_model_dir(Path(model_path))
        assert name is not None
        return self.catalog().get(name)
