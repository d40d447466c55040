"""The boot's model step, between the plan and the instances: ask the Hub whether every repository the plan needs
can be read (re-planning without a speculator, or with the default profile, when one cannot), then download them
once, with progress, so that the instances start offline and never race each other to the Hub."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kiln.choice.resolve import ResolvedChoice
from kiln.choice.select import FALLBACK_PROFILE
from kiln.hardware.system import hub_cache
from kiln.hub.baked import Manifest, check_repo
from kiln.hub.client import HubClient, Progress, RepoCheck
from kiln.hub.files import Needed, repos_for
from kiln.hub.preflight import HubVerdict
from kiln.serve.decide import Decision

log = logging.getLogger("kiln.agent")
MAX_REPLANS = 2  # without the speculator, then the default profile


@dataclass
class ModelStep:
    client: Callable[[str | None], HubClient]  # the token -> a Hub client on the instances' cache
    replan: Callable[[ResolvedChoice], Decision]
    stopping: threading.Event
    offline: bool = False  # HF_HUB_OFFLINE: ask the Hub nothing (weights baked in, or an air-gapped machine)
    manifest: Manifest | None = None  # what `kiln models bake` put into the image
    baked_cache: Path = Path()  # the Hugging Face cache the manifest describes
    models_dir: Path = Path()
    baked: str | None = None  # set when the baked files cover the plan: what they are

    def baked_status(self, decision: Decision) -> tuple[bool, str]:
        """Whether the image's baked files cover everything this plan reads, whole and unchanged, and what."""
        assert self.manifest is not None and decision.plan is not None and decision.profile is not None
        wanted = [(n.repo, n.revision) for n in needed_by(decision)]
        served = [(m.profile, m.plan) for m in decision.models] or [(decision.profile, decision.plan)]
        wanted += [(plan.engine.model, "local") for profile, plan in served if profile.local_model]
        found = []
        for repo, revision in wanted:
            baked = self.manifest.find(repo, revision)
            if baked is None:
                return False, f"{repo} was not baked into the image (it has {', '.join(self.manifest.profiles)})"
            problem = check_repo(baked, hub_cache(self.baked_cache), self.models_dir)
            if problem:
                return False, problem
            found.append(baked)
        files, size = sum(len(b.files) for b in found), sum(b.bytes for b in found)
        return True, (f"{', '.join(b.repo for b in found)}: {files} file(s), {size / 2**30:.2f} GiB, baked into the "
                      "image and complete")

    def check(self, decision: Decision, resolved: ResolvedChoice) -> tuple[Decision, HubVerdict | None]:
        """The decision to serve, and what the Hub said of its repositories (None when it needs none)."""
        for _ in range(MAX_REPLANS + 1):
            if self.offline or decision.failure or decision.plan is None or decision.profile is None:
                return decision, None
            if self.manifest is not None:
                complete, what = self.baked_status(decision)
                if complete:
                    self.baked = what
                    return decision, None
                log.warning("the baked model cannot be used: %s; asking the Hub", what)
            needed = needed_by(decision)
            if not needed:
                return decision, None
            hub = self.client(resolved.choice.hf_token)
            verdict = HubVerdict(tuple((n, hub.check(n.repo, n.revision)) for n in needed))
            problems = verdict.problems(resolved.choice.hf_token is not None)
            if decision.models:  # several: each model stands alone; one the Hub refuses is said, the rest download
                decision.problems += problems
                return decision, verdict
            update: dict[str, object]
            if verdict.refused("model") and decision.profile.name != FALLBACK_PROFILE:
                update = {"profile": FALLBACK_PROFILE, "model": None}
            elif verdict.refused("speculator"):
                update = {"speculative_decoding": False}
            else:
                decision.problems += problems
                if verdict.refused("model"):
                    first = problems[0]
                    decision.failure = (first.what, first.fix)
                return decision, verdict
            resolved = ResolvedChoice(resolved.choice.model_copy(update=update), resolved.origins,
                                      (*resolved.problems, *problems))
            decision = self.replan(resolved)
        return decision, None

    def download(self, hub: HubClient, checks: tuple[RepoCheck, ...],
                 on_progress: Callable[[Progress], None]) -> str | None:
        """Each readable repository into the cache; None when done, else why not (stopped, or the error)."""
        for check in checks:
            log.info("downloading %s: %d file(s), %.2f GiB, into %s", check.repo, len(check.files),
                     check.bytes / 2**30, hub.cache)
            failed: list[BaseException] = []
            worker = threading.Thread(target=_download_one, args=(hub, check, on_progress, failed),
                                      name="kiln-download", daemon=True)
            worker.start()
            while worker.is_alive():
                if self.stopping.wait(0.5):
                    return "stopped during the download; the files already complete are kept"
            if failed:
                return f"downloading {check.repo} failed: {type(failed[0]).__name__}: {failed[0]}"
            log.info("downloaded %s", check.repo)
        return None


def needed_by(decision: Decision) -> list[Needed]:
    """The Hub repositories every model of the decision reads, each once."""
    assert decision.plan is not None and decision.profile is not None
    served = [(m.profile, m.plan) for m in decision.models] or [(decision.profile, decision.plan)]
    needed: list[Needed] = []
    for profile, plan in served:
        needed += [n for n in repos_for(plan, profile.local_model) if n not in needed]
    return needed


def _download_one(hub: HubClient, check: RepoCheck, on_progress: Callable[[Progress], None],
                  failed: list[BaseException]) -> None:
    try:
        hub.download(check, on_progress)
    except Exception as exc:  # reported on /status, never a crash
        failed.append(exc)


class Milestones:
    """Journal lines at every tenth of a download, not at every sample."""

    def __init__(self) -> None:
        self.logged: dict[str, int] = {}

    def __call__(self, progress: Progress) -> None:
        tenth = int(10 * progress.bytes_done / progress.bytes_total) if progress.bytes_total else 10
        if tenth > self.logged.get(progress.repo, -1):
            self.logged[progress.repo] = tenth
            shown = progress.as_dict()
            eta = f", {shown['eta_s']} s left" if shown["eta_s"] is not None else ""
            log.info("download %s: %d%% of %.2f GiB at %.1f MiB/s%s", progress.repo, 10 * tenth,
                     progress.bytes_total / 2**30, progress.rate_bytes_per_s / 2**20, eta)
