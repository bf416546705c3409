"""Pipelines that sample on the GPU: ``uva_sampling`` reads the CSR pinned in host memory over
PCIe and gathers zero-copy (DGL's UVA mode); ``all_in_gpu`` keeps CSR and features in GPU memory
(the upper bound: no feature crosses PCIe).

Both prepare the next batches ahead, in a background thread on a side stream, while one trains
(as ``zero_copy_overlap`` does), so the upper bound is one for the epoch, not only for the feature
transfer. Inside a batch the host never waits for the GPU, but once: the sampler builds the
subgraph in buffers sized by the fan-outs and reads the few per-hop sizes back at the end
(systems/sampling/sampler.py), a wait of the prefetch thread for its own stream that training
does not see.
"""

from __future__ import annotations

import torch

from workloads.gnn.pipelines import OVERLAP_GATHER_THREADS, PYTORCH_DIRECT, PipelineKind, register


def gather_uva(pipeline, sub):
    features = pipeline.graph.features
    x = torch.empty((sub.n_id.numel(), features.shape[1]), dtype=features.dtype, device=pipeline.device)
    # Along the measured path (as zero_copy). The ids come from the sampler, over a CSR it
    # checked: the gather's own range check would read a flag back, a wait inside the batch.
    pipeline.table.launch_into(sub.n_id, x, max_threads=OVERLAP_GATHER_THREADS)
    return x, sub.n_id.numel() * pipeline.row_bytes()


def gather_in_gpu_memory(pipeline, sub):
    # The rows gathered, as for every pipeline; none of them crosses PCIe (``crosses_pcie``).
    return pipeline.table.index_select(0, sub.n_id), sub.n_id.numel() * pipeline.row_bytes()


def register_table_and_side_stream(pipeline) -> None:
    pipeline.table = pipeline.graph.unified_features()  # registers graph.features for zero-copy reads
    pipeline.side_stream = torch.cuda.Stream()


def copy_table_and_side_stream(pipeline) -> None:
    # The pipeline's own copy, freed when it closes: the pipelines measured after it in the same
    # process do not find the table still taking GPU memory.
    pipeline.table = pipeline.graph.features.to(pipeline.device)
    pipeline.side_stream = torch.cuda.Stream()


def prefetched(pipeline, items, count):
    return pipeline.prefetched(items, count)


register(
    PipelineKind(
        "uva_sampling",
        "optimized",
        technique=PYTORCH_DIRECT,
        label="UVA sampling",
        needs_gpu=True,
        sampling="uva",
        gather=gather_uva,
        prepare=register_table_and_side_stream,
        batches=prefetched,
        notes="the GPU samples from the pinned CSR and gathers zero-copy, the next batches prepared ahead",
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
        prepare=copy_table_and_side_stream,
        batches=prefetched,
        crosses_pcie=False,
        resident=lambda sizes, options: {"features": sizes.feature_table},
        notes="CSR and features in GPU memory, sampled on the GPU, the next batches prepared ahead",
    )
)
