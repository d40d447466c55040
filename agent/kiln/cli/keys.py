"""`kiln keys list|show|add|rotate|revoke|limit` and `kiln reload`: change what the endpoint accepts without restarting
anything. The store is root's; the agent re-reads it on SIGHUP and nginx reloads gracefully."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import requests

from kiln.cli.locate import LocalAgent, default_state_dir, locate
from kiln.cli.output import print_json, table
from kiln.errors import ConfigError, KilnError
from kiln.serve.front.filelock import held
from kiln.serve.front.keys import KeyChangeError, KeyStore
from kiln.serve.front.secretfiles import load_keys, save_keys
from kiln.serve.layout import HEALTH_PORT, ServeLayout

RELOAD_WAIT_S = 60.0  # reading a new plan may ask the Hub


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", type=Path, help="the agent's folder (default: the running agent's, else "
                                                  f"{default_state_dir()})")
    p.add_argument("--health", help=f"the agent's health endpoint (default: the one of --state-dir's agent, "
                                    f"else http://127.0.0.1:{HEALTH_PORT})")
    p.add_argument("--json", action="store_true", help="print JSON for programs")


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    if name == "reload":
        _common(parser)
        parser.add_argument("--renew-certificate", action="store_true",
                            help="also renew the ACME certificate now, however long it has left")
        return
    ksub = parser.add_subparsers(dest="action", required=True)
    _common(ksub.add_parser("list", help="each key's name, rate limit and origin (never the key)"))
    show = ksub.add_parser("show", help="print one key")
    show.add_argument("name")
    add = ksub.add_parser("add", help="a new key, printed once")
    add.add_argument("name")
    add.add_argument("--key", help="the key itself (default: a new random one)")
    add.add_argument("--requests-per-minute", type=int, help="a rate limit for this key (429 beyond it)")
    add.add_argument("--models", type=_models, help="the served names it may ask for, comma-separated (403 for "
                     "the others; default: every model)")
    rotate = ksub.add_parser("rotate", help="replace a key; the old one stops working at once")
    rotate.add_argument("name")
    rotate.add_argument("--key", help="the new key (default: a new random one)")
    revoke = ksub.add_parser("revoke", help="stop accepting a key")
    revoke.add_argument("name")
    limit = ksub.add_parser("limit", help="set or clear a key's requests per minute, or the models it may ask for")
    limit.add_argument("name")
    limit.add_argument("requests_per_minute", nargs="?", help="a number, or none")
    limit.add_argument("--models", type=_models, help="the served names it may ask for, comma-separated, or all")
    for p in (show, add, rotate, revoke, limit):
        _common(p)


def _models(text: str) -> tuple[str, ...]:
    """The served names given; () for `all`, which lifts the scope."""
    if text.strip().lower() == "all":
        return ()
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError("give served model names, comma-separated, or all")
    return names


def _rate(text: str) -> int | None:
    if text.lower() in ("none", "off", "0"):
        return None
    if not (text.isascii() and text.isdigit()):  # str.isdigit() takes '²', which int() refuses
        raise ConfigError(f"requests per minute must be a number or none, not {text!r}", fix="e.g. 60")
    return int(text)


def _agent_pid(state_dir: Path) -> int:
    pid_file = ServeLayout(state_dir=state_dir).agent_pid_file
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError) as exc:
        raise KilnError(f"no running kiln agent found ({pid_file}: {exc.__class__.__name__})",
                        fix="start it: `systemctl start kiln-agent`; changes apply when it starts") from exc
    if not psutil.pid_exists(pid) or "kiln" not in " ".join(psutil.Process(pid).cmdline()):
        raise KilnError(f"the kiln agent of {pid_file} (pid {pid}) is not running",
                        fix="start it: `systemctl start kiln-agent`; changes apply when it starts")
    return pid


def _last_reload(health: str) -> dict[str, Any] | None:
    with contextlib.suppress(requests.RequestException, ValueError):
        reload: dict[str, Any] | None = requests.get(f"{health.rstrip('/')}/status/reload",
                                                     timeout=2).json().get("reload")
        return reload
    return None


def signal_reload(state_dir: Path, health: str, renew: bool = False,
                  until_planned: bool = True) -> dict[str, Any] | None:
    """SIGHUP to the agent, then its report of the reload, with `applied_s`: the seconds from the signal until the
    keys and the certificate were in force (None when it did not report in time). With `until_planned`, it also waits
    for the agent to have re-read the plan, which a key change does not need."""
    before = _last_reload(health)
    pid = _agent_pid(state_dir)
    signalled = time.monotonic()
    if renew:
        os.kill(pid, signal.SIGUSR1)
    os.kill(pid, signal.SIGHUP)
    applied: float | None = None
    deadline = signalled + RELOAD_WAIT_S
    while time.monotonic() < deadline:
        now = _last_reload(health)
        if now and now.get("at") and now != before:
            applied = applied if applied is not None else time.monotonic() - signalled
            if now.get("planned") or not until_planned:
                return {**now, "applied_s": round(applied, 3)}
        time.sleep(0.02)
    return None


def cmd_reload(_kiln: None, args: argparse.Namespace) -> int:
    agent = locate(args.state_dir, args.health)
    if not args.json:
        print(agent.said(), file=sys.stderr)
    report = signal_reload(agent.state_dir, agent.health, args.renew_certificate)
    refused = (report or {}).get("error")
    if args.json:
        print_json({"reload": report, "agent": agent.as_dict()})
    elif refused:
        raise KilnError(f"the agent refused the reload, nothing changed: {refused.get('what')}",
                        fix=refused.get("fix") or "see `kiln status`")
    elif report is None:
        print(f"kiln reload: signalled the agent; no report within {RELOAD_WAIT_S:.0f} s (see `kiln status`)")
    else:
        rolling = " (a rolling change of the instances follows: `kiln status`)" if report.get("rolling") else ""
        print(f"kiln reload: {', '.join(report.get('changed') or []) or 'nothing changed'}, applied "
              f"{report['applied_s']:.2f} s after the signal{rolling}")
    return 0 if report is not None and not refused else 1


def _no_store(agent: LocalAgent) -> KilnError:
    return KilnError(f"no kiln agent runs here, and {agent.layout.keys_file} does not exist ({agent.found_by})",
                     fix="start one (`kiln up`, or `systemctl start kiln-agent` on the image), or name its folder "
                         "with --state-dir")


def cmd_keys(_kiln: None, args: argparse.Namespace) -> int:
    agent = locate(args.state_dir, args.health)
    layout = agent.layout
    if not agent.running and args.action != "add" and not os.path.lexists(layout.keys_file):
        raise _no_store(agent)
    if not args.json:
        print(agent.said(), file=sys.stderr)
    if args.action in ("list", "show"):
        return _show(load_keys(layout.keys_file, layout.api_key_file), args, agent)
    with held(layout.keys_file):  # concurrent changes, the agent's too, apply one after another: none is lost
        store = load_keys(layout.keys_file, layout.api_key_file)
        try:
            changed = _change(store, args)
        except KeyChangeError as exc:
            raise ConfigError(str(exc), fix="`kiln keys list` shows the names") from exc
        try:
            save_keys(layout.keys_file, changed)
        except OSError as exc:
            raise KilnError(f"{layout.keys_file} cannot be written ({exc.strerror}); nothing changed",
                            fix=f"free space on its disk (`df -h {layout.keys_file.parent}`), then again") from exc
    report = None
    if agent.running:  # outside the lock: the agent takes it to read the store
        with contextlib.suppress(KilnError):
            report = signal_reload(agent.state_dir, agent.health, until_planned=False)
    refused = (report or {}).get("error")
    if refused:  # the agent kept the keys before the change: so does the store, unless it changed again since
        with held(layout.keys_file):
            if load_keys(layout.keys_file) == changed:
                save_keys(layout.keys_file, store)
        raise KilnError(f"the agent refused the change, nothing changed: {refused.get('what')}",
                        fix=refused.get("fix") or "see `kiln status`")
    key = changed.get(args.name)
    shown = key.secret if key and args.action in ("add", "rotate") else None
    if args.json:
        print_json({"name": args.name, "action": args.action, "key": shown, "applied": report is not None,
                    "applied_s": report["applied_s"] if report else None, "agent": agent.as_dict()})
        return 0
    if shown:
        print(shown)
    print(f"kiln keys: {args.action} {args.name}: " + (f"applied {report['applied_s']:.2f} s after the signal"
                                                      if report else "saved; applies when the agent starts"))
    return 0


def _show(store: KeyStore, args: argparse.Namespace, agent: LocalAgent) -> int:
    if args.action == "list":
        rows = [k.public() for k in store.keys]
        if args.json:
            print_json({"keys": rows, "revoked": sorted(store.revoked), "agent": agent.as_dict()})
        elif not rows:
            print(f"no keys in {agent.layout.keys_file}" + (f"; revoked: {', '.join(sorted(store.revoked))}"
                                                           if store.revoked else ""))
        else:
            print(table(["name", "requests/min", "models", "origin"],
                        [[str(r["name"]), str(r["requests_per_minute"] or "-"),
                          ",".join(r["models"]) if isinstance(r["models"], list) else "all", str(r["origin"])]
                         for r in rows]))
        return 0
    key = store.get(args.name)
    if key is None:
        raise ConfigError(f"no key named {args.name!r} in {agent.layout.keys_file}",
                          fix=f"one of: {', '.join(store.names()) or '(none)'}")
    if args.json:
        print_json({"name": key.name, "key": key.secret, "agent": agent.as_dict()})
    else:
        print(key.secret)
    return 0


def _change(store: KeyStore, args: argparse.Namespace) -> KeyStore:
    if args.action == "add":
        return store.add(args.name, args.key, args.requests_per_minute, args.models or None)
    if args.action == "rotate":
        return store.rotate(args.name, args.key)
    if args.action == "revoke":
        return store.revoke(args.name)
    if args.requests_per_minute is None and args.models is None:
        raise ConfigError("give a rate (requests per minute, or none), --models, or both",
                          fix=f"e.g. `kiln keys limit {args.name} 60` or `kiln keys limit {args.name} --models NAME`")
    if args.requests_per_minute is not None:
        store = store.limit(args.name, _rate(args.requests_per_minute))
    if args.models is not None:
        store = store.scope(args.name, args.models or None)
    return store
