"""``cpu_gather``: the paper's baseline. The training process gathers the sampled rows with
``index_select`` into a pinned staging buffer and copies them to the GPU asynchronously; without
a GPU it trains on the CPU (the rows stay where they are)."""

from __future__ import annotations

import torch

from workloads.gnn.pipelines import PipelineKind, register


def gather_in_process(pipeline, sub):
    features = pipeline.graph.features
    staging = torch.empty(
        (sub.n_id.numel(), features.shape[1]), dtype=features.dtype, pin_memory=pipeline.device.type == "cuda"
    )
    x = torch.index_select(features, 0, sub.n_id, out=staging).to(pipeline.device, non_blocking=True)
    return x, sub.n_id.numel() * pipeline.row_bytes()


register(
    PipelineKind(
        "cpu_gather",
        "baseline",
        label="CPU gather",
        gather=gather_in_process,
        notes="CPU sampling, index_select into pinned staging on the training thread, asynchronous copy",
    )
)
