"""The code blocks of the README and docs/: what the tests run or check of the documentation."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Block:
    page: str  # README.md, docs/serving.md, ...
    language: str  # the fence's info string: sh, yaml, text, ...
    text: str


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(language: str | None = None) -> list[Block]:
    found = []
    for page in pages():
        for lang, text in FENCE.findall(page.read_text(encoding="utf-8")):
            if language is None or lang == language:
                found.append(Block(str(page.relative_to(REPO)), lang, text))
    return found


def user_data() -> list[Block]:
    """Every #cloud-config a page documents."""
    return [b for b in blocks("yaml") if b.text.startswith("#cloud-config\n")]


def shell_commands(block: Block) -> list[str]:
    """The block's commands, continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block.text)
    commands = []
    for line in joined.splitlines():
        command = re.sub(r"(^|\s)#.*$", "", line).strip()
        if command:
            commands.append(command)
    return commands


def kiln_argv(command: str) -> list[str] | None:
    """A `kiln ...` command's arguments (through sudo or .venv/bin/, with or without `VAR=... &&`), else None."""
    command = command.rsplit("&&", maxsplit=1)[-1].strip()
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    while words and (words[0] == "sudo" or re.fullmatch(r"[A-Z_]+=\S*", words[0])):
        words = words[1:]
    if words and words[0] in {"kiln", ".venv/bin/kiln"}:
        shell = next((i for i, w in enumerate(words) if w in {">", ">>", "<", "|", "2>", "2>&1"}), len(words))
        return words[1:shell]  # a redirection or a pipe is the shell's, not kiln's
    return None
