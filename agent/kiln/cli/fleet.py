"""`kiln fleet`: droplets from a kiln image behind a DigitalOcean load balancer, through DigitalOcean's API."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

import requests

from kiln import datafiles
from kiln.choice.schema import Choice
from kiln.choice.sources import MAX_READ_BYTES, read_head
from kiln.cli.fleet_sizing import add_demand_arguments, check_demand, droplets_for, said
from kiln.cli.output import print_json, table
from kiln.errors import KilnError
from kiln.fleet import ops
from kiln.fleet.api import DigitalOcean
from kiln.fleet.spec import ANYWHERE, FleetSpec
from kiln.perf.workload import PRESETS as WORKLOAD_PRESETS
from kiln.planner.demand import demand_of_users, size
from kiln.planner.search import make_plan
from kiln.pricing import hourly_price
from kiln.setup.types import Refusal
from kiln.wiring import Kiln

SIZED_MACHINES = ("h100x1", "h100x8", "h200x1", "h200x8", "l40s", "b300x8")  # DigitalOcean's GPU droplet sizes


def add_arguments(_name: str, fleet: argparse.ArgumentParser) -> None:
    fsub = fleet.add_subparsers(dest="action", required=True)
    up = fsub.add_parser("up", help="create the fleet, or what it lacks; asks first, naming the price per hour")
    up.add_argument("--name", required=True, help="the fleet's name: its droplets are tagged kiln-fleet:NAME")
    up.add_argument("--size", required=True, help="a droplet size, e.g. gpu-h100x8-640gb")
    sized_by = up.add_mutually_exclusive_group(required=True)
    sized_by.add_argument("--count", type=int, help="how many droplets")
    add_demand_arguments(up, sized_by)  # or as many as carry it, by the droplets' own plan
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
    scale.add_argument("count", type=int, nargs="?", help="how many droplets (or --demand, --users)")
    add_demand_arguments(scale, scale.add_mutually_exclusive_group())
    scale.add_argument("--user-data", type=Path, help="user-data for new droplets (needed to grow)")
    scale.add_argument("--image", help="a snapshot id or image slug for new droplets (default: the fleet's first "
                       "droplet's image)")
    down = fsub.add_parser("down", help="delete the fleet's droplets, load balancer and firewall (asks first)")
    down.add_argument("name")
    status = fsub.add_parser("status", help="each droplet's state and health, and the load balancer's view")
    status.add_argument("name")
    plan = fsub.add_parser("plan", help="how many droplets of each size carry a demand within the latency budget, "
                                        "and their cost (no token needed)")
    add_demand_arguments(plan, plan.add_mutually_exclusive_group(required=True))
    plan.add_argument("--profile", help="a catalog profile")
    plan.add_argument("--model", help="a Hugging Face model (ORG/NAME) or a local folder")
    plan.add_argument("--machines", default=",".join(SIZED_MACHINES),
                      help=f"machine fixtures to compare (default: {','.join(SIZED_MACHINES)})")
    plan.add_argument("--workload", choices=[p for p in WORKLOAD_PRESETS if p != "batch"], default="serve",
                      help="the budget and request shape (default: serve)")
    for p in (up, scale, down, status, plan):
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


def _user_data(path: Path) -> str:
    """The droplets' user-data: a regular file of UTF-8 text, within what kiln reads of user-data at boot."""
    try:
        data = read_head(path)
        if len(data) > MAX_READ_BYTES:
            raise KilnError(f"--user-data {path} is larger than {MAX_READ_BYTES:,} bytes",
                            fix="keep user-data small: DigitalOcean allows 64 KiB")
        return data.decode("utf-8")
    except OSError as exc:
        raise KilnError(f"cannot read --user-data {path}: {exc.strerror or exc}",
                        fix="give a regular file of cloud-init user-data") from None
    except UnicodeDecodeError:
        raise KilnError(f"--user-data {path} is not UTF-8 text", fix="give a #cloud-config text file") from None


def cmd_fleet(_kiln: None, args: argparse.Namespace) -> int:
    if args.action == "plan":
        return cmd_fleet_plan(Kiln.create(), args)
    api = DigitalOcean.from_environment()
    sized: dict[str, Any] | None = None
    if args.action == "up":
        user_data = _user_data(args.user_data)
        count = args.count
        if count is None:
            count, sized = _sized_by_demand(args.size, user_data, args)
        spec = FleetSpec(args.name, size=args.size, count=count, region=args.region, image=args.image,
                         user_data=user_data, ssh_keys=tuple(args.ssh_key),
                         ssh_from=tuple(args.ssh_from) or ANYWHERE, certificate_id=args.certificate_id)
        result = ops.up(api, spec, _confirm(args, spec.name))
    elif args.action == "scale":
        user_data = _user_data(args.user_data) if args.user_data else ""
        spec = FleetSpec(args.name, user_data=user_data, image=args.image or "")
        if (args.count is None) == (args.demand is None and args.users is None):
            raise KilnError("give the fleet's new size: a count, or --demand R or --users N",
                            fix=f"e.g. `kiln fleet scale {args.name} 4`, or `--demand 20 --user-data FILE`")
        if args.count is None and not user_data:
            raise KilnError("sizing by demand plans what the droplets serve, which the user-data says",
                            fix="pass the fleet's --user-data FILE")
        if args.count is None:
            check_demand(args)  # before the fleet is read: a demand that cannot be sized asks nothing of the API

        def count_for(size_slug: str) -> int:  # the fleet's droplet size, from the one read of the fleet
            nonlocal sized
            droplets, sized = _sized_by_demand(size_slug, user_data, args)
            return droplets

        result = ops.scale(api, spec, args.count if args.count is not None else count_for, _confirm(args, args.name))
    elif args.action == "down":
        result = ops.down(api, FleetSpec(args.name), _confirm(args, args.name))
    else:
        result = ops.status(api, FleetSpec(args.name), probe_health)
        print_json(result) if args.json else print(status_text(result))
        return 0
    if args.json:
        print_json({**result, "sized_by_demand": sized})
    else:
        print(result["summary"] if not result["changed"] else "done:\n" + result["summary"])
        lb = result.get("load_balancer")
        if lb:
            print(f"load balancer {lb['id']}: {lb['status']}" + (f", https://{lb['ip']}" if lb.get("ip") else
                                                                 " (its address comes once it is active)"))
    return 0


def _sized_by_demand(size_slug: str, user_data: str, args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """The droplets that carry `args`' demand, said on stderr, and the sizing for --json."""
    sizing, demand = droplets_for(Kiln.create(), size_slug, user_data, args)
    print(said(sizing, demand), file=sys.stderr)
    return sizing.droplets, {**sizing.as_dict(), "demand_requests_per_s": round(demand, 3)}


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


def cmd_fleet_plan(kiln: Kiln, args: argparse.Namespace) -> int:
    """Each machine's plan for the workload, its capacity at the budget, and the droplets that carry the demand."""
    if not (args.profile or args.model):
        raise KilnError("name the model", fix="give --profile NAME or --model ORG/NAME")
    check_demand(args)
    profile = kiln.profile(args.profile, args.model)
    workload = WORKLOAD_PRESETS[args.workload].workload
    prices = datafiles.read_yaml("droplets.yaml")
    rows, refused = [], []
    for name in args.machines.split(","):
        machine = kiln.machine(name)
        plan = make_plan(machine, profile, Choice(), kiln.constants, workload=workload)
        if isinstance(plan, Refusal) or plan.predicted.capacity is None:
            refused.append({"machine": name, "why": plan.reason if isinstance(plan, Refusal) else "no capacity"})
            continue
        cap = plan.predicted.capacity
        demand = args.demand if args.demand is not None else demand_of_users(
            args.users, args.think_s, int(cap["streams"]), float(cap["requests_per_s"]))
        sized = size(demand, name, machine.droplet_size, f"{plan.layout()} {plan.quantization}", cap,
                     hourly_price(machine, prices), workload.output_len)
        if sized is None:
            refused.append({"machine": name, "why": f"one droplet carries no load at {workload.budget()}"})
            continue
        rows.append((demand, sized))
    rows.sort(key=lambda r: (r[1].usd_per_hour is None, r[1].usd_per_hour or 0.0))
    if args.json:
        print_json({"profile": profile.name, "workload": workload.as_dict(),
                    "options": [{**s.as_dict(), "demand_requests_per_s": round(d, 3)} for d, s in rows],
                    "refused": refused})
        return 0
    asked = (f"{args.demand:g} requests/s" if args.demand is not None
             else f"{args.users:,} users thinking {args.think_s:g} s between requests")
    print(f"{profile.name}: {asked} at {workload.budget()} ({workload.shape()})")
    print(table(["Droplet size", "Machine", "Setup", "Each carries", "Droplets", "$/hour", "$ per M output tok"],
                [[s.droplet_size or "-", s.machine, s.setup, f"{s.capacity_requests_per_s:,.2f} req/s",
                  s.droplets, "-" if s.usd_per_hour is None else f"{s.usd_per_hour:,.2f}",
                  "-" if s.usd_per_million_output_tokens is None else f"{s.usd_per_million_output_tokens:,.3f}"]
                 for _, s in rows]))
    for r in refused:
        print(f"{r['machine']}: {r['why']}")
    return 0
