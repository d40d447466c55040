"""The adapters that read the user's choice: cloud-init's files, DigitalOcean's metadata, a local file.

Each source is detected cheaply first (a file exists, DMI names the vendor) and only then read,
the way cloud-init's own datasources work. Nothing here interprets what it read.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import requests

from kiln.choice.schema import Problem

DO_METADATA_URL = "http://169.254.169.254/metadata/v1.json"
MAX_READ_BYTES = 1 << 20
HF_TOKEN_FILE = "/etc/kiln/hf_token"


def read_head(path: Path, limit: int = MAX_READ_BYTES) -> bytes:
    """Up to `limit` + 1 bytes of a regular file, so the caller can tell one over `limit`: a FIFO or a device is
    refused instead of waited on. Raises OSError (FileNotFoundError when absent)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return f.read(limit + 1)


class HttpGet(Protocol):
    def __call__(self, url: str, timeout: float) -> bytes: ...


def requests_get(url: str, timeout: float) -> bytes:
    response = requests.get(url, timeout=timeout)
    response.raise_for_status()
    return response.content[: MAX_READ_BYTES + 1]


@dataclass(frozen=True)
class RawInputs:
    """What the sources hold, uninterpreted."""

    user_data: bytes | None = None
    user_data_origin: str = ""
    tags: tuple[str, ...] | None = None
    local_file: str | None = None
    local_file_path: str = "/etc/kiln/kiln.yaml"
    hf_token_file: str | None = None  # /etc/kiln/hf_token, for a token put on the machine by hand
    platform: str = ""
    problems: tuple[Problem, ...] = ()
    addresses: tuple[str, ...] = ()  # the droplet's public and reserved addresses, from the metadata


def public_addresses(metadata: dict[str, Any]) -> tuple[str, ...]:
    """DigitalOcean metadata's public IPv4/IPv6 and reserved IP: what clients reach the droplet at."""
    found: list[str] = []
    interfaces = metadata.get("interfaces")
    public = interfaces.get("public") if isinstance(interfaces, dict) else None
    for iface in public if isinstance(public, list) else []:
        for family in ("ipv4", "ipv6"):  # not anchor_ipv4, which only a reserved IP's traffic arrives on
            entry = iface.get(family) if isinstance(iface, dict) else None
            if isinstance(entry, dict) and isinstance(entry.get("ip_address"), str):
                found.append(entry["ip_address"])
    reserved = metadata.get("reserved_ip") or metadata.get("floating_ip")
    v4 = reserved.get("ipv4") if isinstance(reserved, dict) else None
    if isinstance(v4, dict) and v4.get("active") and isinstance(v4.get("ip_address"), str):
        found.append(v4["ip_address"])
    return tuple(dict.fromkeys(found))


@dataclass
class SourceReader:
    """Reads the sources under `root` (/ on a machine; a folder of the same layout in tests)."""

    root: Path = Path("/")
    http_get: HttpGet = requests_get
    metadata_url: str = DO_METADATA_URL
    timeout_s: float = 2.0
    problems: list[Problem] = field(default_factory=list)

    def _path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def _read(self, absolute: str) -> bytes | None:
        path = self._path(absolute)
        try:
            return read_head(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.problems.append(Problem(absolute, "", f"cannot read: {exc.strerror}",
                                         "run the agent as root, or fix the file's permissions"))
            return None

    def instance_data(self) -> dict[str, Any]:
        raw = self._read("/run/cloud-init/instance-data.json")
        if raw is None:
            return {}
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            return {}
        return data if isinstance(data, dict) else {}

    def platform(self, instance: dict[str, Any]) -> str:
        v1 = instance.get("v1")
        if not isinstance(v1, dict):
            v1 = {}
        name = str(v1.get("platform") or v1.get("cloud_name") or "")
        if not name and self.on_digitalocean():
            return "digitalocean"
        return name

    def on_digitalocean(self) -> bool:
        vendor = self._read("/sys/class/dmi/id/sys_vendor")
        return vendor is not None and vendor.strip() == b"DigitalOcean"

    def cloud_init_user_data(self) -> tuple[bytes | None, str]:
        """User-data as cloud-init received it (any datasource), or a NoCloud seed not yet consumed."""
        for path, origin in (
            ("/var/lib/cloud/instance/user-data.txt", "cloud-init"),
            ("/var/lib/cloud/seed/nocloud/user-data", "NoCloud seed"),
            ("/var/lib/cloud/seed/nocloud-net/user-data", "NoCloud seed"),
        ):
            data = self._read(path)
            if data is not None:
                return data, f"{origin} ({path})"
        return None, ""

    def digitalocean_metadata(self) -> dict[str, Any] | None:
        try:
            raw = self.http_get(self.metadata_url, self.timeout_s)
            data = json.loads(raw)
        except (requests.RequestException, OSError, ValueError, RecursionError) as exc:
            self.problems.append(Problem(
                "digitalocean metadata", "", f"unreachable or unreadable: {type(exc).__name__}",
                "droplet tags are ignored this boot; check the droplet's metadata service"))
            return None
        return data if isinstance(data, dict) else None

    def read(self) -> RawInputs:
        self.problems = []
        instance = self.instance_data()
        platform = self.platform(instance)
        user_data, origin = self.cloud_init_user_data()
        tags: tuple[str, ...] | None = None
        addresses: tuple[str, ...] = ()
        if platform == "digitalocean" or self.on_digitalocean():
            metadata = self.digitalocean_metadata()
            if metadata is not None:
                raw_tags = metadata.get("tags")
                tags = tuple(str(t) for t in raw_tags) if isinstance(raw_tags, list) else ()
                addresses = public_addresses(metadata)
                if user_data is None and isinstance(metadata.get("user_data"), str):
                    user_data, origin = metadata["user_data"].encode(), "digitalocean metadata"
        local = self._read("/etc/kiln/kiln.yaml")
        token = self._read(HF_TOKEN_FILE)
        return RawInputs(
            user_data=user_data,
            user_data_origin=origin,
            tags=tags,
            local_file=None if local is None else local.decode("utf-8", errors="replace"),
            hf_token_file=None if token is None else token.decode("utf-8", errors="replace").strip(),
            platform=platform,
            problems=tuple(self.problems),
            addresses=addresses,
        )
