"""The public endpoint's certificate: the user's own, one from ACME, or one kiln makes at first boot. Pure functions
of PEM text, names and the time; the agent reads and writes the files."""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SELF_SIGNED_DAYS = 825  # the longest server certificate clients still accept; renewed a month before the end
RENEW_BEFORE = dt.timedelta(days=30)
# TLS 1.2 and 1.3 only; for 1.2 only forward-secret AEAD suites (Mozilla's "intermediate" list without DHE, which
# would need a dhparam file and adds nothing for today's clients).
PROTOCOLS = ("TLSv1.2", "TLSv1.3")
CIPHERS_TLS12 = ("ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384",
                 "ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305")


class CertificateError(ValueError):
    """A certificate or key that cannot serve: what is wrong, for the user."""


@dataclass(frozen=True)
class CertificateInfo:
    sha256: str  # AB:CD:..., what a client pins
    names: tuple[str, ...]  # subjectAltName entries, DNS names and addresses as text
    not_before: dt.datetime
    not_after: dt.datetime
    self_signed: bool

    def as_dict(self) -> dict[str, object]:
        return {"sha256": self.sha256, "names": list(self.names), "not_before": self.not_before.isoformat(),
                "not_after": self.not_after.isoformat(), "self_signed": self.self_signed}

    def due(self, now: dt.datetime, before: dt.timedelta = RENEW_BEFORE) -> bool:
        return now >= self.not_after - before


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def make_self_signed(names: Sequence[str], now: dt.datetime, days: int = SELF_SIGNED_DAYS) -> tuple[str, str]:
    """(certificate PEM, private key PEM): ECDSA P-256, valid for the given addresses and host names."""
    if not names:
        raise CertificateError("a certificate needs at least one name or address")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0]),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kiln (self-signed)")])
    public = key.public_key()
    cert = (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject).public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))  # a client's clock a little behind
            .not_valid_after(now - dt.timedelta(minutes=5) + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([_san(n) for n in dict.fromkeys(map(normal_name, names))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, content_commitment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem.decode()


def _leaf(cert_pem: str) -> x509.Certificate:
    try:
        chain = x509.load_pem_x509_certificates(cert_pem.encode())
    except ValueError as exc:
        raise CertificateError(f"the certificate is not PEM X.509: {exc}") from exc
    return chain[0]


def inspect(cert_pem: str) -> CertificateInfo:
    leaf = _leaf(cert_pem)
    try:
        sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = tuple(str(v) for v in (*sans.get_values_for_type(x509.DNSName),
                                       *sans.get_values_for_type(x509.IPAddress)))
    except x509.ExtensionNotFound:
        names = ()
    digest = leaf.fingerprint(hashes.SHA256()).hex().upper()
    return CertificateInfo(sha256=":".join(digest[i:i + 2] for i in range(0, len(digest), 2)), names=names,
                           not_before=leaf.not_valid_before_utc, not_after=leaf.not_valid_after_utc,
                           self_signed=leaf.issuer == leaf.subject)


def check_pair(cert_pem: str, key_pem: str, now: dt.datetime) -> CertificateInfo:
    """The user's certificate and key, checked before nginx gets them: parse, match, and in date."""
    info = inspect(cert_pem)
    try:
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    except (ValueError, TypeError) as exc:
        raise CertificateError(f"the private key is not an unencrypted PEM key: {exc}") from exc
    ours = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    theirs = _leaf(cert_pem).public_key().public_bytes(serialization.Encoding.DER,
                                                       serialization.PublicFormat.SubjectPublicKeyInfo)
    if ours != theirs:
        raise CertificateError("the private key does not belong to the certificate (the first PEM block)")
    if now >= info.not_after:
        raise CertificateError(f"the certificate expired on {info.not_after:%Y-%m-%d}")
    if now < info.not_before:
        raise CertificateError(f"the certificate is not valid before {info.not_before:%Y-%m-%d %H:%M} UTC")
    return info


def normal_name(name: str) -> str:
    """An address as a certificate stores it (2604:A880:0800::1 is 2604:a880:800::1), a host name in lower case."""
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name.lower()


def covers(info: CertificateInfo, names: Sequence[str]) -> bool:
    """Whether a certificate kiln made still names every address the machine has now."""
    return {normal_name(n) for n in names} <= {normal_name(n) for n in info.names}
