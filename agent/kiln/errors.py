"""Errors a person can act on: what is wrong, where, and how to fix it."""

from __future__ import annotations


class KilnError(Exception):
    """An error with a place and a fix, printed without a traceback."""

    def __init__(self, what: str, *, where: str = "", fix: str = "") -> None:
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(self.message())

    def message(self) -> str:
        head = f"{self.where}: {self.what}" if self.where else self.what
        return f"{head}\n  fix: {self.fix}" if self.fix else head

    def as_dict(self) -> dict[str, str]:
        return {"error": self.what, "where": self.where, "fix": self.fix}


class ConfigError(KilnError):
    """A file or value given to kiln is malformed."""


class NotFoundError(KilnError):
    """A named thing (profile, machine fixture) does not exist."""
