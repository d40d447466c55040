"""How the plan's processes are put together: each instance's spec (argv, environment, log), the runtime file each
unit reads, the Hub token's file, the units' drop-ins and the launcher, children or systemd units."""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from kiln.processes import LocalProcesses, ProcessSpec
from kiln.render.systemd import instance_dropin
from kiln.render.vllm import OFFLINE_ENV, RenderedInstance
from kiln.serve.caches import Caches
from kiln.serve.decide import Decision
from kiln.serve.front.secretfiles import write_private
from kiln.serve.layout import ServeLayout
from kiln.serve.processes.ownership import give_to_user, share_with_group
from kiln.serve.processes.supervisor import Launcher, Member
from kiln.serve.processes.systemd_units import SystemdUnits
from kiln.tinymodel import make_tiny_model

log = logging.getLogger("kiln.agent")


def log_file(folder: Path | None, name: str) -> Path | None:
    return folder / f"{name}.log" if folder else None


@dataclass
class Assembly:
    layout: ServeLayout
    caches: Caches
    systemd: bool = False  # each process is its systemd unit (the image) instead of a child
    service_user: str = "kiln"  # with systemd: the units' User=, who must read the files written here
    models_cached: bool = False  # the plan's repositories are in the cache: the instances start offline
    launcher: Launcher | None = None  # the last one made
    runtime_specs: dict[str, ProcessSpec] = field(default_factory=dict)  # runtime.json's entries, by name
    _runtime_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def logs(self) -> Path | None:
        return None if self.systemd else self.layout.log_dir  # under systemd, the journal

    def instance(self, rendered: RenderedInstance) -> Member:
        base = f"http://{self.layout.local_host}:{rendered.port}"
        return Member(self.spec(rendered), probe_url=f"{base}/health", route_url=base, port=rendered.port,
                      gpus=rendered.gpus)

    def spec(self, rendered: RenderedInstance) -> ProcessSpec:
        """How an instance's process starts: its argv, its environment, its log, the Hub token's file."""
        return ProcessSpec(rendered.name, rendered.argv, self.env(rendered),
                           log_file=log_file(self.logs, rendered.name), env_files=(self.layout.hf_token_env,),
                           cpus=rendered.cpus)

    def env(self, rendered: RenderedInstance) -> dict[str, str]:
        """An instance's environment (and the self-check's): offline once the plan's repositories are cached."""
        return {**rendered.env, **(OFFLINE_ENV if self.models_cached else {})}

    def make_launcher(self, decision: Decision) -> Launcher:
        launcher: Launcher = LocalProcesses()
        if self.systemd:
            # The state folder is root's; the units (User=kiln) write only these folders in it, and read the
            # runtime (argv, environment) through their group (write_runtime).
            writable = [self.layout.models_dir, *self.caches.folders, self.layout.home_dir]
            for folder in writable:
                folder.mkdir(parents=True, exist_ok=True)
            give_to_user(self.service_user, self.layout.state_dir, writable)
            launcher = SystemdUnits(self.dropins(decision))
        self.launcher = launcher
        return launcher

    def dropins(self, decision: Decision) -> dict[str, str]:
        assert decision.plan is not None
        state_dir = self.layout.state_dir
        elsewhere = tuple(str(f) for f in self.caches.folders if state_dir not in (f, *f.parents))
        profiles = {r.name: m.plan.profile for m in decision.models for r in m.rendered}
        return {r.name: instance_dropin(r, profile=profiles.get(r.name, decision.plan.profile), writable=elsewhere)
                for r in decision.all_rendered}

    def use_dropins(self, decision: Decision) -> None:
        """A new plan's drop-ins, for the units started from now on."""
        if isinstance(self.launcher, SystemdUnits):
            self.launcher.set_dropins(self.dropins(decision))

    def make_local_model(self, decision: Decision) -> None:
        assert decision.plan is not None and decision.profile is not None
        served = [(m.profile, m.plan) for m in decision.models] or [(decision.profile, decision.plan)]
        for profile, plan in served:
            if profile.local_model and profile.cpu_only:
                target = self.layout.models_dir / plan.engine.model
                if not (target / "config.json").exists():
                    log.info("making the tiny model in %s", target)
                    make_tiny_model(profile, target)

    def write_runtime(self, members: list[Member]) -> None:
        """What `kiln agent exec NAME` (each unit's ExecStart) starts: argv and environment, no secret."""
        self.runtime_specs = {m.name: m.spec for m in members}
        self._write_runtime()

    def put_runtime(self, member: Member, dropin: str | None = None) -> None:
        """One process's entry (and its unit's drop-in), as a rolling change starts it: the others keep theirs,
        so an instance of the plan before that restarts meanwhile starts as it was."""
        self.runtime_specs = {**self.runtime_specs, member.name: member.spec}
        self._write_runtime()
        if dropin is not None and isinstance(self.launcher, SystemdUnits):
            self.launcher.put_dropin(member.name, dropin)

    def _runtime_text(self) -> str:
        return json.dumps({"processes": [spec.as_dict() for spec in self.runtime_specs.values()]}, indent=2) + "\n"

    def _write_runtime(self) -> None:
        with self._runtime_lock:
            path = self.layout.runtime_file
            write_private(path, self._runtime_text())
            if self.systemd:
                share_with_group(self.service_user, [path])

    def restore_runtime(self) -> str | None:
        """Every unit's start reads the runtime file: when it is not what the agent wrote (edited, truncated, a
        full disk), it is written again from the agent's own record. What was wrong, or None when it was intact."""
        if not self.runtime_specs:
            return None
        path = self.layout.runtime_file
        try:
            on_disk = path.read_text()
        except FileNotFoundError:
            why = "missing"
        except (OSError, UnicodeDecodeError) as exc:
            why = f"unreadable ({exc.__class__.__name__})"
        else:
            if on_disk == self._runtime_text():
                return None
            why = "changed outside kiln"
        self._write_runtime()
        return why

    def write_hf_token(self, token: str | None) -> None:
        """The token's one place besides its source: a root-only environment file the instances start with."""
        path = self.layout.hf_token_env
        if token is None:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        write_private(path, f"HF_TOKEN={token}\n")
        log.info("Hugging Face token: set (in %s, root only)", path)
