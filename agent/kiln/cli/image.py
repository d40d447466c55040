"""`kiln image build` (local Debian qcow2 by default, or a DigitalOcean snapshot) and `kiln image smoke`."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from kiln import __version__
from kiln.cli.output import print_json
from kiln.errors import ConfigError
from kiln.image import local, packer, recipe, smoke
from kiln.image.tools import find_ansible_playbook, find_repo
from kiln.image.vm import SmokeTest
from kiln.wiring import Kiln


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError("expected KEY=VALUE")
    return key, value


def _extra_var(text: str) -> tuple[str, object]:
    """KEY=VALUE for the playbook; a VALUE in JSON list or mapping form is that list or mapping."""
    key, value = _key_value(text)
    if value.lstrip().startswith(("[", "{")):
        try:
            return key, json.loads(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{key}: {value!r} is not valid JSON ({exc})") from exc
    return key, value


def add_arguments(_name: str, image: argparse.ArgumentParser) -> None:
    actions = image.add_subparsers(dest="action", required=True)

    build = actions.add_parser("build", help="build an image: a local Debian 12 qcow2 (default) or a DigitalOcean "
                                             "snapshot")
    build.add_argument("--target", choices=["local", "digitalocean"], default="local")
    build.add_argument("--out", type=Path, default=Path("output/image"), help="output folder (default: output/image)")
    build.add_argument("--version", default=__version__, help=f"the image version (default: {__version__})")
    build.add_argument("--repo", type=Path, help="the kiln checkout with image/ and roles/ (default: found)")
    build.add_argument("--ansible-playbook", help="ansible-playbook to run (default: PATH, then .venv-tools/)")
    build.add_argument("-e", "--extra-var", type=_extra_var, action="append", default=[], metavar="KEY=VALUE",
                       help="local: a variable for the playbook, e.g. -e vllm_flavour=cpu or "
                            "-e kiln_models='[\"tiny-cpu\"]' (JSON for lists; repeatable)")
    build.add_argument("--disk-gb", type=int, default=16, help="local: the disk's virtual size (default: 16)")
    build.add_argument("--wheelhouse", type=Path, action="append",
                       help="local: a folder of wheels the image's pip may use (default: this machine's pip "
                            "find-links)")
    build.add_argument("--var", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                       help="digitalocean: a Packer variable, e.g. --var size=gpu-h100x8-640gb (repeatable)")
    build.add_argument("--validate", action="store_true", help="digitalocean: only `packer validate`")
    build.add_argument("--json", action="store_true", help="print the result as JSON")

    smoke = actions.add_parser("smoke", help="boot an image under QEMU with user-data and check it serves")
    smoke.add_argument("image", type=Path, help="the qcow2 to boot (left unchanged: it boots an overlay)")
    smoke.add_argument("--profile", default="tiny-cpu", help="the profile the user-data selects (default: tiny-cpu)")
    smoke.add_argument("--timeout", type=float, default=900, help="seconds for the whole boot test (default: 900)")
    smoke.add_argument("--memory-mb", type=int, default=4096)
    smoke.add_argument("--cpus", type=int, default=2)
    smoke.add_argument("--keep", type=Path, help="keep the console log and collected files in this folder")
    smoke.add_argument("--expect-baked", action="store_true",
                       help="the image was built with -e kiln_models naming the profile: check the agent used it")
    smoke.add_argument("--json", action="store_true", help="print the result as JSON")


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def cmd_image(kiln: Kiln, args: argparse.Namespace) -> int:
    # SIGTERM unwinds like Ctrl-C: the build unmounts what it set up, the smoke test stops its VM.
    signal.signal(signal.SIGTERM, _interrupt)
    if args.action == "smoke":
        return _smoke(args)
    repo = (args.repo or find_repo()).resolve()
    ansible = find_ansible_playbook(repo, args.ansible_playbook)
    if args.target == "digitalocean":
        packer.digitalocean_build(repo, args.out.resolve(), ansible, dict(args.var), validate_only=args.validate)
        return 0
    if args.disk_gb < 8:
        raise ConfigError(f"--disk-gb {args.disk_gb} is too small", fix="give 8 or more (vLLM alone takes ~4 GiB)")
    image = recipe.LocalImage(name="kiln", version=args.version, disk_gb=args.disk_gb,
                              extra_vars=dict(args.extra_var))
    wheelhouses = tuple(p.resolve() for p in args.wheelhouse) if args.wheelhouse else local.pip_wheelhouses()
    result = local.LocalBuild(repo, args.out.resolve(), image, ansible, wheelhouses).run()
    if args.json:
        print_json(result.as_dict())
    else:
        print(f"image  {result.image}\nsize   {result.size_bytes / 2**20:,.0f} MiB on disk, "
              f"{result.virtual_size_bytes / 2**30:.0f} GiB virtual\ntime   {result.seconds / 60:.1f} min\n"
              f"log    {result.log}\nnext   kiln image smoke {result.image}", file=sys.stdout)
    return 0


def _smoke(args: argparse.Namespace) -> int:
    checks, seen = SmokeTest(args.image, args.profile, args.timeout, args.memory_mb, args.cpus, args.keep,
                             expect_baked=args.expect_baked).run()
    report = smoke.report_dict(checks, seen)
    if args.json:
        print_json(report)
    else:
        for c in checks:
            print(f"{'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}")
        timings = ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.0f} s"
                            for k, v in report["timings_s"].items())
        print(f"timings: {timings}")
        print("smoke test passed" if report["ok"] else "smoke test FAILED")
    return 0 if report["ok"] else 1
