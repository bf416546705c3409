"""The gather variants that the feature_gather topic compares: one registry, one entry per way of
delivering ``table[idx]`` where training needs it.

A variant is a :class:`GatherVariant` registered in ``GATHER_VARIANTS`` from a module of this
package (every module whose name does not start with ``_`` is imported when the registry is
first read), so a new way of gathering is one new file here, or a module of your own named in
``SUITE_PLUGINS``. Its ``make(batch, **options)`` returns a callable that runs one gather of
``batch`` and returns the rows; the flags say what the measuring part must give it.

The contract every variant keeps: it starts from the indices in host memory (``batch.idx``,
pinned on a GPU machine, where a CPU sampler leaves them), so a GPU path pays for sending them;
it ends when the rows are in GPU memory (``batch.device == 'cuda'``) or, without a GPU, in host
memory; and it ends with a blocking wait (:func:`wait`: the host thread sleeps, so the CPU time
it records is work, not spinning), unless it is ``kernel_only``. The part checks every
variant's rows byte for byte against ``table[idx]`` before timing it.

The suite's own entries, by module: ``cpu_baselines`` (``pageable``, ``cpu_gather``,
``cpu_gather_pipelined``: the baselines), ``stock_torch`` (``torch_uva``,
``torch_uva_sorted``: stock torch on the CUDA alias of the pinned table, the peer a user writes
by hand), ``wholegraph`` (NVIDIA WholeGraph's gather, a peer library), ``zero_copy``
(PyTorch-Direct: ``naive`` -> ``aligned`` -> ``vectorized`` -> ``sorted`` -> ``hot_cache``,
``split`` and ``default``, which is ``UnifiedTensor[idx]``), ``zero_copy_kernel_only``
(``vectorized_kernel``, a diagnostic) and ``all_in_gpu`` (the upper bound).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.registry import Entry, Registry

# What a variant may need the part to put in its batch, beyond the table, the indices and the
# CUDA alias (names for ``GatherVariant.requires``):
GPU_TABLE = "gpu_table"  # a copy of the table in GPU memory (``batch.gpu_table``)
HOT_ROWS = "hot_rows"  # a GPU cache of the batch's hottest rows (``batch.slots``, ``batch.cache``)
BATCH_INPUTS = (GPU_TABLE, HOT_ROWS)

Gather = Callable[[], torch.Tensor]


@dataclass(frozen=True)
class GatherVariant(Entry):
    """One way of gathering rows, and what the measuring part must give it.

    ``make(batch, **options)`` returns the gather as a callable; ``options`` holds only those
    the flags below ask for: ``max_threads`` (``thread_cap``), ``split_fraction``
    (``shares_from``) and ``table_copy`` (``table_copy``).
    """

    make: Callable[..., Gather] | None = None
    family: str = ""  # a kind of path shared by variants (tables quote the best of each); default: the name
    cpu_threads: bool = False  # gathers on CPU threads: runs with every usable CPU (count recorded), or a sweep
    thread_cap: bool = False  # takes ``max_threads``, a cap on the GPU threads it uses (0: fill the GPU)
    kernel_only: bool = False  # a diagnostic: one kernel timed with CUDA events, no per-call work
    requires: tuple[str, ...] = ()  # batch inputs from BATCH_INPUTS
    # (CPU variant, GPU variant): their rates, measured first on the same batch, set the share of
    # rows this variant hands to the CPU (``split_fraction``: cpu / (cpu + gpu)).
    shares_from: tuple[str, ...] = ()
    # Makes the variant's own copy of a host table (outside timing; a context manager that frees
    # it), shared by every batch of that table; raises RuntimeError when it cannot hold the table.
    table_copy: Callable[[torch.Tensor], Any] | None = None
    records: Callable[[Batch], dict] | None = None  # configuration columns it records for a batch
    reads_gpu_memory_only: bool = False  # no row crosses PCIe (no ``pcie_bytes`` rows)
    check_runtime: Callable[[], str | None] | None = None  # why it cannot run here beyond its packages
    describe: Callable[[], str] | None = None  # a line for the provenance (a library's version)

    def __post_init__(self):
        super().__post_init__()
        if self.make is None:
            raise ValueError(f"gather variant {self.name}: give make(batch, **options)")
        unknown = set(self.requires) - set(BATCH_INPUTS)
        if unknown:
            raise ValueError(f"gather variant {self.name}: requires {sorted(unknown)}; known: {BATCH_INPUTS}")
        if self.shares_from and len(self.shares_from) != 2:
            raise ValueError(f"gather variant {self.name}: shares_from names a CPU and a GPU variant")
        if not self.family:
            object.__setattr__(self, "family", self.name)

    def missing(self, device: str = "cpu") -> str | None:
        reason = super().missing(device)
        if reason is None and self.check_runtime is not None and str(device).startswith("cuda"):
            reason = self.check_runtime()
        return reason

    def build(
        self,
        batch: Batch,
        *,
        threads: int = 0,
        max_threads: int = 0,
        split_fraction: float | None = None,
        table_copy=None,
    ) -> Gather:
        """The gather of ``batch``, given the options this variant takes; with ``threads`` > 0 a
        CPU-threaded variant runs on that many CPU threads."""
        options: dict = {}
        if self.thread_cap:
            options["max_threads"] = max_threads
        if self.shares_from:
            if split_fraction is None:
                raise ValueError(f"{self.name} needs a split_fraction (from {' and '.join(self.shares_from)})")
            options["split_fraction"] = split_fraction
        if self.table_copy is not None and table_copy is not None:
            options["table_copy"] = table_copy
        run = self.make(batch, **options)
        return with_threads(run, threads) if self.cpu_threads else run


GATHER_VARIANTS: Registry[GatherVariant] = Registry("gather variant", __name__)


def register(entry: GatherVariant) -> GatherVariant:
    return GATHER_VARIANTS.register(entry)


@dataclass
class Batch:
    """One gather's inputs: a host table, the rows asked for, and buffers the variants share."""

    table: torch.Tensor  # [rows, dim], host, pinned on a GPU machine
    idx: torch.Tensor  # [n] int64, pinned host memory (CPU: plain)
    device: str
    alias: torch.Tensor | None = None  # the pinned table as a CUDA tensor (no copy)
    gpu_table: torch.Tensor | None = None  # GPU_TABLE
    slots: torch.Tensor | None = None  # HOT_ROWS: slots[row] is the row's place in cache, or -1
    cache: torch.Tensor | None = None
    staging: torch.Tensor = field(init=False)  # [n, dim] host, pinned on a GPU machine
    idx_gpu: torch.Tensor | None = field(init=False, default=None)
    out: torch.Tensor | None = field(init=False, default=None)  # rows in GPU memory, shared by variants

    def __post_init__(self):
        n, dim = self.idx.shape[0], self.table.shape[1]
        pinned = self.device == "cuda"
        self.staging = torch.empty((n, dim), dtype=self.table.dtype, pin_memory=pinned)
        if pinned:
            self.idx_gpu = torch.empty_like(self.idx, device="cuda")
            self.out = torch.empty((n, dim), dtype=self.table.dtype, device="cuda")

    @property
    def bytes(self) -> int:
        return self.idx.shape[0] * self.table.shape[1] * self.table.element_size()

    @property
    def row_bytes(self) -> int:
        return self.table.shape[1] * self.table.element_size()


def wait() -> None:
    """Wait for the GPU's queued work with the host thread asleep (a blocking event)."""
    event = torch.cuda.Event(blocking=True)
    event.record()
    event.synchronize()


def with_threads(run: Gather, threads: int) -> Gather:
    """``run`` with torch's CPU thread count set to ``threads`` for each call (0: as it is)."""
    if threads <= 0:
        return run

    def wrapped():
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return run()
        finally:
            torch.set_num_threads(before)

    return wrapped
