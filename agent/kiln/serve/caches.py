"""Where the agent keeps the Hugging Face cache and the compile caches: the disk `choose_cache_disk` picks, with
the bytes of the planned model each candidate already holds read from the cache folders."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from kiln.hardware.disks import CacheDisk, Mount, choose_cache_disk, mount_of, scratch_candidates, scratch_root
from kiln.hardware.system import blob_bytes, hub_cache, repo_folder
from kiln.render.vllm import Runtime
from kiln.serve.layout import HF_HOME_FOLDER


@dataclass(frozen=True)
class Caches:
    disk: CacheDisk

    @classmethod
    def in_state_dir(cls, state_dir: Path, why: str) -> Caches:
        """The caches in the state folder on the boot disk, where an image bakes its weights."""
        return cls(CacheDisk(str(state_dir), "", "", 0, False, why))

    @property
    def root(self) -> Path:
        return Path(self.disk.root)

    @property
    def hf_home(self) -> Path:
        return hf_home_under(self.root)

    @property
    def compile_dir(self) -> Path:
        """torch.compile, Inductor, Triton and CUDA caches; a folder of its own, since on the boot disk the root is
        the agent's state folder, whose other files the instances must not own."""
        return self.root / "compile"

    @property
    def folders(self) -> list[Path]:
        """What the instances write: the Hugging Face cache and the compile caches."""
        return [self.hf_home, self.compile_dir]

    def runtime(self, base: Runtime) -> Runtime:
        return dataclasses.replace(base, hf_home=str(self.hf_home), cache_root=str(self.compile_dir))

    def as_dict(self) -> dict[str, object]:
        return {**self.disk.as_dict(), "hf_home": str(self.hf_home)}


def hf_home_under(root: Path) -> Path:
    return root / HF_HOME_FOLDER


def held_bytes(root: Path, repos: list[str]) -> int:
    """The bytes of these repositories in the Hugging Face cache under root."""
    return sum(blob_bytes(repo_folder(hub_cache(hf_home_under(root)), repo)) for repo in repos)


def place_caches(mounts: list[Mount], state_dir: Path, repos: list[str]) -> Caches:
    """The cache disk for a plan that reads `repos` from the Hub. On the boot disk the caches stay in the state
    folder, where an image bakes its weights; on a scratch disk they go to <mount>/kiln."""
    boot = mount_of(str(state_dir), mounts)
    roots = [str(state_dir)] + ([scratch_root(m) for m in scratch_candidates(mounts, boot)] if boot else [])
    held = {root: held_bytes(Path(root), repos) for root in roots}
    disk = choose_cache_disk(mounts, str(state_dir), held)
    return Caches(disk)
