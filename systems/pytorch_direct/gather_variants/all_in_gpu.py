"""The upper bound: the table held in GPU memory, so no row crosses PCIe (``all_in_gpu``)."""

from __future__ import annotations

import torch

from systems.pytorch_direct.gather_variants import GPU_TABLE, Batch, GatherVariant, register, wait


def make_all_in_gpu(b: Batch):
    def run():
        b.idx_gpu.copy_(b.idx, non_blocking=True)
        torch.index_select(b.gpu_table, 0, b.idx_gpu, out=b.out)
        wait()
        return b.out

    return run


register(
    GatherVariant(
        "all_in_gpu",
        "upper_bound",
        needs_gpu=True,
        make=make_all_in_gpu,
        family="all in GPU",
        requires=(GPU_TABLE,),
        reads_gpu_memory_only=True,
        notes="index_select on a copy of the table in GPU memory",
    )
)
