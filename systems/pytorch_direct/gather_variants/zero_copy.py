"""PyTorch-Direct: GPU threads read the rows from the pinned host table, as an ablation.

``naive`` -> ``aligned`` -> ``vectorized`` (the kernels of ``ops.gather``) -> ``sorted`` (rows
read in ascending index order) -> ``hot_cache`` (sorted, and the hottest rows kept in GPU
memory), and ``split`` (part of the batch through the CPU path at the same time, in proportion
to the CPU's and ``sorted``'s rates). ``default`` is ``UnifiedTensor[idx]``: the path that
systems/pytorch_direct/dispatch.py picks for the table from earlier measurements (the suite's
kernel or stock torch on the alias, sorted or not), with the suite's bounds check either way.
"""

from __future__ import annotations

import torch

from systems.pytorch_direct import dispatch
from systems.pytorch_direct.gather_variants import HOT_ROWS, Batch, GatherVariant, register, wait
from systems.pytorch_direct.ops import gather_op, launch_sorted_gather

PYTORCH_DIRECT = "PyTorch-Direct"


def kernel_gather(kernel: str, *, sort: bool = False, cached: bool = False):
    """A variant's make: ``ops.gather`` with ``kernel`` (its ``loads``), optionally sorted and
    reading hot rows from the batch's GPU cache."""

    def make(b: Batch, *, max_threads: int = 0):
        options = dict(loads=kernel, sort=sort, max_threads=max_threads)
        if cached:
            options.update(slots=b.slots, cache=b.cache)

        def run():
            b.idx_gpu.copy_(b.idx, non_blocking=True)
            out = gather_op(b.table, b.idx_gpu, **options)  # the op itself: its arguments are the variant's
            wait()
            return out

        return run

    return make


def make_split(b: Batch, *, split_fraction: float, max_threads: int = 0):
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

    return run


def make_default(b: Batch):
    path = dispatch.choose_for(b.table).path

    def run():
        b.idx_gpu.copy_(b.idx, non_blocking=True)
        out = dispatch.gather_rows(path, b.table, b.alias, b.idx_gpu)
        wait()
        return out

    return run


def _kernel_step(name: str, make, notes: str, **flags) -> GatherVariant:
    return GatherVariant(
        name, "optimized", needs_gpu=True, make=make, family=PYTORCH_DIRECT, thread_cap=True, notes=notes, **flags
    )


for step in (
    _kernel_step("naive", kernel_gather("naive"), "a lane per element, wherever the row starts"),
    _kernel_step("aligned", kernel_gather("aligned"), "warp reads start on the row's 128-byte line"),
    _kernel_step("vectorized", kernel_gather("vectorized"), "aligned, 16-byte loads where the row allows"),
    _kernel_step("sorted", kernel_gather("vectorized", sort=True), "vectorized, rows read in ascending order"),
    _kernel_step(
        "hot_cache",
        kernel_gather("vectorized", sort=True, cached=True),
        "sorted, the hottest rows read from a cache in GPU memory",
        requires=(HOT_ROWS,),
    ),
    _kernel_step(
        "split",
        make_split,
        "the CPU gathers a share of the batch while the GPU gathers the rest (sorted)",
        cpu_threads=True,
        shares_from=("cpu_gather", "sorted"),
    ),
):
    register(step)

register(
    GatherVariant(
        "default",
        "optimized",
        needs_gpu=True,
        make=make_default,
        family=PYTORCH_DIRECT,
        records=lambda b: {"path": dispatch.choose_for(b.table).path},
        notes="UnifiedTensor[idx]: the path the GPU's dispatch table measured fastest, bounds-checked",
    )
)
