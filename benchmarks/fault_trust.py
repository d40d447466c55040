"""The fault table's rows for what the trust review and the probe of `kiln up` found: settings and keys that are
wrong, requests built to hurt, and floods. Each row is made on the running stack while clients stream, except the
few that are about reading a choice or making a plan, which run offline. The numbers name the review's faults."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from benchmarks.fault_harness import KILN, Row, Stack, last_line, measured
from kiln.choice.resolve import layers_from_inputs, merge
from kiln.choice.sources import RawInputs
from kiln.choice.userdata import extract_settings

BAD_GRAMMAR = "root ::= root root |"  # the probe of `kiln up` saw vLLM answer it with 500


def rows(stack: Stack) -> list[Row]:
    return [*settings_rows(stack), *key_rows(stack), *request_rows(stack), *flood_rows(stack), *offline_rows()]


def _codes(replies: list[requests.Response | str]) -> str:
    counted = Counter(r if isinstance(r, str) else str(r.status_code) for r in replies)
    return ", ".join(f"{n} x {code}" for code, n in sorted(counted.items()))


def _send(stack: Stack, method: str, path: str, *, key: str | None = None, timeout: float = 60,
          **kwargs: Any) -> requests.Response | str:
    """One request to the public endpoint; a failure to get any answer is its exception's name."""
    try:
        return stack.call(method, path, key=key, timeout=timeout, **kwargs)
    except requests.RequestException as exc:
        return exc.__class__.__name__


def _message(reply: requests.Response | str) -> str:
    if isinstance(reply, str):
        return reply
    with contextlib.suppress(ValueError, AttributeError, KeyError, TypeError):
        return f"{reply.status_code} {str(reply.json()['error']['message'])[:90]!r}"
    return f"{reply.status_code} {reply.headers.get('Content-Type')}: {reply.text[:60]!r}"


# -- settings given on the machine, then `kiln reload` ---------------------------------------------------------
def settings_rows(stack: Stack) -> list[Row]:
    def reload_with(settings: str) -> str:
        stack.config.write_text(settings, encoding="utf-8")
        reloaded = stack.kiln("reload")
        return (f"`kiln reload` exit {reloaded.returncode}: {last_line(reloaded)}; the default key serves: "
                f"{stack.serves()}")

    def without_settings() -> None:
        stack.config.unlink(missing_ok=True)
        stack.kiln("reload")

    return [
        measured(stack, "1. api_keys names the default key a second time, then kiln reload",
                 lambda: reload_with(f"api_keys:\n  ci: {stack.key}\n"), undo=without_settings),
        measured(stack, "2a. workload prefix_len 2000, over the preset's 1,024-token prompt, then kiln reload",
                 lambda: reload_with("workload:\n  prefix_len: 2000\n"), undo=without_settings),
    ]


# -- the key store ---------------------------------------------------------------------------------------------
def key_rows(stack: Stack) -> list[Row]:
    keys = stack.state / "keys.json"

    def newline_key() -> str:
        added = stack.kiln("keys", "add", "nl", "--key", "kiln-newline-key-0123456789abcdef\n")
        return f"`kiln keys add` exit {added.returncode}: {last_line(added)}; the default key serves: {stack.serves()}"

    kept = keys.read_bytes()

    def short_key() -> str:
        store = json.loads(kept)
        store["keys"].append({"name": "short", "key": "abc"})
        keys.write_text(json.dumps(store), encoding="utf-8")
        reloaded = stack.kiln("reload")
        return (f"`kiln reload` exit {reloaded.returncode}: {last_line(reloaded)}; the default key serves: "
                f"{stack.serves()}")

    def restore() -> None:
        keys.write_bytes(kept)
        stack.kiln("reload")

    def parallel_adds() -> str:
        names = [f"par{i}" for i in range(10)]
        with ThreadPoolExecutor(len(names)) as pool:
            done = list(pool.map(lambda n: stack.kiln("keys", "add", n), names))
        listed = {k["name"] for k in json.loads(stack.kiln("keys", "list", "--json").stdout)["keys"]}
        kept_names = [n for n in names if n in listed]
        for name in kept_names:
            stack.kiln("keys", "revoke", name)
        return (f"{sum(d.returncode == 0 for d in done)} of 10 said added; {len(kept_names)} of 10 in the store; "
                f"then revoked")

    def symlinked() -> str:
        target = stack.state / "keys-elsewhere.json"
        target.write_bytes(kept)
        keys.unlink()
        keys.symlink_to(target)
        listed, reloaded = stack.kiln("keys", "list"), stack.kiln("reload")
        return (f"`kiln keys list` exit {listed.returncode}: {last_line(listed)}; `kiln reload` exit "
                f"{reloaded.returncode}; the default key serves: {stack.serves()}")

    def unlink_and_restore() -> None:
        keys.unlink()
        restore()

    def odd_limit() -> str:
        done = stack.kiln("keys", "limit", "default", "\u00b2")
        said = done.stdout + done.stderr
        return f"exit {done.returncode}, traceback: {'Traceback' in said}: {last_line(done)}"

    return [
        measured(stack, "12a. kiln keys add with a key ending in a newline", newline_key),
        measured(stack, "12b. a 3-character key written into keys.json by hand, then kiln reload", short_key,
                 undo=restore),
        measured(stack, "13. ten `kiln keys add` at once", parallel_adds),
        measured(stack, "14. keys.json replaced by a symbolic link, then kiln keys list and kiln reload", symlinked,
                 undo=unlink_and_restore),
        measured(stack, "19d. kiln keys limit default \u00b2", odd_limit),
    ]


# -- requests built to hurt ------------------------------------------------------------------------------------
def request_rows(stack: Stack) -> list[Row]:
    def completion(**body: Any) -> dict[str, Any]:
        return {"model": "tiny-cpu", "prompt": "x", "max_tokens": 8, **body}

    def timed(reply_of: Any) -> tuple[requests.Response | str, float]:
        started = time.monotonic()
        reply = reply_of()
        return reply, time.monotonic() - started

    def then_another() -> str:
        _, took = timed(stack.serves)
        return f"another client's request then took {took:.2f} s"

    def n_spelled() -> str:
        said = []
        for n in (10000, 10000.0, "10000"):
            reply, took = timed(lambda n=n: _send(stack, "POST", "/v1/completions", json=completion(n=n)))
            said.append(f"n={n!r}: {_message(reply)[:48]} in {took:.2f} s")
        return "; ".join(said) + f"; {then_another()}"

    def grammars() -> str:
        body = completion(structured_outputs={"grammar": BAD_GRAMMAR})
        started = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(lambda _: _send(stack, "POST", "/v1/completions", json=body), range(4)))
        took = time.monotonic() - started
        return (f"{_codes(replies)} in {took:.1f} s ({_message(replies[0])[:80]}); {then_another()}; the phase: "
                f"{stack.status().get('phase')}")

    def prompt_list() -> str:
        body = completion(prompt=["x"] * 1024, n=16)
        reply, took = timed(lambda: _send(stack, "POST", "/v1/completions", json=body, timeout=120))
        return f"{_message(reply)[:80]} in {took:.2f} s; {then_another()}"

    def tools() -> str:
        listed = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object",
                                                                                  "properties": {}}}}
                  for i in range(5000)]
        body = {"model": "tiny-cpu", "messages": [{"role": "user", "content": "x"}], "max_tokens": 8,
                "tools": listed, "tool_choice": "required"}
        reply, took = timed(lambda: _send(stack, "POST", "/v1/chat/completions", json=body, timeout=120))
        return f"{_message(reply)[:80]} in {took:.2f} s; {then_another()}"

    def no_role() -> str:
        body = {"model": "tiny-cpu", "messages": [{"content": "x"}], "max_tokens": 8}
        return _message(_send(stack, "POST", "/v1/chat/completions", json=body))

    return [
        measured(stack, "6. n given as 10000, 10000.0 and \"10000\"", n_spelled),
        measured(stack, "11. four requests at once with the grammar `root ::= root root |`, once answered with 500",
                 grammars),
        measured(stack, "16. one completion of 1,024 prompts with n: 16", prompt_list),
        measured(stack, "19e. 5,000 tools with tool_choice: required", tools),
        measured(stack, "19c. a chat message without its role (the router's 422)", no_role),
    ]


# -- floods and the endpoint's own answers ---------------------------------------------------------------------
def flood_rows(stack: Stack) -> list[Row]:
    log = stack.state / "logs" / "proxy.log"

    def over_rate() -> str:
        added = stack.kiln("keys", "add", "limited", "--requests-per-minute", "6", "--json")
        key = json.loads(added.stdout)["key"]
        size = log.stat().st_size
        started = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            replies = list(pool.map(lambda _: _send(stack, "GET", "/v1/models", key=key, timeout=10), range(400)))
        took = time.monotonic() - started
        grown = log.stat().st_size - size
        stack.kiln("keys", "revoke", "limited")
        return f"{_codes(replies)} in {took:.1f} s; proxy.log grew {grown} bytes ({grown / took:.0f} B/s)"

    def status_flood() -> str:
        def one(_: int) -> str:
            try:
                return str(requests.get(f"{stack.health}/status", timeout=10).status_code)
            except requests.RequestException as exc:
                return exc.__class__.__name__

        with ThreadPoolExecutor(500) as pool:
            answers = Counter(pool.map(one, range(1000)))
        return ", ".join(f"{n} x {a}" for a, n in answers.most_common())

    def health_flood() -> str:
        with ThreadPoolExecutor(200) as pool:
            replies = list(pool.map(lambda _: _send(stack, "GET", "/health", key="", timeout=10), range(2000)))
        return f"keyless public /health: {_codes(replies)}"

    def odd_http() -> str:
        lower = _send(stack, "GET", "/v1/models", headers={"Authorization": f"bearer {stack.key}"})
        plain = requests.get(f"http://127.0.0.1:{stack.public_port}/v1/models", timeout=10)
        status = lower if isinstance(lower, str) else str(lower.status_code)
        return f"`bearer KEY`: {status}; plain HTTP on the TLS port: {_message(plain)[:90]}"

    return [
        measured(stack, "17. one key over its rate (6 a minute), 400 requests", over_rate),
        measured(stack, "18a. 1,000 local /status requests, 500 at once", status_flood),
        measured(stack, "3, 18b. 2,000 keyless /health requests on the public port, 200 at once", health_flood),
        measured(stack, "19a, 19b. the Bearer scheme in lower case; plain HTTP on the TLS port", odd_http),
    ]


# -- reading a choice and making a plan (offline) --------------------------------------------------------------
def offline_rows() -> list[Row]:
    def row(fault: str, note: str) -> Row:
        return Row(fault, 0, 0, 0, None, "offline", note)

    extracted = extract_settings(b"#cloud-config\nwrite_files: 5\n")
    owner = b"#cloud-config\nkiln:\n  profile: tiny-cpu\n  tls: self-signed\n"
    tagged = merge(layers_from_inputs(RawInputs(user_data=owner, tags=(
        "kiln-api-key:kiln-" + "s" * 40, "kiln-tls:off", "kiln-instances:2"))))
    refused = sorted({p.field for p in tagged.problems if p.source == "droplet tags"})
    planned = subprocess.run([KILN, "plan", "--machine", "rtx4000ada", "--profile", "llama-3.1-8b-instruct",
                              "--gpu-memory-utilization", "0.98", "--json"], capture_output=True, text=True,
                             check=False, timeout=300, env={**os.environ, "NO_COLOR": "1"})
    plan = json.loads(planned.stdout) if planned.returncode == 0 else {}
    share = plan.get("gpu_memory_utilization")
    warned = next((w for w in plan.get("warnings") or [] if "gpu_memory_utilization" in w), "no warning")
    return [
        row("2b. user-data `write_files: 5`",
            f"problems: {'; '.join(p.what for p in extracted.problems)[:100] or 'none'}"),
        row("5. droplet tags setting api_key and tls: off",
            f"refused from tags: {', '.join(refused)}; tls stays {tagged.choice.tls}; instances from tags: "
            f"{tagged.choice.instances}"),
        row("7. gpu_memory_utilization 0.98 on a 20 GB RTX 4000 Ada",
            f"`kiln plan` exit {planned.returncode}: planned {share}; {warned[:90]}"),
    ]

