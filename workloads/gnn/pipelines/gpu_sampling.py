"""Pipelines that sample on the GPU: ``uva_sampling`` reads the CSR pinned in host memory over
PCIe and gathers zero-copy (DGL's UVA mode); ``all_in_gpu`` keeps CSR and features in GPU memory
(the upper bound: no feature crosses PCIe)."""

from __future__ import annotations

from workloads.gnn.pipelines import PipelineKind, register


def gather_uva(pipeline, sub):
    return pipeline.table[sub.n_id], sub.n_id.numel() * pipeline.row_bytes()  # ids on the GPU; the op checks them


def gather_in_gpu_memory(pipeline, sub):
    # The rows gathered, as for every pipeline; none of them crosses PCIe (``crosses_pcie``).
    return pipeline.graph.gpu_features().index_select(0, sub.n_id), sub.n_id.numel() * pipeline.row_bytes()


def register_table(pipeline) -> None:
    pipeline.table = pipeline.graph.unified_features()


register(
    PipelineKind(
        "uva_sampling",
        "optimized",
        label="UVA sampling",
        needs_gpu=True,
        sampling="uva",
        gather=gather_uva,
        prepare=register_table,
        notes="the GPU samples from the pinned CSR and gathers zero-copy",
    )
)
register(
    PipelineKind(
        "all_in_gpu",
        "upper_bound",
        label="all in GPU",
        needs_gpu=True,
        sampling="cuda",
        gather=gather_in_gpu_memory,
        crosses_pcie=False,
        notes="CSR and features in GPU memory, sampled on the GPU",
    )
)
