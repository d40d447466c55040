"""`kiln choice`: the user's choice (user-data, tags, /etc/kiln/kiln.yaml) as the agent reads it at boot."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kiln.choice.resolve import resolve_choice
from kiln.choice.schema import SECRET_FIELDS
from kiln.choice.select import select_profile
from kiln.choice.sources import SourceReader
from kiln.cli.output import print_json, table
from kiln.wiring import Kiln


def add_arguments(_name: str, choice: argparse.ArgumentParser) -> None:
    choice.add_argument("--root", type=Path, default=Path("/"), help="read the sources under this folder")
    choice.add_argument("--json", action="store_true", help="print JSON for programs")


def cmd_choice(kiln: Kiln, args: argparse.Namespace) -> int:
    resolved = resolve_choice(SourceReader(root=args.root).read())
    choice = resolved.choice
    profile, selection_problems = select_profile(choice, kiln.catalog(), lambda model: kiln.profile(
        None, model, choice.hf_token, choice.revision))
    problems = [*resolved.problems, *selection_problems]
    if args.json:
        print_json({"choice": json.loads(resolved.choice.model_dump_json(exclude=set(SECRET_FIELDS))),
                    "api_key_set": resolved.choice.api_key is not None,
                    "hf_token_set": resolved.choice.hf_token is not None, "origins": dict(resolved.origins),
                    "profile": profile.name, "problems": [p.as_dict() for p in problems]})
        return 0
    values = resolved.choice.model_dump(exclude_none=True, exclude=set(SECRET_FIELDS))
    rows = [[k, v, resolved.origins.get(k, "")] for k, v in values.items()]
    rows += [[k, "(set, hidden)", resolved.origins.get(k, "")] for k in sorted(SECRET_FIELDS)
             if getattr(resolved.choice, k)]
    print(table(["Setting", "Value", "From"], rows) if rows else "No choice found: the image defaults apply.")
    print(f"\nServes: {profile.name}")
    for p in problems:
        print(f"problem: {p.text()}", file=sys.stderr)
    return 0
