"""The one adapter over the Hugging Face Hub (huggingface_hub): can this machine read a repository, how big are the
files vLLM loads, and one resumable download of exactly those files into the shared cache."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx2
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from kiln.hardware.system import blob_bytes, repo_folder
from kiln.hub.files import RepoFile, files_vllm_loads

OK, GATED, MISSING, UNREACHABLE = "ok", "gated", "missing", "unreachable"


@dataclass(frozen=True)
class RepoCheck:
    repo: str
    revision: str
    status: str
    files: tuple[RepoFile, ...] = ()
    http_status: int | None = None
    message: str = ""  # the Hub's own words, for the journal

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass
class Progress:
    """A download's progress as the cache folder shows it, sampled while it runs."""

    repo: str
    bytes_total: int
    bytes_done: int = 0
    started: float = field(default_factory=time.monotonic)
    samples: list[tuple[float, int]] = field(default_factory=list)

    def sample(self, done: int, now: float) -> None:
        self.bytes_done = min(done, self.bytes_total)
        self.samples = [*self.samples[-20:], (now, self.bytes_done)]

    @property
    def rate_bytes_per_s(self) -> float:
        if len(self.samples) < 2 or self.samples[-1][0] <= self.samples[0][0]:
            return 0.0
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return max(0.0, (b1 - b0) / (t1 - t0))

    def as_dict(self) -> dict[str, object]:
        rate = self.rate_bytes_per_s
        left = self.bytes_total - self.bytes_done
        return {"repo": self.repo, "bytes_done": self.bytes_done, "bytes_total": self.bytes_total,
                "rate_bytes_per_s": round(rate), "eta_s": round(left / rate, 1) if rate > 0 else None}


class HubClient:
    """`endpoint` None is huggingface_hub's own default (HF_ENDPOINT, else huggingface.co)."""

    def __init__(self, cache: Path, token: str | None, endpoint: str | None = None, timeout_s: float = 20) -> None:
        self.cache = cache
        self.token = token
        self.endpoint = endpoint
        self.timeout_s = timeout_s

    def check(self, repo: str, revision: str) -> RepoCheck:
        """Exists, may be read with this token, and the bytes of the files vLLM loads."""
        try:
            info = HfApi(endpoint=self.endpoint, token=self.token).model_info(
                repo, revision=revision, files_metadata=True, timeout=self.timeout_s)
            listed = [RepoFile(s.rfilename, int(s.size or 0)) for s in info.siblings or []]
            files = files_vllm_loads(listed)
            # The metadata of a gated repository is public; reading a file is what the licence guards.
            probe = next((f.name for f in files if f.name == "config.json"), files[0].name if files else None)
            if probe:
                get_hf_file_metadata(hf_hub_url(repo, probe, revision=info.sha or revision, endpoint=self.endpoint),
                                     token=self.token, timeout=self.timeout_s)
        except GatedRepoError as exc:
            return RepoCheck(repo, revision, GATED, http_status=_status(exc), message=_words(exc))
        except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
            return RepoCheck(repo, revision, MISSING, http_status=_status(exc), message=_words(exc))
        except HfHubHTTPError as exc:
            return RepoCheck(repo, revision, UNREACHABLE, http_status=_status(exc), message=_words(exc))
        except (OSError, httpx2.TransportError) as exc:  # the network: the Hub is not there (anything else is a bug)
            return RepoCheck(repo, revision, UNREACHABLE, message=f"{type(exc).__name__}: {exc}")
        return RepoCheck(repo, revision, OK, tuple(files))

    def planning_files(self, repo: str, revision: str, names: tuple[str, ...]) -> tuple[RepoCheck, Path | None]:
        """The repository's check, and a folder holding those of `names` it has (config.json and the other small
        files planning reads; never a weight file). No folder when the Hub refused or did not answer."""
        check = self.check(repo, revision)
        if check.status != OK:
            return check, None
        folder: Path | None = None
        try:
            for name in names:
                if any(f.name == name for f in check.files):
                    got = hf_hub_download(repo, name, revision=revision, cache_dir=self.cache, token=self.token,
                                          endpoint=self.endpoint, etag_timeout=self.timeout_s)
                    folder = Path(str(got)).parent
        except GatedRepoError as exc:
            return RepoCheck(repo, revision, GATED, http_status=_status(exc), message=_words(exc)), None
        except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
            return RepoCheck(repo, revision, MISSING, http_status=_status(exc), message=_words(exc)), None
        except HfHubHTTPError as exc:
            return RepoCheck(repo, revision, UNREACHABLE, http_status=_status(exc), message=_words(exc)), None
        except Exception as exc:  # the HTTP client's own connection errors: the Hub is not there
            return RepoCheck(repo, revision, UNREACHABLE, message=f"{type(exc).__name__}: {exc}"), None
        return check, folder

    def cached_bytes(self, repo: str) -> int:
        return blob_bytes(repo_folder(self.cache, repo))

    def download(self, check: RepoCheck, on_progress: Callable[[Progress], None], every_s: float = 1.0) -> Path:
        """Exactly the files vLLM loads, resuming what an earlier attempt left; progress sampled every `every_s`."""
        progress = Progress(check.repo, check.bytes)
        folder = repo_folder(self.cache, check.repo)
        done = threading.Event()

        def watch() -> None:
            while not done.wait(every_s):
                progress.sample(blob_bytes(folder), time.monotonic())
                on_progress(progress)

        os.environ.setdefault("HF_XET_HIGH_PERFORMANCE", "1")
        watcher = threading.Thread(target=watch, name="kiln-download-progress", daemon=True)
        watcher.start()
        try:
            path = snapshot_download(check.repo, revision=check.revision, cache_dir=self.cache, token=self.token,
                                     endpoint=self.endpoint, allow_patterns=[f.name for f in check.files])
        finally:
            done.set()
            watcher.join()
        progress.sample(check.bytes, time.monotonic())
        on_progress(progress)
        return Path(str(path))


def _status(exc: HfHubHTTPError) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _words(exc: Exception) -> str:
    """The Hub's own explanation (its X-Error-Message), else the last line of huggingface_hub's message."""
    response = getattr(exc, "response", None)
    said = response.headers.get("X-Error-Message") if response is not None else None
    if said:
        return str(said)
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
