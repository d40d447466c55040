"""Turn pydantic's validation errors into lines a person can act on."""

from __future__ import annotations

from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from kiln.errors import ConfigError

ModelT = TypeVar("ModelT", bound=BaseModel)

# libyaml's loader where PyYAML was built with it: the same safe subset, about ten times faster (the catalog and
# the data files are parsed at every boot and every CLI call).
SafeLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _location(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(f".{item}" if parts else str(item))
    return "".join(parts) or "(top level)"


def message(err: Any) -> str:
    """pydantic's message without the prefix its validators add ("Value error, ..."), which says nothing to a user."""
    msg = str(err["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix):]
    return msg


def describe(exc: ValidationError) -> list[str]:
    """One line per problem: key, what is wrong, what was given."""
    lines = []
    for err in exc.errors():
        loc = _location(tuple(p for p in err["loc"] if not str(p).startswith("function-")))
        given = err.get("input")
        shown = repr(given)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        msg = message(err)
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check its spelling)"
        elif err["type"] == "missing":
            lines.append(f"{loc}: missing; this key is required")
            continue
        lines.append(f"{loc}: {msg} (got {shown})")
    return lines


def validate(model: type[ModelT], data: Any, *, where: str, fix: str) -> ModelT:
    """Validate data against a schema, or raise a ConfigError listing every problem."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = describe(exc)
        raise ConfigError("; ".join(problems), where=where, fix=fix) from None


class YamlError(ValueError):
    """YAML that does not parse, with the place."""


def parse_yaml(text: str) -> Any:
    """safe_load, with every way it can fail (bad dates and deep nesting too) as one YamlError."""
    try:
        return yaml.load(text, Loader=SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise YamlError(f"not valid YAML{at}: {problem}") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise YamlError(f"not valid YAML: {exc}") from None


def load_yaml_text(text: str, *, where: str) -> Any:
    """Parse YAML (JSON is YAML too), or raise a ConfigError naming the line."""
    try:
        return parse_yaml(text)
    except YamlError as exc:
        raise ConfigError(str(exc), where=where,
                          fix="check indentation and quoting; a YAML linter shows the exact spot") from None
