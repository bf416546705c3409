"""The baselines: the rows gathered by the CPU, then copied to the GPU.

``pageable``: ``table[idx].to('cuda')``, from pageable memory. ``cpu_gather``: ``index_select``
into a pinned staging buffer, then an asynchronous copy (without a GPU: the gather alone).
``cpu_gather_pipelined``: the same in chunks through two staging buffers, each chunk's copy
overlapping the next chunk's gather: what a careful user writes. Speedups are quoted against the
faster of the two CPU gathers (their family).
"""

from __future__ import annotations

import torch

from systems.pytorch_direct.gather_variants import Batch, GatherVariant, register, wait

CPU_GATHER = "CPU gather"
# cpu_gather_pipelined: rows per chunk come from this many bytes (small enough that the first
# chunk's gather, which nothing overlaps, is a small share of a batch; large enough that a
# chunk's dispatch to the CPU threads and its copy launch stay a small share of a chunk), and
# this many pinned staging buffers take turns.
PIPELINE_CHUNK_BYTES = 8 << 20
PIPELINE_BUFFERS = 2


def make_pageable(b: Batch):
    def run():
        out = b.table[b.idx].to("cuda")
        wait()
        return out

    return run


def make_cpu_gather(b: Batch):
    def run():
        torch.index_select(b.table, 0, b.idx, out=b.staging)
        if b.device == "cpu":
            return b.staging
        b.out.copy_(b.staging, non_blocking=True)
        wait()
        return b.out

    return run


def chunk_rows(b: Batch) -> int:
    """Rows per chunk of cpu_gather_pipelined."""
    return max(1, PIPELINE_CHUNK_BYTES // max(1, b.row_bytes))  # a row of no features counts as a byte


def make_pipelined(b: Batch):
    """cpu_gather in chunks: the CPU gathers chunk k+1 into one pinned staging buffer while the
    copy engine sends chunk k from another, so only the last chunk's copy is not hidden."""
    if b.device != "cuda":
        raise ValueError("cpu_gather_pipelined overlaps a copy to the GPU; without a GPU it is cpu_gather")
    n, rows = b.idx.shape[0], chunk_rows(b)
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


register(
    GatherVariant(
        "pageable",
        "baseline",
        needs_gpu=True,
        make=make_pageable,
        family="pageable copy",
        notes="table[idx].to('cuda'): a CPU gather, then a copy from pageable memory",
    )
)
register(
    GatherVariant(
        "cpu_gather",
        "baseline",
        make=make_cpu_gather,
        family=CPU_GATHER,
        cpu_threads=True,
        notes="index_select into pinned staging, then an asynchronous copy",
    )
)
register(
    GatherVariant(
        "cpu_gather_pipelined",
        "baseline",
        needs_gpu=True,
        make=make_pipelined,
        family=CPU_GATHER,
        cpu_threads=True,
        records=lambda b: {"chunk_rows": chunk_rows(b)},
        notes="cpu_gather in 8 MiB chunks through two staging buffers, copies overlapping the next gather",
    )
)
