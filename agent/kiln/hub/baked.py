"""Weights baked into the image: what `kiln models bake` put in the cache, recorded with sizes and SHA-256, and the
check at first boot that they are all still there, which lets the agent skip the Hub and download nothing.

The manifest lives beside the cache it describes (<state>/baked.json). Large files are checked by size and by their
blob's name, which for an LFS file in huggingface_hub's cache is its SHA-256; small files are hashed again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kiln.hardware.system import repo_folder

REHASH_BELOW = 16 * 2**20  # config and tokenizer files are hashed again at boot; weights are named by their hash
MANIFEST = "baked.json"


@dataclass(frozen=True)
class BakedFile:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class BakedRepo:
    repo: str  # a Hub id, or a local model's folder name under the models folder
    revision: str
    commit: str
    files: tuple[BakedFile, ...]
    local: bool = False

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BakedRepo:
        return cls(str(data["repo"]), str(data["revision"]), str(data["commit"]),
                   tuple(BakedFile(str(f["name"]), int(f["size"]), str(f["sha256"])) for f in data["files"]),
                   bool(data.get("local", False)))


@dataclass(frozen=True)
class Manifest:
    machine: str  # the machine class the profiles were planned for
    profiles: tuple[str, ...] = ()
    repos: tuple[BakedRepo, ...] = ()

    def as_json(self) -> str:
        return json.dumps({"machine": self.machine, "profiles": list(self.profiles),
                           "repos": [asdict(r) for r in self.repos]}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        return cls(str(data["machine"]), tuple(str(p) for p in data["profiles"]),
                   tuple(BakedRepo.from_dict(r) for r in data["repos"]))

    def with_profile(self, profile: str, repos: list[BakedRepo]) -> Manifest:
        """This manifest with one more profile; a repository baked again replaces its earlier record."""
        kept = [r for r in self.repos if not any(n.repo == r.repo and n.revision == r.revision for n in repos)]
        profiles = self.profiles if profile in self.profiles else (*self.profiles, profile)
        return Manifest(self.machine, profiles, (*kept, *repos))

    def find(self, repo: str, revision: str) -> BakedRepo | None:
        return next((r for r in self.repos if r.repo == repo and r.revision == revision), None)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def snapshot_of(cache: Path, repo: str, revision: str) -> tuple[str, Path] | None:
    """The commit a revision points at in huggingface_hub's cache, and its snapshot folder."""
    folder = repo_folder(cache, repo)
    ref = folder / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snapshot = folder / "snapshots" / commit
    return (commit, snapshot) if snapshot.is_dir() else None


def record_files(folder: Path, names: list[str]) -> tuple[BakedFile, ...]:
    return tuple(BakedFile(n, (folder / n).stat().st_size, sha256_of(folder / n)) for n in sorted(names))


def record_repo(cache: Path, repo: str, revision: str, names: list[str]) -> BakedRepo:
    """A downloaded repository as it is in the cache (its snapshot's files, hashed once, at bake time)."""
    found = snapshot_of(cache, repo, revision)
    if found is None:
        raise FileNotFoundError(f"{repo}@{revision} is not in {cache}")
    commit, snapshot = found
    return BakedRepo(repo, revision, commit, record_files(snapshot, names))


def record_local(models_dir: Path, name: str) -> BakedRepo:
    folder = models_dir / name
    names = [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()]
    return BakedRepo(name, "local", "local", record_files(folder, names), local=True)


def _file_problem(path: Path, expected: BakedFile) -> str | None:
    try:
        size = path.stat().st_size
    except OSError:
        return f"{expected.name} is missing"
    if size != expected.size:
        return f"{expected.name} has {size} bytes, {expected.size} were baked"
    blob = path.resolve().name
    if expected.size >= REHASH_BELOW and blob != expected.sha256:
        return f"{expected.name} is the blob {blob[:12]}, not the baked SHA-256 {expected.sha256[:12]}"
    if expected.size < REHASH_BELOW and sha256_of(path) != expected.sha256:
        return f"{expected.name} does not have the baked SHA-256"
    return None


def check_repo(baked: BakedRepo, cache: Path, models_dir: Path) -> str | None:
    """None when every baked file is present, whole and unchanged; else the first difference."""
    if baked.local:
        folder = models_dir / baked.repo
    else:
        found = snapshot_of(cache, baked.repo, baked.revision)
        if found is None or found[0] != baked.commit:
            return f"{baked.repo}: the snapshot {baked.commit[:12]} is not in {cache}"
        folder = found[1]
    for file in baked.files:
        problem = _file_problem(folder / file.name, file)
        if problem:
            return f"{baked.repo}: {problem}"
    return None


def read_manifest(path: Path) -> Manifest | None:
    try:
        return Manifest.from_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # an unreadable manifest bakes nothing: the Hub is asked as without one
