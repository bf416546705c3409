"""A cache of a host table's most used rows in GPU memory, for ``ops.gather``'s ``slots`` and
``cache``, and how to choose the rows: count how often each row is read (in sampled batches seen
so far, or in hindsight) and keep the most read.

    counts = count_rows(id_batches, table.shape[0])   # reads per row
    hot = HotRows(table, hottest_rows(counts, capacity), "cuda")
    gather(table, idx, slots=hot.slots, cache=hot.cache)

A static cache of ``capacity`` rows serves at most the share of reads that the ``capacity`` most
read rows take (:func:`hit_rate` of :func:`hottest_rows` of the reads themselves): filled from
counts of the very batches it then serves, a cache reaches that bound, and no other choice of
rows passes it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch

from harness.arguments import cpu_or_cuda, whole_number
from harness.errors import NeedsGpuError, UserError


def _count(value, what: str) -> int:
    """``value`` as a number of rows: an integer of any kind, >= 0 (not a bool, not a float)."""
    if (number := whole_number(value)) is None:
        raise UserError(f"{what} must be a whole number of rows >= 0, got {value!r}")
    return number


# Unsigned types wider than a byte: torch has no min() or max() of them, and a uint64 value from
# 2^63 up turns negative as int64 (an error would then name a value that was never given).
WIDE_UNSIGNED = (torch.uint16, torch.uint32, torch.uint64)


def _as_int64(values: torch.Tensor, what: str) -> torch.Tensor:
    """``values`` (integers of any type, on any device) as int64, refused where a value does not
    fit; unsigned ones are checked on the host."""
    if values.dtype == torch.uint64 and values.numel():
        largest = int(values.cpu().numpy().max())
        if largest >= 2**63:
            raise UserError(f"{what} holds {largest}, too large for an int64 id or count")
    return values.to(torch.int64)


def _row_ids(ids: torch.Tensor, what: str) -> torch.Tensor:
    """``ids`` (any shape) as a flat int64 host tensor, refused unless it holds integers: a float
    id would be truncated and a boolean mask read as the ids 0 and 1, both without a word."""
    if isinstance(ids, np.ndarray) and ids.dtype.kind in "biufc":  # numbers: checked as a tensor of them
        ids = torch.from_numpy(ids)
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        kind = ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise UserError(f"{what} must be a tensor of integer row ids, got {kind}")
    return _as_int64(ids, what).to("cpu").reshape(-1)


def count_rows(id_batches: Iterable[torch.Tensor], num_rows: int) -> torch.Tensor:
    """How many times each row is read in ``id_batches`` (int64 counts in host memory)."""
    if isinstance(id_batches, torch.Tensor | np.ndarray):
        # One tensor or array is one batch (of any shape): iterated, its ids would come one at a
        # time, each bincounted over every row (the right counts at ids x rows cost, hours for a
        # real batch).
        id_batches = [id_batches]
    num_rows = _count(num_rows, "num_rows")
    counts = torch.zeros(num_rows, dtype=torch.int64)
    for ids in id_batches:
        ids = _row_ids(ids, "a batch")
        if ids.numel() and not 0 <= int(ids.min()) <= int(ids.max()) < num_rows:
            raise UserError(f"a batch reads rows {int(ids.min())}..{int(ids.max())} of a table of {num_rows}")
        counts += torch.bincount(ids, minlength=num_rows)
    return counts


def _check_counts(counts: torch.Tensor) -> torch.Tensor:
    """Counts are reads per row, as :func:`count_rows` gives them: a 1-D tensor of integers (float
    weights would be truncated to whole reads, and a 2-D tensor sorted row by row). Returns them as
    int64 (torch neither sorts nor takes the minimum of every integer type)."""
    if not isinstance(counts, torch.Tensor) or counts.dim() != 1 or counts.is_floating_point() or counts.is_complex():
        kind = f"{counts.dtype} of shape {tuple(counts.shape)}" if isinstance(counts, torch.Tensor) else type(counts)
        raise UserError(f"counts must be a 1-D tensor of integer reads per row (count_rows), got {kind}")
    if counts.dtype == torch.bool:
        raise UserError("counts must be a 1-D tensor of integer reads per row (count_rows), got torch.bool")
    counts = _as_int64(counts, "counts")
    if counts.numel() and int(counts.min()) < 0:  # a share of reads above 1 otherwise
        raise UserError(f"counts are reads per row and cannot be negative, got {int(counts.min())}")
    return counts


def hottest_rows(counts: torch.Tensor, capacity: int) -> torch.Tensor:
    """The ``capacity`` most read rows, most read first; rows never read are left out, and equal
    counts go to the lower row id."""
    capacity = _count(capacity, "capacity")
    counts = _check_counts(counts)
    # A stable sort keeps equal counts in row order.
    order = torch.sort(counts, descending=True, stable=True).indices
    return order[: min(capacity, int((counts > 0).sum()))]


def hit_rate(counts: torch.Tensor, rows: torch.Tensor) -> float:
    """The share of the counted reads that a cache of ``rows`` serves."""
    # Checked, not indexed blindly: a negative row would wrap around to the last rows, and a row
    # named twice would count its reads twice (a cache holds it once).
    counts = _check_counts(counts)
    rows = _row_ids(rows, "rows").unique()
    if rows.numel() and not 0 <= int(rows[0]) <= int(rows[-1]) < counts.numel():
        raise UserError(f"rows {int(rows[0])}..{int(rows[-1])} outside counts of {counts.numel()} rows")
    # In float64: counts near int64's limit would wrap their int64 sum into a negative share.
    total = float(counts.sum(dtype=torch.float64))
    return min(1.0, float(counts[rows].sum(dtype=torch.float64)) / total) if total else 0.0


class HotRows:
    """Copies of some rows of ``table`` on ``device``: ``slots[row]`` is the row's place in
    ``cache``, or -1 (the layout ``ops.gather`` reads). A snapshot: a gather reads a cached row from
    the copy, so after the table's rows are written, make a new HotRows."""

    def __init__(self, table: torch.Tensor, rows: torch.Tensor, device: str | torch.device):
        if not isinstance(table, torch.Tensor):
            raise UserError(f"table must be a torch tensor (torch.from_numpy for an array), got {type(table).__name__}")
        if table.dim() != 2:
            raise UserError(f"table must be 2-D [rows, features], got shape {tuple(table.shape)}")
        given, device = device, cpu_or_cuda(device)
        if device is None:  # the cache serves gathers on these two
            raise UserError(f"device must be 'cpu' or 'cuda' (or 'cuda:N'), got {given!r}")
        if device.type == "cuda" and not torch.cuda.is_available():  # not torch's AssertionError
            raise NeedsGpuError(f"HotRows on {str(device)!r} needs a CUDA GPU; none is available (use 'cpu')")
        rows = _row_ids(rows, "rows")
        if rows.numel() and not 0 <= int(rows.min()) <= int(rows.max()) < table.shape[0]:
            raise UserError(f"cached rows {int(rows.min())}..{int(rows.max())} outside a table of {table.shape[0]}")
        values, counts = rows.unique(return_counts=True)
        if bool((counts > 1).any()):
            raise UserError(f"rows names row {int(values[counts > 1][0])} twice: a row is cached once")
        self.rows = rows
        slots = torch.full((table.shape[0],), -1, dtype=torch.int32)
        slots[rows] = torch.arange(rows.numel(), dtype=torch.int32)
        self.slots = slots.to(device)
        self.cache = table.index_select(0, rows).to(device)

    @property
    def nbytes(self) -> int:
        return self.cache.numel() * self.cache.element_size() + self.slots.numel() * self.slots.element_size()

    def misses(self, idx: torch.Tensor) -> torch.Tensor:
        """How many of ``idx`` (on the cache's device) are not cached: a 0-d tensor, so the count
        on a GPU does not wait for it. On the CPU an id outside the table is refused; on a GPU
        checking would cost a wait, so the ids must be the table's (a sampler's are; an id past the
        table trips torch's device-side assert, a negative one counts the last row's slot)."""
        if not isinstance(idx, torch.Tensor) or idx.is_floating_point() or idx.is_complex() or idx.dtype == torch.bool:
            kind = idx.dtype if isinstance(idx, torch.Tensor) else type(idx).__name__
            raise UserError(f"idx must be a tensor of integer row ids, got {kind}")
        if idx.dtype in WIDE_UNSIGNED:  # torch indexes with none of them
            idx = _as_int64(idx, "idx")
        if idx.device.type == "cpu" and idx.numel():
            low, high = int(idx.min()), int(idx.max())
            if low < 0:
                raise UserError(f"id {low} is negative: ids are rows of the table, from 0")
            if high >= self.slots.numel():
                raise UserError(f"id {high} is out of range for a table of {self.slots.numel()} rows")
        if idx.dtype not in (torch.int32, torch.int64):  # torch reads uint8 as a mask and refuses int16
            idx = idx.long()
        return (self.slots[idx] < 0).sum()
