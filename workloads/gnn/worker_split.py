"""CPU budgets and the loader workers' split of them.

A CPU budget is the number of cores a pipeline's process tree may run on: its training threads,
its sampling (or loader) workers and their threads. :func:`cpu_budget` pins the training
process to that many of its cores while a pipeline runs (workers forked inside inherit it), so
a pipeline can be measured at 2, 4, 8 cores and at all of them on one machine.

How ``cpu_gather_workers`` splits a budget (W workers of T threads, the rest training) depends on
the machine: :func:`pick_split` trains a few batches with each candidate split and keeps the
fastest; the caller records what it measured.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.nn import functional as F

from harness.arguments import whole_number
from harness.errors import UserError
from workloads.gnn.pipelines import Pipeline, usable_cores

ALL_CORES = "all"
SPLIT_EPOCH = 8_000  # the epoch index whose batches the split is timed on (training never reaches it)
SPLIT_BATCHES = 6  # batches timed per candidate, after one that starts the workers


def budget_cores(budget: int | str) -> int:
    """The cores a budget names: a number, or ``"all"`` this process may use."""
    if budget == ALL_CORES:
        return usable_cores()
    if (cores := whole_number(budget, at_least=1)) is None:
        raise UserError(f"a CPU budget is a positive number of cores or {ALL_CORES!r}, got {budget!r}")
    return cores


@contextmanager
def cpu_budget(cores: int) -> Iterator[None]:
    """Run the block (and every process it forks) on ``cores`` of this process's cores."""
    if not hasattr(os, "sched_setaffinity"):
        if cores != usable_cores():
            raise UserError("CPU budgets below all cores need Linux CPU affinity (os.sched_setaffinity)")
        yield
        return
    allowed = sorted(os.sched_getaffinity(0))
    if cores > len(allowed):
        raise UserError(f"a CPU budget of {cores} cores exceeds the {len(allowed)} this process may use")
    os.sched_setaffinity(0, allowed[:cores])
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


def training_threads_left(cores: int, workers: int, threads_per_worker: int = 1) -> int:
    """The training process's torch threads: the budget's cores its workers leave (at least one)."""
    return max(1, cores - workers * threads_per_worker)


def candidate_splits(cores: int, workers: list[int], threads_per_worker: list[int]) -> list[tuple[int, int]]:
    """(workers, threads per worker) pairs that leave at least one core of ``cores`` to training;
    with none, one worker of one thread (training then shares a core)."""
    splits = [(w, t) for w in workers for t in threads_per_worker if w >= 1 and t >= 1 and w * t < cores]
    return splits or [(1, 1)]


def pick_split(
    make_pipeline, model: torch.nn.Module, cores: int, splits: list[tuple[int, int]], learning_rate: float
) -> tuple[tuple[int, int], dict[str, float]]:
    """The fastest of ``splits`` and each one's seconds per training step ({"WxT": s}).

    ``make_pipeline(workers, threads_per_worker)`` returns a ``cpu_gather_workers`` pipeline;
    each candidate trains a copy of ``model`` (the model itself is left as it is) for
    SPLIT_BATCHES batches after a first one that starts its workers."""
    if len(splits) == 1:
        return splits[0], {}
    timings = {}
    # The trials' dropout draws come from a fork of the random state: the measured run then
    # starts from the state it would have had without them, as every other pipeline does.
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        for workers, threads in splits:
            timings[f"{workers}x{threads}"] = _time_split(make_pipeline, model, cores, workers, threads, learning_rate)
    best = min(timings, key=timings.get)
    workers, threads = map(int, best.split("x"))
    return (workers, threads), timings


def _time_split(make_pipeline, model, cores: int, workers: int, threads: int, learning_rate: float) -> float:
    """Seconds per training step of a copy of ``model`` fed by ``workers`` x ``threads``."""
    torch.set_num_threads(training_threads_left(cores, workers, threads))
    trial = copy.deepcopy(model)
    optimizer = torch.optim.Adam(trial.parameters(), lr=learning_rate)
    pipeline: Pipeline = make_pipeline(workers, threads)
    try:
        return _seconds_per_step(trial, optimizer, pipeline)
    finally:
        pipeline.close()


def _seconds_per_step(model, optimizer, pipeline: Pipeline) -> float:
    batches = pipeline.batches(SPLIT_EPOCH)
    steps, began, first_done = 0, time.perf_counter(), None
    try:
        for batch in batches:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(batch.x, batch.edge_index)[: batch.batch_size], batch.y).backward()
            optimizer.step()
            if pipeline.device.type == "cuda":
                torch.cuda.synchronize()
            if first_done is None:  # the first batch starts the workers: timed only if it is the only one
                first_done = time.perf_counter()
                continue
            steps += 1
            if steps == SPLIT_BATCHES:
                break
    finally:
        batches.close()
    if not steps:
        return (first_done or time.perf_counter()) - began
    return (time.perf_counter() - first_done) / steps
