"""The one adapter over ACME (RFC 8555): a certificate for the public endpoint from Let's Encrypt or any ACME CA,
proved with HTTP-01 through a webroot the front web server already serves. Issuance and renewal are the same call;
the account key is the only state kept between them."""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import logging
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, cast

import requests
from acme import challenges, client, crypto_util, errors, messages
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from josepy.errors import Error as JoseError
from josepy.jwa import ES256
from josepy.jwk import JWK, JWKEC

LETS_ENCRYPT = "https://acme-v02.api.letsencrypt.org/directory"
USER_AGENT = "kiln-acme"
MAX_ACCOUNT_KEY_BYTES = 64 * 1024
MAX_REQUEST_TIMEOUT_S = 45.0  # one HTTP request to the CA; the whole call has `timeout_s`
FIRST_POLL_S = 0.25  # validation takes Pebble milliseconds, Let's Encrypt seconds: poll soon, then less often
MAX_POLL_S = 10.0
CHALLENGE_DIR = ".well-known/acme-challenge"
_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,256}")  # base64url: nothing that could leave the challenge folder
_DOMAIN = re.compile(r"(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")

log = logging.getLogger("kiln.acme")


@dataclass(frozen=True)
class Issued:
    """What nginx needs: the certificate chain and its key; and when to renew."""

    certificate_pem: str  # the leaf then the chain, as the ACME server sent it (what nginx's ssl_certificate takes)
    private_key_pem: str  # a new ECDSA P-256 key for this certificate, PKCS#8 PEM
    not_after: dt.datetime  # the leaf's expiry, timezone-aware UTC

    def __repr__(self) -> str:  # never the key, should an Issued reach a log
        return f"Issued(not_after={self.not_after.isoformat()}, certificate_pem=<{len(self.certificate_pem)} chars>)"


class AcmeError(Exception):
    """Issuance failed; the message says what failed and what the CA said, for the user to act on."""


def _fail(message: str, cause: BaseException | None = None) -> NoReturn:
    raise AcmeError(message) from cause


def _problem(error: messages.Error) -> str:
    """An ACME problem document as one line: the CA's detail, then its type."""
    parts = [error.detail or error.title or error.description or "no detail given"]
    if error.code:
        parts.append(f"({error.code})")
    elif error.typ and error.typ != "about:blank":
        parts.append(f"({error.typ})")
    text = " ".join(parts)
    for sub in error.subproblems or ():
        who = f"{sub.identifier.value}: " if sub.identifier else ""
        text += f"; {who}{_problem(sub)}"
    return text


def _describe(exc: BaseException) -> str:
    if isinstance(exc, messages.Error):
        return f"the CA answered: {_problem(exc)}"
    if isinstance(exc, errors.IssuanceError):
        return f"the CA answered: {_problem(exc.error)}"
    if isinstance(exc, requests.exceptions.SSLError):
        return f"TLS with the CA failed ({exc}); check the CA bundle"
    if isinstance(exc, requests.Timeout):
        return "the CA did not answer in time"
    if isinstance(exc, requests.ConnectionError):
        return f"could not connect ({exc})"
    if isinstance(exc, errors.TimeoutError):
        return "the CA did not finish within the time limit"
    if isinstance(exc, errors.ConflictError):
        return f"conflict at {exc.location}"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@contextlib.contextmanager
def _step(what: str) -> Iterator[None]:
    """Turns what the acme library, requests and the file system raise into an AcmeError naming the step."""
    try:
        yield
    except AcmeError:
        raise
    except (errors.Error, requests.RequestException, JoseError, OSError, ValueError) as exc:
        _fail(f"{what}: {_describe(exc)}", exc)


# -- the account key -----------------------------------------------------------------------------------------------


def _read_account_key(path: Path) -> bytes | None:
    """The key file's bytes, None when there is none; never through a symbolic link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            _fail(f"the ACME account key {path} is a symbolic link; kiln does not follow one there", exc)
        _fail(f"cannot read the ACME account key {path}: {exc.strerror}", exc)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            _fail(f"the ACME account key {path} is not a regular file")
        return f.read(MAX_ACCOUNT_KEY_BYTES + 1)


def _write_private(path: Path, data: bytes) -> None:
    """Atomically, mode 0600 from the start, never through a link left at the final or the temporary name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # replaces a link at `path` itself, never its target
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _account_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """The account's key: made (ECDSA P-256) and kept on first use, the same key ever after."""
    data = _read_account_key(path)
    if data is None:
        key = ec.generate_private_key(ec.SECP256R1())
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        with _step(f"cannot save the new ACME account key to {path}"):
            _write_private(path, pem)
        log.info("made a new ACME account key in %s", path)
        return key
    if len(data) > MAX_ACCOUNT_KEY_BYTES:
        _fail(f"the ACME account key {path} is too large to be a key")
    try:
        loaded = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        _fail(f"the ACME account key {path} cannot be read as an unencrypted PEM private key; move it away to make a "
              "new account", exc)
    if not isinstance(loaded, ec.EllipticCurvePrivateKey) or loaded.curve.name != "secp256r1":
        _fail(f"the ACME account key {path} is not an ECDSA P-256 key; move it away to make a new account")
    return loaded


# -- the challenge file --------------------------------------------------------------------------------------------


def _challenge_dir(webroot: Path) -> Path:
    """webroot/.well-known/acme-challenge, made where missing (0755), through no symbolic link."""
    if not webroot.is_dir():
        _fail(f"the webroot {webroot} is not a folder")
    here = webroot
    for part in CHALLENGE_DIR.split("/"):
        here = here / part
        if here.is_symlink():
            _fail(f"{here} is a symbolic link; kiln writes ACME challenges only into a real folder")
        if not here.exists():
            with _step(f"cannot make {here} for the ACME challenge"):
                here.mkdir(mode=0o755)
                os.chmod(here, 0o755)  # whatever the umask
        elif not here.is_dir():
            _fail(f"{here} is not a folder; the ACME challenge cannot be written there")
    return here


def _write_challenge(path: Path, text: str) -> None:
    with _step(f"cannot write the ACME challenge file {path}"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            os.fchmod(f.fileno(), 0o644)  # the web server's user reads it
            f.write(text)


# -- the protocol --------------------------------------------------------------------------------------------------


class _Deadline:
    """The whole call's time limit, which every wait and every request shares."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def check(self, waiting_for: str) -> None:
        if self.left() <= 0:
            _fail(f"timed out after {self.seconds:.0f} s waiting for {waiting_for}")

    def as_datetime(self) -> dt.datetime:
        """What the acme library's polling takes: a naive local time."""
        return dt.datetime.now() + dt.timedelta(seconds=max(self.left(), 0.0))


def _register(acme: client.ClientV2, email: str | None, directory_url: str,
              progress: Callable[[str], None]) -> None:
    """Agree to the terms and register the key, or find the account this key already has (and set its email)."""
    new = messages.NewRegistration.from_data(email=email, terms_of_service_agreed=True)
    with _step(f"registering the ACME account at {directory_url}"):
        try:
            acme.new_account(new)
            return
        except errors.ConflictError as exc:  # RFC 8555 7.3.1: the key has an account; this is its URL
            regr = messages.RegistrationResource(body=messages.Registration(), uri=exc.location)
            acme.net.account = regr
    if email is None:
        return
    with _step(f"reading the ACME account {regr.uri}"):
        regr = acme.query_registration(regr)
    if tuple(regr.body.emails) != (email,):
        progress(f"changing the ACME account's email to {email}")
        with _step(f"changing the ACME account's email to {email}"):
            acme.update_registration(regr, messages.Registration.from_data(email=email))


def _http01(authz: messages.AuthorizationResource) -> messages.ChallengeBody:
    for challb in authz.body.challenges:
        if isinstance(challb.chall, challenges.HTTP01):
            return challb
    offered = ", ".join(str(c.chall.typ) for c in authz.body.challenges) or "none"
    _fail(f"the CA offers no HTTP-01 challenge for {authz.body.identifier.value} (only: {offered})")


def _validation_failure(domain: str, authz: messages.AuthorizationResource, url: str) -> str:
    details = [_problem(c.error) for c in authz.body.challenges if c.error is not None]
    said = "; ".join(details) if details else f"the authorization is {authz.body.status} with no detail"
    return (f"the CA could not validate {domain} over HTTP-01 (it fetched {url}, which must serve this machine's "
            f"webroot on port 80): {said}")


def _authorize(acme: client.ClientV2, authz: messages.AuthorizationResource, key: JWK, webroot: Path,
               deadline: _Deadline, progress: Callable[[str], None]) -> None:
    """Prove control of one name with HTTP-01; the challenge file is gone afterwards, whatever happened."""
    domain = str(authz.body.identifier.value)
    if authz.body.status == messages.STATUS_VALID:
        progress(f"{domain}: already authorized")
        return
    if authz.body.status != messages.STATUS_PENDING:
        _fail(f"the CA's authorization for {domain} is {authz.body.status}, not pending")
    challb = _http01(authz)
    chall = cast(challenges.HTTP01, challb.chall)
    token = chall.encode("token")
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        _fail(f"the CA sent an HTTP-01 token kiln will not use as a file name: {token!r}")
    url = chall.uri(domain)
    response, validation = challb.response_and_validation(key)
    path = _challenge_dir(webroot) / token
    try:
        _write_challenge(path, validation)
        progress(f"{domain}: answering the HTTP-01 challenge at {url}")
        backoff = FIRST_POLL_S
        with _step(f"answering the HTTP-01 challenge for {domain}"):
            acme.answer_challenge(challb, response)
        while True:
            with _step(f"polling the authorization for {domain}"):
                authz, http = acme.poll(authz)
            if authz.body.status == messages.STATUS_VALID:
                progress(f"{domain}: validated")
                return
            if authz.body.status not in (messages.STATUS_PENDING, messages.STATUS_PROCESSING):
                _fail(_validation_failure(domain, authz, url))
            deadline.check(f"the CA to validate {domain} (it fetches {url})")
            if "Retry-After" in http.headers:  # the CA's pace, within reason
                wait = min(max((acme.retry_after(http, 1) - dt.datetime.now()).total_seconds(), 0.1), MAX_POLL_S)
            else:
                wait, backoff = backoff, min(backoff * 2, MAX_POLL_S)
            time.sleep(min(wait, max(deadline.left(), 0.0)))
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _leaf(chain_pem: str, key: ec.EllipticCurvePrivateKey, domain: str) -> x509.Certificate:
    """The first certificate in what the CA sent, checked to be for our key and our name."""
    try:
        certs = x509.load_pem_x509_certificates(chain_pem.encode())
    except ValueError as exc:
        _fail(f"the CA sent a certificate for {domain} that cannot be read", exc)
    leaf = certs[0]
    if leaf.public_key() != key.public_key():
        _fail(f"the CA sent a certificate for {domain} that is not for the key kiln asked with")
    try:
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        names = x509.SubjectAlternativeName([])
    if domain not in names.get_values_for_type(x509.DNSName):
        _fail(f"the CA sent a certificate that does not name {domain}")
    return leaf


def issue_certificate(directory_url: str, domain: str, email: str | None, account_key_file: Path, webroot: Path,
                      *, verify: bool | str = True, timeout_s: float = 180.0,
                      progress: Callable[[str], None] | None = None) -> Issued:
    """A certificate for `domain` from the ACME CA at `directory_url`, with a new key.

    The account key in `account_key_file` is made on first use and reused (renewals use the same account). The CA
    checks control of `domain` by fetching http://DOMAIN/.well-known/acme-challenge/TOKEN, which this writes under
    `webroot`. `verify` goes to requests: a CA bundle path, or True for the system's. Raises AcmeError."""
    say = progress or (lambda _message: None)
    domain = domain.strip().rstrip(".").lower()
    if not _DOMAIN.fullmatch(domain):
        _fail(f"{domain!r} is not a host name an ACME CA can issue for (HTTP-01 takes no address or wildcard)")
    if timeout_s <= 0:
        _fail("the ACME timeout must be positive")
    deadline = _Deadline(timeout_s)
    account_key = _account_key(account_key_file)
    jwk = JWKEC(key=account_key)
    request_timeout = int(max(1.0, min(MAX_REQUEST_TIMEOUT_S, timeout_s)))
    # ClientNetwork passes verify_ssl straight to requests, which also takes a CA bundle path (the annotation says
    # bool only).
    net = client.ClientNetwork(jwk, alg=ES256, verify_ssl=cast(bool, verify), user_agent=USER_AGENT,
                               timeout=request_timeout)
    try:
        say(f"contacting the ACME CA at {directory_url}")
        with _step(f"reading the ACME directory at {directory_url}"):
            directory = client.ClientV2.get_directory(directory_url, net)
        acme = client.ClientV2(directory, net)
        if acme.external_account_required():
            _fail(f"the ACME CA at {directory_url} requires external account binding, which kiln does not support")
        say("registering the ACME account" + (f" for {email}" if email else ""))
        _register(acme, email, directory_url, say)
        deadline.check("the ACME account")

        cert_key = ec.generate_private_key(ec.SECP256R1())
        key_pem = cert_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption())
        csr_pem = crypto_util.make_csr(key_pem, [domain])
        say(f"ordering a certificate for {domain}")
        with _step(f"ordering a certificate for {domain}"):
            order = acme.new_order(csr_pem)
        for authz in order.authorizations:
            _authorize(acme, authz, jwk, webroot, deadline, say)

        say(f"finalizing the order for {domain}")
        with _step(f"finalizing the certificate order for {domain}"):
            order = acme.finalize_order(order, deadline.as_datetime())
        if not order.fullchain_pem:
            _fail(f"the CA finished the order for {domain} without a certificate")
        leaf = _leaf(order.fullchain_pem, cert_key, domain)
        say(f"issued a certificate for {domain}, valid until {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
        return Issued(certificate_pem=order.fullchain_pem, private_key_pem=key_pem.decode("ascii"),
                      not_after=leaf.not_valid_after_utc)
    finally:
        net.session.close()
