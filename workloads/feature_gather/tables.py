"""Feature tables and the row indices that a sampler would ask for.

One host buffer of random bytes (never zeros), pinned in place when there is a GPU; tables of any
size, dtype and feature dim are views of its first bytes, so a sweep pins memory once. Index sets
hold distinct rows (a sampler's batch is de-duplicated), drawn either uniformly or with a
Zipf-skewed popularity like that of sampled GNN nodes (popularity ~ (rank + 1)^-s). Node ids are
randomly permuted in real datasets, so by default popular rows are scattered over the table; the
``hot_first`` layout stores rows in popularity order instead (a relabelling of node ids).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.errors import UserError
from workloads.buffers import MIB, PinnedHostBuffer, fill_random_

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


# How the tables' host memory is pinned: in place (cudaHostRegister), as a PyTorch-Direct user pins
# an existing tensor; the ceilings that bound the gathers are those of reads of such memory.
TABLE_MEMORY = "registered"


class HostTable:
    """A buffer of ``nbytes`` random bytes in host memory, pinned in place on a GPU machine
    (cudaHostRegister through UnifiedTensor, as a user of PyTorch-Direct would), and the same
    bytes as a CUDA tensor (the UnifiedTensor's alias, no copy) for stock torch ops."""

    def __init__(self, nbytes: int, device: str, seed: int = 0):
        self.nbytes = nbytes
        self._pinned = PinnedHostBuffer(nbytes, TABLE_MEMORY, seed=seed) if device == "cuda" else None
        if self._pinned is not None:
            self.buffer = self._pinned.tensor
            self._alias = self._pinned.unified.cuda_alias()
        else:
            self.buffer = fill_random_(torch.empty(nbytes, dtype=torch.uint8), seed=seed)
            self._alias = None

    def view(self, table_bytes: int, dtype: str, dim: int) -> torch.Tensor:
        """The table [rows, dim] of ``dtype`` in the first ``table_bytes`` of the buffer."""
        row_bytes = dim * DTYPES[dtype].itemsize
        rows = min(table_bytes, self.nbytes) // row_bytes
        if rows == 0:  # else zero rows are "gathered" in no time, and the part fails far from here
            raise UserError(
                f"a row of {dim} {dtype} features ({row_bytes} bytes) does not fit a table of "
                f"{min(table_bytes, self.nbytes)} bytes: raise table_mib or lower the row size"
            )
        return self.buffer[: rows * row_bytes].view(DTYPES[dtype]).view(rows, dim)

    def cuda_view(self, table: torch.Tensor) -> torch.Tensor | None:
        """``table`` (a :meth:`view`) as a CUDA tensor over the same pinned bytes; None without a GPU."""
        if self._alias is None:
            return None
        nbytes = table.numel() * table.element_size()
        return self._alias[:nbytes].view(table.dtype).view(table.shape)

    def close(self) -> None:
        """Unpin the buffer; the caller has dropped every batch that holds a :meth:`cuda_view`."""
        self._alias = None
        if self._pinned is not None:
            self._pinned.close()


def uniform_rows(num_rows: int, n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` distinct rows in random order, uniformly."""
    return torch.randperm(num_rows, generator=generator, device=generator.device)[:n].clone()


@dataclass
class Popularity:
    """Zipf popularity over ``num_rows`` rows and where each popularity rank is stored."""

    num_rows: int
    exponent: float
    generator: torch.Generator

    def __post_init__(self):
        device = self.generator.device
        ranks = torch.arange(self.num_rows, device=device, dtype=torch.float32)
        self.log_weight = -self.exponent * torch.log1p(ranks)
        # Random node ids: rank r lives at row scattered[r].
        self.scattered = torch.randperm(self.num_rows, generator=self.generator, device=device)

    def sample_ranks(self, n: int) -> torch.Tensor:
        """``n`` distinct ranks drawn without replacement with probability ~ weight.

        Exponential-race sampling: the n smallest of Exp(1)/weight are a weighted sample
        without replacement; computed in log space so tiny weights do not underflow."""
        u = torch.rand(self.num_rows, generator=self.generator, device=self.generator.device)
        log_keys = torch.log(-torch.log(u.clamp_min(1e-30))) - self.log_weight
        return torch.topk(log_keys, n, largest=False, sorted=False).indices

    def rows(self, ranks: torch.Tensor, layout: str) -> torch.Tensor:
        if layout == "scattered":
            return self.scattered[ranks]
        if layout == "hot_first":
            return ranks
        raise ValueError(f"unknown layout {layout!r}")

    def hottest_rows(self, count: int, layout: str) -> torch.Tensor:
        return self.rows(torch.arange(count, device=self.generator.device), layout)


def window_rows(
    num_rows: int, row_bytes: int, window_bytes: int, windows: int, n: int, generator: torch.Generator
) -> torch.Tensor:
    """``n`` distinct rows drawn from ``windows`` randomly placed windows of ``window_bytes``."""
    device = generator.device
    rows_per_window = window_bytes // row_bytes
    if rows_per_window == 0:
        raise UserError(f"a window of {window_bytes} B holds no row of {row_bytes} B: widen window_kib")
    if windows < 1:
        raise UserError(f"no window of {window_bytes} B fits the union of rows: make union_mib a window or more")
    slots = num_rows // rows_per_window
    if windows > slots:
        raise ValueError(f"{windows} windows of {window_bytes} B do not fit in a table of {num_rows} rows")
    starts = torch.randperm(slots, generator=generator, device=device)[:windows] * rows_per_window
    union = (starts[:, None] + torch.arange(rows_per_window, device=device)).flatten()
    pick = torch.randperm(union.numel(), generator=generator, device=device)[:n]
    return union[pick]


def mib(value: int) -> int:
    return value * MIB
