"""``vectorized_kernel``, a diagnostic, not a path: the vectorized kernel alone, timed with CUDA
events, indices already on the GPU and no bounds-check read-back, so the per-call overhead of
the full path (index copy, dispatch, bounds check, waiting) is the difference between the two."""

from __future__ import annotations

from systems.pytorch_direct.gather_variants import Batch, GatherVariant, register
from systems.pytorch_direct.gather_variants.zero_copy import PYTORCH_DIRECT
from systems.pytorch_direct.ops import launch_gather


def make_kernel_only(b: Batch, *, max_threads: int = 0):
    b.idx_gpu.copy_(b.idx)

    def run():
        launch_gather(b.table, b.idx_gpu, b.out, kernel="vectorized", max_threads=max_threads, check=False)
        return b.out

    return run


register(
    GatherVariant(
        "vectorized_kernel",
        "optimized",
        needs_gpu=True,
        make=make_kernel_only,
        family=PYTORCH_DIRECT,
        thread_cap=True,
        kernel_only=True,
        notes="the vectorized kernel alone, timed with CUDA events (the per-call overhead is the rest)",
    )
)
