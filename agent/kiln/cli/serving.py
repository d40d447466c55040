"""`kiln agent run|exec`, `kiln up` and `kiln status`: the serving runtime's commands."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
from pathlib import Path
from typing import Any

import psutil
import requests

from kiln.choice.resolve import merge, resolve_choice
from kiln.choice.schema import Choice, Layer, Problem, validate_fields
from kiln.choice.sources import SourceReader
from kiln.cli.output import print_json, table
from kiln.cluster.discovery import DO_API_URL
from kiln.datafiles import vllm_serve_launcher
from kiln.errors import KilnError, NotFoundError
from kiln.render.vllm import IMAGE_VLLM, MODULE_VLLM, find_vllm_python, image_vllm_command
from kiln.serve.agent import Agent, AgentOptions, configure_logging
from kiln.serve.cluster_node import ClusterOptions
from kiln.serve.layout import (
    HEALTH_PORT,
    HTTP_PORT,
    LOCAL_PORT,
    PUBLIC_PORT,
    ROUTER_METRICS_PORT,
    ROUTER_PORT,
    ServeLayout,
)
from kiln.serve.router import ROUTER_POLICIES, RouterSettings
from kiln.serve.selfcheck import SelfCheckSettings
from kiln.validation import YamlError, parse_yaml
from kiln.wiring import Kiln

EXIT_UNAVAILABLE = 2
PROXY_USER = "www-data"  # nginx's workers on the image: Debian's web user, who can read none of kiln's secrets


def _add_ports(p: argparse.ArgumentParser, port: int, http_port: int | None) -> None:
    p.add_argument("--state-dir", type=Path, help="plan, API keys, certificate, logs and made models")
    p.add_argument("--port", type=int, default=port, help=f"the public OpenAI endpoint, HTTPS (default {port})")
    p.add_argument("--http-port", type=int, default=http_port,
                   help="plain HTTP: the ACME challenge and a redirect, or the API with TLS off"
                        + (f" (default {http_port})" if http_port else " (default: none)"))
    p.add_argument("--health-port", type=int, default=HEALTH_PORT, help="the local health endpoint")
    p.add_argument("--router-port", type=int, default=ROUTER_PORT, help="vllm-router (localhost)")
    p.add_argument("--router-metrics-port", type=int, default=ROUTER_METRICS_PORT)
    p.add_argument("--machine", help="plan for a fixture or machine file instead of this machine's GPUs")
    p.add_argument("--router-policy", choices=ROUTER_POLICIES, default=RouterSettings.policy,
                   help="how vllm-router spreads requests over the instances")


def add_parsers(sub: Any) -> None:
    agent = sub.add_parser("agent", help="the boot agent (run by kiln-agent.service on the image)")
    asub = agent.add_subparsers(dest="action", required=True)
    run = asub.add_parser("run", help="detect, plan, serve and supervise until stopped")
    _add_ports(run, PUBLIC_PORT, HTTP_PORT)
    run.add_argument("--root", type=Path, default=Path("/"), help="read the user's choice under this folder")
    run.add_argument("--public-host", default="0.0.0.0", help="address the public endpoint binds")
    run.add_argument("--motd", type=Path, default=Path("/run/motd.d/kiln"), help="where to show the endpoint")
    run.add_argument("--launcher", choices=["auto", "systemd", "process"], default="auto",
                     help="each server as its systemd unit, or as the agent's child (auto: systemd when the agent "
                          "runs as a systemd service)")
    run.add_argument("-v", "--verbose", action="store_true")
    exe = asub.add_parser("exec", help="replace this process by a planned server (the systemd units' ExecStart)")
    exe.add_argument("name", help="proxy, router or an instance name from runtime.json")
    exe.add_argument("--state-dir", type=Path, default=ServeLayout().state_dir)

    up = sub.add_parser("up", help="serve in the foreground on this machine (a laptop: the tiny CPU model)")
    _add_ports(up, LOCAL_PORT, None)
    up.add_argument("--profile", default="tiny-cpu", help="the profile to serve (default: tiny-cpu)")
    up.add_argument("--instances", type=int, help="vLLM instances (default: 2 for tiny-cpu)")
    up.add_argument("--host", default="127.0.0.1", help="address the public endpoint binds (default: localhost)")
    up.add_argument("--api-key", help="the endpoint's key (default: generated and kept in the state folder)")
    up.add_argument("--tls", choices=["self-signed", "off"], default="self-signed",
                    help="HTTPS with a certificate made for this machine (default), or plain HTTP")
    up.add_argument("--config", type=Path, help="a settings file like /etc/kiln/kiln.yaml, over these options; "
                                                "`kiln reload` re-reads it")
    up.add_argument("--price-per-hour", type=float, help="USD per hour, for the cost per million tokens")
    up.add_argument("--no-self-check", action="store_true", help="skip the short load test once the instances serve")
    up.add_argument("-v", "--verbose", action="store_true")

    status = sub.add_parser("status", help="what the agent serves, its health, and where the API key is")
    status.add_argument("--health", help=f"the health endpoint (default: the agent's of --state-dir, else "
                                         f"http://127.0.0.1:{HEALTH_PORT})")
    status.add_argument("--state-dir", type=Path, default=ServeLayout().state_dir,
                        help="the agent's folder, as given to `kiln up` (default: the image's)")
    status.add_argument("--json", action="store_true", help="print JSON for programs")
    status.add_argument("--certificate", action="store_true",
                        help="print the endpoint's certificate (PEM), for a client to pin")


def _layout(args: argparse.Namespace, default_state: Path, public_host: str) -> ServeLayout:
    return ServeLayout(state_dir=(args.state_dir or default_state).expanduser().resolve(), public_host=public_host,
                       public_port=args.port, http_port=args.http_port or None, router_port=args.router_port,
                       router_metrics_port=args.router_metrics_port, health_port=args.health_port)


def _primary_address() -> str:
    """The first non-loopback IPv4 address: what the endpoint is reached at."""
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family.name == "AF_INET" and not a.address.startswith("127."):
                return str(a.address)
    return "127.0.0.1"


def _machine_names() -> tuple[str, ...]:
    """What a client may reach this machine by: its addresses and host name, and localhost."""
    names: list[str] = []
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family.name in ("AF_INET", "AF_INET6") and "%" not in a.address:
                names.append(str(a.address))
    host = socket.gethostname().lower()
    if re.match(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$", host):
        names.append(host)
    return tuple(dict.fromkeys([*names, "localhost"]))


def _serve(agent: Agent) -> int:
    def stop(_signum: int, _frame: object) -> None:
        agent.stop()

    def reload(_signum: int, _frame: object) -> None:
        agent.request_reload()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, reload)
    signal.signal(signal.SIGUSR1, lambda _signum, _frame: agent.request_renewal())
    return agent.run()


def cmd_agent(kiln: Kiln, args: argparse.Namespace) -> int:
    if args.action == "exec":
        return exec_planned(args.state_dir, args.name)
    configure_logging(args.verbose)
    layout = _layout(args, ServeLayout().state_dir, args.public_host)
    systemd = _use_systemd(args.launcher)
    options = AgentOptions(layout=layout, read_choice=lambda: resolve_choice(SourceReader(root=args.root).read()),
                           machine=args.machine, vllm_command=_agent_vllm(), advertised_host=_primary_address(),
                           motd_file=args.motd, systemd=systemd, proxy_user=PROXY_USER if systemd else None,
                           router=RouterSettings(policy=args.router_policy), process_started=_process_started(),
                           tls_names=_machine_names(), cluster=_cluster_options(firewall=systemd))
    return _serve(Agent(kiln, options))


def _cluster_options(*, firewall: bool) -> ClusterOptions:
    """DIGITALOCEAN_API_URL points the search for the cluster's droplets at another API address."""
    return ClusterOptions(firewall=firewall, do_api_url=os.environ.get("DIGITALOCEAN_API_URL", DO_API_URL))


def _config_layer(path: Path | None) -> list[Layer]:
    """The settings file of `kiln up --config`, read at start and at every reload; absent: nothing."""
    if path is None or not path.exists():
        return []
    try:
        return [validate_fields(parse_yaml(path.read_text(encoding="utf-8")), source=str(path))]
    except (OSError, YamlError) as exc:
        return [Layer(str(path), problems=(Problem(str(path), "", str(exc), "fix the file, then `kiln reload`"),))]


def _process_started() -> float:
    """When this process began (epoch seconds): the agent's start-up counts Python and its imports too."""
    return psutil.Process().create_time()


def _agent_vllm() -> tuple[str, ...]:
    """The image's vLLM, or where there is none (a development machine), the vLLM this Python can import."""
    if not Path(IMAGE_VLLM[0]).exists():
        return (find_vllm_python(), *MODULE_VLLM)
    return image_vllm_command(Path(IMAGE_VLLM[0]).parent.parent, vllm_serve_launcher())


def _use_systemd(launcher: str) -> bool:
    if launcher == "auto":
        return "INVOCATION_ID" in os.environ and Path("/run/systemd/system").is_dir()
    return launcher == "systemd"


def exec_planned(state_dir: Path, name: str) -> int:
    runtime = ServeLayout(state_dir=state_dir).runtime_file
    try:
        processes = json.loads(runtime.read_text(encoding="utf-8"))["processes"]
    except (OSError, ValueError, KeyError) as exc:
        raise KilnError(f"cannot read {runtime}: {exc}", fix="start kiln-agent.service; it writes this file") from exc
    spec = next((p for p in processes if p["name"] == name), None)
    if spec is None:
        raise NotFoundError(f"no process named {name!r} in {runtime}",
                            fix=f"one of: {', '.join(p['name'] for p in processes)}")
    os.execve(spec["argv"][0], spec["argv"], {**os.environ, **spec["env"]})
    return 0  # not reached


def cmd_up(kiln: Kiln, args: argparse.Namespace) -> int:
    configure_logging(args.verbose)
    state_home = Path(os.environ.get("XDG_STATE_HOME", "~/.local/state")).expanduser()
    layout = _layout(args, state_home / "kiln", args.host)
    instances = args.instances or (2 if args.profile == "tiny-cpu" else None)
    choice = Choice(profile=args.profile, instances=instances, api_key=args.api_key,
                    price_per_hour=args.price_per_hour, tls=args.tls)
    given = Layer("command line", {k: getattr(choice, k) for k in choice.model_dump(exclude_none=True)})
    options = AgentOptions(layout=layout, read_choice=lambda: merge([given, *_config_layer(args.config)]),
                           machine=args.machine, vllm_command=(find_vllm_python(), *MODULE_VLLM),
                           advertised_host=args.host if args.host != "0.0.0.0" else _primary_address(),
                           router=RouterSettings(policy=args.router_policy), process_started=_process_started(),
                           self_check=None if args.no_self_check else SelfCheckSettings(),
                           tls_names=("127.0.0.1", "localhost", *((args.host,) if args.host != "0.0.0.0" else
                                                                  _machine_names())),
                           cluster=_cluster_options(firewall=False))
    agent = Agent(kiln, options)
    print(f"kiln up: {args.profile} on this machine; state in {layout.state_dir}")
    print(f"  endpoint  {layout.endpoint_url(options.advertised_host, args.tls != 'off')}/v1   (OpenAI API; "
          f"keys: `kiln keys list --state-dir {layout.state_dir}`)")
    print(f"  health    {layout.health_url}/status   (`kiln status --health {layout.health_url}`)")
    print(f"  logs      {layout.log_dir}/")
    print("Ctrl-C stops everything.", flush=True)
    return _serve(agent)


def cmd_status(_kiln: Kiln, args: argparse.Namespace) -> int:
    base = ServeLayout(state_dir=args.state_dir).health_of(args.health).rstrip("/")
    try:
        reply = requests.get(f"{base}/status", timeout=5)
        reply.raise_for_status()
        status: dict[str, Any] = reply.json()
    except requests.RequestException as exc:
        raise KilnError(f"no kiln agent answers at {base}: {exc.__class__.__name__}",
                        fix="start it: `systemctl start kiln-agent` on the image, or `kiln up` on a laptop") from exc
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


def status_text(s: dict[str, Any]) -> str:
    plan = s.get("plan") or {}
    keys = ", ".join(k["name"] + (f" ({k['requests_per_minute']}/min)" if k.get("requests_per_minute") else "")
                     for k in s.get("keys") or [])
    worker = (s.get("cluster") or {}).get("role") == "worker"
    served = f"on the head, {s['cluster']['head']}" if worker else f"{s.get('endpoint')}/v1"
    lines = [f"phase     {s.get('phase')}", f"endpoint  {served}",
             f"api keys  {keys or '(none yet)'}  (`sudo kiln keys show NAME` prints one)",
             f"health    {s.get('health')}"]
    if s.get("tls"):
        lines.append(tls_line(s["tls"]))
    if plan:
        stages = f" x PP{plan['pipeline_parallel_size']}" if plan.get("pipeline_parallel_size", 1) > 1 else ""
        lines.append(f"serving   {plan.get('profile')} ({plan.get('quantization')}, "
                     f"TP{plan.get('tensor_parallel_size')}{stages} x {len(plan.get('instances', []))})")
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
