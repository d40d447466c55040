"""`kiln models bake`: put exactly what a profile's plan reads into the image (checkpoint, tokenizer, draft model or
EAGLE head, for the machine class the image is for), recorded in a manifest the agent checks at first boot."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from kiln.choice.resolve import ResolvedChoice
from kiln.choice.schema import Choice
from kiln.cli.locate import default_state_dir, locate
from kiln.cli.output import print_json, table
from kiln.errors import KilnError
from kiln.hardware.fixtures import fixture_names
from kiln.hardware.system import hub_cache
from kiln.hub.baked import MANIFEST, BakedRepo, Manifest, read_manifest, record_local, record_repo
from kiln.hub.client import OK, HubClient, Progress
from kiln.hub.files import repos_for
from kiln.processes import LocalProcesses, ProcessSpec
from kiln.render.vllm import MODULE_VLLM, OFFLINE_ENV, Runtime, find_vllm_python
from kiln.serve.caches import Caches
from kiln.serve.decide import Decision, decide
from kiln.serve.front.secretfiles import write_private
from kiln.serve.layout import ServeLayout
from kiln.serve.processes.probes import http_probe
from kiln.serve.reports.startup import parse_startup
from kiln.tinymodel import make_tiny_model
from kiln.wiring import Kiln


def add_arguments(_name: str, models: argparse.ArgumentParser) -> None:
    msub = models.add_subparsers(dest="action", required=True)
    bake = msub.add_parser("bake", help="download what a profile's plan reads into the agent's cache, with a manifest")
    bake.add_argument("--profile", action="append", default=[], help="a profile name (repeat for several)")
    bake.add_argument("--model", action="append", default=[],
                      help="a Hugging Face repository ORG/NAME outside the catalog (repeat for several; HF_TOKEN reads "
                           "gated ones)")
    bake.add_argument("--machine", help="the machine class the image is for: a fixture "
                                        f"({', '.join(fixture_names())}) or a file (default: this machine)")
    bake.add_argument("--state-dir", type=Path,
                      help="the agent's state folder on the image (default: the running agent's, else "
                           f"{default_state_dir()})")
    bake.add_argument("--warm", action="store_true",
                      help="then start the first instance of each plan once, to fill the compile caches the image "
                           "keeps (torch.compile, Inductor, Triton, CUDA)")
    bake.add_argument("--warm-timeout", type=float, default=3600, help="seconds one warm-up may take (default 3600)")
    bake.add_argument("--json", action="store_true", help="print JSON for programs")


def _bar(p: Progress) -> None:
    done = p.bytes_done / p.bytes_total if p.bytes_total else 1.0
    print(f"  {p.repo}: {100 * done:5.1f}% of {p.bytes_total / 2**30:.2f} GiB, "
          f"{p.rate_bytes_per_s / 2**20:.1f} MiB/s", file=sys.stderr, flush=True)


def image_caches(layout: ServeLayout) -> Caches:
    """The caches as the agent keeps them on the image's boot disk, where the baked files are."""
    return Caches.in_state_dir(layout.state_dir, "baked into the image")


def warm(decision: Decision, layout: ServeLayout, timeout_s: float) -> dict[str, Any]:
    """Start the plan's first instance as the agent would, offline, until it serves; what its log says it did."""
    first = decision.rendered[0]
    log_file = layout.log_dir / "warm-up.log"
    spec = ProcessSpec("warm-up", first.argv, {**first.env, **OFFLINE_ENV}, log_file=log_file)
    running = LocalProcesses().start(spec)
    url, began, ok = f"http://127.0.0.1:{first.port}/health", time.monotonic(), False
    try:
        while time.monotonic() - began < timeout_s and running.exit_code() is None:
            if http_probe(url):
                ok = True
                break
            print(f"  warming up {decision.plan.profile if decision.plan else ''}: "
                  f"{time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
            time.sleep(10)
    finally:
        running.stop(grace_s=60)
    if not ok:
        tail = "\n".join(running.log_lines()[-15:])
        raise KilnError(f"the warm-up instance did not serve within {timeout_s:.0f} s (log {log_file}):\n{tail}",
                        fix="check the log; the image is usable without a warm-up (the first boot compiles)")
    return parse_startup(running.log_lines()).as_dict()


def bake_profile(kiln: Kiln, name: str, machine: str | None, layout: ServeLayout, hub: HubClient,
                 warm_timeout_s: float | None = None, model: str | None = None,
                 ) -> tuple[list[BakedRepo], dict[str, Any] | None]:
    """Bake a catalog profile (`name`), or with `model` a Hub repository planned from its config files."""
    runtime = image_caches(layout).runtime(Runtime(vllm_command=(find_vllm_python(), *MODULE_VLLM),
                                                   models_dir=str(layout.models_dir)))
    if model is not None:
        profile = kiln.profile(None, model, hub.token, hub_cache=hub.cache)  # refuses what it cannot read or size
        name = profile.name
    choice = Choice(model=model, hf_token=hub.token) if model is not None else Choice(profile=name)
    decision = (decide(kiln, machine, ResolvedChoice(choice, {}), runtime) if model is not None
                else decide(kiln, machine, ResolvedChoice(choice, {}), runtime, fallback=name))
    if decision.plan is None or decision.profile is None:
        what, fix = decision.failure or (f"{name} cannot be planned on {machine or 'this machine'}", "")
        raise KilnError(what, fix=fix)
    plan, profile = decision.plan, decision.profile
    if decision.profile.name != name:
        raise KilnError(f"{model or name} cannot be planned on {machine or 'this machine'}: "
                        + "; ".join(p.what for p in decision.problems), fix="`kiln plan --model` says why")
    baked: list[BakedRepo] = []
    if profile.local_model:
        target = layout.models_dir / plan.engine.model
        if not (target / "config.json").exists():
            make_tiny_model(profile, target)
        baked.append(record_local(layout.models_dir, plan.engine.model))
    for needed in repos_for(plan, profile.local_model):
        check = hub.check(needed.repo, needed.revision)
        if check.status != OK:
            raise KilnError(f"{needed.repo} ({needed.role} of {name}) cannot be baked: the Hub said {check.status}"
                            f" ({check.message})",
                            fix=f"accept the licence at https://huggingface.co/{needed.repo} if it is gated, and give "
                                "the build a token that may read it (HF_TOKEN; `-e kiln_hf_token=...` for the image "
                                "build)")
        print(f"{name}: {needed.repo} ({needed.role}): {len(check.files)} file(s), {check.bytes / 2**30:.2f} GiB",
              file=sys.stderr, flush=True)
        hub.download(check, _bar, every_s=10.0)
        baked.append(record_repo(hub.cache, needed.repo, needed.revision, [f.name for f in check.files]))
    return baked, warm(decision, layout, warm_timeout_s) if warm_timeout_s is not None else None


def cmd_models(kiln: Kiln, args: argparse.Namespace) -> int:
    agent = locate(args.state_dir)
    if not args.json:
        print(agent.said(), file=sys.stderr)
    layout = agent.layout
    hub = HubClient(hub_cache(layout.hf_home), os.environ.get("HF_TOKEN") or None,
                    endpoint=os.environ.get("HF_ENDPOINT") or None)
    path = layout.state_dir / MANIFEST
    machine_name = kiln.machine(args.machine).name
    manifest = read_manifest(path) or Manifest(machine_name)
    if manifest.machine != machine_name:
        manifest = Manifest(machine_name)  # planned for another machine class: what it names is not what boots
    warmed: dict[str, Any] = {}
    if not args.profile and not args.model:
        raise KilnError("nothing to bake", fix="name a --profile or a --model ORG/NAME")
    wanted = [(name, None) for name in args.profile] + [("", model) for model in args.model]
    for name, model in wanted:
        repos, timeline = bake_profile(kiln, name, args.machine, layout, hub,
                                       args.warm_timeout if args.warm else None, model)
        label = name or str(model)
        manifest = manifest.with_profile(label, repos)
        layout.state_dir.mkdir(parents=True, exist_ok=True)
        write_private(path, manifest.as_json())
        if timeline is not None:
            warmed[label] = timeline
    if args.json:
        print_json({"manifest": str(path), "machine": manifest.machine, "profiles": list(manifest.profiles),
                    "repos": [{"repo": r.repo, "commit": r.commit, "files": len(r.files), "bytes": r.bytes}
                              for r in manifest.repos], "warmed": warmed})
    else:
        print(table(["Repository", "Commit", "Files", "GiB"],
                    [[r.repo, r.commit[:12], len(r.files), f"{r.bytes / 2**30:.2f}"] for r in manifest.repos]))
        print(f"\nbaked for {manifest.machine}: {', '.join(manifest.profiles)} (manifest {path})")
        for name, timeline in warmed.items():
            print(f"warmed {name}: ready in {timeline['ready_s']} s, compile cache {timeline['compile_cache']}, caches "
                  f"in {image_caches(layout).compile_dir}")
    return 0
