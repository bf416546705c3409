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
        except (MemoryError, RuntimeError) as err:
            if not out_of_memory(err):
                raise
            # A size the config asks for that this machine cannot hold (a table, a transfer, a
            # model): the allocator's own words say how much, a traceback would add nothing.
            where = " ".join(getattr(err, "__notes__", []))
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            print(
                f"error: ran out of memory{' ' + where if where else ''}: {first} (does the config ask for more than "
                "this machine holds?)",
                file=sys.stderr,
            )
            raise SystemExit(2) from None

    return wrapped


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is an allocation that failed: Python's MemoryError, torch's CPU allocator's
    RuntimeError, or its OutOfMemoryError on a GPU (a RuntimeError too)."""
    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
        return True
    return isinstance(err, RuntimeError) and "can't allocate memory" in str(err)


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
