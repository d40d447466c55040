"""The boot loop, in one place: decide, write the plan down, start the front, the router and the instances,
supervise them, and report on the health endpoint until told to stop."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pynvml

from kiln import datafiles
from kiln.choice.resolve import ResolvedChoice
from kiln.cluster.membership import Membership
from kiln.cluster.membership import NotYet as ClusterNotYet
from kiln.doctor.needs import needs_of
from kiln.doctor.report import Report
from kiln.errors import KilnError
from kiln.hardware.system import hub_cache
from kiln.hub.baked import MANIFEST, read_manifest
from kiln.hub.client import HubClient, Progress
from kiln.hub.files import repos_for
from kiln.hub.preflight import HubVerdict
from kiln.perf.workload import resolve as resolve_workload
from kiln.pricing import hourly_price
from kiln.processes import ProcessSpec, children_of
from kiln.render.cluster import distributed_ports
from kiln.render.vllm import IMAGE_VLLM, Runtime, render_instances, vllm_python
from kiln.serve.caches import Caches, place_caches
from kiln.serve.cluster_node import ClusterOptions, NodeWatch, find_membership, open_firewall
from kiln.serve.decide import Decision, ServedModel, decide, models_change, renumbered
from kiln.serve.drain import drain
from kiln.serve.endpoint import Endpoint
from kiln.serve.front.front import Front
from kiln.serve.front.nginx_workers import serving_workers, wait_in_force
from kiln.serve.front.proxy import ModelRoute, ProxySettings, find_nginx, find_njs_module, nginx_argv
from kiln.serve.front.secretfiles import write_private
from kiln.serve.layout import ServeLayout
from kiln.serve.models import Milestones, ModelStep
from kiln.serve.processes.assembly import Assembly, log_file
from kiln.serve.processes.ownership import keep_for_root
from kiln.serve.processes.probes import http_probe, served_certificate_sha256
from kiln.serve.processes.router import RouterClient, RouterSettings, find_router, router_argv
from kiln.serve.processes.supervisor import READY, Member, RouterLink, Supervisor, SupervisorSettings
from kiln.serve.reports.health import HealthServer
from kiln.serve.reports.notify import sd_notify
from kiln.serve.reports.reports import Reports
from kiln.serve.reports.selfcheck import SelfCheckSettings
from kiln.serve.reports.selfcheck_run import run_self_check
from kiln.serve.reports.startup import AgentSteps
from kiln.serve.reports.state import DETECTING, DOWNLOADING, JOINING, PLANNING, STARTING_PHASE, AgentState
from kiln.serve.reports.telemetry import gpu_telemetry
from kiln.wiring import Kiln

log = logging.getLogger("kiln.agent")
METER_INTERVAL_S = 5.0
LOOP_S = 0.2  # how soon a reload (SIGHUP) is acted on
DOCTOR_WAIT_S = 120.0  # how long a transient pre-flight failure (a fabric still being set up) may take to clear
DOCTOR_RETRY_S = 5.0
QUEUE_FACTOR = 2  # requests in flight per instance slot: one running batch and one waiting
PROXY_RELOAD_WAIT_S = 10.0  # nginx starts its new workers in well under a second, even on a loaded machine


@dataclass(frozen=True)
class AgentOptions:
    layout: ServeLayout
    read_choice: Callable[[], ResolvedChoice]
    machine: str | None = None  # a fixture or machine file instead of NVML (tests, `kiln up --machine`)
    vllm_command: tuple[str, ...] = IMAGE_VLLM
    advertised_host: str = "127.0.0.1"
    extra_env: tuple[tuple[str, str], ...] = ()
    supervisor: SupervisorSettings = field(default_factory=SupervisorSettings)
    router: RouterSettings = field(default_factory=RouterSettings)
    max_in_flight: int | None = None  # default: QUEUE_FACTOR x the instances' max_num_seqs
    motd_file: Path | None = None
    self_check: SelfCheckSettings | None = field(default_factory=SelfCheckSettings)
    systemd: bool = False  # start each process as its systemd unit (the image) instead of as a child
    service_user: str = "kiln"  # with systemd: the units' User=, who must read the files the agent writes
    process_started: float | None = None  # epoch seconds the process began, to time Python and the imports too
    tls_names: tuple[str, ...] = ()  # addresses and host names a self-signed certificate names, besides metadata's
    proxy_user: str | None = None  # nginx's workers' user when its master runs as root (the image: www-data)
    cluster: ClusterOptions = field(default_factory=ClusterOptions)


class Agent:
    def __init__(self, kiln: Kiln, options: AgentOptions) -> None:
        self.kiln = kiln
        self.options = options
        layout = options.layout
        self.state = AgentState(endpoint=layout.endpoint_url(options.advertised_host), health=layout.health_url,
                                keys_file=str(layout.keys_file), state_dir=str(layout.state_dir),
                                telemetry=lambda: gpu_telemetry(pynvml))
        try:
            self.health = HealthServer(self.state, layout.local_host, layout.health_port, self.metrics)
        except OSError as exc:
            raise KilnError(f"the health endpoint cannot listen on {layout.health_url}: {exc.strerror}",
                            fix="stop the other kiln agent (`kiln status`), or pass another --health-port") from exc
        self.supervisor: Supervisor | None = None
        self.decision: Decision | None = None
        self.stopping = threading.Event()
        self._self_check: threading.Thread | None = None
        self.parts = Assembly(layout, Caches.in_state_dir(layout.state_dir, "not chosen yet"), options.systemd,
                              options.service_user)
        self.steps = AgentSteps()
        self._lap_from = time.monotonic()
        self.reports = Reports(self.state, layout, lambda: self.supervisor)
        self.endpoint: Endpoint | None = None  # keys, certificate and nginx's configuration, once serving
        self.reload_requested = threading.Event()
        self.renewal_requested = threading.Event()
        self._rollout: threading.Thread | None = None
        self._verdict: HubVerdict | None = None
        self._waiting: list[tuple[Member, Member]] = []  # an instance held until the one before it on its GPU serves
        # With several models: each model's router (None: the supervisor's own, the first model's) and its port
        self._routers: dict[str, tuple[RouterLink | None, int]] = {}
        self._router_binary = ""  # vllm-router, found when the processes are first put together
        self.membership: Membership | None = None  # this machine's part of a cluster
        self.node_watch: NodeWatch | None = None

    # -- the loop ----------------------------------------------------------------------------------------------
    def run(self) -> int:
        """Serve until stop() is called; 0 when stopped cleanly, whatever happened to the model."""
        self.health.start()
        sd_notify("READY=1\nSTATUS=detecting the machine")
        pid_file = self.options.layout.agent_pid_file
        try:
            write_private(pid_file, f"{os.getpid()}\n", mode=0o644)
            write_private(self.options.layout.agent_health_file, f"{self.options.layout.health_url}\n", mode=0o644)
        except OSError as exc:
            log.warning("could not write %s (`kiln reload` will not find the agent): %s", pid_file, exc)
        try:
            self._boot_reported()
            next_meter = time.monotonic() + METER_INTERVAL_S
            while not self.stopping.wait(LOOP_S):
                if self.reload_requested.is_set():
                    self.reload_requested.clear()
                    self._reload()
                if self.endpoint:
                    forced = self.renewal_requested.is_set()
                    self.renewal_requested.clear()
                    self.endpoint.renew(force=forced)
                self._release_waiting()
                if time.monotonic() >= next_meter:
                    next_meter = time.monotonic() + METER_INTERVAL_S
                    self.reports.meter()
                    self._check_runtime_file()
                    self._start_self_check()
        finally:
            sd_notify("STOPPING=1")
            if self.node_watch:
                self.node_watch.stop()
            if self.supervisor:
                self.supervisor.stop()
            self.health.stop()
            pid_file.unlink(missing_ok=True)
            self.options.layout.agent_health_file.unlink(missing_ok=True)
        return 0

    def stop(self) -> None:
        self.stopping.set()

    def _boot_reported(self) -> None:
        """The boot, whatever it meets: a failure is said on /status, in the journal and the MOTD, and the agent keeps
        answering (its health endpoint, reloads, a stop); never a traceback that takes it down."""
        state_dir = self.options.layout.state_dir
        try:
            self._boot()
        except OSError as exc:  # a full, read-only or broken state disk
            self._fail(f"{exc.filename or state_dir} cannot be written: {exc.strerror or exc}",
                       f"free space on its disk or repair it (`df -h {state_dir}`), then restart kiln "
                       "(`systemctl restart kiln-agent`, or `kiln up` again)")
        except Exception as exc:
            log.exception("the boot failed")
            self._fail(f"the agent failed while starting: {exc.__class__.__name__}: {exc}",
                       "see the journal (`journalctl -u kiln-agent`) and report it; restart kiln to try again")

    def request_reload(self) -> None:
        """SIGHUP (`kiln reload`, `systemctl reload kiln-agent`): re-read the choice and the keys."""
        self.reload_requested.set()

    def request_renewal(self) -> None:
        """SIGUSR1 (`kiln reload --renew-certificate`): renew the ACME certificate now."""
        self.renewal_requested.set()

    def _lap(self, step: str) -> None:
        now = time.monotonic()
        self.steps.add(step, now - self._lap_from)
        self._lap_from = now
        self.state.startup["agent"] = self.steps.as_dict()

    def _boot(self) -> None:
        options, layout, state = self.options, self.options.layout, self.state
        if options.process_started is not None:
            self.steps.add("start kiln (Python, imports)", max(0.0, time.time() - options.process_started))
        self._lap_from = time.monotonic()
        state.set_phase(DETECTING)
        if options.systemd:  # before anything is read from it or written to it
            try:
                keep_for_root(layout.state_dir)
            except KilnError as exc:
                self._fail(exc.what, exc.fix)
                return
        resolved = options.read_choice()
        self._lap("read the choice")
        if resolved.choice.cluster is not None and not self._join_cluster(resolved):
            return
        state.set_phase(PLANNING)
        self._runtime = runtime = Runtime(vllm_command=options.vllm_command, models_dir=str(layout.models_dir),
                                          hf_home=str(layout.hf_home), extra_env=options.extra_env,
                                          key_usage_path=datafiles.data_dir("vllm"),
                                          serve_shim=datafiles.vllm_serve_launcher(),
                                          first_instance_port=layout.first_instance_port)
        self._models = models = ModelStep(client=self._hub_client, stopping=self.stopping,
                           replan=lambda choice: decide(self.kiln, options.machine, choice, runtime,
                                                        membership=self.membership),
                           offline=os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"),
                           manifest=read_manifest(layout.state_dir / MANIFEST), baked_cache=layout.hf_home,
                           models_dir=layout.models_dir)
        first = decide(self.kiln, options.machine, resolved, runtime, membership=self.membership)
        self._lap("detect and plan")
        decision, verdict = models.check(first, resolved)
        if models.baked:
            self.parts.models_cached = True
            state.download = {"state": "baked", "detail": models.baked}
            log.info("model: %s: nothing to download", models.baked)
        self._lap("ask the Hub")
        state.choice = decision.choice_report()
        self._report_problems(decision)
        if decision.failure or not decision.plan:
            if decision.machine is not None:  # what the machine itself says, beside why nothing can be planned
                self.state.doctor = self.kiln.doctor(options.machine, layout.hf_home)[1].as_dict()
            what, fix = decision.failure or ("no plan", "")
            self._fail(what, fix, journal=f"nothing to serve: {what}")
            return
        self._use_caches(self._caches_for(decision))
        decision.render(self.parts.caches.runtime(runtime))
        self._lap("choose the cache disk")
        if not self._preflight(decision, verdict):
            return
        self._lap("pre-flight")
        if verdict and verdict.readable and not self._download(models, verdict, resolved.choice.hf_token):
            return
        self._lap("download")
        self.decision = decision
        state.plan = decision.plan_report()
        write_private(layout.plan_file, json.dumps(state.plan, indent=2) + "\n")
        price = resolved.choice.price_per_hour
        state.usd_per_hour = price if price is not None else (
            hourly_price(decision.machine, datafiles.read_yaml("droplets.yaml")) if decision.machine else None)
        try:
            self.supervisor = self._supervisor(decision, resolved)
        except KilnError as exc:
            self._fail(exc.what, exc.fix)
            return
        state.supervisor = self.supervisor
        state.set_phase(STARTING_PHASE)
        self.supervisor.start()
        if self.membership and decision.node:
            self._watch_cluster(self.membership, decision)
        self._lap("start the units")
        log.info("agent's own share of the start: %.2f s (%s)", self.steps.as_dict()["own_s"],
                 ", ".join(f"{n} {s:.2f} s" for n, s in self.steps.steps))
        sd_notify(f"STATUS=serving {decision.plan.profile} on {len(decision.rendered)} instance(s)")

    # -- a cluster ---------------------------------------------------------------------------------------------
    def _join_cluster(self, resolved: ResolvedChoice) -> bool:
        """Find this node's place in the cluster (waiting for the tagged droplets); False when it has none."""
        setting = resolved.choice.cluster
        assert setting is not None
        self.state.set_phase(JOINING)

        def waiting(why: ClusterNotYet) -> None:
            self.state.fail(f"cluster {setting.name}: {why.what}", why.fix)
            log.warning("cluster %s: %s (fix: %s); asking again", setting.name, why.what, why.fix)

        found = find_membership(setting, resolved.choice.do_token, self.options.cluster, self.stopping, waiting)
        if isinstance(found, ClusterNotYet):
            if not self.stopping.is_set():
                self._fail(f"cluster {setting.name}: {found.what}", found.fix)
            return False
        self.membership = found
        self.state.cluster = found.as_dict()
        log.info("cluster %s: rank %d of %d, head %s, this node %s (%s), found by %s", found.name, found.rank,
                 found.nodes, found.head_address, found.address, found.interface or "interface unknown",
                 found.found_by)
        self._lap("find the cluster")
        return True

    def _watch_cluster(self, member: Membership, decision: Decision) -> None:
        assert self.supervisor is not None and decision.plan is not None and decision.machine is not None
        if self.options.cluster.firewall:
            why = open_firewall(member, (self.options.cluster.peer_port, *distributed_ports(decision.plan)))
            if why:
                log.warning("firewall: %s; the cluster's traffic may be refused (fix: open TCP from the VPC to "
                            "this node)", why)
        gpus = tuple({"index": g.index, "name": g.name, "memory_gib": round(g.memory_bytes / 2**30, 1)}
                     for g in decision.machine.gpus)
        self.node_watch = NodeWatch(member, self.supervisor, self.supervisor.instances[0], self.state, gpus,
                                    self.options.cluster)
        self.node_watch.start()

    def _hub_client(self, token: str | None) -> HubClient:
        return HubClient(hub_cache(self.parts.caches.hf_home), token)

    def _caches_for(self, decision: Decision) -> Caches:
        """Where this plan's caches go: the disk that holds its files already, else the roomiest."""
        assert decision.plan is not None and decision.profile is not None
        served = [(m.plan, m.profile) for m in decision.models] or [(decision.plan, decision.profile)]
        repos = [n.repo for plan, profile in served for n in repos_for(plan, profile.local_model)]
        return place_caches(self.kiln.mounts(), self.options.layout.state_dir, repos)

    def _use_caches(self, caches: Caches) -> None:
        self.parts.caches = caches
        self.state.cache = caches.as_dict()
        log.info("cache disk: %s: %s", caches.root, caches.disk.reason)

    def _max_in_flight(self, decision: Decision) -> int:
        """nginx's bound on requests in flight: the option, else QUEUE_FACTOR x the instances' batch slots."""
        assert decision.plan is not None
        served = [(m.plan, m.rendered) for m in decision.models] or [(decision.plan, decision.rendered)]
        return (self.options.max_in_flight
                or sum(QUEUE_FACTOR * plan.engine.max_num_seqs * len(rendered) for plan, rendered in served))

    def _doctor(self, decision: Decision, verdict: HubVerdict | None) -> Report:
        assert decision.plan is not None and decision.profile is not None
        cache = self.parts.caches.hf_home
        needs = needs_of(decision.plan, decision.profile)
        if verdict and verdict.readable:  # the Hub's exact sizes instead of the estimate
            needs = dataclasses.replace(needs, model_bytes=verdict.bytes)
        return self.kiln.doctor(self.options.machine, cache, needs, vllm_python(self.options.vllm_command))[1]

    def _download(self, models: ModelStep, verdict: HubVerdict, token: str | None) -> bool:
        self.state.set_phase(DOWNLOADING)
        milestones = Milestones()

        def progress(p: Progress) -> None:
            self.state.download = p.as_dict()
            milestones(p)

        why = models.download(self._hub_client(token), verdict.readable, progress)
        if why is None:
            self.parts.models_cached = True
            return True
        if not self.stopping.is_set():
            self._fail(why, "check the network and the disk; restart kiln-agent to resume (files already complete "
                       "are kept)")
        return False

    def _preflight(self, decision: Decision, verdict: HubVerdict | None = None) -> bool:
        """Run the doctor before any vLLM starts; False (phase failed, with the fix) when something blocks."""
        report = self._doctor(decision, verdict)
        deadline = time.monotonic() + DOCTOR_WAIT_S
        while report.only_transient_failures() and time.monotonic() < deadline:
            log.info("pre-flight: waiting: %s", report.summary())
            if self.stopping.wait(DOCTOR_RETRY_S):
                break
            report = self._doctor(decision, verdict)
        self.state.doctor = report.as_dict()
        for check in report.warnings:
            log.warning("pre-flight warning: %s: %s (fix: %s)", check.name, check.detail, check.fix)
        if not report.blocking:
            log.info("pre-flight: %s", report.summary())
            return True
        for check in report.blocking[1:]:
            log.error("pre-flight: %s: %s (fix: %s)", check.name, check.detail, check.fix)
        first = report.blocking[0]
        self._fail(f"pre-flight: {first.name}: {first.detail}", first.fix,
                   motd_fix=f"{first.fix} (`kiln doctor` for the full report)")
        return False

    def _fail(self, what: str, fix: str, *, journal: str | None = None, motd_fix: str | None = None) -> None:
        """Nothing will be served: say why and how to fix it on /status, in the journal, the MOTD and to systemd."""
        self.state.fail(what, fix, fatal=True)
        log.error("%s (fix: %s)", journal or what, fix)
        self._write_motd_text(f"kiln: NOT SERVING: {what}\nkiln: fix: {motd_fix or fix}\n")
        sd_notify(f"STATUS=failed: {what}")

    def _report_problems(self, decision: Decision) -> None:
        for problem in decision.problems:
            log.warning("%s", problem.text())
        if decision.problems:
            first = decision.problems[0]
            self.state.fail(": ".join(x for x in (first.source, first.field, first.what) if x), first.fix)

    # -- what runs ---------------------------------------------------------------------------------------------
    def _supervisor(self, decision: Decision, resolved: ResolvedChoice) -> Supervisor:
        layout, options = self.options.layout, self.options
        assert decision.plan is not None and decision.profile is not None
        self.parts.make_local_model(decision)
        self.parts.write_hf_token(resolved.choice.hf_token)
        if decision.node and not decision.node.is_head:
            return self._worker_supervisor(decision)
        nginx, router = find_nginx(), find_router()
        if not nginx:
            raise KilnError("nginx is not installed; it fronts the public endpoint",
                            fix="install it: apt-get install nginx-light (or nginx)")
        if not router:
            raise KilnError("vllm-router is not installed", fix="pip install vllm-router in kiln's environment")
        settings = ProxySettings(max_in_flight=self._max_in_flight(decision), worker_user=options.proxy_user,
                                 instance_ports=tuple(r.port for r in decision.rendered),
                                 routes=tuple(ModelRoute(m.names, self.options.layout.for_router(n).router_port,
                                                         tuple(r.port for r in m.rendered))
                                              for n, m in enumerate(decision.models)),
                                 njs_module=find_njs_module())
        own_host = layout.local_host if layout.public_host in ("0.0.0.0", "::") else layout.public_host
        self.endpoint = Endpoint(Front(layout, settings, nginx=nginx),
                                 self.state, options.advertised_host, options.tls_names, self._write_motd_text,
                                 self._reload_proxy,
                                 served_sha256=lambda: served_certificate_sha256(own_host, layout.public_port))
        self.endpoint.configure(resolved)
        proxy = Member(ProcessSpec("proxy", nginx_argv(nginx, layout), log_file=log_file(self.parts.logs, "proxy")))
        router_member = Member(ProcessSpec("router", router_argv(router, layout, options.router),
                                           log_file=log_file(self.parts.logs, "router")),
                               probe_url=f"{layout.router_url}/health")
        instances = [self.parts.instance(r) for r in decision.rendered]
        for member in instances if decision.node else ():
            member.held = True  # the cluster's head starts its engine once every node answers
        self._router_binary = router
        links = []
        if decision.models:
            self._routers = {decision.models[0].name: (None, layout.router_port)}
        for n, served in enumerate(decision.models[1:], start=1):  # one router per model (docs/serving.md)
            link = self._router_link(n)
            links.append(link)
            self._routers[served.name] = (link, self.options.layout.for_router(n).router_port)
            for rendered in served.rendered:
                member = self.parts.instance(rendered)
                member.via = link
                instances.append(member)
        self._waiting = one_after_another(instances)
        self.parts.write_runtime([proxy, router_member, *(link.member for link in links), *instances])
        return Supervisor(launcher=self.parts.make_launcher(decision), routing=RouterClient(layout.router_url),
                          probe=http_probe, settings=options.supervisor, router=router_member, others=[proxy],
                          instances=instances, more_routers=links)

    def _router_link(self, n: int) -> RouterLink:
        own = self.options.layout.for_router(n)
        return RouterLink(Member(ProcessSpec(f"router-{n}", router_argv(self._router_binary, own, self.options.router),
                                             log_file=log_file(self.parts.logs, f"router-{n}")),
                                 probe_url=f"{own.router_url}/health"), RouterClient(own.router_url))

    def _release_waiting(self) -> None:
        """Start an instance held for the one before it on its GPU, once that one serves."""
        for member, before in list(self._waiting):
            if before.state == READY and self.supervisor is not None:
                self._waiting.remove((member, before))
                self.supervisor.release(member)

    def _worker_supervisor(self, decision: Decision) -> Supervisor:
        """A cluster's worker node: only its engine, headless, started for the head's generation (NodeWatch)."""
        rendered = decision.rendered[0]
        engine = Member(self.parts.spec(rendered), port=rendered.port, held=True)
        self.parts.write_runtime([engine])
        if self.membership:
            m = self.membership
            self._write_motd_text(f"kiln: cluster {m.name}: this node is rank {m.rank} of {m.nodes}; the endpoint is "
                                  f"served by the head, {m.head_address} (`kiln status` there lists every node)\n")
        return Supervisor(launcher=self.parts.make_launcher(decision),
                          routing=RouterClient(self.options.layout.router_url), probe=http_probe,
                          settings=self.options.supervisor, instances=[engine])

    def _check_runtime_file(self) -> None:
        try:
            why = self.parts.restore_runtime()
        except OSError as exc:  # a full or read-only disk: said, and tried again at the next lap
            self.state.fail(f"the runtime file {self.options.layout.runtime_file} cannot be written: {exc}",
                            "free space on the state disk; kiln writes it again by itself")
            return
        if why:
            log.warning("%s was %s; written again from the agent's plan", self.options.layout.runtime_file, why)
            self.state.fail(f"the runtime file {self.options.layout.runtime_file} was {why}; kiln wrote it again "
                            "from the running plan", "nothing to do; to change the plan, edit the choice and run "
                            "`kiln reload`")

    def _reload_proxy(self) -> None:
        """nginx re-reads its configuration; this returns once no worker answers with the one before, so a key
        revoked is refused from the moment `kiln keys` says it is applied."""
        proxy = self.supervisor.others[0] if self.supervisor and self.supervisor.others else None
        if not (proxy and proxy.running):
            return
        master = proxy.running.pid
        before = serving_workers(children_of(master)) if master else set()
        proxy.running.reload()
        if master and not wait_in_force(lambda: children_of(master), before, PROXY_RELOAD_WAIT_S):
            what = (f"nginx has not put its new configuration in force within {PROXY_RELOAD_WAIT_S:.0f} s: "
                    "its workers may still answer with the keys and limits before")
            log.error("%s", what)
            self.state.fail(what, f"see the proxy's log in {self.parts.logs}, then `kiln reload`")

    def _reload(self) -> None:
        """Keys, rates and the certificate apply at once: nginx re-reads its configuration gracefully."""
        started = time.monotonic()
        if self.endpoint is None:
            log.warning("reload: nothing is served yet; the choice is read again at the next start")
            return
        try:
            resolved = self.options.read_choice()
        except Exception as exc:  # a bad file must not take serving down
            log.error("reload: could not read the choice: %s; nothing changed", exc)
            return
        for problem in resolved.problems:
            log.warning("reload: %s", problem.text())
        if resolved.problems:  # left out; the rest applies, and /status says what was left out
            first = resolved.problems[0]
            where = f"{first.source}: {first.field}" if first.field else first.source
            self.state.fail(f"reload: {where}: {first.what}" + (f" (and {len(resolved.problems) - 1} more in the "
                            "journal)" if len(resolved.problems) > 1 else ""), first.fix, origin="reload")
        report: dict[str, object] = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "changed": [],
                                     "seconds": 0.0, "planned": False, "rolling": None}
        try:
            changed = self.endpoint.reload(resolved)
        except KilnError as exc:  # nginx refused the change, or the key store cannot be read: nothing changed
            log.error("reload: %s (fix: %s)", exc.what, exc.fix)
            self.state.fail(f"reload: {exc.what}", exc.fix, origin="reload")
            self.state.reload = {**report, "seconds": round(time.monotonic() - started, 3), "planned": True,
                                 "error": {"what": exc.what, "fix": exc.fix}}
            return
        if not resolved.problems:  # an earlier reload's fault no longer holds; a new one is reported below
            self.state.recovered("reload")
        self._check_runtime_file()
        # Keys and certificate are in force now; the plan is read next (the Hub may be asked).
        report |= {"changed": changed, "seconds": round(time.monotonic() - started, 3)}
        self.state.reload = report
        plan = self._changed_plan(resolved)
        changed = [*changed, "plan"] if plan is not None else changed
        self.state.reload = {**report, "changed": changed, "seconds": round(time.monotonic() - started, 3),
                             "planned": True, "rolling": {"state": "running"} if plan else None}
        log.info("reload: %s in %.2f s", ", ".join(changed) or "nothing changed", time.monotonic() - started)
        if plan is not None:
            self._rollout = threading.Thread(target=self._roll, args=(*plan, resolved), name="kiln-rollout",
                                             daemon=True)
            self._rollout.start()

    def _changed_plan(self, resolved: ResolvedChoice) -> tuple[Decision, Caches] | None:
        """The new choice's decision, rendered for where its caches go, when it serves something else than now;
        None when the plan stays (or cannot change now: a rolling change under way, or a choice that cannot be
        served, which is reported)."""
        if self._rollout and self._rollout.is_alive():
            log.warning("reload: a rolling change is under way; the plan is read again at the next reload")
            return None
        if self.membership is not None:
            log.warning("reload: a cluster's plan changes only when every node restarts (systemctl restart "
                        "kiln-agent on each); keys and the certificate changed now")
            return None
        decision = decide(self.kiln, self.options.machine, resolved, self._runtime)
        several = (bool(decision.models), bool(self.decision and self.decision.models))
        if any(several) and decision.plan is not None:
            if not all(several):
                what = "reload: one model becomes several or several one; that change is served at kiln's next start"
                log.warning("%s", what)
                self.state.fail(what, "restart kiln (`systemctl restart kiln-agent`, or `kiln up` again)",
                                origin="reload")
                return None
            assert self.decision is not None
            if not models_change(self.decision.models, decision.models).any:
                return None
            return decision, self._caches_for(decision)
        decision, self._verdict = self._models.check(decision, resolved)
        if decision.failure or decision.plan is None:
            what, fix = decision.failure or ("no plan", "")
            log.error("reload: the new choice cannot be served: %s (fix: %s); the current plan keeps serving",
                      what, fix)
            self.state.fail(f"reload: {what}; the current plan keeps serving", fix, origin="reload")
            return None
        caches = self._caches_for(decision)
        decision.render(caches.runtime(self._runtime))
        return None if decision.plan_report() == self.state.plan else (decision, caches)

    def _roll(self, decision: Decision, caches: Caches, resolved: ResolvedChoice) -> None:
        """A new plan, one instance at a time: each leaves routing, finishes its requests in flight (bounded),
        stops, and its successor starts and joins routing before the next; the others serve throughout."""
        sup, layout = self.supervisor, self.options.layout
        assert sup is not None and decision.plan is not None and self.endpoint is not None
        started = time.monotonic()
        self._use_caches(caches)
        if decision.models:
            return self._roll_models(decision, resolved, started)
        report = self._doctor(decision, self._verdict)
        if report.blocking:
            first = report.blocking[0]
            return self._rolled("refused", f"pre-flight: {first.name}: {first.detail}", first.fix)
        verdict = self._verdict
        if verdict and verdict.readable:
            why = self._models.download(self._hub_client(resolved.choice.hf_token), verdict.readable,
                                        lambda p: setattr(self.state, "download", p.as_dict()))
            if why:
                return self._rolled("refused", why, "check the network and the disk, then `kiln reload`")
        self.parts.make_local_model(decision)
        self.parts.write_hf_token(resolved.choice.hf_token)
        members = [self.parts.instance(r) for r in decision.rendered]
        dropins = self.parts.dropins(decision)
        if len(sup.instances) < 2:
            last = [t.get("ready_s") for t in (self.state.startup.get("instances") or {}).values()]
            took = max((t for t in last if t is not None), default=None)
            log.warning("rolling change: the only instance restarts; nothing is served until it is back%s",
                        f" (about {took:.0f} s: its last start took that long)" if took else "")
        log.info("rolling change to %s: %d instance(s) replaced one at a time", decision.plan.profile, len(members))
        why = sup.roll(members, lambda member: drain(member, self.stopping), self.options.supervisor.start_timeout_s,
                       lambda member: self.parts.put_runtime(member, dropins.get(member.name)))
        if why:
            return self._rolled("stopped", why, "see `kiln status`; the instances not yet replaced keep serving")
        self.parts.write_runtime([*sup.others, *([sup.router] if sup.router else []), *members])  # committed
        self.parts.use_dropins(decision)
        self.decision = decision
        self.state.plan = decision.plan_report()
        self.state.choice = decision.choice_report()
        write_private(layout.plan_file, json.dumps(self.state.plan, indent=2) + "\n")
        self.endpoint.set_plan(self._max_in_flight(decision), tuple(r.port for r in decision.rendered))
        self._rolled("done", f"{decision.plan.profile} on {len(members)} instance(s) in "
                             f"{time.monotonic() - started:.0f} s", "")

    def _roll_models(self, decision: Decision, resolved: ResolvedChoice, started: float) -> None:
        """Several models: the ones removed stop, each changed one rolls its own instances, the ones added start
        with routers of their own; the models kept are not touched, and serve throughout."""
        sup, old = self.supervisor, self.decision
        assert sup is not None and old is not None and self.endpoint is not None
        change = models_change(old.models, decision.models)
        self.parts.make_local_model(decision)
        self.parts.write_hf_token(resolved.choice.hf_token)
        names = {m.name for m in sup.instances}
        ports = {m.port for m in sup.instances if m.port} | {port for _, port in self._routers.values()}
        first_port = self._runtime.first_instance_port or int(self.kiln.constants.get("planning",
                                                                                      "first_instance_port"))
        runtime = dataclasses.replace(self.parts.caches.runtime(self._runtime), first_instance_port=None)
        kept = {m.name: m for m in change.kept}
        models = []
        for model in decision.models:
            if model.name in kept:
                models.append(kept[model.name])
                continue
            fresh = renumbered(model, names, ports, first_port)
            fresh.rendered = render_instances(fresh.plan, runtime, local_model=fresh.profile.local_model)
            models.append(fresh)
        decision.models = models
        decision.rendered = models[0].rendered
        dropins = self.parts.dropins(decision)
        by_name = {m.name: m for m in models}

        def members_of(model: ServedModel) -> list[Member]:
            own = {r.name for r in model.rendered}
            return [m for m in sup.instances if m.name in own]

        for model in change.removed:  # out of nginx's routes first: its name is then an unknown model (404)
            link, _ = self._routers.pop(model.name)
            self._set_routes(decision, [m for m in models if m.name in self._routers])
            sup.remove(members_of(model), lambda member: drain(member, self.stopping), link)
            log.info("reload: %s is no longer served", model.name)
        for was, _ in change.changed:
            model = by_name[was.name]
            link = self._routers[model.name][0]
            members = [self.parts.instance(r) for r in model.rendered]
            for member in members:
                member.via = link
            why = sup.roll(members, lambda member: drain(member, self.stopping),
                           self.options.supervisor.start_timeout_s,
                           lambda member: self.parts.put_runtime(member, dropins.get(member.name)),
                           old=members_of(was))
            if why:
                return self._rolled("stopped", f"{model.name}: {why}", "see `kiln status`; the other models serve")
            log.info("reload: %s rolled to its new plan", model.name)
        for model in change.added:
            used = {int(link.member.name.split("-")[1]) for link, _ in self._routers.values() if link}
            n = next(k for k in range(1, len(used) + 2) if k not in used)
            link = self._router_link(n)
            members = [self.parts.instance(r) for r in model.rendered]
            for member in members:
                member.via = link
            self._waiting += one_after_another([*sup.instances, *members])
            for member in (link.member, *members):
                self.parts.put_runtime(member, dropins.get(member.name))
            sup.add(members, link)
            why = self._until_routed(members)
            if why:
                return self._rolled("stopped", f"{model.name}: {why}", "see `kiln status`; the other models serve")
            # Routed once it serves: until then its name stays unknown (404) rather than unavailable (503).
            self._routers[model.name] = (link, self.options.layout.for_router(n).router_port)
            self._set_routes(decision, [m for m in models if m.name in self._routers])
            log.info("reload: %s added on %d instance(s)", model.name, len(members))
        self.parts.write_runtime(sup.members())
        self.parts.use_dropins(decision)
        self.decision = decision
        self.state.plan = decision.plan_report()
        self.state.choice = decision.choice_report()
        write_private(self.options.layout.plan_file, json.dumps(self.state.plan, indent=2) + "\n")
        self._set_routes(decision, models)
        what = ", ".join([*(f"{m.name} removed" for m in change.removed),
                          *(f"{m.name} changed" for m, _ in change.changed),
                          *(f"{m.name} added" for m in change.added)])
        self._rolled("done", f"{what} in {time.monotonic() - started:.0f} s", "")

    def _until_routed(self, members: list[Member]) -> str | None:
        """None once every member serves and is routed; else why not (stopping, or past the start timeout)."""
        deadline = time.monotonic() + self.options.supervisor.start_timeout_s
        while not all(m.state == READY and m.routed for m in members):
            if self.stopping.wait(self.options.supervisor.tick_s):
                return "stopping"
            if time.monotonic() > deadline:
                late = next(m for m in members if not m.routed)
                return f"{late.name} was not serving {self.options.supervisor.start_timeout_s:.0f} s after it started"
        return None

    def _set_routes(self, decision: Decision, models: list[ServedModel]) -> None:
        assert self.endpoint is not None
        routes = tuple(ModelRoute(m.names, self._routers[m.name][1], tuple(r.port for r in m.rendered))
                       for m in models)
        self.endpoint.set_plan(self._max_in_flight(decision), tuple(r.port for r in decision.rendered), routes)

    def _rolled(self, state: str, what: str, fix: str) -> None:
        if self.state.reload is not None:
            self.state.reload["rolling"] = {"state": state, "detail": what, "fix": fix or None}
        if state == "done":
            log.info("rolling change: done: %s", what)
        else:
            log.error("rolling change: %s: %s (fix: %s)", state, what, fix)
            self.state.fail(f"rolling change {state}: {what}", fix)

    def _write_motd_text(self, text: str) -> None:
        path = self.options.motd_file
        if path is None:
            return
        try:
            write_private(path, text)
        except OSError as exc:
            log.warning("could not write the MOTD %s: %s", path, exc)

    # -- the self-check ----------------------------------------------------------------------------------------
    def _start_self_check(self) -> None:
        """Once, when every instance first serves."""
        sup, settings, decision = self.supervisor, self.options.self_check, self.decision
        if (self._self_check or not sup or not settings or self.endpoint is None or decision is None
                or len(sup.ready_instances()) < len(sup.instances)):
            return
        self.state.self_check = {"state": "running"}
        workload = decision.choice.choice.workload
        settings = settings.shaped(resolve_workload(workload) if workload else None)
        self._self_check = threading.Thread(target=self._run_self_check, args=(decision, settings),
                                            name="kiln-self-check", daemon=True)
        self._self_check.start()

    def _run_self_check(self, decision: Decision, settings: SelfCheckSettings) -> None:
        layout = self.options.layout
        result = run_self_check(decision, settings, self.kiln.constants, layout.router_url,
                                vllm_python(self.options.vllm_command), layout.state_dir / "self-check.log",
                                self.parts.env(decision.rendered[0]))
        self.state.self_check = result
        log.log(logging.WARNING if result.get("degraded") else logging.INFO, "self-check: %s", result["verdict"])

    # -- reports -----------------------------------------------------------------------------------------------
    def metrics(self) -> bytes:
        return self.reports.metrics()


def one_after_another(instances: list[Member]) -> list[tuple[Member, Member]]:
    """Instances that share a GPU start one after another: concurrent starts measure each other's memory as used
    and shrink each other's KV cache, or fail (vllm#55827). Each is held until the one before it on its GPUs serves."""
    waiting = []
    for n, member in enumerate(instances):
        before = next((m for m in reversed(instances[:n]) if set(m.gpus) & set(member.gpus)), None)
        if before is not None and member.gpus:
            member.held = True
            waiting.append((member, before))
    return waiting


def configure_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
