"""The peer a user writes by hand: stock torch on the CUDA alias of the pinned table
(``UnifiedTensor.cuda_alias``), every row read over PCIe by torch's own kernel.

``torch_uva``: ``index_select`` on the alias. ``torch_uva_sorted``: the ids sorted first, the
rows put back in request order with ``index_copy_``.
"""

from __future__ import annotations

import torch

from systems.pytorch_direct.gather_variants import Batch, GatherVariant, register, wait

STOCK_TORCH = "stock torch"


def make_torch_uva(b: Batch):
    def run():
        b.idx_gpu.copy_(b.idx, non_blocking=True)
        torch.index_select(b.alias, 0, b.idx_gpu, out=b.out)
        wait()
        return b.out

    return run


def make_torch_uva_sorted(b: Batch):
    def run():
        b.idx_gpu.copy_(b.idx, non_blocking=True)
        ids, order = torch.sort(b.idx_gpu)
        b.out.index_copy_(0, order, torch.index_select(b.alias, 0, ids))
        wait()
        return b.out

    return run


register(
    GatherVariant(
        "torch_uva",
        "peer",
        needs_gpu=True,
        make=make_torch_uva,
        family=STOCK_TORCH,
        notes="index_select on the CUDA alias of the pinned table",
    )
)
register(
    GatherVariant(
        "torch_uva_sorted",
        "peer",
        needs_gpu=True,
        make=make_torch_uva_sorted,
        family=STOCK_TORCH,
        notes="ids sorted, index_select on the CUDA alias, rows put back with index_copy_",
    )
)
