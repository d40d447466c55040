"""`kiln detect` (this machine's GPUs, a fixture, or a recording of them) and `kiln profiles list|show|validate`."""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

import yaml

from kiln.cli.output import print_json, table
from kiln.cli.views import machine_dict, machine_text, profile_row
from kiln.hardware.fixtures import fixture_names
from kiln.profiles.catalog import find_profile_dir, validate_paths
from kiln.wiring import Kiln

EXIT_REFUSED = 2


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    if name == "detect":
        parser.add_argument("--machine", help=f"a fixture ({', '.join(fixture_names())}) or a machine file")
        parser.add_argument("--list", action="store_true", help="list the machine fixtures")
        parser.add_argument("--record", type=Path, metavar="FILE",
                            help="write what NVML and the host answer as a machine file (read back with "
                                 "--machine FILE)")
        parser.add_argument("--json", action="store_true", help="print JSON for programs")
        return
    psub = parser.add_subparsers(dest="action", required=True)
    psub.add_parser("list", help="every profile in the catalog").add_argument(
        "--json", action="store_true", help="print JSON for programs")
    show = psub.add_parser("show", help="one profile in full")
    show.add_argument("name")
    show.add_argument("--json", action="store_true", help="print JSON for programs")
    val = psub.add_parser("validate", help="check profile files (default: the catalog)")
    val.add_argument("paths", nargs="*", type=Path)
    val.add_argument("--json", action="store_true", help="print JSON for programs")


def cmd_detect(kiln: Kiln, args: argparse.Namespace) -> int:
    if args.list:
        machines = kiln.fixtures()
        if args.json:
            print_json([machine_dict(m) for m in machines])
        else:
            print(table(["Fixture", "Droplet size", "GPUs", "Description"],
                        [[m.name, m.droplet_size or "-", f"{m.gpu_count}x {m.gpus[0].name}" if m.gpus else "-",
                          m.description] for m in machines]))
        return 0
    if args.record:
        return record(kiln, args)
    machine = kiln.machine(args.machine)
    print_json(machine_dict(machine)) if args.json else print(machine_text(machine))
    return 0


def record(kiln: Kiln, args: argparse.Namespace) -> int:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    name = (args.machine and Path(args.machine).stem) or socket.gethostname()
    data = kiln.record(args.machine, name, f"recorded by `kiln detect --record` on {name}, {when}")
    text = yaml.safe_dump(data, sort_keys=False, width=120, default_flow_style=None)
    args.record.write_text(f"# {data['description']}\n" + text, encoding="utf-8")
    gpus = len((data["nvml"] or {}).get("devices", []))
    if args.json:
        print_json({"file": str(args.record), "gpus": gpus, "nvml": data["nvml"] is not None})
    else:
        print(f"recorded {gpus} GPU(s) to {args.record}" + ("" if data["nvml"] else " (NVML did not start)")
              + f"; read it back with `kiln detect --machine {args.record}`")
    return 0


def cmd_profiles(kiln: Kiln, args: argparse.Namespace) -> int:
    if args.action == "validate":
        paths = args.paths or [kiln.profile_dir or find_profile_dir()]
        errors = validate_paths(paths, kiln.gpus.specs)
        if args.json:
            print_json({"ok": not errors, "errors": [e.as_dict() for e in errors]})
        else:
            for e in errors:
                print(e.message(), file=sys.stderr)
            print(f"{len(errors)} problem(s)" if errors else "all profiles valid")
        return EXIT_REFUSED if errors else 0
    catalog = kiln.catalog()
    if args.action == "list":
        profiles = [catalog.profiles[n] for n in catalog.names()]
        if args.json:
            print_json([p.model_dump(mode="json") for p in profiles])
        else:
            print(table(["Profile", "Params", "Checkpoints", "Context", "Speculative"],
                        [profile_row(p) for p in profiles]))
        return 0
    profile = catalog.get(args.name)
    if args.json:
        print_json(profile.model_dump(mode="json"))
    else:
        path = catalog.directory / f"{profile.name}.yaml"
        print(path.read_text(encoding="utf-8"))
    return 0
