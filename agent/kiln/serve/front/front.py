"""The public endpoint's files: the keys, the certificate and nginx's configuration, all root's. The agent asks for
them at boot and after every change; nginx then reloads gracefully (HUP), which cuts no request in flight."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kiln.choice.schema import NamedKey, Problem, TlsAcme, TlsCertificate, TlsSetting
from kiln.errors import KilnError
from kiln.processes import run_to_end
from kiln.serve.front.acme import Issued
from kiln.serve.front.filelock import held
from kiln.serve.front.keys import DEFAULT_NAME, KeyChangeError, KeyStore, declared_keys
from kiln.serve.front.proxy import ProxySettings, TlsFiles, nginx_config, nginx_test_argv
from kiln.serve.front.secretfiles import load_keys_checked, read_private, save_keys, write_private
from kiln.serve.front.tls import CertificateError, CertificateInfo, check_pair, covers, inspect, make_self_signed
from kiln.serve.layout import ServeLayout

log = logging.getLogger("kiln.agent")


class FrontConfigError(KilnError):
    """nginx refuses a configuration; the live one is unchanged."""
PUBLIC = 0o644  # certificates: clients pin them, `kiln status --certificate` prints them


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@dataclass(frozen=True)
class TlsState:
    files: TlsFiles | None  # None: plain HTTP
    mode: str  # off, self-signed, certificate, acme
    info: CertificateInfo | None = None
    problem: Problem | None = None
    acme: TlsAcme | None = None  # an ACME certificate is wanted (and may not be issued yet)

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"mode": self.mode}
        if self.files:
            out["certificate"] = str(self.files.certificate)
        if self.info:
            out |= self.info.as_dict()
        if self.acme:
            out["domain"] = self.acme.domain
        if self.problem:
            out["problem"] = self.problem.as_dict()
        return out


@dataclass
class Front:
    layout: ServeLayout
    settings: ProxySettings
    clock: Callable[[], dt.datetime] = utc_now
    keys: KeyStore = field(default_factory=KeyStore)
    tls: TlsState = field(default_factory=lambda: TlsState(None, "off"))
    nginx: str | None = None  # checks each configuration before it is used (`nginx -t`); None: written unchecked
    key_problems: tuple[Problem, ...] = ()  # the last load_keys': what of the store or the settings was left out

    # -- keys --------------------------------------------------------------------------------------------------
    def load_keys(self, api_key: str | None, api_keys: Mapping[str, NamedKey] | None) -> KeyStore:
        """The store on disk, with what user-data declares now; a first boot makes the default key. A bad entry of
        the store, or a declared key the store cannot take (its key is another name's), is left out, said in
        key_problems, and the rest applies."""
        with held(self.layout.keys_file):  # `kiln keys` changes it under the same lock
            stored, problems = load_keys_checked(self.layout.keys_file, self.layout.api_key_file)
            store, left_out = stored, list(problems)
            for name, spec in sorted(declared_keys(api_key, api_keys).items()):
                try:
                    store = store.with_declared({name: spec})
                except KeyChangeError as exc:
                    left_out.append(Problem("settings", "api_key" if name == DEFAULT_NAME and api_key else "api_keys",
                                            f"the key named {name} is not applied: {exc}",
                                            "give it a key no other name holds (`kiln keys list` names them), then "
                                            "`kiln reload`"))
            store = store.with_default()
            if store != stored:
                save_keys(self.layout.keys_file, store)
            self.layout.api_key_file.unlink(missing_ok=True)
        self.keys, self.key_problems = store, tuple(left_out)
        return store

    # -- the certificate ---------------------------------------------------------------------------------------
    def _pair(self, kind: str) -> TlsFiles:
        return TlsFiles(self.layout.tls_dir / f"{kind}.crt", self.layout.tls_dir / f"{kind}.key")

    def _write(self, files: TlsFiles, cert_pem: str, key_pem: str) -> None:
        self.layout.tls_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        write_private(files.private_key, key_pem)
        write_private(files.certificate, cert_pem, mode=PUBLIC)

    def _held(self, files: TlsFiles) -> CertificateInfo | None:
        cert, key = read_private(files.certificate), read_private(files.private_key)
        if not cert or not key:
            return None
        try:
            return check_pair(cert, key, self.clock())
        except CertificateError:
            return None

    def self_signed(self, names: Sequence[str]) -> TlsState:
        """The certificate kiln made, kept across boots while it names every address and is a month from its end."""
        files, now = self._pair("self-signed"), self.clock()
        held = self._held(files)
        if held and covers(held, names) and not held.due(now):
            return TlsState(files, "self-signed", held)
        cert, key = make_self_signed(names, now)
        self._write(files, cert, key)
        info = inspect(cert)
        log.info("TLS: made a self-signed certificate for %s, SHA-256 %s", ", ".join(names), info.sha256)
        return TlsState(files, "self-signed", info)

    def choose_tls(self, setting: TlsSetting | None, names: Sequence[str]) -> TlsState:
        """The certificate nginx starts with. A bad one given by the user, or an ACME one not issued yet, leaves
        the self-signed one serving, with the reason."""
        if setting == "off":
            self.tls = TlsState(None, "off")
        elif isinstance(setting, TlsCertificate):
            self.tls = self._given(setting, names)
        elif isinstance(setting, TlsAcme):
            files = self._acme_files(setting)
            held = self._held(files)
            if held and setting.domain in held.names:
                self.tls = TlsState(files, "acme", held, acme=setting)
            else:
                self.tls = dataclasses.replace(self.self_signed(names), acme=setting)
        else:
            self.tls = self.self_signed(names)
        return self.tls

    def _given(self, setting: TlsCertificate, names: Sequence[str]) -> TlsState:
        try:
            info = check_pair(setting.certificate, setting.private_key, self.clock())
        except CertificateError as exc:
            fallback = self.self_signed(names)
            problem = Problem("user-data", "tls", f"the given certificate cannot serve: {exc}; serving a "
                              f"self-signed one (SHA-256 {fallback.info.sha256 if fallback.info else '?'})",
                              "give the PEM certificate (leaf first, then its chain) and its unencrypted key")
            return TlsState(fallback.files, "self-signed", fallback.info, problem)
        files = self._pair("given")
        self._write(files, setting.certificate.strip() + "\n", setting.private_key.strip() + "\n")
        return TlsState(files, "certificate", info)

    def _acme_files(self, setting: TlsAcme) -> TlsFiles:
        return self._pair(f"acme-{setting.domain}")

    @property
    def acme_account_key(self) -> Path:
        return self.layout.tls_dir / "acme-account.key"

    def acme_due(self) -> bool:
        """An ACME certificate is wanted and there is none yet, or it is within its renewal window."""
        wanted = self.tls.acme
        if wanted is None:
            return False
        info = self.tls.info
        if self.tls.mode != "acme" or info is None:
            return True
        # At most a third of the lifetime before its end (Let's Encrypt's own advice), so that a window longer
        # than the certificate never orders one after another.
        return info.due(self.clock(), min(dt.timedelta(days=wanted.renew_before_days),
                                          (info.not_after - info.not_before) / 3))

    def acme_issued(self, issued: Issued) -> TlsState:
        assert self.tls.acme is not None
        files = self._acme_files(self.tls.acme)
        self._write(files, issued.certificate_pem, issued.private_key_pem)
        self.tls = TlsState(files, "acme", inspect(issued.certificate_pem), acme=self.tls.acme)
        return self.tls

    # -- nginx -------------------------------------------------------------------------------------------------
    def write_config(self) -> None:
        """nginx's configuration for the keys, settings and certificate now, checked by nginx itself (`nginx -t`)
        before it replaces the live one: a configuration nginx refuses is never signalled, the old one stays."""
        for sub in ("tmp", "logs"):
            (self.layout.proxy_config.parent / sub).mkdir(parents=True, exist_ok=True)
        self.layout.acme_webroot.mkdir(parents=True, exist_ok=True)
        try:
            text = nginx_config(self.layout, self.settings, self.keys, self.tls.files)
        except ValueError as exc:  # what the configuration cannot say: nothing is written, the live one stays
            raise FrontConfigError(f"{exc}; the endpoint keeps the configuration before the change",
                                   fix="install what it names, or undo the change (`kiln keys list`), then "
                                   "`kiln reload`") from exc
        live = self.layout.proxy_config
        if self.nginx is None:
            write_private(live, text)
            return
        candidate = live.with_name(f"{live.stem}.new{live.suffix}")
        write_private(candidate, text)
        code, output = run_to_end(nginx_test_argv(self.nginx, self.layout, candidate))
        if code != 0:
            candidate.unlink(missing_ok=True)
            said = " ".join(self.keys.redact(line.strip()) for line in output.splitlines() if line.strip())
            raise FrontConfigError(f"nginx refuses the new configuration ({said or f'exit {code}'}); the endpoint "
                                   "keeps the one before the change",
                                   fix="undo the change (`kiln keys list`, /etc/kiln/kiln.yaml), then `kiln reload`")
        os.replace(candidate, live)
