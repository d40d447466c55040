"""Find kiln's settings inside cloud-init user-data: pure parsing of bytes, no I/O.

Accepted, as cloud-init itself accepts them: gzip-compressed data, MIME multi-part archives,
and #cloud-config documents. kiln's settings are the content of the `write_files` entry for
/etc/kiln/kiln.yaml (warning-free for cloud-init's schema), or a top-level `kiln:` mapping.
"""

from __future__ import annotations

import base64
import binascii
import email
import gzip
import zlib
from dataclasses import dataclass
from typing import Any

from kiln.choice.schema import Problem
from kiln.validation import YamlError, parse_yaml

KILN_FILE = "/etc/kiln/kiln.yaml"
MAX_USER_DATA_BYTES = 1 << 20  # DigitalOcean caps user-data at 64 KiB; anything near 1 MiB is not ours
MAX_DECOMPRESSED_BYTES = 4 << 20
SOURCE = "user-data"


@dataclass(frozen=True)
class Extracted:
    settings: Any = None  # the settings mapping found, or None
    file_content: str | None = None  # the exact text written to /etc/kiln/kiln.yaml, if any
    problems: tuple[Problem, ...] = ()


def _problem(what: str, fix: str, field: str = "") -> Extracted:
    return Extracted(problems=(Problem(SOURCE, field, what, fix),))


def _gunzip(data: bytes) -> bytes | None:
    try:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out = d.decompress(data, MAX_DECOMPRESSED_BYTES + 1)
    except zlib.error:
        return None
    return out


def _decode_write_file(entry: dict[str, Any]) -> str | None:
    content = entry.get("content", "")
    if not isinstance(content, str):
        return None
    encoding = str(entry.get("encoding", "text/plain")).lower()
    raw = content.encode()
    try:
        if encoding in ("b64", "base64"):
            raw = base64.b64decode(content, validate=False)
        elif encoding in ("gz+b64", "gzip+base64", "gz+base64", "gzip+b64"):
            raw = gzip.decompress(base64.b64decode(content, validate=False))
        elif encoding in ("gz", "gzip"):
            return None
        return raw.decode("utf-8")
    except (binascii.Error, OSError, UnicodeDecodeError, EOFError):
        return None


def _from_cloud_config(text: str) -> Extracted:
    try:
        doc = parse_yaml(text)
    except YamlError as exc:
        return _problem(f"#cloud-config is {exc}",
                        "validate it with `cloud-init schema --config-file FILE` before launching")
    if not isinstance(doc, dict):
        return _problem("#cloud-config is not a mapping", "start with `#cloud-config` then `key: value` lines")
    entries = doc.get("write_files") or []
    problems: tuple[Problem, ...] = ()
    if not isinstance(entries, list):  # cloud-init's schema refuses it too; kiln's own `kiln:` may still be there
        problems = _problem(f"write_files is {type(entries).__name__}, not a list of files",
                            "write it as a list: `write_files:` then `  - path: /etc/kiln/kiln.yaml` entries",
                            "write_files").problems
        entries = []
    for entry in entries:
        if isinstance(entry, dict) and str(entry.get("path", "")).strip() == KILN_FILE:
            content = _decode_write_file(entry)
            if content is None:
                return _problem(f"the write_files entry for {KILN_FILE} cannot be decoded",
                                "give its content as plain text (a YAML block `content: |`)", "write_files")
            try:
                return Extracted(settings=parse_yaml(content), file_content=content)
            except YamlError as exc:
                return _problem(f"the content written to {KILN_FILE} is {exc}",
                                "indent the settings under `content: |` as `key: value` lines", "write_files")
    if "kiln" in doc:
        return Extracted(settings=doc["kiln"], problems=problems)
    return Extracted(problems=problems)


def _from_mime(message: email.message.Message) -> Extracted:
    found = Extracted()
    for part in message.walk():
        if part.get_content_type() != "text/cloud-config":
            continue
        payload = part.get_payload(decode=True)
        if isinstance(payload, bytes):
            result = _from_cloud_config(payload.decode("utf-8", errors="replace"))
            if result.settings is not None or result.problems:
                found = result
    return found


def extract_settings(data: bytes) -> Extracted:
    """kiln's settings from raw user-data bytes; problems instead of exceptions."""
    if not data.strip():
        return Extracted()
    if len(data) > MAX_USER_DATA_BYTES:
        return _problem(f"user-data is {len(data)} bytes; kiln reads at most {MAX_USER_DATA_BYTES}",
                        "keep user-data small: DigitalOcean allows 64 KiB")
    if data[:2] == b"\x1f\x8b":
        unpacked = _gunzip(data)
        if unpacked is None:
            return _problem("user-data looks gzip-compressed but does not decompress", "compress it with gzip")
        if len(unpacked) > MAX_DECOMPRESSED_BYTES:
            return _problem("compressed user-data expands past 4 MiB", "send smaller user-data")
        data = unpacked
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return _problem("user-data is binary, not UTF-8 text",
                        "send a #cloud-config text document (optionally gzip-compressed)")
    first = text.lstrip("\ufeff").split("\n", 1)[0].strip().lower()
    if first.startswith("#cloud-config"):
        return _from_cloud_config(text)
    if first.startswith("content-type:") or first.startswith("mime-version:"):
        return _from_mime(email.message_from_string(text))
    return Extracted()
