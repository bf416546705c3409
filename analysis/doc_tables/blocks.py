"""The generated blocks of a markdown doc: find them, compare them, rewrite them.

A block is ``<!-- generated: NAME -->`` on a line of its own, the rendered body, and
``<!-- /generated -->`` on a line of its own. Everything outside the blocks is left byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UserError

OPEN = re.compile(r"^<!-- generated: ([A-Za-z0-9_.-]+) -->$")
CLOSE = "<!-- /generated -->"


@dataclass(frozen=True)
class Block:
    name: str
    body: str  # the lines between the markers, without the blank lines framing them
    start: int  # line index of the opening marker
    end: int  # line index of the closing marker


def blocks(text: str, where: str = "doc") -> list[Block]:
    """The generated blocks of ``text``, refusing unclosed, nested or stray markers in one line."""
    lines = text.split("\n")
    found, open_at, name = [], None, None
    for number, line in enumerate(lines):
        opening = OPEN.match(line.strip())
        if opening:
            if open_at is not None:
                raise UserError(f"{where}:{number + 1}: generated block {opening[1]!r} opens inside block {name!r}")
            open_at, name = number, opening[1]
        elif line.strip() == CLOSE:
            if open_at is None:
                raise UserError(f"{where}:{number + 1}: {CLOSE} closes no generated block")
            body = "\n".join(lines[open_at + 1 : number]).strip("\n")
            found.append(Block(name, body, open_at, number))
            open_at = None
        elif line.strip().startswith("<!-- generated"):
            raise UserError(f"{where}:{number + 1}: malformed marker {line.strip()!r} (<!-- generated: NAME -->)")
    if open_at is not None:
        raise UserError(f"{where}:{open_at + 1}: generated block {name!r} is never closed ({CLOSE})")
    return found


def rewrite(text: str, render: Callable[[str], str], where: str = "doc") -> str:
    """``text`` with every generated block's body replaced by ``render(name)``."""
    lines = text.split("\n")
    for block in reversed(blocks(text, where)):  # from the end, so earlier line numbers hold
        lines[block.start + 1 : block.end] = ["", render(block.name), ""]
    return "\n".join(lines)


def stale(path: Path, render: Callable[[str], str]) -> list[str]:
    """The names of the blocks of the doc at ``path`` whose body differs from ``render(name)``."""
    return stale_in(path.read_text(), render, str(path))


def stale_in(text: str, render: Callable[[str], str], where: str = "") -> list[str]:
    """:func:`stale` of a doc's ``text`` already read (``where`` names it in errors)."""
    return [b.name for b in blocks(text, where) if b.body != render(b.name)]


def outside(text: str) -> str:
    """``text`` with every generated block blanked (line count kept): what people wrote."""
    lines = text.split("\n")
    for block in blocks(text):
        for number in range(block.start, block.end + 1):
            lines[number] = ""
    return "\n".join(lines)
