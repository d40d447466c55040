"""The one adapter over vLLM's benchmark client (vllm.benchmarks.serve), run in the Python that has vLLM.

On the image vLLM lives in its own virtualenv, apart from kiln's, so the client runs as a subprocess there and
hands its figures back through --save-result."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from kiln.datafiles import data_dir
from kiln.errors import KilnError
from kiln.processes import die_with_parent

# vLLM's `vllm bench serve`, reading every event of a stream (see the file's docstring).
BENCH_LAUNCHER = Path(data_dir("vllm")) / "kiln_vllm_bench.py"


@dataclass(frozen=True)
class Target:
    base_url: str
    model: str  # the served model name
    tokenizer: str  # a local folder or a Hugging Face id
    api_key: str | None = None
    cacert: str | None = None  # the certificate (or CA) an HTTPS endpoint is checked against; None: the system's


def discover(base_url: str, api_key: str | None, cacert: str | None = None, tokenizer: str | None = None) -> Target:
    """The served model and its tokenizer from /v1/models (`root`: the Hub id, or the model's id when the model is a
    folder on the server; then `tokenizer` names it)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        reply = requests.get(f"{base_url}/v1/models", headers=headers, timeout=10, verify=cacert or True)
    except requests.exceptions.SSLError as exc:
        raise KilnError(f"{base_url}'s certificate is not trusted here",
                        fix="pass --cacert FILE (kiln's own: `kiln status --certificate > kiln.crt`)") from exc
    except requests.RequestException as exc:
        raise KilnError(f"{base_url} does not answer: {exc.__class__.__name__}",
                        fix="check --url, and that the server is up (`kiln status`)") from exc
    if reply.status_code == 401:
        raise KilnError(f"{base_url} wants an API key", fix="pass --api-key (`kiln status` shows it)")
    reply.raise_for_status()
    model = reply.json()["data"][0]
    return Target(base_url, str(model["id"]), tokenizer or str(model.get("root") or model["id"]), api_key, cacert)


# What vLLM's client does first: load the tokenizer it counts tokens with.
TOKENIZER_CHECK = "import sys; from transformers import AutoTokenizer; AutoTokenizer.from_pretrained(sys.argv[1])"
TOKENIZER_CHECK_S = 120.0


@dataclass
class VllmBench:
    python: str
    log_file: Path | None = None

    def check_tokenizer(self, tokenizer: str) -> None:
        """A tokenizer that cannot be loaded, said in one line before any load is sent (vLLM's client would fail
        with a traceback in its log). The local cache is tried first; the Hub only for an ORG/NAME id."""
        fix = ("pass --tokenizer with the served model's folder or Hub id, or --state-dir of the kiln agent that "
               "serves it")
        if any((Path(tokenizer) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
            return  # a model folder with its tokenizer: vLLM's client loads it as it is
        error = self._load_tokenizer(tokenizer, offline=True)
        if error is not None and "/" in tokenizer and not Path(tokenizer).exists():
            error = self._load_tokenizer(tokenizer, offline=False)
        if error is not None:
            raise KilnError(f"the tokenizer {tokenizer!r} cannot be loaded: {error}", fix=fix)

    def _load_tokenizer(self, tokenizer: str, *, offline: bool) -> str | None:
        """None when it loads, else the error's line."""
        env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", **({"HF_HUB_OFFLINE": "1"} if offline else {})}
        try:
            done = subprocess.run([self.python, "-c", TOKENIZER_CHECK, tokenizer], capture_output=True, text=True,
                                  check=False, timeout=TOKENIZER_CHECK_S, env=env)
        except subprocess.TimeoutExpired:
            return f"it did not load within {TOKENIZER_CHECK_S:.0f} s"
        if done.returncode == 0:
            return None
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception)\b", line)]
        return ((errors or lines or ["no reason given"])[-1])[:300]

    def run(self, target: Target, workload: Sequence[str], env: dict[str, str] | None = None) -> dict[str, Any]:
        """One benchmark run; vLLM's result JSON (throughputs, percentiles, goodput)."""
        with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
            argv = [self.python, str(BENCH_LAUNCHER), "--backend", "openai", "--base-url", target.base_url,
                    "--endpoint", "/v1/completions", "--model", target.model, "--tokenizer", target.tokenizer,
                    "--ready-check-timeout-sec", "0", "--disable-tqdm", "--save-result", "--save-detailed",
                    "--result-dir", tmp, "--result-filename", "result.json", *workload]
            child_env = {**os.environ, **(env or {}), "VLLM_NO_USAGE_STATS": "1"}
            if target.api_key:
                child_env["OPENAI_API_KEY"] = target.api_key
            if target.cacert:  # the client's default SSL context reads it (Python's ssl, through OpenSSL)
                child_env["SSL_CERT_FILE"] = target.cacert
            log = self.log_file.open("a") if self.log_file else subprocess.DEVNULL
            try:
                done = subprocess.run(argv, env=child_env, stdout=log, stderr=subprocess.STDOUT, check=False,
                                      preexec_fn=die_with_parent)  # a killed agent leaves no client behind
            finally:
                if self.log_file and not isinstance(log, int):
                    log.close()
            result = Path(tmp) / "result.json"
            if done.returncode != 0 or not result.exists():
                where = f"; see {self.log_file}" if self.log_file else ""
                raise KilnError(f"vLLM's benchmark client failed (exit {done.returncode}){where}",
                                fix="check the URL, the model and that the tokenizer can be loaded offline")
            data: dict[str, Any] = json.loads(result.read_text())
            return data
