"""kiln's ACME client (kiln.serve.front.acme) against Pebble, Let's Encrypt's test ACME server (tests/pebble.py): a real
issuance over HTTP-01 through a webroot served by a small static file server, a renewal with the same account, and
the errors a user sees when the CA cannot fetch the challenge or cannot be reached."""

from __future__ import annotations

import functools
import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import pytest
from acme import client, errors, messages
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.verification import PolicyBuilder, Store
from josepy.jwa import ES256
from josepy.jwk import JWKEC
from tests.pebble import Pebble, available, pebble_server

from kiln.serve.front.acme import AcmeError, Issued, issue_certificate

pytestmark = pytest.mark.skipif(available() is not None, reason=available() or "")

DOMAIN = "kiln.test"
CHALLENGES = Path(".well-known/acme-challenge")


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class FileServer:
    """A static web server on 127.0.0.1 serving `webroot`, standing in for nginx's port 80; `requests` lists the
    paths asked for."""

    webroot: Path
    server: ThreadingHTTPServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def _serve(webroot: Path) -> FileServer:
    webroot.mkdir(parents=True, exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(webroot)))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="webroot", daemon=True)
    thread.start()
    return FileServer(webroot, server, thread)


@dataclass
class Ca:
    pebble: Pebble
    files: FileServer
    workdir: Path


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ca]:
    workdir = tmp_path_factory.mktemp("acme")
    files = _serve(workdir / "webroot")
    try:
        with pebble_server(workdir / "pebble", files.port) as pebble:
            yield Ca(pebble, files, workdir)
    finally:
        files.stop()


def _issue(ca: Ca, account_key: Path, webroot: Path | None = None, domain: str = DOMAIN,
           messages: list[str] | None = None) -> Issued:
    return issue_certificate(ca.pebble.directory_url, domain, "ops@kiln.test", account_key,
                             webroot or ca.files.webroot, verify=str(ca.pebble.ca_bundle), timeout_s=60,
                             progress=messages.append if messages is not None else None)


def _check_issued(ca: Ca, issued: Issued) -> x509.Certificate:
    """The chain is for DOMAIN and the key in `issued`, and verifies up to Pebble's root."""
    chain = x509.load_pem_x509_certificates(issued.certificate_pem.encode())
    assert len(chain) >= 2, "the leaf then at least the intermediate"
    leaf = chain[0]
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [DOMAIN]

    key = serialization.load_pem_private_key(issued.private_key_pem.encode(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    assert issued.private_key_pem.startswith("-----BEGIN PRIVATE KEY-----")  # PKCS#8
    assert key.public_key() == leaf.public_key()

    assert issued.not_after == leaf.not_valid_after_utc and issued.not_after.utcoffset() is not None

    roots = x509.load_pem_x509_certificates(ca.pebble.issuing_roots_pem().encode())
    root = next(c for c in roots if c.subject == c.issuer)
    verifier = PolicyBuilder().store(Store([root])).build_server_verifier(x509.DNSName(DOMAIN))
    built = verifier.verify(leaf, chain[1:])
    assert built[0] == leaf and built[-1] == root
    return leaf


def _challenge_files(webroot: Path) -> list[str]:
    folder = webroot / CHALLENGES
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_issue_then_renew_with_the_same_account(ca: Ca, tmp_path: Path) -> None:
    account_key = tmp_path / "state" / "acme-account.key"
    said: list[str] = []
    started = time.monotonic()
    first = _issue(ca, account_key, messages=said)
    issue_s = time.monotonic() - started
    leaf = _check_issued(ca, first)

    assert _challenge_files(ca.files.webroot) == [], "the challenge file is removed afterwards"
    assert stat.S_IMODE((ca.files.webroot / CHALLENGES).stat().st_mode) == 0o755
    assert stat.S_IMODE(account_key.stat().st_mode) == 0o600
    assert any("HTTP-01" in m and f"http://{DOMAIN}/.well-known/acme-challenge/" in m for m in said), said
    assert first.private_key_pem not in repr(first)
    key_bytes = account_key.read_bytes()

    started = time.monotonic()
    second = _issue(ca, account_key)
    renew_s = time.monotonic() - started
    renewed = _check_issued(ca, second)
    assert account_key.read_bytes() == key_bytes, "the renewal reuses the account key"
    assert renewed.serial_number != leaf.serial_number
    assert second.private_key_pem != first.private_key_pem
    assert _challenge_files(ca.files.webroot) == []
    print(f"issue {issue_s:.2f} s, renewal {renew_s:.2f} s")


def _account_emails(ca: Ca, account_key: Path) -> tuple[str, ...]:
    """The account's email as the CA has it, asked with the acme library directly."""
    key = serialization.load_pem_private_key(account_key.read_bytes(), password=None)
    net = client.ClientNetwork(JWKEC(key=key), alg=ES256, verify_ssl=cast(bool, str(ca.pebble.ca_bundle)))
    acme = client.ClientV2(client.ClientV2.get_directory(ca.pebble.directory_url, net), net)
    with pytest.raises(errors.ConflictError) as existing:
        acme.new_account(messages.NewRegistration(only_return_existing=True))
    regr = acme.query_registration(messages.RegistrationResource(body=messages.Registration(),
                                                                 uri=existing.value.location))
    return tuple(regr.body.emails)


def test_a_changed_email_updates_the_account(ca: Ca, tmp_path: Path) -> None:
    account_key = tmp_path / "account.key"
    _issue(ca, account_key)
    assert _account_emails(ca, account_key) == ("ops@kiln.test",)
    said: list[str] = []
    issue_certificate(ca.pebble.directory_url, DOMAIN, "new-ops@kiln.test", account_key, ca.files.webroot,
                      verify=str(ca.pebble.ca_bundle), timeout_s=60, progress=said.append)
    assert _account_emails(ca, account_key) == ("new-ops@kiln.test",)
    assert "changing the ACME account's email to new-ops@kiln.test" in said


def test_renewal_with_an_authorization_the_ca_still_holds(ca: Ca, tmp_path: Path) -> None:
    """Let's Encrypt reuses a valid authorization for 30 days, so a renewal usually answers no challenge."""
    with pebble_server(tmp_path / "pebble", ca.files.port, authz_reuse_percent=100) as reusing:
        reusing_ca = Ca(reusing, ca.files, tmp_path)
        account_key = tmp_path / "account.key"
        _check_issued(reusing_ca, _issue(reusing_ca, account_key))
        said: list[str] = []
        _check_issued(reusing_ca, _issue(reusing_ca, account_key, messages=said))
    assert f"{DOMAIN}: already authorized" in said and not any("HTTP-01" in m for m in said), said


def test_challenge_the_ca_cannot_fetch(ca: Ca, tmp_path: Path) -> None:
    unserved = tmp_path / "not-the-webroot"
    unserved.mkdir()
    with pytest.raises(AcmeError) as raised:
        _issue(ca, tmp_path / "account.key", webroot=unserved, domain=f"broken.{DOMAIN}")
    message = str(raised.value)
    assert f"broken.{DOMAIN}" in message
    assert f"http://broken.{DOMAIN}/.well-known/acme-challenge/" in message  # the URL it fetched
    assert "the CA could not validate" in message and "404" in message, message  # and what the CA said
    assert _challenge_files(unserved) == [], "the challenge file is removed after a failure too"


def test_refuses_an_account_key_that_is_a_symbolic_link(ca: Ca, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.key"
    target.write_text("")
    link = tmp_path / "account.key"
    link.symlink_to(target)
    with pytest.raises(AcmeError, match="symbolic link"):
        _issue(ca, link)
    assert target.read_text() == ""


def test_unreachable_ca(tmp_path: Path) -> None:
    with pytest.raises(AcmeError, match=r"reading the ACME directory at https://127\.0\.0\.1:9/dir: could not connect"):
        issue_certificate("https://127.0.0.1:9/dir", DOMAIN, None, tmp_path / "account.key", tmp_path, timeout_s=5)
    assert stat.S_IMODE((tmp_path / "account.key").stat().st_mode) == 0o600
    assert not os.path.exists(tmp_path / CHALLENGES)
