"""The epoch loop of GNN training, the same for one process (workloads/gnn_training/train.py)
and for every rank of a data-parallel run (workloads/gnn_multi_gpu/rank.py).

:func:`timed_epochs` trains the warm-up and timed epochs and times each with one wait at each
end, so the pipeline overlaps inside an epoch as in real training; it yields every epoch's time,
losses, feature bytes and CPU time to the caller, which records them (and, across ranks, reduces
them first). The one difference between one process and many is what an epoch's ends wait for:
the GPU (the default) or every rank (``before``/``after``: a barrier).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from harness import resources
from harness.timing import PhaseClock, wall_clock
from workloads.gnn.pipelines import Pipeline


def train_epoch(
    model, optimizer, pipeline: Pipeline, epoch: int, clock: PhaseClock | None = None
) -> tuple[list[float], int]:
    """One epoch; returns the losses (one wait, at the end) and the feature bytes gathered."""
    model.train()
    pipeline.clock = clock
    losses, gathered = [], 0
    batches = pipeline.batches(epoch)
    try:
        for batch in batches:
            with clock.phase("train") if clock is not None else nullcontext():
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(batch.x, batch.edge_index)[: batch.batch_size], batch.y)
                loss.backward()
                optimizer.step()
            losses.append(loss.detach())
            gathered += batch.feature_bytes
    finally:
        batches.close()  # on an error too: stops a prefetch thread at once
        pipeline.clock = None
    return [float(loss) for loss in losses], int(gathered)  # a GPU count (a cache's misses) is read here


@torch.no_grad()
def accuracy(model, pipeline: Pipeline) -> float:
    model.eval()
    correct = total = 0
    for batch in pipeline.batches(epoch=0, seeds=pipeline.graph.val_idx):
        predicted = model(batch.x, batch.edge_index)[: batch.batch_size].argmax(1)
        correct += int((predicted == batch.y).sum())
        total += batch.batch_size
    if not total:  # 0 of 0 is no accuracy (it read as 0%)
        raise ValueError("the graph has no validation nodes (val_idx is empty): there is no accuracy to measure")
    return correct / total


@dataclass(frozen=True)
class Epoch:
    """One trained epoch, as :func:`timed_epochs` yields it."""

    index: int  # from 0, warm-up epochs included
    repetition: int | None  # the timed epoch's number from 0; None for a warm-up epoch
    seconds: float
    losses: list[float]  # this process's, one per step
    feature_bytes: int  # bytes of feature rows this process gathered
    cpu_before: float  # this process's CPU core-seconds, sampling workers included, as the epoch began

    def cpu_seconds(self) -> float:
        """CPU core-seconds since the epoch began, sampling workers included, read when called:
        the caller picks the moment, so each topic reads it where it always has."""
        return resources.cpu_core_seconds(include_children=True) - self.cpu_before


def timed_epochs(
    model,
    optimizer,
    pipeline: Pipeline,
    *,
    warmup: int,
    repeat: int,
    device: str,
    before: Callable[[], object] | None = None,
    after: Callable[[], object] | None = None,
) -> Iterator[Epoch]:
    """Train ``warmup`` + ``repeat`` epochs, yielding each once it is timed (the caller's work on
    it runs before the next epoch starts). An epoch's time runs from ``before`` to ``after``
    (default: waiting for the GPU, see harness.timing.wall_clock)."""
    for epoch in range(warmup + repeat):
        # Sampling workers are child processes (persistent, still running): count them too.
        cpu_before = resources.cpu_core_seconds(include_children=True)
        result = {}
        seconds = wall_clock(
            lambda: result.update(out=train_epoch(model, optimizer, pipeline, epoch)),
            device,
            before=before,
            after=after,
        )
        losses, gathered = result["out"]
        yield Epoch(epoch, epoch - warmup if epoch >= warmup else None, seconds, losses, gathered, cpu_before)
