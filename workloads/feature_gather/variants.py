"""The gather paths compared, each a callable that delivers ``table[idx]`` where training needs it.

Every path starts from the indices in pinned host memory (where a CPU sampler leaves them), so
the zero-copy paths pay for sending the indices to the GPU, and ends when the rows are in GPU
memory (``device='cuda'``) or, on a machine without a GPU, in a host buffer. Each call ends
with a blocking wait (the host thread sleeps, so the CPU time it records is work, not spinning).

Baselines: ``pageable`` (``table[idx].to('cuda')``), ``cpu_gather`` (``index_select`` into a
pinned staging buffer, then an asynchronous copy; threads recorded), ``cpu_gather_pipelined``
(the same in chunks through two staging buffers, each chunk's copy overlapping the next chunk's
gather: what a careful user writes), and stock torch on a CUDA tensor aliasing the pinned table
(``UnifiedTensor.cuda_alias``): ``torch_uva`` (``index_select`` on the alias, every row read over
PCIe by torch's own kernel) and ``torch_uva_sorted`` (the ids sorted first, the rows put back in
request order with ``index_copy_``), and NVIDIA WholeGraph's gather from its own host-mapped copy
of the table (``wholegraph``, workloads/feature_gather/wholegraph.py). Upper bound: ``all_in_gpu``
(the table held in GPU memory).
PyTorch-Direct: ``naive`` -> ``aligned`` -> ``vectorized``
-> ``sorted`` (rows read in ascending index order) -> ``hot_cache`` (sorted, and the hottest rows
kept in GPU memory) and ``split`` (part of the batch through the CPU path at the same time);
``default`` is ``UnifiedTensor[idx]``: the path that systems/pytorch_direct/dispatch.py picks for
the table from earlier measurements (the suite's kernel or stock torch on the alias, sorted or
not), with the suite's bounds check either way.
``vectorized_kernel`` is a diagnostic, not a path: the vectorized kernel alone, timed with CUDA
events, indices already on the GPU and no bounds-check read-back, so the per-call overhead of
the full path (index copy, dispatch, bounds check, waiting) is the difference between the two.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from systems.pytorch_direct import dispatch
from systems.pytorch_direct.ops import gather, launch_gather, launch_sorted_gather

CPU_BASELINES = ("cpu_gather", "cpu_gather_pipelined")  # speedups are quoted against the faster
STOCK_TORCH = ("torch_uva", "torch_uva_sorted")  # the user's own code on the alias: the peer to beat
PEERS = ("wholegraph",)  # another library's zero-copy gather
BASELINES = ("pageable", *CPU_BASELINES, *STOCK_TORCH, *PEERS)
UPPER_BOUNDS = ("all_in_gpu",)  # no transfer at all: what no feeding path can beat
ZERO_COPY = ("naive", "aligned", "vectorized", "sorted", "hot_cache", "split", "default")
KERNEL_ONLY = ("vectorized_kernel",)  # timed with CUDA events (see above)
CHECKED_ROWS = 4096
# cpu_gather_pipelined: rows per chunk come from this many bytes (small enough that the first
# chunk's gather, which nothing overlaps, is a small share of a batch; large enough that a
# chunk's dispatch to the CPU threads and its copy launch stay a small share of a chunk), and
# this many pinned staging buffers take turns.
PIPELINE_CHUNK_BYTES = 8 << 20
PIPELINE_BUFFERS = 2


def role(variant: str) -> str:
    """The results' ``role`` of a variant (harness.results.ROLES)."""
    if variant in BASELINES:
        return "baseline"
    return "upper_bound" if variant in UPPER_BOUNDS else "optimized"


def wait() -> None:
    event = torch.cuda.Event(blocking=True)
    event.record()
    event.synchronize()


@dataclass
class Batch:
    """One gather's inputs: a host table and the rows asked for."""

    table: torch.Tensor  # [rows, dim], host, pinned on a GPU machine
    idx: torch.Tensor  # [n] int64, pinned host memory (CPU: plain)
    device: str
    alias: torch.Tensor | None = None  # the pinned table as a CUDA tensor (no copy), for torch_uva
    gpu_table: torch.Tensor | None = None  # for all_in_gpu
    slots: torch.Tensor | None = None  # for hot_cache
    cache: torch.Tensor | None = None
    staging: torch.Tensor = field(init=False)
    idx_gpu: torch.Tensor | None = field(init=False, default=None)
    out: torch.Tensor | None = field(init=False, default=None)  # rows in GPU memory, shared by paths

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
    def chunk_rows(self) -> int:
        """Rows per chunk of cpu_gather_pipelined."""
        return max(1, PIPELINE_CHUNK_BYTES // (self.table.shape[1] * self.table.element_size()))


def make(
    variant: str,
    batch: Batch,
    *,
    threads: int = 0,
    max_threads: int = 0,
    split_fraction: float = 0.0,
    wholegraph_table=None,
) -> Callable[[], torch.Tensor]:
    """A callable that runs one gather along ``variant`` and returns the gathered rows."""
    b = batch
    if variant == "cpu_gather":

        def run():
            torch.index_select(b.table, 0, b.idx, out=b.staging)
            if b.device == "cpu":
                return b.staging
            b.out.copy_(b.staging, non_blocking=True)
            wait()
            return b.out
    elif variant == "cpu_gather_pipelined":
        run = _pipelined_cpu_gather(b)
    elif variant == "torch_uva":

        def run():
            b.idx_gpu.copy_(b.idx, non_blocking=True)
            torch.index_select(b.alias, 0, b.idx_gpu, out=b.out)
            wait()
            return b.out
    elif variant == "torch_uva_sorted":

        def run():
            b.idx_gpu.copy_(b.idx, non_blocking=True)
            ids, order = torch.sort(b.idx_gpu)
            b.out.index_copy_(0, order, torch.index_select(b.alias, 0, ids))
            wait()
            return b.out
    elif variant == "wholegraph":
        from workloads.feature_gather.wholegraph import make_wholegraph  # needs pylibwholegraph

        run = make_wholegraph(b, wholegraph_table)
    elif variant == "pageable":

        def run():
            out = b.table[b.idx].to("cuda")
            wait()
            return out
    elif variant == "all_in_gpu":

        def run():
            b.idx_gpu.copy_(b.idx, non_blocking=True)
            torch.index_select(b.gpu_table, 0, b.idx_gpu, out=b.out)
            wait()
            return b.out
    elif variant == "default":
        path = dispatch.choose_for(b.table).path

        def run():
            b.idx_gpu.copy_(b.idx, non_blocking=True)
            out = dispatch.gather_rows(path, b.table, b.alias, b.idx_gpu)
            wait()
            return out
    elif variant == "vectorized_kernel":
        b.idx_gpu.copy_(b.idx)

        def run():
            launch_gather(b.table, b.idx_gpu, b.out, kernel="vectorized", max_threads=max_threads, check=False)
            return b.out
    elif variant in ("naive", "aligned", "vectorized", "sorted", "hot_cache"):
        kernel = variant if variant in ("naive", "aligned") else "vectorized"
        options = dict(kernel=kernel, sort=variant in ("sorted", "hot_cache"), max_threads=max_threads)
        if variant == "hot_cache":
            options.update(slots=b.slots, cache=b.cache)

        def run():
            b.idx_gpu.copy_(b.idx, non_blocking=True)
            out = gather(b.table, b.idx_gpu, **options)
            wait()
            return out
    elif variant == "split":
        k = int(round(split_fraction * b.idx.shape[0]))
        cpu_idx, staging = b.idx[:k], b.staging[:k]

        copy_stream = torch.cuda.Stream()

        def run():
            # The GPU gathers its share (sorted, as in `sorted`) while the CPU gathers the rest;
            # nothing waits for the GPU until both are queued, and the CPU share's copy goes on
            # its own stream so it does not queue behind the gather kernel.
            b.idx_gpu.copy_(b.idx, non_blocking=True)
            gpu_idx = b.idx_gpu[k:]
            bounds_check = launch_sorted_gather(
                b.table, gpu_idx, b.out[k:], kernel="vectorized", max_threads=max_threads, check=False
            )
            torch.index_select(b.table, 0, cpu_idx, out=staging)
            with torch.cuda.stream(copy_stream):
                b.out[:k].copy_(staging, non_blocking=True)
            torch.cuda.current_stream().wait_stream(copy_stream)
            bounds_check()
            wait()
            return b.out
    else:
        raise ValueError(f"unknown variant {variant!r}")

    if variant in ("cpu_gather", "cpu_gather_pipelined", "split"):
        return _with_threads(run, threads)
    return run


def _pipelined_cpu_gather(b: Batch) -> Callable[[], torch.Tensor]:
    """cpu_gather in chunks: the CPU gathers chunk k+1 into one pinned staging buffer while the
    copy engine sends chunk k from another, so only the last chunk's copy is not hidden."""
    if b.device != "cuda":
        raise ValueError("cpu_gather_pipelined overlaps a copy to the GPU; without a GPU it is cpu_gather")
    n, rows = b.idx.shape[0], b.chunk_rows
    buffers = [b.staging[:rows]] + [
        torch.empty_like(b.staging[:rows], pin_memory=True) for _ in range(PIPELINE_BUFFERS - 1)
    ]
    copied = [torch.cuda.Event(blocking=True) for _ in buffers]  # blocking: the host sleeps, not spins
    copy_stream = torch.cuda.Stream()
    done = torch.cuda.Event(blocking=True)

    def run():
        copy_stream.wait_stream(torch.cuda.current_stream())  # earlier readers of b.out come first
        for k, start in enumerate(range(0, n, rows)):
            stop = min(start + rows, n)
            slot = k % len(buffers)
            if k >= len(buffers):
                copied[slot].synchronize()  # this buffer's previous chunk has left it
            staging = buffers[slot][: stop - start]
            torch.index_select(b.table, 0, b.idx[start:stop], out=staging)
            with torch.cuda.stream(copy_stream):
                b.out[start:stop].copy_(staging, non_blocking=True)
                copied[slot].record(copy_stream)
        done.record(copy_stream)
        done.synchronize()
        torch.cuda.current_stream().wait_stream(copy_stream)
        return b.out

    return run


def _with_threads(run, threads: int):
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


POISON = 0xA5  # a byte pattern random table rows do not repeat across a whole sample


def check(run: Callable[[], torch.Tensor], batch: Batch, variant: str) -> None:
    """Compare a path's rows with the reference ``table[idx]``, byte for byte, on sample rows.

    The batch's buffers are poisoned first: several paths write into the same ``out`` and
    staging buffers, so a path that wrote nothing would otherwise pass on the rows the path
    before it left there."""
    batch.staging.view(torch.uint8).fill_(POISON)
    if batch.out is not None:
        batch.out.view(torch.uint8).fill_(POISON)
    out = run()
    n = batch.idx.shape[0]
    sample = torch.linspace(0, n - 1, min(CHECKED_ROWS, n)).long()
    got = out[sample.to(out.device)].cpu().contiguous().view(torch.uint8)
    expected = batch.table[batch.idx[sample]].contiguous().view(torch.uint8)
    if not torch.equal(got, expected):
        raise RuntimeError(f"feature_gather: variant '{variant}' returned rows that differ from the table")
