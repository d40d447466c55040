"""The endpoint's named API keys. Pure values: what user-data declares, what `kiln keys` changed on the machine, and
the one store both end in (kept root-only by the agent, in keys.json). Only names leave the store."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kiln.choice.items import SERVED_NAME
from kiln.choice.schema import KEY_NAME, KEY_SECRET, NamedKey

KEY_PREFIX = "kiln-"
DEFAULT_NAME = "default"  # the single `api_key` of user-data, and the key kiln makes when none is given
MAX_SCOPED_MODELS = 64


class KeyChangeError(ValueError):
    """A key change that cannot be made: what is wrong, for the user."""


def redact(text: str, secrets_: Sequence[str]) -> str:
    """Text with every key in it, in any letters' case, and any bearer token, replaced: for logs and errors."""
    for secret in sorted(secrets_, key=len, reverse=True):
        text = re.sub(re.escape(secret), "[a key]", text, flags=re.IGNORECASE)
    return re.sub(r"(?i)(bearer\s+)[^\s\"';]+", r"\1[a key]", text)


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class ApiKey:
    name: str
    secret: str
    requests_per_minute: int | None = None
    origin: str = "kiln keys"  # user-data, kiln keys, generated
    models: tuple[str, ...] | None = None  # the served names (models and adapters) it may ask for; None: every one

    def public(self) -> dict[str, object]:
        return {"name": self.name, "requests_per_minute": self.requests_per_minute, "origin": self.origin,
                "models": list(self.models) if self.models is not None else None}

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models


@dataclass(frozen=True)
class KeyStore:
    keys: tuple[ApiKey, ...] = ()
    revoked: frozenset[str] = field(default_factory=frozenset)  # names user-data may not bring back

    def get(self, name: str) -> ApiKey | None:
        return next((k for k in self.keys if k.name == name), None)

    def names(self) -> list[str]:
        return [k.name for k in self.keys]

    def redact(self, text: str) -> str:
        return redact(text, [k.secret for k in self.keys])

    def _check(self, key: ApiKey) -> None:
        # fullmatch: `$` alone matches before a final newline, which nginx's configuration cannot hold.
        if not re.fullmatch(KEY_NAME, key.name):
            raise KeyChangeError(f"key name {key.name[:40]!r} must be 1 to 32 lowercase letters, digits, - or _")
        if not re.fullmatch(KEY_SECRET, key.secret) or not 16 <= len(key.secret) <= 256:
            raise KeyChangeError("a key is 16 to 256 characters of letters, digits and ._~+-")
        rate = key.requests_per_minute
        if rate is not None and (not isinstance(rate, int) or isinstance(rate, bool) or not 1 <= rate <= 1_000_000):
            raise KeyChangeError("a rate limit is a whole number of requests per minute, 1 to 1,000,000")
        if key.models is not None:
            bad = next((m for m in key.models if not isinstance(m, str) or not re.fullmatch(SERVED_NAME, m)), None)
            if not key.models or bad is not None or len(key.models) > MAX_SCOPED_MODELS:
                raise KeyChangeError(f"a key's models are 1 to {MAX_SCOPED_MODELS} served names (letters, digits and "
                                     "._:/-), as clients send them in `model`" + (f"; not {str(bad)[:40]!r}"
                                                                                   if bad is not None else ""))
        if any(k.secret == key.secret and k.name != key.name for k in self.keys):
            raise KeyChangeError("that key is already in use under another name")

    def _put(self, key: ApiKey) -> KeyStore:
        self._check(key)
        kept = tuple(k for k in self.keys if k.name != key.name)
        return KeyStore(tuple(sorted((*kept, key), key=lambda k: k.name)), self.revoked - {key.name})

    def add(self, name: str, secret: str | None = None, requests_per_minute: int | None = None,
            models: tuple[str, ...] | None = None) -> KeyStore:
        if self.get(name):
            raise KeyChangeError(f"a key named {name!r} exists; `kiln keys rotate {name}` replaces its key")
        return self._put(ApiKey(name, secret or generate_key(), requests_per_minute, models=models))

    def rotate(self, name: str, secret: str | None = None) -> KeyStore:
        old = self.get(name)
        if old is None:
            raise KeyChangeError(f"no key named {name!r}")
        return self._put(replace(old, secret=secret or generate_key(), origin="kiln keys"))

    def limit(self, name: str, requests_per_minute: int | None) -> KeyStore:
        old = self.get(name)
        if old is None:
            raise KeyChangeError(f"no key named {name!r}")
        return self._put(replace(old, requests_per_minute=requests_per_minute))

    def scope(self, name: str, models: tuple[str, ...] | None) -> KeyStore:
        """The models a key may ask for; None: every model served here."""
        old = self.get(name)
        if old is None:
            raise KeyChangeError(f"no key named {name!r}")
        return self._put(replace(old, models=models))

    def revoke(self, name: str) -> KeyStore:
        if self.get(name) is None:
            raise KeyChangeError(f"no key named {name!r}")
        return KeyStore(tuple(k for k in self.keys if k.name != name), self.revoked | {name})

    def with_declared(self, declared: Mapping[str, NamedKey]) -> KeyStore:
        """User-data's keys, as it says them now, except the ones revoked on the machine."""
        store = self
        for name, spec in sorted(declared.items()):
            if name in self.revoked:
                continue
            current = store.get(name)
            wanted = ApiKey(name, spec.key, spec.requests_per_minute, "user-data", spec.models)
            # A key changed on the machine (`kiln keys rotate`) stays changed; user-data's own edits apply.
            if current is None or (current.origin in ("user-data", "generated") and current != wanted):
                store = store._put(wanted)
        return store

    def with_default(self) -> KeyStore:
        """A first boot gets a key when none is declared; once keys were revoked on purpose, none is made again
        (the endpoint then refuses every request until `kiln keys add`)."""
        if self.keys or self.revoked:
            return self
        return self._put(ApiKey(DEFAULT_NAME, generate_key(), origin="generated"))

    def to_json(self) -> str:
        return json.dumps({"keys": [{"name": k.name, "key": k.secret, "requests_per_minute": k.requests_per_minute,
                                     "origin": k.origin, **({"models": list(k.models)} if k.models is not None else {})}
                                    for k in self.keys],
                           "revoked": sorted(self.revoked)}, indent=2) + "\n"

    @staticmethod
    def from_json(text: str) -> KeyStore:
        return KeyStore.read_json(text)[0]

    @staticmethod
    def read_json(text: str) -> tuple[KeyStore, tuple[str, ...]]:
        """The store keys.json holds, and why each entry kiln would not have written (a hand edit) is left out: one
        bad entry neither stops the endpoint nor reaches nginx's configuration. A file that is no store at all raises
        (ValueError, KeyError, TypeError): then nothing is replaced."""
        data: dict[str, Any] = json.loads(text)
        entries, revoked = data.get("keys", []), data.get("revoked", [])
        if not isinstance(entries, list) or not isinstance(revoked, list):
            raise TypeError("keys and revoked are lists")
        store, dropped = KeyStore(revoked=frozenset(n for n in revoked if isinstance(n, str))), []
        for n, entry in enumerate(entries, 1):
            if not isinstance(entry, dict):
                dropped.append(f"entry {n} is not a key (a mapping of name, key and requests_per_minute)")
                continue
            name, secret, origin = entry.get("name"), entry.get("key"), entry.get("origin", "kiln keys")
            label = f"the key named {name[:40]!r}" if isinstance(name, str) else f"entry {n}"
            if not isinstance(name, str) or not isinstance(secret, str) or not isinstance(origin, str):
                dropped.append(f"{label} has no name or key as text")
                continue
            models = entry.get("models")
            key = ApiKey(name, secret, entry.get("requests_per_minute"), origin,
                         tuple(models) if isinstance(models, list) else models)
            try:
                if store.get(name):
                    raise KeyChangeError("its name is given twice; the first is kept")
                store._check(key)
            except KeyChangeError as exc:
                dropped.append(f"{label} is left out: {exc}")
                continue
            store = replace(store, keys=(*store.keys, key))
        return store, tuple(dropped)


def declared_keys(api_key: str | None, api_keys: Mapping[str, NamedKey] | None) -> dict[str, NamedKey]:
    """user-data's `api_key` is the key named `default`, beside `api_keys`."""
    declared = dict(api_keys or {})
    if api_key:
        declared.setdefault(DEFAULT_NAME, NamedKey(key=api_key))
    return declared
