"""The ways of feeding sampled minibatches to a GPU, compared by the GNN topics (gnn_training,
gnn_multi_gpu).

Every pipeline turns a batch of seed nodes into (features of the subgraph's nodes, its edges,
the seeds' labels) on the training device:

CPU sampling runs in the training process, or in ``sampler_workers`` worker processes (a
PyTorch DataLoader) that hand over finished subgraphs, as DGL's and PyG's loaders do.

``cpu_gather``        CPU sampling; CPU ``index_select`` of the rows into a pinned staging
                      buffer, then an asynchronous copy (the baseline). Without a GPU it trains
                      on the CPU, the only pipeline there.
``zero_copy``         CPU sampling; the GPU gathers the rows from the feature table pinned in
                      place (PyTorch-Direct's UnifiedTensor).
``zero_copy_overlap`` as ``zero_copy``, but a background thread prepares the next batches (on a
                      side stream, gather with capped threads) while batch i trains.
``uva_sampling``      the GPU samples from the CSR pinned in host memory and gathers zero-copy
                      (DGL's UVA mode).
``all_in_gpu``        CSR and features in GPU memory: the upper bound.

All draw the same batches (the sampler's random numbers depend only on seeds), so their loss
curves match.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from systems.pytorch_direct.ops import launch_gather
from systems.sampling.sampler import NeighborSampler
from workloads.graphs.shared import shared_anonymous_copy

PIPELINES = ("cpu_gather", "zero_copy", "zero_copy_overlap", "uva_sampling", "all_in_gpu")
GPU_PIPELINES = PIPELINES[1:]
# The results' ``role`` of each pipeline, in one table so both GNN topics label a pipeline alike.
ROLE = {
    "cpu_gather": "baseline",
    "zero_copy": "optimized",
    "zero_copy_overlap": "optimized",
    "uva_sampling": "optimized",
    "all_in_gpu": "upper_bound",
}
WORKER_TIMEOUT_S = 600  # a sampling worker that delivers nothing for this long is stuck: fail, never hang
OVERLAP_GATHER_THREADS = 10_240  # the zero-copy gather's thread cap while training runs beside it
PREFETCH_BATCHES = 2  # batches zero_copy_overlap prepares ahead of the one training


SAMPLING_PLACE = {"uva_sampling": "uva", "all_in_gpu": "cuda"}  # where each pipeline samples; else "cpu"


def workers_of(pipeline: str, sampler_workers: int) -> int:
    """The sampling workers ``pipeline`` uses: GPU sampling stays in the training process."""
    return sampler_workers if SAMPLING_PLACE.get(pipeline, "cpu") == "cpu" else 0


def training_threads(sampler_workers: int, processes: int = 1) -> int:
    """torch's threads in a training process: its share of the cores (``processes`` training
    processes on this machine) less its sampling workers.

    More would oversubscribe the cores: a parallel op (a gather, a range check, a copy into
    pinned memory) then waits at its barrier for threads descheduled by busy workers; measured
    on the H200 box with 8 workers and 16 threads, a 1.3 MB range check took 14 ms, not 0.14."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // processes - sampler_workers)


@dataclass
class Minibatch:
    x: torch.Tensor
    edge_index: torch.Tensor
    y: torch.Tensor
    batch_size: int
    feature_bytes: int  # bytes of feature rows this batch gathered


class Graph:
    """A graph's tensors, placed once for all the pipelines of a run."""

    def __init__(self, arrays: dict, device: str, features: torch.Tensor | None = None):
        self.indptr = torch.from_numpy(arrays["indptr"])
        self.indices = torch.from_numpy(arrays["indices"])
        # The table is pinned in place for zero-copy: shared anonymous memory, not the
        # copy-on-write file mapping, nor private memory (a fork copies pinned private pages into
        # each sampling worker); or a table the caller shares between processes.
        self.features = shared_anonymous_copy(arrays["features"]) if features is None else features
        self.labels = torch.from_numpy(arrays["labels"])
        self.train_idx = torch.from_numpy(arrays["train_idx"])
        self.val_idx = torch.from_numpy(arrays["val_idx"])
        self.device = device
        self._unified = self._gpu = None

    def unified_features(self):
        if self._unified is None:
            from systems.pytorch_direct import UnifiedTensor

            # The suite's kernel, as in the committed gnn_training results (UnifiedTensor's default
            # path is chosen per table by feature_gather's measurements; see dispatch.py).
            self._unified = UnifiedTensor(self.features, path="kernel")
        return self._unified

    def pinned_csr(self):
        if not self.indptr.is_pinned():
            self.indptr, self.indices = self.indptr.pin_memory(), self.indices.pin_memory()
        return self.indptr, self.indices

    def gpu_features(self) -> torch.Tensor:
        """The feature table in GPU memory (the all-in-GPU sampler keeps its own copy of the CSR)."""
        if self._gpu is None:
            self._gpu = self.features.cuda()
        return self._gpu

    def close(self) -> None:
        if self._unified is not None:
            self._unified.close()


def epoch_seeds(
    train_idx: torch.Tensor, batch_size: int, seed: int, epoch: int, shard: tuple[int, int] = (0, 1)
) -> list[torch.Tensor]:
    """The epoch's batches of training seeds: shuffled by (seed, epoch), the same for every pipeline.

    With ``shard=(rank, world)`` (data-parallel training), the shuffled seeds form global batches
    of ``world * batch_size`` (an incomplete last one is dropped, so every rank takes every step)
    and this rank's batch i is slice ``rank`` of global batch i.
    """
    rank, world = shard
    order = train_idx[torch.randperm(train_idx.numel(), generator=torch.Generator().manual_seed(seed + epoch))]
    if world == 1:
        return list(order.split(batch_size))
    steps = order.numel() // (world * batch_size)
    return [order[(i * world + rank) * batch_size : (i * world + rank + 1) * batch_size] for i in range(steps)]


def batch_number(epoch: int, index: int) -> int:
    """What picks a batch's random draws: batch ``index`` of ``epoch`` always gets the same ones."""
    return epoch * 100_000 + index


class _TrainingBatches(torch.utils.data.Dataset):
    """Batch ``index`` of ``epoch`` (the key), sampled wherever this runs: in the training process
    or in a DataLoader worker, which computes the epoch's seeds itself (once per epoch)."""

    def __init__(
        self, sampler: NeighborSampler, train_idx: torch.Tensor, batch_size: int, seed: int, shard: tuple[int, int]
    ):
        self.sampler, self.train_idx, self.batch_size, self.seed = sampler, train_idx, batch_size, seed
        self.shard = shard
        self._epoch, self._seeds = None, []

    def __getitem__(self, key: tuple[int, int]):
        epoch, index = key
        if epoch != self._epoch:
            self._epoch = epoch
            self._seeds = epoch_seeds(self.train_idx, self.batch_size, self.seed, epoch, self.shard)
        return self.sampler.sample(self._seeds[index], batch_number(epoch, index))


def _as_is(subgraph):
    return subgraph


class _EpochKeys(torch.utils.data.Sampler):
    """The keys of one epoch's batches; set ``epoch`` and ``batches`` before iterating."""

    def __init__(self):
        self.epoch = self.batches = 0

    def __iter__(self):
        return ((self.epoch, index) for index in range(self.batches))

    def __len__(self) -> int:
        return self.batches


class Pipeline:
    def __init__(
        self,
        name: str,
        graph: Graph,
        fanouts: list[int],
        batch_size: int,
        *,
        seed: int,
        sampler_workers: int = 0,
        clock=None,
        shard: tuple[int, int] = (0, 1),
    ):
        if name not in PIPELINES:
            raise ValueError(f"pipeline must be one of {PIPELINES}, got {name!r}")
        if name in GPU_PIPELINES and graph.device != "cuda":
            raise ValueError(f"pipeline {name!r} needs a GPU")
        self.name, self.graph, self.batch_size, self.seed = name, graph, batch_size, seed
        if not (shard[1] >= 1 and 0 <= shard[0] < shard[1]):
            raise ValueError(f"shard must be (rank, world) with 0 <= rank < world, got {shard}")
        self.shard = shard  # (rank, world): this process's slice of every global batch
        if shard[1] > 1 and graph.train_idx.numel() < shard[1] * batch_size:
            raise ValueError(
                f"{graph.train_idx.numel()} training nodes do not fill one global batch of "
                f"{shard[1]} ranks x {batch_size}; use a smaller batch or fewer ranks"
            )
        self.clock = clock  # a harness.timing.PhaseClock for a breakdown, or None
        self.device = torch.device(graph.device)
        place = SAMPLING_PLACE.get(name, "cpu")
        csr = graph.pinned_csr() if place == "uva" else (graph.indptr, graph.indices)
        self.sampler = NeighborSampler(*csr, fanouts, place=place, seed=seed)
        self.labels = graph.labels.to(self.sampler.device)  # indexed where the sampler puts the ids
        if sampler_workers < 0:
            raise ValueError(f"sampler_workers must be >= 0, got {sampler_workers}")
        if name in ("zero_copy", "zero_copy_overlap", "uva_sampling"):
            # Registers graph.features in place for zero-copy reads. uva_sampling gathers through
            # it; the zero-copy pipelines launch the gather on graph.features themselves.
            self.table = graph.unified_features()
        self.side_stream = torch.cuda.Stream() if name == "zero_copy_overlap" else None
        self.training_batches = _TrainingBatches(self.sampler, graph.train_idx, batch_size, seed, shard)
        # Worker processes, kept for the whole run (persistent), so an epoch does not pay for
        # starting them.
        self.sampler_workers = workers_of(name, sampler_workers)
        self._keys = _EpochKeys()
        self._loader = None
        if self.sampler_workers:
            self._loader = torch.utils.data.DataLoader(
                self.training_batches,
                sampler=self._keys,
                batch_size=None,
                collate_fn=_as_is,
                num_workers=self.sampler_workers,
                prefetch_factor=4,
                persistent_workers=True,
                timeout=WORKER_TIMEOUT_S,
                multiprocessing_context="fork",
            )  # fork: the CSR is not pickled

    def close(self) -> None:
        """Stop the sampling workers."""
        self._loader = None

    def _phase(self, name: str):
        return self.clock.phase(name) if self.clock is not None else nullcontext()

    def seeds(self, epoch: int) -> list[torch.Tensor]:
        """The epoch's batches of training seeds (the same for every pipeline)."""
        return epoch_seeds(self.graph.train_idx, self.batch_size, self.seed, epoch, self.shard)

    def _subgraphs(self, epoch: int, seeds: list[torch.Tensor] | None) -> Iterator:
        """The batches' subgraphs, in order: the epoch's training batches, or batches of the given seeds."""
        if seeds is not None:
            return (self.sampler.sample(s, batch_number(epoch, i)) for i, s in enumerate(seeds))
        if self._loader is None:
            batches = len(self.seeds(epoch))
            return (self.training_batches[epoch, i] for i in range(batches))
        self._keys.epoch, self._keys.batches = epoch, len(self.seeds(epoch))
        return iter(self._loader)

    def _next(self, subgraphs: Iterator) -> Minibatch:
        with self._phase("sample"):  # with workers: the wait for the next finished subgraph
            sub = next(subgraphs)
        with self._phase("gather"):
            row_bytes = self.graph.features.shape[1] * self.graph.features.element_size()
            features = self.graph.features
            if self.name == "cpu_gather":
                staging = torch.empty(
                    (sub.n_id.numel(), features.shape[1]), dtype=features.dtype, pin_memory=self.device.type == "cuda"
                )
                x = torch.index_select(features, 0, sub.n_id, out=staging).to(self.device, non_blocking=True)
            elif self.name == "all_in_gpu":
                x = self.graph.gpu_features().index_select(0, sub.n_id)
            elif self.name == "uva_sampling":
                x = self.table[sub.n_id]  # ids already on the GPU; the op checks their range
            else:
                # Ids from the CPU sampler: range-checked here on the CPU, so the launch need not
                # wait for the kernel's own check (that wait would stall the overlap).
                if sub.n_id.numel() and not 0 <= int(sub.n_id.min()) <= int(sub.n_id.max()) < features.shape[0]:
                    raise IndexError("the sampler returned a node id outside the feature table")
                n_id = sub.n_id.pin_memory().to(self.device, non_blocking=True)
                x = torch.empty((n_id.numel(), features.shape[1]), dtype=features.dtype, device=self.device)
                cap = OVERLAP_GATHER_THREADS if self.side_stream is not None else 0
                launch_gather(features, n_id, x, kernel="vectorized", max_threads=cap, check=False)
            edge_index = self._to_device(sub.edge_index)
            y = self._to_device(self.labels[sub.n_id[: sub.batch_size]])
        return Minibatch(x, edge_index, y, sub.batch_size, sub.n_id.numel() * row_bytes)

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """A copy on the training device that does not block: CPU tensors go through pinned memory
        (a copy from pageable memory would wait for the stream, stalling the overlap)."""
        if t.device == self.device:
            return t
        if t.device.type == "cpu":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device, non_blocking=True)

    def batches(self, epoch: int, seeds: torch.Tensor | None = None) -> Iterator[Minibatch]:
        """The epoch's minibatches (training seeds shuffled by epoch, or the given seeds in order)."""
        seeds = None if seeds is None else list(seeds.split(self.batch_size))
        subgraphs = self._subgraphs(epoch, seeds)
        count = len(self.seeds(epoch)) if seeds is None else len(seeds)
        if self.side_stream is None:
            for _ in range(count):
                yield self._next(subgraphs)
            return
        if self.clock is not None:
            # A breakdown is of the work, one phase after another: prepare on the side stream in turn.
            for _ in range(count):
                with torch.cuda.stream(self.side_stream):
                    batch = self._next(subgraphs)
                torch.cuda.current_stream().wait_stream(self.side_stream)
                yield self._used_on_current_stream(batch)
            return
        yield from self._prefetched(subgraphs, count)

    def _prefetched(self, subgraphs: Iterator, count: int) -> Iterator[Minibatch]:
        """Batches prepared by a background thread on the side stream, up to PREFETCH_BATCHES
        ahead: their CPU work (waiting for the sampler, checking ids, launching the gather) runs
        while this thread launches the training of the batch before, and their gather kernels
        (with capped threads) run beside the training kernels."""
        ready: queue.Queue = queue.Queue(maxsize=PREFETCH_BATCHES)
        stop = threading.Event()
        device = torch.cuda.current_device()

        def hand_over(item) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            torch.cuda.set_device(device)
            try:
                with torch.cuda.stream(self.side_stream):
                    for _ in range(count):
                        batch = self._next(subgraphs)
                        prepared = torch.cuda.Event()
                        prepared.record(self.side_stream)
                        if not hand_over((batch, prepared)):
                            return
            except BaseException as error:  # handed to the consumer, raised there
                hand_over((error, None))

        producer = threading.Thread(target=produce, name=f"{self.name}-prefetch", daemon=True)
        producer.start()
        try:
            for _ in range(count):
                try:
                    batch, prepared = ready.get(timeout=WORKER_TIMEOUT_S)
                except queue.Empty:
                    raise RuntimeError(
                        f"no batch prepared in {WORKER_TIMEOUT_S} s: the prefetch thread is stuck"
                    ) from None
                if isinstance(batch, BaseException):
                    raise batch
                torch.cuda.current_stream().wait_event(prepared)
                yield self._used_on_current_stream(batch)
        finally:
            stop.set()
            producer.join(timeout=WORKER_TIMEOUT_S)  # it checks `stop` between batches
            if producer.is_alive():  # it would go on reading the sampler that the next epoch resets
                raise RuntimeError(f"the prefetch thread did not stop within {WORKER_TIMEOUT_S} s")

    @staticmethod
    def _used_on_current_stream(batch: Minibatch) -> Minibatch:
        """Tell the caching allocator that the side stream's tensors are now used on this one."""
        for t in (batch.x, batch.edge_index, batch.y):
            t.record_stream(torch.cuda.current_stream())
        return batch
