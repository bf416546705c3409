"""User-facing errors: one line that says what is wrong and what to do.

Entry points wrap their ``main`` in :func:`exit_on_user_error`, so bad input ends the program with
that one line and exit status 2 instead of a traceback; programming errors still raise.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


class UserError(Exception):
    """Bad input from the user (config, arguments, files, machine): explained in one line."""


class NeedsGpuError(UserError):
    """The requested work needs a CUDA GPU and this machine has none."""


class WrongResult(UserError):
    """A variant's result differs from the reference it is checked against before timing (a gather
    variant, a relational GNN form, a store): nothing of it is measured; said in one line."""


def exit_on_user_error(main: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapped


@contextlib.contextmanager
def raised_in(what: str) -> Iterator[None]:
    """An error raised inside (a user's variant whose own code failed) keeps its traceback, and
    its last line names ``what``: the traceback alone may end deep in a library. The suite's own
    one-line errors pass as they are."""
    try:
        yield
    except UserError:
        raise
    except Exception as err:
        err.add_note(f"(raised in {what})")
        raise
