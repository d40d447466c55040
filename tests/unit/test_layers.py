"""Imports run one way, down the layers: a module imports only from its own layer or the layers below it."""

from __future__ import annotations

import ast

from tests.conftest import REPO

PACKAGE = REPO / "agent" / "kiln"
# Top to bottom. A name is a subpackage or a module of kiln's top level.
LAYERS: list[set[str]] = [
    {"cli"},
    {"serve", "image", "fleet"},
    {"bench", "cluster", "wiring"},
    {"doctor", "hub", "render"},
    {"planner"},
    {"choice"},
    {"perf"},
    {"setup"},
    {"profiles", "hardware", "tinymodel", "pricing"},
    {"errors", "validation", "datafiles", "processes"},
]


def layer_of(name: str) -> int:
    for depth, names in enumerate(LAYERS):
        if name in names:
            return depth
    raise AssertionError(f"kiln.{name} is in no layer: add it to LAYERS")


def imports() -> list[tuple[str, str, str]]:
    """(importing file, its part of kiln, the imported part of kiln) for every import of kiln's own code."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "data" or (rel.name == "__init__.py" and len(rel.parts) == 1):
            continue  # data/ holds scripts run by other interpreters
        part = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                dotted = name.split(".")
                if dotted[0] == "kiln" and len(dotted) > 1 and dotted[1] != part:
                    found.append((str(rel), part, dotted[1]))
    return found


def test_every_part_of_kiln_has_a_layer() -> None:
    parts = {p.name if p.is_dir() else p.stem for p in PACKAGE.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    for part in parts:
        layer_of(part)


def test_imports_run_down_the_layers() -> None:
    upward = [f"{file}: kiln.{part} imports kiln.{target}" for file, part, target in imports()
              if layer_of(target) < layer_of(part)]
    assert not upward, "\n".join(sorted(upward))


def test_the_check_sees_imports() -> None:
    found = imports()
    assert ("cli/plan.py", "cli", "planner") in found
    assert any(part == "serve" and target == "render" for _, part, target in found)
