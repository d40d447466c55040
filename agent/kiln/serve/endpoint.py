"""The public endpoint as the agent runs it: keys and certificate set at start, changed by a reload, the ACME
certificate issued and renewed in the background. nginx re-reads its configuration gracefully after each change,
so nothing restarts and no request in flight is cut. /status and the login message follow every change."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kiln.choice.resolve import ResolvedChoice
from kiln.errors import KilnError
from kiln.serve.front.acme import AcmeError, Issued, issue_certificate
from kiln.serve.front.front import Front, TlsState
from kiln.serve.front.proxy import ModelRoute
from kiln.serve.reports.state import AgentState
from kiln.setup.headline import headline_of

log = logging.getLogger("kiln.agent")
ACME_RETRY_S = 600.0  # after a failed ACME order: Let's Encrypt allows 5 failed validations an hour
SWAP_WAIT_S = 30.0  # nginx's new workers take the new certificate; a loaded machine starts them late


@dataclass
class Endpoint:
    front: Front
    state: AgentState
    advertised_host: str
    tls_names: tuple[str, ...]  # besides the metadata's addresses
    motd: Callable[[str], None]  # writes the login message
    reload_proxy: Callable[[], None]  # SIGHUP to nginx's master
    _lock: threading.Lock = field(default_factory=threading.Lock)  # a reload and the ACME thread both write
    issue: Callable[..., Issued] = issue_certificate  # the ACME order (kiln.serve.front.acme)
    _acme: threading.Thread | None = None
    _acme_retry_at: float = 0.0
    # The SHA-256 of the certificate the endpoint presents now (kiln.serve.processes.probes); None: not checked.
    served_sha256: Callable[[], str | None] | None = None
    swap_wait_s: float = SWAP_WAIT_S

    def configure(self, resolved: ResolvedChoice) -> TlsState:
        """Keys and certificate from the choice, into nginx's configuration (nginx re-reads it on reload_proxy)."""
        names = tuple(dict.fromkeys((*resolved.addresses, self.advertised_host, *self.tls_names)))
        with self._lock:
            before = (self.front.keys, self.front.tls)
            try:
                keys = self.front.load_keys(resolved.choice.api_key, resolved.choice.api_keys)
                tls = self.front.choose_tls(resolved.choice.tls, names)
                self.front.write_config()
            except KilnError:  # nginx keeps serving the configuration before; so do /status and the MOTD
                self.front.keys, self.front.tls = before
                raise
            except ValueError as exc:  # a key change that cannot be made (KeyChangeError): the same, never an exit
                self.front.keys, self.front.tls = before
                raise KilnError(f"the keys cannot change: {exc}; the endpoint keeps the keys before",
                                fix="`kiln keys list`, correct the keys in /etc/kiln/kiln.yaml, then `kiln reload`"
                                ) from exc
            except OSError as exc:  # a full disk: the same, said as such
                self.front.keys, self.front.tls = before
                raise KilnError(f"the endpoint's files cannot be written ({exc.strerror}: {exc.filename}); the "
                                "endpoint keeps serving as before",
                                fix=f"free space on {self.front.layout.state_dir}'s disk, then `kiln reload`") from exc
        for problem in self.front.key_problems:  # left out; the other keys are in force
            log.warning("keys: %s", problem.text())
        if self.front.key_problems:
            first = self.front.key_problems[0]
            self.state.fail(": ".join(x for x in (first.source, first.field, first.what) if x), first.fix)
        if tls.problem:
            log.warning("%s", tls.problem.text())
            self.state.fail(f"{tls.problem.source}: {tls.problem.field}: {tls.problem.what}", tls.problem.fix)
        self.state.endpoint = self.front.layout.endpoint_url(self.advertised_host, tls.files is not None)
        self.state.tls = tls.as_dict()
        self.state.keys = [k.public() for k in keys.keys]
        self.motd(self.motd_text())
        return tls

    def reload(self, resolved: ResolvedChoice) -> list[str]:
        """Keys, rates and the certificate in force at once; what changed. A KilnError when nginx refuses the new
        configuration or the key store cannot be read: then nothing changed."""
        self._acme_retry_at = 0.0  # a reload retries a failed ACME order at once
        before = (self.front.keys, self.front.tls.info)
        self.configure(resolved)
        self.reload_proxy()
        if self.front.tls.info != before[1]:
            self._await_served(self.front.tls)
        return [what for what, old, new in (("keys", before[0], self.front.keys),
                                           ("certificate", before[1], self.front.tls.info)) if old != new]

    def set_plan(self, requests: int, instance_ports: tuple[int, ...],
                 routes: tuple[ModelRoute, ...] | None = None) -> None:
        """A new plan's queue bound (its instances' batch slots), its instances' ports and, with several models,
        each model's route."""
        with self._lock:
            before = self.front.settings
            self.front.settings = dataclasses.replace(before, max_in_flight=requests, instance_ports=instance_ports,
                                                      routes=before.routes if routes is None else routes)
            if self.front.settings == before:  # nothing to change: no reload, which closes idle client connections
                return
            try:
                self.front.write_config()
            except (KilnError, OSError) as exc:  # the bound before stays in force
                self.front.settings = before
                log.error("the new plan's bound on requests in flight is not in force: %s", exc)
                self.state.fail(f"the bound of {requests} requests in flight is not in force: {exc}",
                                "see the agent's journal, then `kiln reload`")
                return
        self.reload_proxy()

    def motd_text(self) -> str:
        tls = self.front.tls
        lines = [f"kiln: OpenAI-compatible endpoint {self.state.endpoint}/v1 (`kiln status` for the model and health)"]
        capacity = ((self.state.plan or {}).get("predicted") or {}).get("capacity")
        if capacity:
            lines.append(f"kiln: {(self.state.plan or {}).get('profile')} predicted: {headline_of(capacity)}")
        lines.append(f"kiln: API keys: {', '.join(self.front.keys.names())} (`sudo kiln keys show NAME` prints one)")
        if tls.files and tls.info:
            lines.append(f"kiln: TLS {tls.mode} certificate {tls.files.certificate}, SHA-256 {tls.info.sha256}"
                         + (" (pin it: `kiln status --certificate`)" if tls.info.self_signed else ""))
        elif not tls.files:
            lines.append("kiln: TLS off: plain HTTP (safe only behind a load balancer that terminates TLS)")
        return "\n".join(lines) + "\n"

    # -- ACME --------------------------------------------------------------------------------------------------
    def renew(self, force: bool = False) -> None:
        """An ACME certificate, in the background: the first one after boot, then each renewal, or now when forced
        (`kiln reload --renew-certificate`). Cheap to call."""
        if self._acme and self._acme.is_alive():
            return
        if not force and (time.monotonic() < self._acme_retry_at or not self.front.acme_due()):
            return
        if force and self.front.tls.acme is None:
            log.warning("TLS: nothing to renew: the certificate is not from ACME (tls: {domain: ...})")
            return
        self._acme = threading.Thread(target=self._issue, name="kiln-acme", daemon=True)
        self._acme.start()

    def _issue(self) -> None:
        wanted, layout = self.front.tls.acme, self.front.layout
        assert wanted is not None
        log.info("TLS: asking %s for a certificate for %s", wanted.directory, wanted.domain)
        try:
            issued = self.issue(wanted.directory, wanted.domain, wanted.email, self.front.acme_account_key,
                                layout.acme_webroot, progress=lambda text: log.info("ACME: %s", text))
        except Exception as exc:  # any failure backs off: every order counts against the CA's rate limits
            self._back_off(f"ACME: {exc}" if isinstance(exc, AcmeError) else f"ACME: {exc.__class__.__name__}: {exc}",
                           f"point {wanted.domain}'s DNS at this machine and keep port 80 open")
            return
        try:
            with self._lock:
                tls = self.front.acme_issued(issued)
                self.front.write_config()
            self.reload_proxy()
        except Exception as exc:  # issued, but not put in place: ordering again at once would only repeat this
            self._back_off(f"the ACME certificate was issued but cannot be put in place: {exc}",
                           f"free space and check the permissions of {layout.tls_dir}")
            return
        self._await_served(tls)
        self.state.tls = tls.as_dict()
        self.motd(self.motd_text())
        log.info("TLS: serving the ACME certificate for %s until %s", wanted.domain, issued.not_after.isoformat())

    def _await_served(self, tls: TlsState) -> None:
        """Until the endpoint presents the new certificate: /status says what clients get, not what was sent to
        nginx, whose old workers serve the old one until its new ones start."""
        if self.served_sha256 is None or tls.info is None:
            return
        deadline = time.monotonic() + self.swap_wait_s
        while (served := self.served_sha256()) != tls.info.sha256:
            if time.monotonic() >= deadline:
                log.warning("TLS: the endpoint still presents %s, %.0f s after nginx was told to serve %s",
                            served or "no certificate", self.swap_wait_s, tls.info.sha256)
                return
            time.sleep(0.2)

    def _back_off(self, what: str, fix: str) -> None:
        self._acme_retry_at = time.monotonic() + ACME_RETRY_S
        fix = f"{fix}; kiln retries in {ACME_RETRY_S / 60:.0f} minutes (or `kiln reload`)"
        log.warning("TLS: no certificate from ACME: %s (fix: %s)", what, fix)
        self.state.fail(f"tls: {what}", fix)
        self.state.tls = {**(self.state.tls or {}), "problem": {"error": what, "fix": fix}}
