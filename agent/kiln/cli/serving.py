"""`kiln agent run|exec`, `kiln up` and `kiln status`: the serving runtime's commands."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
from pathlib import Path

import psutil

from kiln.choice.resolve import merge, resolve_choice, settings_file_layer
from kiln.choice.schema import Choice, Layer
from kiln.choice.sources import SourceReader
from kiln.cli.locate import default_state_dir
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
from kiln.serve.processes.router import ROUTER_POLICIES, RouterSettings
from kiln.serve.reports.selfcheck import SelfCheckSettings
from kiln.wiring import Kiln

EXIT_UNAVAILABLE = 2
PROXY_USER = "www-data"  # nginx's workers on the image: Debian's web user, who can read none of kiln's secrets


def tcp_port(text: str) -> int:
    """A TCP port, refused at the command line (argparse's usage error) when out of range."""
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1 to 65535)")
    return value


def _add_ports(p: argparse.ArgumentParser, port: int, http_port: int | None) -> None:
    p.add_argument("--state-dir", type=Path, help="plan, API keys, certificate, logs and made models (default: "
                                                  f"{default_state_dir()})")
    p.add_argument("--port", type=tcp_port, default=port, help=f"the public OpenAI endpoint, HTTPS (default {port})")
    p.add_argument("--http-port", type=int, default=http_port,
                   help="plain HTTP: the ACME challenge and a redirect, or the API with TLS off"
                        + (f" (default {http_port})" if http_port else " (default: none)"))
    p.add_argument("--health-port", type=tcp_port, default=HEALTH_PORT, help="the local health endpoint")
    p.add_argument("--router-port", type=tcp_port, default=ROUTER_PORT, help="vllm-router (localhost)")
    p.add_argument("--router-metrics-port", type=tcp_port, default=ROUTER_METRICS_PORT)
    p.add_argument("--instance-port", type=tcp_port, help="the first vLLM instance's port (localhost), the next ones "
                                                    "after it (default: the plan's, 8100)")
    p.add_argument("--machine", help="plan for a fixture or machine file instead of this machine's GPUs")
    p.add_argument("--router-policy", choices=ROUTER_POLICIES, default=RouterSettings.policy,
                   help="how vllm-router spreads requests over the instances")


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    if name == "agent":
        asub = parser.add_subparsers(dest="action", required=True)
        run = asub.add_parser("run", help="detect, plan, serve and supervise until stopped")
        _add_ports(run, PUBLIC_PORT, HTTP_PORT)
        run.add_argument("--root", type=Path, default=Path("/"), help="read the user's choice under this folder")
        run.add_argument("--public-host", default="0.0.0.0", help="address the public endpoint binds")
        run.add_argument("--motd", type=Path, default=Path("/run/motd.d/kiln"), help="where to show the endpoint")
        run.add_argument("--launcher", choices=["auto", "systemd", "process"], default="auto",
                         help="each server as its systemd unit, or as the agent's child (auto: systemd when the "
                              "agent runs as a systemd service)")
        run.add_argument("-v", "--verbose", action="store_true")
        exe = asub.add_parser("exec", help="replace this process by a planned server (the systemd units' ExecStart)")
        exe.add_argument("name", help="proxy, router or an instance name from runtime.json")
        exe.add_argument("--state-dir", type=Path, default=ServeLayout().state_dir)
        return
    up = parser
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


def _layout(args: argparse.Namespace, default_state: Path, public_host: str) -> ServeLayout:
    return ServeLayout(state_dir=(args.state_dir or default_state).expanduser().resolve(), public_host=public_host,
                       public_port=args.port, http_port=args.http_port or None, router_port=args.router_port,
                       router_metrics_port=args.router_metrics_port, health_port=args.health_port,
                       first_instance_port=args.instance_port)


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
    return [settings_file_layer(path, "fix the file, then `kiln reload`")]


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
    layout = _layout(args, default_state_dir(), args.host)
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
    found = "" if layout.health_port == HEALTH_PORT else f" --health {layout.health_url}"  # else the default's
    print(f"  endpoint  {layout.endpoint_url(options.advertised_host, args.tls != 'off')}/v1   (OpenAI API; "
          f"keys: `kiln keys list{found}`)")
    print(f"  health    {layout.health_url}/status   (`kiln status{found}`)")
    print(f"  logs      {layout.log_dir}/")
    print("Ctrl-C stops everything.", flush=True)
    return _serve(agent)
