"""`kiln`: detect the machine, browse profiles, plan vLLM serving.

A command's module is imported only when that command runs, with its arguments: `kiln --version` and `kiln status`
do not load the planner, the Hub client or the server."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from kiln import __version__
from kiln.cli.output import print_json
from kiln.errors import KilnError

EXIT_REFUSED = 2


@dataclass(frozen=True)
class Command:
    module: str  # kiln.cli.<module>, with add_arguments(name, parser) and the handler
    handler: str
    help: str
    wired: bool = True  # it plans or reads the catalog: the handler gets kiln's parts, else None


COMMANDS: dict[str, Command] = {
    "detect": Command("inventory", "cmd_detect", "show this machine's GPUs, or a named machine fixture"),
    "profiles": Command("inventory", "cmd_profiles", "list, show and validate model profiles"),
    "plan": Command("plan", "cmd_plan", "plan vLLM serving for a profile on a machine"),
    "choice": Command("choice", "cmd_choice", "show the user's choice as the agent reads it at boot"),
    "agent": Command("serving", "cmd_agent", "the boot agent (run by kiln-agent.service on the image)"),
    "up": Command("serving", "cmd_up", "serve in the foreground on this machine (a laptop: the tiny CPU model)"),
    "status": Command("status", "cmd_status", "what the agent serves, its health, and where the API key is",
                      wired=False),
    "doctor": Command("doctor", "cmd_doctor",
                      "check the driver, fabric manager, GPU health, links, disk and /dev/shm"),
    "bench": Command("bench", "cmd_bench", "measure an endpoint: TTFT/TPOT/throughput per concurrency, and cost"),
    "image": Command("image", "cmd_image", "bake a kiln machine image, or boot-test one"),
    "models": Command("models", "cmd_models", "bake models into an image"),
    "keys": Command("keys", "cmd_keys", "the endpoint's named API keys (root): list, add, rotate, revoke",
                    wired=False),
    "reload": Command("keys", "cmd_reload",
                      "re-read /etc/kiln/kiln.yaml and the keys; nothing restarts for keys, rates or the certificate",
                      wired=False),
    "predict": Command("predict", "cmd_predict", "predict throughput and latency of a setup for a workload"),
    "fleet": Command("fleet", "cmd_fleet", "droplets behind a DigitalOcean load balancer (reads DIGITALOCEAN_TOKEN)",
                     wired=False),
}


def _module(command: Command) -> ModuleType:
    return importlib.import_module(f"kiln.cli.{command.module}")


class _Commands(argparse._SubParsersAction):  # type: ignore[type-arg]
    """The subcommands, each given its arguments only once it is chosen (or all of them, for a full parser)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.filled: set[str] = set()

    def fill(self, name: str) -> None:
        if name not in self.filled:
            self.filled.add(name)
            _module(COMMANDS[name]).add_arguments(name, self._name_parser_map[name])

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        if isinstance(values, Sequence) and values and values[0] in COMMANDS:
            self.fill(str(values[0]))
        super().__call__(parser, namespace, values, option_string)


def build_parser(*, full: bool = False) -> argparse.ArgumentParser:
    """kiln's command line; `full` adds every command's arguments now instead of when the command is chosen."""
    parser = argparse.ArgumentParser(prog="kiln", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    parser.add_argument("--profiles-dir", type=Path, help="profile catalog folder (default: found automatically)")
    sub = parser.add_subparsers(dest="command", required=True, action=_Commands)
    for name, command in COMMANDS.items():
        sub.add_parser(name, help=command.help, description=command.help)
    if full:
        for name in COMMANDS:
            sub.fill(name)  # type: ignore[attr-defined]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = COMMANDS[args.command]
    try:
        handler = getattr(_module(command), command.handler)
        # The parts are put together only for a command that uses them.
        kiln = importlib.import_module("kiln.wiring").Kiln.create(args.profiles_dir) if command.wired else None
        code: int = handler(kiln, args)
        return code
    except KilnError as exc:
        if getattr(args, "json", False):
            print_json(exc.as_dict())
        print(f"kiln: {exc.message()}", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        print("kiln: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`kiln plan --json | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
