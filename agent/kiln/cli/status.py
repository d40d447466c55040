"""`kiln status`: what the local agent serves, its health, and where its keys are."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import requests

from kiln.cli.locate import locate
from kiln.cli.output import print_json, table
from kiln.errors import KilnError
from kiln.serve.layout import HEALTH_PORT
from kiln.setup.headline import headline_of

EXIT_UNAVAILABLE = 2


def add_arguments(_name: str, status: argparse.ArgumentParser) -> None:
    status.add_argument("--health", help=f"the agent's health endpoint (default: the one of --state-dir's agent, "
                                         f"else http://127.0.0.1:{HEALTH_PORT})")
    status.add_argument("--state-dir", type=Path, help="the agent's folder (default: the running agent's)")
    status.add_argument("--json", action="store_true", help="print JSON for programs")
    status.add_argument("--certificate", action="store_true",
                        help="print the endpoint's certificate (PEM), for a client to pin")


def cmd_status(_kiln: None, args: argparse.Namespace) -> int:
    agent = locate(args.state_dir, args.health)
    base = agent.health.rstrip("/")
    try:
        reply = requests.get(f"{base}/status", timeout=5)
        reply.raise_for_status()
        status: dict[str, Any] = reply.json()
    except (requests.RequestException, ValueError) as exc:
        raise KilnError(f"no kiln agent answers at {base}: {exc.__class__.__name__}",
                        fix="start it: `systemctl start kiln-agent` on the image, or `kiln up` on a laptop; "
                            "an agent on another port: --health URL") from exc
    if not agent.running and args.state_dir is not None:
        raise KilnError(f"the agent answering at {base} is not the one of {agent.state_dir} "
                        f"(its folder: {status.get('state_dir') or 'not named'})",
                        fix="name that agent's own --health URL, or drop --state-dir")
    if args.certificate:
        path = (status.get("tls") or {}).get("certificate")
        if not path:
            raise KilnError("the endpoint serves no certificate (TLS is off, or the agent has not started serving)",
                            fix="see `kiln status`")
        print(Path(path).read_text(encoding="utf-8"), end="")
        return 0
    if args.json:
        print_json(status)
        return 0
    print(agent.said(), file=sys.stderr)
    print(status_text(status))
    return 0 if status.get("phase") in ("ready", "starting", "downloading", "degraded", "joining") else EXIT_UNAVAILABLE


def download_bar(d: dict[str, Any], width: int = 30) -> str:
    """`org/model [#########.....] 1.2/4.0 GiB 210.5 MiB/s, 14 s left`"""
    total, done = int(d.get("bytes_total") or 0), int(d.get("bytes_done") or 0)
    filled = width * done // total if total else width
    eta = d.get("eta_s")
    rate = f" {int(d.get('rate_bytes_per_s') or 0) / 2**20:.1f} MiB/s" if done < total else " done"
    return (f"{d.get('repo')} [{'#' * filled}{'.' * (width - filled)}] {done / 2**30:.2f}/{total / 2**30:.2f} GiB"
            + rate + (f", {eta:.0f} s left" if eta and done < total else ""))


def startup_lines(startup: dict[str, Any]) -> list[str]:
    """The start-up timeline: the agent's own steps, then each instance's vLLM phases."""
    lines: list[str] = []
    agent = startup.get("agent")
    if agent:
        steps = ", ".join(f"{st['step']} {st['seconds']:.2f} s" for st in agent["steps"])
        lines += ["", f"start-up  the agent's own share {agent['own_s']:.2f} s ({steps})"]
    for name, timeline in sorted((startup.get("instances") or {}).items()):
        phases = ", ".join(f"{p['phase']} {p['seconds']:.1f} s" + (f" ({p['gib']:.2f} GiB)" if "gib" in p else "")
                           for p in timeline["phases"])
        ready = f"ready in {timeline['ready_s']:.1f} s" if timeline.get("ready_s") is not None else "starting"
        cache = f", compile cache {timeline['compile_cache']}" if timeline.get("compile_cache") else ""
        lines.append(f"  {name}: {ready}{cache}: {phases or 'no phase logged yet'}")
    return lines


def tls_line(tls: dict[str, Any]) -> str:
    if tls.get("mode") == "off":
        return "tls       off: plain HTTP (safe only behind a load balancer that terminates TLS)"
    line = (f"tls       {tls.get('mode')}" + (f" for {tls['domain']}" if tls.get("domain") else "")
            + f": {tls.get('certificate')}, SHA-256 {tls.get('sha256')}, until {str(tls.get('not_after'))[:10]}")
    if tls.get("self_signed"):
        line += " (pin it: `kiln status --certificate`)"
    problem = tls.get("problem")
    return line + (f"\n          problem: {problem['error']} (fix: {problem['fix']})" if problem else "")


def cluster_lines(c: dict[str, Any] | None) -> list[str]:
    """This node's part of a cluster; on the head, every node."""
    if not c:
        return []
    generation = f", engine generation {c['generation']}" if "generation" in c else ""
    lines = ["", f"cluster   {c['name']}: {c['role']}, rank {c['rank']} of {c['nodes']}, head {c['head']} "
                 f"(found by {c['found_by']}){generation}"]
    members = c.get("members") or []
    if c.get("role") == "head" and members:
        lines.append(table(["Rank", "Node", "Address", "Up", "Joined", "GPUs"], [
            [m["rank"], m.get("name") or "-", m.get("address") or "-", "yes" if m.get("up") else "NO",
             "yes" if m.get("joined") else "no", len(m.get("gpus") or [])] for m in members]))
    return lines


def model_lines(models: list[dict[str, Any]]) -> list[str]:
    """Several models: each one's names, GPUs (or share of one), instances and predicted capacity."""
    lines = []
    for m in models:
        plan = m.get("plan") or {}
        where = f"GPUs {','.join(map(str, m['gpus']))}" if m.get("gpus") else "CPU"
        if m.get("memory_share"):
            where += f" ({m['memory_share']:g} of its memory)"
        instances = ", ".join(i["name"] for i in plan.get("instances", []))
        lines.append(f"serving   {', '.join(m.get('served_names') or [m['name']])}: {m.get('task')}, {where}, "
                     f"{instances}")
        capacity = (plan.get("predicted") or {}).get("capacity")
        if capacity:
            lines.append(f"            predicted {headline_of(capacity)}")
    return lines


def status_text(s: dict[str, Any]) -> str:
    plan = s.get("plan") or {}
    keys = ", ".join(k["name"] + (f" ({k['requests_per_minute']}/min)" if k.get("requests_per_minute") else "")
                     for k in s.get("keys") or [])
    worker = (s.get("cluster") or {}).get("role") == "worker"
    served = f"on the head, {s['cluster']['head']}" if worker else f"{s.get('endpoint')}/v1"
    lines = [f"phase     {s.get('phase')}", f"endpoint  {served}",
             f"api keys  {keys or '(none yet)'}  (`sudo kiln keys show NAME` prints one)",
             f"health    {s.get('health')}"] + ([f"state     {s['state_dir']}"] if s.get("state_dir") else [])
    if s.get("tls"):
        lines.append(tls_line(s["tls"]))
    if plan and plan.get("models"):
        lines += model_lines(plan["models"])
    elif plan:
        stages = f" x PP{plan['pipeline_parallel_size']}" if plan.get("pipeline_parallel_size", 1) > 1 else ""
        lines.append(f"serving   {plan.get('profile')} ({plan.get('quantization')}, "
                     f"TP{plan.get('tensor_parallel_size')}{stages} x {len(plan.get('instances', []))})")
        capacity = (plan.get("predicted") or {}).get("capacity")
        if capacity:
            lines.append(f"predicted {headline_of(capacity)}")
    download = s.get("download")
    if download:
        baked = download.get("state") == "baked"
        lines.append(f"download  {download['detail'] + ': nothing to download' if baked else download_bar(download)}")
    cache = s.get("cache")
    if cache:
        lines.append(f"cache     {cache['root']} on the {cache['disk']} disk ({cache['device']}, "
                     f"{int(cache['free_bytes']) / 2**30:,.0f} GiB free): {cache['reason']}")
    serving = s.get("serving") or {}
    cost = serving.get("usd_per_million_output_tokens")
    lines.append(f"rate      {serving.get('output_tokens_per_s', 0)} output tokens/s"
                 + (f", ${cost:.4f} per million at ${serving.get('usd_per_hour')}/h" if cost is not None else ""))
    rows = [[m["name"], m.get("port") or "-", m.get("pid") or "-", m["state"], m["restarts"],
             "yes" if m.get("routed") else "-"] for m in [*s.get("instances", []), *s.get("services", [])]]
    if rows:
        lines += ["", table(["Process", "Port", "PID", "State", "Restarts", "Routed"], rows)]
    lines += cluster_lines(s.get("cluster"))
    gpus = s.get("gpus") or []
    if gpus:
        lines += ["", table(["GPU", "Util %", "Memory GiB", "Temp C", "Power W"],
                            [[g["index"], g["utilization_percent"], f"{(g['memory_used_bytes'] or 0) / 2**30:.1f}",
                              g["temperature_c"], g["power_w"]] for g in gpus])]
    if plan.get("explanation"):
        lines += ["", "why: " + plan["explanation"]]
    lines += startup_lines(s.get("startup") or {})
    doctor = s.get("doctor") or {}
    if doctor:
        lines += ["", f"pre-flight {doctor.get('verdict')} (`kiln doctor` for the full report)"]
        lines += [f"  {c['status'].upper()} {c['check']}: {c['detail']}\n    fix: {c.get('fix', '')}"
                  for c in doctor.get("checks", []) if c["status"] in ("warn", "fail")]
    err = s.get("last_error")
    if err:
        lines += ["", f"last error: {err['error']}", f"  fix: {err['fix']}"]
    return "\n".join(lines)
