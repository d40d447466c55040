"""Pebble, Let's Encrypt's small test ACME server, as a fixture: a real RFC 8555 server on this machine, so the ACME
client is tested against the protocol rather than a mock of it.

pebble-challtestsrv is the DNS server Pebble resolves with; it answers 127.0.0.1 for every name (and no AAAA), so
Pebble's validation authority fetches HTTP-01 challenges from 127.0.0.1 at the port the test serves its webroot on.
Pebble's own HTTPS listener gets a certificate from a throwaway CA made here; `Pebble.ca_bundle` is that CA.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PEBBLE = "/usr/bin/pebble"
CHALLTESTSRV = "/usr/bin/pebble-challtestsrv"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


@dataclass
class Pebble:
    directory_url: str
    ca_bundle: Path  # the CA of Pebble's own HTTPS listener (directory and management), for requests' verify=
    management_url: str
    commands: dict[str, list[str]] = field(default_factory=dict)  # what was run, for the record

    def issuing_roots_pem(self) -> str:
        """The root Pebble issues under (new at every start), and its intermediate, to verify an issued chain.

        The intermediate is in the chain Pebble sends too; having it here lets a test check a leaf alone."""
        parts = []
        for path in ("/roots/0", "/intermediates/0"):
            response = requests.get(self.management_url + path, verify=str(self.ca_bundle), timeout=10)
            response.raise_for_status()
            parts.append(response.text.strip() + "\n")
        return "".join(parts)


def available() -> str | None:
    """None when Pebble can run here, else why not (a skip reason)."""
    missing = [p for p in (PEBBLE, CHALLTESTSRV) if not os.access(p, os.X_OK)]
    if missing:
        return f"Pebble is not installed ({', '.join(missing)} missing; Debian's package 'pebble' has both)"
    return None


def free_port() -> int:
    """A port nothing listens on now, TCP and UDP (the DNS server takes both)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.bind(("127.0.0.1", 0))
            port = int(tcp.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    raise RuntimeError("no free port found")


def _write_listener_certificate(workdir: Path) -> tuple[Path, Path, Path]:
    """(CA PEM, certificate PEM, key PEM) for Pebble's HTTPS listener on 127.0.0.1 and localhost."""
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kiln test: Pebble listener CA")])
    ca = (x509.CertificateBuilder()
          .subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, content_commitment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_file, cert_file, key_file = workdir / "listener-ca.pem", workdir / "listener.pem", workdir / "listener.key"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return ca_file, cert_file, key_file


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(STOP_TIMEOUT_S)


def _wait_tcp(port: int, proc: subprocess.Popen[bytes], log: Path, deadline: float) -> None:
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}:\n{_tail(log)}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args!r} did not listen on {port} in {START_TIMEOUT_S:.0f} s:\n{_tail(log)}")
        time.sleep(0.05)


@contextmanager
def pebble_server(workdir: Path, http_port: int, *, authz_reuse_percent: int = 0) -> Iterator[Pebble]:
    """Pebble and its DNS server, running until the block ends; then both are gone, and their ports free.

    `http_port` is where Pebble's validation authority fetches HTTP-01 challenges (on 127.0.0.1). Pebble reuses a
    valid authorization for a new order of the same account at random, half the time by default; here never unless
    asked (`authz_reuse_percent`), so a test knows whether a challenge is answered."""
    workdir.mkdir(parents=True, exist_ok=True)
    ca_file, cert_file, key_file = _write_listener_certificate(workdir)
    dns_port, dns_mgmt_port, acme_port, mgmt_port = (free_port() for _ in range(4))
    config = {"pebble": {"listenAddress": f"127.0.0.1:{acme_port}",
                         "managementListenAddress": f"127.0.0.1:{mgmt_port}",
                         "certificate": str(cert_file), "privateKey": str(key_file),
                         "httpPort": http_port, "tlsPort": free_port(),
                         "ocspResponderURL": "", "externalAccountBindingRequired": False}}
    config_file = workdir / "pebble-config.json"
    config_file.write_text(json.dumps(config, indent=2))
    dns_cmd = [CHALLTESTSRV, "-dns01", f"127.0.0.1:{dns_port}", "-management", f"127.0.0.1:{dns_mgmt_port}",
               "-http01", "", "-https01", "", "-tlsalpn01", "",
               "-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""]
    pebble_cmd = [PEBBLE, "-config", str(config_file), "-dnsserver", f"127.0.0.1:{dns_port}"]
    env = {**os.environ, "PEBBLE_VA_NOSLEEP": "1", "PEBBLE_WFE_NONCEREJECT": "0",
           "PEBBLE_AUTHZREUSE": str(authz_reuse_percent)}
    dns_log, pebble_log = workdir / "challtestsrv.log", workdir / "pebble.log"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        with dns_log.open("wb") as out:
            procs.append(subprocess.Popen(dns_cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                          cwd=workdir, env=env))
        _wait_tcp(dns_mgmt_port, procs[0], dns_log, deadline)
        with pebble_log.open("wb") as out:
            procs.append(subprocess.Popen(pebble_cmd, stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT, cwd=workdir, env=env))
        pebble = Pebble(directory_url=f"https://127.0.0.1:{acme_port}/dir", ca_bundle=ca_file,
                        management_url=f"https://127.0.0.1:{mgmt_port}",
                        commands={"pebble-challtestsrv": dns_cmd, "pebble": pebble_cmd})
        while True:
            if procs[1].poll() is not None:
                raise RuntimeError(f"pebble exited with {procs[1].returncode}:\n{_tail(pebble_log)}")
            try:
                if requests.get(pebble.directory_url, verify=str(ca_file), timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"pebble's directory did not answer in {START_TIMEOUT_S:.0f} s:\n"
                                   f"{_tail(pebble_log)}")
            time.sleep(0.05)
        yield pebble
    finally:
        for proc in reversed(procs):
            _stop(proc)

