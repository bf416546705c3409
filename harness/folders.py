"""Where a command will write, checked before it works: one line naming the folder, not a
traceback from ``mkdir`` after minutes of measuring or rendering."""

from __future__ import annotations

import os
from pathlib import Path

from harness.errors import UserError


def refuse_unwritable(folder: Path, what: str) -> None:
    """Refuse, in one line, a folder that cannot be made or written to: a file on its path, or a
    nearest existing folder this process may not write. Nothing is made here: a command refused
    later leaves no empty folder behind."""
    existing = Path(folder)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{what} {folder} cannot be made: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{what} {folder} cannot be written to: {existing} is not writable")
