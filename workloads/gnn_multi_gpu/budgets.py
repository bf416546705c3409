"""Each rank's CPU budget: a block of the launcher's cores of its own, as large at every world size.

The launcher splits the cores it may run on (its affinity, in order) into one block per rank, of
``cpu_budget_per_rank`` cores; with ``share``, of its cores divided by the most ranks this machine
runs (its GPUs; 2 CPU processes on a machine without one), so that one rank has as many cores as
each of 2 or 8, and scaling efficiency compares equal budgets. Each rank pins itself to its block
before it starts a thread or a loader worker; the workers it forks inherit the block, so no rank's
workers run on another rank's cores. Where CPU affinity is unknown (not Linux), the counts are still
split, unpinned.
"""

from __future__ import annotations

import os

from harness.arguments import whole_number
from harness.errors import UserError

SHARE = "share"  # the usable cores over the most ranks this machine runs


def cores_per_rank(setting: int | str, usable: int, most_ranks: int, world: int) -> int:
    """The cores each of ``world`` ranks gets: ``setting`` (a number, or :data:`SHARE`) out of the
    ``usable`` cores of a machine that runs at most ``most_ranks`` ranks at once."""
    if setting == SHARE:
        per_rank = usable // max(most_ranks, world)
        if per_rank < 1:
            raise UserError(f"{world} ranks need a core each; this process may use {usable}")
        return per_rank
    if (per_rank := whole_number(setting, at_least=1)) is None:
        raise UserError(f"cpu_budget_per_rank is a positive number of cores or {SHARE!r}, got {setting!r}")
    if world * per_rank > usable:
        raise UserError(
            f"cpu_budget_per_rank {per_rank} for {world} ranks needs {world * per_rank} cores; "
            f"this process may use {usable}: lower it or use {SHARE!r}"
        )
    return per_rank


def allowed_cores() -> list[int]:
    """The cores this process may run on, in order (all of them where affinity is unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def rank_core_blocks(world: int, per_rank: int, cores: list[int]) -> list[list[int]]:
    """One block of ``per_rank`` of ``cores`` per rank, in order; no core in two blocks."""
    if world * per_rank > len(cores):
        raise UserError(f"{world} ranks of {per_rank} cores need {world * per_rank} cores; there are {len(cores)}")
    return [cores[rank * per_rank : (rank + 1) * per_rank] for rank in range(world)]


def pin_to(cores: list[int]) -> bool:
    """Run this process (the calling thread, and every thread and process started from it after)
    on ``cores``; False where CPU affinity cannot be set here."""
    if not hasattr(os, "sched_setaffinity"):
        return False
    os.sched_setaffinity(0, cores)
    return True
