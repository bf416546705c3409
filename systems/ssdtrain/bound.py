"""How much offloading can lower the activation peak without slowing the step: an upper bound from a
measured profile and a store's measured bandwidth.

The peak of a training step's activations is at the end of forward, so offloading lowers it by the
bytes whose writes have ended by then; and it costs no time only if backward never waits for a read,
so every byte read back must arrive before backward reaches its block. With each block's forward
time ``f_i``, backward time ``b_i`` and saved bytes ``s_i`` that offloading can move (none below
``min_bytes``), and bandwidths ``W`` (writes) and
``R`` (reads, independent of the writes: PCIe and NVMe are full duplex):

* Writes. Block i's bytes are saved steadily over its forward, from ``S_i`` to ``E_i``, and join
  one first-in-first-out queue drained at ``W`` (as the engine does). ``w_i``, the bytes of block i
  written by the end of forward ``F``, follow from the queue's backlog, which is piecewise linear;
  the last ``keep_last`` blocks are never offloaded (backward needs them first).
* Reads. Backward starts at ``F`` and reaches block i at ``T_i = sum_{j>i} b_j`` after it; the bytes
  of blocks i and above must all be read by then: ``x_i + x_{i+1} + ... <= R T_i``.
* The bound is the largest ``x_0 + ... + x_{n-1}`` with ``0 <= x_i <= w_i`` under those read
  constraints: ``min_i (R T_i + w_0 + ... + w_{i-1})`` (with ``i = n`` giving ``sum w``): whatever
  the split, the bytes of blocks i and above are at most ``R T_i`` and those below at most what
  was written of them; filling from the lowest block up reaches it.

Bytes are treated as divisible (a tensor is freed only once all of it is written), the blocks'
forward as the whole forward, and the store as the only limit, so no engine does better: the bound
is what a store of that bandwidth could buy at no time overhead, set beside what offloading measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from harness.arguments import whole_number
from harness.errors import UserError


@dataclass(frozen=True)
class Bound:
    activation_bytes: float  # the largest activation-peak reduction at no time overhead
    written_by_forward_end: tuple[float, ...]  # per block: bytes the write queue finished by then
    read_limited: bool  # reads, not writes, set the bound


def written_by_forward_end(
    saved_bytes: Sequence[float], forward_seconds: Sequence[float], bandwidth: float, keep_last: int = 1
) -> list[float]:
    """Per block, the bytes written by the end of forward when every block but the last
    ``keep_last`` offloads, each block's bytes arriving steadily over its forward into one
    first-in-first-out queue drained at ``bandwidth`` B/s (the module's write model)."""
    n = len(saved_bytes)
    backlog = 0.0  # bytes queued and not yet written
    queued: list[float] = []  # per offloaded block, its bytes still in the queue (oldest first)
    for i in range(n):
        arrive = float(saved_bytes[i]) if i < n - keep_last else 0.0
        seconds = float(forward_seconds[i])
        capacity = bandwidth * seconds  # what the queue can write during this block
        # The queue never runs ahead of arrivals: over the block it writes the older backlog and
        # as much of this block's bytes as have arrived, at most the capacity.
        drained = min(backlog + arrive, capacity) if seconds > 0 else 0.0
        queued.append(arrive)
        backlog += arrive - drained
        for j in range(len(queued)):  # first in, first out
            taken = min(queued[j], drained)
            queued[j] -= taken
            drained -= taken
    return [float(saved_bytes[i]) - queued[i] if i < n - keep_last else 0.0 for i in range(n)]


def offload_bound(
    saved_bytes: Sequence[float],
    forward_seconds: Sequence[float],
    backward_seconds: Sequence[float],
    write_bandwidth: float,
    read_bandwidth: float | None = None,
    keep_last: int = 1,
) -> Bound:
    """The largest activation-peak reduction offloading can reach at no time overhead (the module),
    from each block's saved bytes, forward and backward seconds and the store's bandwidths in B/s
    (``read_bandwidth`` defaults to ``write_bandwidth``)."""
    n = len(saved_bytes)
    read_bandwidth = write_bandwidth if read_bandwidth is None else read_bandwidth
    if not n or len(forward_seconds) != n or len(backward_seconds) != n:
        raise UserError(
            f"one saved size, forward and backward time per block expected, got {n}, {len(forward_seconds)} and "
            f"{len(backward_seconds)}"
        )
    if not (0 < write_bandwidth < math.inf and 0 < read_bandwidth < math.inf):
        raise UserError(f"the store's bandwidths must be positive, got {write_bandwidth!r} and {read_bandwidth!r} B/s")
    if not all(0 <= v < math.inf for v in [*saved_bytes, *forward_seconds, *backward_seconds]):  # NaN too
        raise UserError("saved bytes and times must be finite and not negative")
    if (keep_last := whole_number(given := keep_last, at_most=n)) is None:
        raise UserError(f"keep_last must be a whole number between 0 and {n}, got {given!r}")
    written = written_by_forward_end(saved_bytes, forward_seconds, write_bandwidth, keep_last)
    best, below, read_limited = sum(written), 0.0, False
    for i in range(n):
        reach = sum(backward_seconds[i + 1 :])  # backward reaches block i this long after it starts
        limit = read_bandwidth * reach + below
        if limit < best:
            best, read_limited = limit, True
        below += written[i]
    return Bound(best, tuple(written), read_limited)


def bound_of_profile(profiles, bandwidth: float, keep_last: int = 1, backward_ratio: float = 2.0) -> Bound:
    """:func:`offload_bound` of a ``planning.profile`` (its ``LayerProfile`` list), each block's
    backward taken as ``backward_ratio`` times its forward as the cost model takes it."""
    forward = [p.forward_seconds for p in profiles]
    return offload_bound(
        [p.movable_bytes for p in profiles], forward, [backward_ratio * f for f in forward], bandwidth, None, keep_last
    )
