"""``cpu_gather_workers``: the CPU path as a PyG user runs it, ``NeighborLoader(num_workers=W,
pin_memory=True)`` and ``batch.to(device, non_blocking=True)``: the strong CPU baseline.

Loader worker processes (a DataLoader, as NeighborLoader is one) sample each batch and gather
its feature rows and labels into shared memory, ``WORKER_PREFETCH`` batches ahead per worker;
the DataLoader's pin-memory thread pins them; the training process copies batch i+1 to the GPU on
a copy stream while batch i trains. ``sampler_workers`` sets W and ``worker_threads`` the torch
threads of each worker (workloads/gnn/worker_split.py picks both per machine and CPU budget).
Without a GPU it trains on the CPU and the copy is a no-op. Its batches are ``cpu_gather``'s.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from workloads.gnn.pipelines import GatheredBatch, Minibatch, PipelineKind, register


def copy_rows(pipeline, item: GatheredBatch):
    # The pin-memory thread has pinned the rows (on a GPU machine), so the copy does not block.
    return pipeline._to_device(item.x), item.x.shape[0] * pipeline.row_bytes()


def make_copy_stream(pipeline) -> None:
    pipeline.side_stream = torch.cuda.Stream() if pipeline.device.type == "cuda" else None


def copy_ahead(pipeline, items: Iterator, count: int) -> Iterator[Minibatch]:
    """Batch i+1's copies queued on the copy stream before batch i is handed to training, so the
    copy engine moves the next rows while the training kernels run."""
    if pipeline.side_stream is None or pipeline.clock is not None:
        # No GPU, or a breakdown (one phase after another): each batch in turn.
        for _ in range(count):
            yield pipeline._next(items)
        return
    stream, waiting = pipeline.side_stream, None
    for _ in range(count):
        with torch.cuda.stream(stream):
            batch = pipeline._next(items)
        copied = torch.cuda.Event()
        copied.record(stream)
        if waiting is not None:
            yield _handed_over(pipeline, *waiting)
        waiting = (batch, copied)
    if waiting is not None:
        yield _handed_over(pipeline, *waiting)


def _handed_over(pipeline, batch: Minibatch, copied: torch.cuda.Event) -> Minibatch:
    torch.cuda.current_stream().wait_event(copied)
    return pipeline.used_on_current_stream(batch)


register(
    PipelineKind(
        "cpu_gather_workers",
        "baseline",
        label="CPU gather in loader workers",
        worker_gathers=True,
        swept_worker_threads=(),  # the config's threads per worker
        gather=copy_rows,
        prepare=make_copy_stream,
        batches=copy_ahead,
        notes="PyG-style loader: workers sample and gather into shared memory, pinned, copied one batch ahead",
    )
)
