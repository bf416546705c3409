"""Progress bars for long loops (stderr, so they never mix with a program's results on stdout)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def progress(items: Iterable[T], desc: str, total: int | None = None) -> Iterator[T]:
    """Iterate over ``items`` with a progress bar; quiet when SUITE_NO_PROGRESS=1 (tests)."""
    interactive = sys.stderr.isatty()
    return iter(
        tqdm(
            items,
            desc=desc,
            total=total,
            file=sys.stderr,
            disable=os.environ.get("SUITE_NO_PROGRESS") == "1",
            # In a log file (Snakemake jobs) a bar redrawn ten times a second is noise.
            mininterval=0.1 if interactive else 10.0,
            dynamic_ncols=interactive,
            leave=True,
        )
    )


def report(line: str) -> None:
    """A one-line account of finished work (stderr, between progress bars; kept in logs)."""
    tqdm.write(line, file=sys.stderr)
