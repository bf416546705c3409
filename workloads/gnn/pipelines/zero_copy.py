"""PyTorch-Direct's zero-copy gather: CPU sampling, then GPU threads read the sampled rows from
the feature table pinned in place, along the path measured fastest for the table's row and table
size on this GPU (systems/pytorch_direct/dispatch.py). ``zero_copy`` prepares each batch when training asks for it;
``zero_copy_overlap`` prepares the next batches in a background thread on a side stream (gather
with capped threads) while the batch before trains."""

from __future__ import annotations

import torch

from workloads.gnn.pipelines import OVERLAP_GATHER_THREADS, PYTORCH_DIRECT, PipelineKind, register


def checked_ids_on_gpu(pipeline, n_id: torch.Tensor) -> torch.Tensor:
    """The CPU sampler's ids, range-checked here on the CPU (so the launch need not wait for the
    kernel's own check, which would stall the overlap), then sent without blocking."""
    rows = pipeline.graph.features.shape[0]
    if n_id.numel() and not 0 <= int(n_id.min()) <= int(n_id.max()) < rows:
        raise IndexError("the sampler returned a node id outside the feature table")
    return n_id.pin_memory().to(pipeline.device, non_blocking=True)


def gather_zero_copy(pipeline, sub):
    features = pipeline.graph.features
    n_id = checked_ids_on_gpu(pipeline, sub.n_id)
    x = torch.empty((n_id.numel(), features.shape[1]), dtype=features.dtype, device=pipeline.device)
    cap = OVERLAP_GATHER_THREADS if pipeline.side_stream is not None else 0
    # Along the path measured fastest for this table (UnifiedTensor's dispatch); the ids were
    # range-checked above, so the gather's own check (a wait for the GPU) is dropped.
    pipeline.table.launch_into(n_id, x, max_threads=cap)
    return x, sub.n_id.numel() * pipeline.row_bytes()


def register_table(pipeline) -> None:
    # Registers the table in place for zero-copy reads.
    pipeline.table = pipeline.graph.unified_features()


def register_table_and_side_stream(pipeline) -> None:
    register_table(pipeline)
    pipeline.side_stream = torch.cuda.Stream()


register(
    PipelineKind(
        "zero_copy",
        "optimized",
        technique=PYTORCH_DIRECT,
        label="zero-copy",
        needs_gpu=True,
        gather=gather_zero_copy,
        prepare=register_table,
        notes="CPU sampling, the GPU reads the rows from the table pinned in place",
    )
)
register(
    PipelineKind(
        "zero_copy_overlap",
        "optimized",
        technique=PYTORCH_DIRECT,
        label="zero-copy, overlapped",
        needs_gpu=True,
        gather=gather_zero_copy,
        prepare=register_table_and_side_stream,
        batches=lambda pipeline, items, count: pipeline.prefetched(items, count),
        notes="zero_copy with the next batches prepared on a side stream while one trains",
    )
)
