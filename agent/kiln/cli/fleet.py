"""`kiln fleet`: droplets from a kiln image behind a DigitalOcean load balancer, through DigitalOcean's API."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

import requests

from kiln.cli.output import print_json, table
from kiln.fleet import ops
from kiln.fleet.api import DigitalOcean
from kiln.fleet.spec import ANYWHERE, FleetSpec


def add_arguments(_name: str, fleet: argparse.ArgumentParser) -> None:
    fsub = fleet.add_subparsers(dest="action", required=True)
    up = fsub.add_parser("up", help="create the fleet, or what it lacks; asks first, naming the price per hour")
    up.add_argument("--name", required=True, help="the fleet's name: its droplets are tagged kiln-fleet:NAME")
    up.add_argument("--size", required=True, help="a droplet size, e.g. gpu-h100x8-640gb")
    up.add_argument("--count", type=int, required=True, help="how many droplets")
    up.add_argument("--region", required=True, help="e.g. nyc2, tor1, atl1")
    up.add_argument("--image", required=True,
                    help="the kiln image's snapshot id (`kiln image build --target digitalocean`)")
    up.add_argument("--user-data", type=Path, required=True, help="cloud-init user-data for every droplet")
    up.add_argument("--ssh-key", action="append", default=[], help="an SSH key's id or fingerprint (repeatable)")
    up.add_argument("--ssh-from", action="append", default=[], metavar="CIDR",
                    help="addresses that may reach SSH (repeatable; default: anywhere)")
    up.add_argument("--certificate-id", help="a DigitalOcean certificate: the load balancer terminates TLS with it "
                    "(default: TLS passes through to the droplets)")
    scale = fsub.add_parser("scale", help="grow or shrink the fleet to COUNT droplets")
    scale.add_argument("name")
    scale.add_argument("count", type=int)
    scale.add_argument("--user-data", type=Path, help="user-data for new droplets (needed to grow)")
    scale.add_argument("--image", help="a snapshot id or image slug for new droplets (default: the fleet's first "
                       "droplet's image)")
    down = fsub.add_parser("down", help="delete the fleet's droplets, load balancer and firewall (asks first)")
    down.add_argument("name")
    status = fsub.add_parser("status", help="each droplet's state and health, and the load balancer's view")
    status.add_argument("name")
    for p in (up, scale, down, status):
        p.add_argument("--json", action="store_true", help="print JSON for programs")
    for p in (up, scale, down):
        p.add_argument("--yes", action="store_true", help="do not ask; for scripts that have read the price")


def _confirm(args: argparse.Namespace, name: str) -> ops.Confirm:
    def ask(summary: str) -> bool:
        if args.yes:
            return True
        print(summary, file=sys.stderr)
        print(f"Type the fleet's name ({name}) to go on: ", end="", file=sys.stderr, flush=True)
        answer = sys.stdin.readline()
        return answer.strip() == name
    return ask


def probe_health(address: str) -> str:
    """The droplet's public /health: the load balancer's own check (no key; the certificate may be its own)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            reply = requests.get(f"https://{address}/health", timeout=3, verify=False)
        except requests.RequestException as exc:
            return f"no answer ({exc.__class__.__name__})"
    return "serving" if reply.status_code == 200 else f"not serving ({reply.status_code})"


def cmd_fleet(_kiln: None, args: argparse.Namespace) -> int:
    api = DigitalOcean.from_environment()
    if args.action == "up":
        spec = FleetSpec(args.name, size=args.size, count=args.count, region=args.region, image=args.image,
                         user_data=args.user_data.read_text(encoding="utf-8"), ssh_keys=tuple(args.ssh_key),
                         ssh_from=tuple(args.ssh_from) or ANYWHERE, certificate_id=args.certificate_id)
        result = ops.up(api, spec, _confirm(args, spec.name))
    elif args.action == "scale":
        user_data = args.user_data.read_text(encoding="utf-8") if args.user_data else ""
        spec = FleetSpec(args.name, user_data=user_data, image=args.image or "")
        result = ops.scale(api, spec, args.count, _confirm(args, args.name))
    elif args.action == "down":
        result = ops.down(api, FleetSpec(args.name), _confirm(args, args.name))
    else:
        result = ops.status(api, FleetSpec(args.name), probe_health)
        print_json(result) if args.json else print(status_text(result))
        return 0
    if args.json:
        print_json(result)
    else:
        print(result["summary"] if not result["changed"] else "done:\n" + result["summary"])
        lb = result.get("load_balancer")
        if lb:
            print(f"load balancer {lb['id']}: {lb['status']}" + (f", https://{lb['ip']}" if lb.get("ip") else
                                                                 " (its address comes once it is active)"))
    return 0


def status_text(result: dict[str, Any]) -> str:
    rows = [[d["name"], d["status"], d["public_ip"] or "-", d["private_ip"] or "-", d["health"],
             "yes" if d["behind_load_balancer"] else "no"] for d in result["droplets"]]
    lb = result["load_balancer"]
    lines = [f"fleet {result['fleet']} (tag {result['tag']}): {len(rows)} droplet(s)",
             table(["Droplet", "State", "Public IP", "Private IP", "/health", "Behind LB"], rows) if rows else "",
             "load balancer: " + (f"{lb['status']}, {lb['ip'] or 'no address yet'}, targets "
                                  f"{len(lb['droplet_ids'])} droplet(s)" if lb else "none"),
             "firewall: " + (result["firewall"]["status"] if result["firewall"] else "none")]
    return "\n".join(line for line in lines if line)
