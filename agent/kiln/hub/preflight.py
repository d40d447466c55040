"""What the Hub said of each repository a plan needs, as problems with their fixes, and what to do about them. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from kiln.choice.schema import Problem
from kiln.errors import KilnError
from kiln.hub.client import GATED, MISSING, OK, UNREACHABLE, RepoCheck
from kiln.hub.files import Needed

TOKEN_WHERE = "hf_token in user-data (or the file /etc/kiln/hf_token)"


def problem_for(need: Needed, check: RepoCheck, token_set: bool) -> Problem:
    repo, page = check.repo, f"https://huggingface.co/{check.repo}"
    then = ("speculative decoding is off" if need.role == "speculator"
            else "falling back to the image's default profile")
    if check.status == GATED and check.http_status == 403:
        return Problem("hugging face", need.role, f"{repo} is gated and this hf_token may not read it "
                       f"({check.message}); {then}",
                       f"accept the licence at {page} with the token's account (some need the authors' approval), "
                       "then systemctl restart kiln-agent")
    if check.status == GATED:
        what = "the hf_token was refused" if token_set else "no hf_token is set"
        return Problem("hugging face", need.role, f"{repo} is gated and {what} ({check.message}); {then}",
                       f"accept the licence at {page}, then set {TOKEN_WHERE}"
                       + (" with a valid read token from https://huggingface.co/settings/tokens" if token_set else ""))
    if check.status == MISSING:
        return Problem("hugging face", need.role, f"{repo} (revision {check.revision}) is not on the Hub or is "
                       f"private ({check.message}); {then}",
                       f"check the repository name; a private repository needs {TOKEN_WHERE} that can read it")
    return Problem("hugging face", need.role, f"the Hub did not answer for {repo} ({check.message}); nothing is "
                   "downloaded ahead, and vLLM will try itself", "check the machine's network and HF_ENDPOINT")


@dataclass(frozen=True)
class HubVerdict:
    checks: tuple[tuple[Needed, RepoCheck], ...]

    def refused(self, role: str) -> bool:
        """The Hub answered, and the answer was no."""
        return any(n.role == role and c.status in (GATED, MISSING) for n, c in self.checks)

    @property
    def readable(self) -> tuple[RepoCheck, ...]:
        return tuple(c for _, c in self.checks if c.status == OK)

    @property
    def unreachable(self) -> bool:
        return any(c.status == UNREACHABLE for _, c in self.checks)

    @property
    def bytes(self) -> int:
        return sum(c.bytes for c in self.readable)

    def problems(self, token_set: bool) -> list[Problem]:
        return [problem_for(n, c, token_set) for n, c in self.checks if c.status != OK]


def refusal(check: RepoCheck, token_set: bool) -> KilnError:
    """Why a model named by its Hub id cannot be planned: the Hub's answer, and what to do."""
    page = f"https://huggingface.co/{check.repo}"
    where = f"model {check.repo} (revision {check.revision})"
    if check.status == GATED and check.http_status == 403:
        return KilnError(f"the repository is gated and this hf_token may not read it ({check.message})", where=where,
                         fix=f"accept the licence at {page} with the token's account (some need the authors' "
                             "approval)")
    if check.status == GATED:
        said = "the hf_token was refused" if token_set else "no hf_token is set"
        return KilnError(f"the repository is gated and {said} ({check.message})", where=where,
                         fix=f"accept the licence at {page}, then set {TOKEN_WHERE} (or HF_TOKEN for the kiln "
                             "command) with a read token from https://huggingface.co/settings/tokens")
    if check.status == MISSING:
        return KilnError(f"no such repository or revision on the Hub, or it is private ({check.message})",
                         where=where, fix=f"check the name at {page}; a private repository needs {TOKEN_WHERE} "
                                          "that can read it")
    return KilnError(f"the Hub did not answer ({check.message})", where=where,
                     fix="check the machine's network and HF_ENDPOINT, or give a local model directory")
