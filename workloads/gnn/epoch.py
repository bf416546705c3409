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
from harness.errors import UserError
from harness.timing import PhaseClock, wall_clock
from workloads.gnn.pipelines import Pipeline


def train_epoch(
    model, optimizer, pipeline: Pipeline, epoch: int, clock: PhaseClock | None = None
) -> tuple[list[float], int]:
    """One epoch; returns the losses (one wait, at the end) and the feature bytes gathered."""
    check_model(model, pipeline)
    model.train()
    pipeline.clock = clock
    losses, gathered = [], 0
    batches = pipeline.batches(epoch)
    try:
        for batch in batches:
            with clock.phase("train") if clock is not None else nullcontext():
                optimizer.zero_grad(set_to_none=True)
                out = model(batch.x, batch.edge_index)[: batch.batch_size]
                if not losses:  # the first batch shows the model's classes
                    check_classes(pipeline, "train_idx", out.shape[1])
                loss = F.cross_entropy(out, batch.y)
                loss.backward()
                optimizer.step()
            losses.append(loss.detach())
            gathered += batch.feature_bytes
    finally:
        batches.close()  # on an error too: stops a prefetch thread at once
        pipeline.clock = None
    return [float(loss) for loss in losses], int(gathered)  # a GPU count (a cache's misses) is read here


def check_model(model, pipeline: Pipeline) -> None:
    """Refuse, in one line, a model that does not fit the pipeline's batches, where the model says
    what it takes: ``hops`` (its layers, one per sampling hop: a deeper model would run on
    neighbourhoods cut short, a shallower one ignore the outer hop) and ``in_dim`` (the width of
    its input rows). The suite's models say both; a model that says neither is not checked."""
    hops, width = getattr(model, "hops", None), getattr(model, "in_dim", None)
    if pipeline.sampler is None:  # a closed pipeline: its batches say so
        return
    fanouts = pipeline.sampler.fanouts
    if hops is not None and hops != len(fanouts):
        raise UserError(
            f"the model has {hops} layers and the pipeline samples {len(fanouts)} hops (fan-outs {fanouts}): "
            "give the pipeline one fan-out per layer"
        )
    features = pipeline.graph.features.shape[1]
    if width is not None and width != features:
        raise UserError(f"the model takes rows of {width} features and the graph's rows have {features}")


def check_classes(pipeline: Pipeline, split: str, classes: int) -> None:
    """Refuse a label the model has no class for, in one line: the loss would fail deep in torch
    (``Target 7 is out of bounds``) and accuracy count the node as a miss. The graph knows each
    split's largest label; ``classes`` is the model's output width, read without waiting for it."""
    largest = pipeline.graph.largest_label[split]
    if largest is not None and largest[1] >= classes:
        node, label = largest
        raise UserError(
            f"{split} names node {node}, whose label is {label}: the model has {classes} classes (0..{classes - 1})"
        )


@torch.no_grad()
def accuracy(model, pipeline: Pipeline) -> float:
    check_model(model, pipeline)
    model.eval()
    correct = total = 0
    for batch in pipeline.batches(epoch=0, seeds=pipeline.graph.val_idx):
        out = model(batch.x, batch.edge_index)[: batch.batch_size]
        if not total:  # the first batch shows the model's classes
            check_classes(pipeline, "val_idx", out.shape[1])
        predicted = out.argmax(1)
        correct += int((predicted == batch.y).sum())
        total += batch.batch_size
    if not total:  # 0 of 0 is no accuracy (it read as 0%)
        raise UserError("the graph has no validation nodes (val_idx is empty): there is no accuracy to measure")
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
