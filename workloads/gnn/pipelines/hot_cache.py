"""Zero-copy gathering with the most used rows kept in GPU memory (PyTorch-Direct's hot-row
cache, systems/pytorch_direct/hot_rows.py): rows in the cache are read from GPU memory, the
others over PCIe.

``hot_cache`` learns which rows to keep as a user's code would: before training it samples
``warmup_batches`` batches of its own (batch numbers that training never draws), counts how often
each row is read and keeps the ``rows`` most read. That fill (sampling, counting, copying the rows
to the GPU) is timed and recorded as ``cache_fill_time``. ``hot_cache_oracle`` keeps the rows
that the measured ``epochs`` read most, counted from those very batches in hindsight: the best a
static cache of that size can do, an upper bound, its fill untimed. Both record each epoch's
``cache_hit_rate`` (the share of rows read from the cache); their ``pcie_bytes`` count misses only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from harness.arguments import whole_number
from harness.errors import UserError
from systems.pytorch_direct.hot_rows import HotRows, count_rows, hottest_rows
from systems.pytorch_direct.ops import launch_gather, launch_sorted_gather
from workloads.gnn.pipelines import MAX_EPOCH, PYTORCH_DIRECT, PipelineKind, batch_number, epoch_seeds, register
from workloads.gnn.pipelines.zero_copy import checked_ids_on_gpu

# The learned fill's own batches are numbered from the first epoch past those training accepts
# (Pipeline.batches refuses epochs past MAX_EPOCH): their shuffles and draws are streams no
# training batch ever uses, so the fill never sees the batches it then serves.
PRESAMPLE_EPOCH = MAX_EPOCH + 1


def presampled_ids(pipeline, batches: int) -> Iterator[torch.Tensor]:
    """The node ids of ``batches`` batches sampled for the fill, as training would sample them."""
    epoch, drawn = PRESAMPLE_EPOCH, 0
    while drawn < batches:
        for index, seeds in enumerate(epoch_seeds(pipeline.graph.train_idx, pipeline.batch_size, pipeline.seed, epoch)):
            if drawn == batches:
                return
            yield pipeline.sampler.sample(seeds, batch_number(epoch, index)).n_id
            drawn += 1
        epoch += 1


def training_ids(pipeline, epochs: int) -> Iterator[torch.Tensor]:
    """The node ids of every batch of training epochs 0..epochs-1 (what the oracle knows)."""
    for epoch in range(epochs):
        for index, seeds in enumerate(pipeline.seeds(epoch)):
            yield pipeline.sampler.sample(seeds, batch_number(epoch, index)).n_id


def _option(pipeline, name: str, what: str) -> int:
    """An option that counts something, as an int: numpy's integers too, never a bool or a float."""
    value = pipeline.options[name]
    if (number := whole_number(value, at_least=1)) is None:
        raise UserError(f"{pipeline.name}: {name} must be {what}, got {value!r}")
    return number


def _cache_of(pipeline, id_batches: Iterator[torch.Tensor]) -> HotRows:
    rows = _option(pipeline, "rows", "a whole number of cached rows >= 1")
    counts = count_rows(id_batches, pipeline.graph.features.shape[0])
    return HotRows(pipeline.graph.features, hottest_rows(counts, rows), pipeline.device)


def _start(pipeline) -> None:
    if pipeline.device.type == "cuda":
        pipeline.table = pipeline.graph.unified_features()  # the misses are read zero-copy
    pipeline.reads = pipeline.misses = 0


def fill_learned(pipeline) -> None:
    _start(pipeline)
    batches = _option(pipeline, "warmup_batches", "a whole number of batches >= 1")
    if pipeline.device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    pipeline.cache = _cache_of(pipeline, presampled_ids(pipeline, batches))
    if pipeline.device.type == "cuda":
        torch.cuda.synchronize()  # the rows' copy to the GPU is part of the fill
    pipeline.setup_metrics["cache_fill_time"] = (time.perf_counter() - started, "s")
    pipeline.setup_metrics["cache_bytes"] = (float(pipeline.cache.nbytes), "B")


def fill_in_hindsight(pipeline) -> None:
    _start(pipeline)
    epochs = _option(pipeline, "epochs", "a whole number of epochs >= 1")
    pipeline.cache = _cache_of(pipeline, training_ids(pipeline, epochs))
    pipeline.setup_metrics["cache_bytes"] = (float(pipeline.cache.nbytes), "B")


def gather_cached(pipeline, sub):
    features = pipeline.graph.features
    n_id = checked_ids_on_gpu(pipeline, sub.n_id)
    x = torch.empty((n_id.numel(), features.shape[1]), dtype=features.dtype, device=pipeline.device)
    cache = pipeline.cache
    # Only the suite's kernel reads through a cache; it reads the rows in ascending order where
    # the dispatch measured a sorted path fastest for this table (the misses are the same rows
    # zero_copy reads, fewer of them).
    launch = launch_sorted_gather if pipeline.table.path.endswith("_sorted") else launch_gather
    launch(features, n_id, x, kernel="vectorized", slots=cache.slots, cache=cache.cache, check=False)
    misses = cache.misses(n_id)  # stays on the GPU: summed per epoch, read once
    pipeline.reads += n_id.numel()
    pipeline.misses = pipeline.misses + misses
    return x, misses * pipeline.row_bytes()


def cached_rows_and_slots(sizes, options) -> dict[str, int]:
    """A cache of ``rows`` rows, and its int32 slot of every row (HotRows' layout)."""
    rows = min(options.get("rows", 0), sizes.nodes)
    return {"cache": rows * sizes.feature_dim * sizes.feature_itemsize + sizes.nodes * 4}


def hit_rate_since_last(pipeline) -> dict[str, tuple[float, str]]:
    """The share of rows read from the cache since the last call (one epoch), and start again."""
    reads, misses = pipeline.reads, int(pipeline.misses)
    pipeline.reads = pipeline.misses = 0
    return {"cache_hit_rate": (1.0 - misses / reads if reads else 0.0, "ratio")}


register(
    PipelineKind(
        "hot_cache",
        "optimized",
        technique=PYTORCH_DIRECT,
        label="zero-copy, learned hot-row cache",
        needs_gpu=True,
        gather=gather_cached,
        prepare=fill_learned,
        epoch_metrics=hit_rate_since_last,
        options=("rows", "warmup_batches"),
        resident=cached_rows_and_slots,
        notes="zero_copy with the rows most read in sampled warm-up batches kept in GPU memory (fill timed)",
    )
)
register(
    PipelineKind(
        "hot_cache_oracle",
        "upper_bound",
        label="zero-copy, ideal hot-row cache (hindsight)",
        needs_gpu=True,
        gather=gather_cached,
        prepare=fill_in_hindsight,
        epoch_metrics=hit_rate_since_last,
        options=("rows", "epochs"),
        resident=cached_rows_and_slots,
        notes="zero_copy with the rows the measured epochs read most kept in GPU memory: the ideal static cache",
    )
)
