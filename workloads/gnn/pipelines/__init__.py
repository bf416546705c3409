"""The ways of feeding sampled minibatches to a GPU, compared by the GNN topics (gnn_training,
gnn_multi_gpu): one registry, :data:`PIPELINE_KINDS`, one entry per pipeline.

Every pipeline turns a batch of seed nodes into (features of the subgraph's nodes, its edges,
the seeds' labels) on the training device. A pipeline is a :class:`PipelineKind` registered from
a module of this package (one file per way of feeding; every module whose name does not start
with ``_`` is imported when the registry is first read, or a module of your own named in
``SUITE_PLUGINS``). The suite's own, in the order figures list them:

``cpu_gather``         CPU sampling (in ``sampler_workers`` processes or in the training
                       process); the training process gathers the rows with ``index_select``
                       into a pinned staging buffer, then copies them asynchronously (the
                       paper's baseline). Without a GPU it trains on the CPU.
``cpu_gather_workers`` what PyG's ``NeighborLoader(num_workers=..., pin_memory=True)`` does:
                       worker processes sample and gather rows and labels, a pin-memory thread
                       pins the batches, and the copy of the next batch overlaps training (the
                       strong CPU baseline). Runs without a GPU too (the copy is then a no-op).
``pyg_neighbor_loader``
                       PyG's own ``NeighborLoader`` (its sampler, its workers) over the suite's
                       graph; registered only where pyg-lib or torch-sparse imports, otherwise
                       listed in ``UNAVAILABLE_PIPELINES`` with why.
``zero_copy``          CPU sampling; the GPU gathers the rows from the feature table pinned in
                       place (PyTorch-Direct's UnifiedTensor).
``zero_copy_overlap``  as ``zero_copy``, but a background thread prepares the next batches (on
                       a side stream, gather with capped threads) while batch i trains.
``uva_sampling``       the GPU samples from the CSR pinned in host memory and gathers zero-copy
                       (DGL's UVA mode), the next batches prepared ahead on a side stream.
``all_in_gpu``         CSR and features in GPU memory, sampled on the GPU ahead of training on a
                       side stream: the upper bound.
``hot_cache``          ``zero_copy`` with the most used rows kept in GPU memory, chosen by
                       counting the rows of sampled warm-up batches (the fill is timed).
``hot_cache_oracle``   the same cache filled with the rows the measured epochs use most, known
                       in hindsight: the ideal static cache, an upper bound.

CPU sampling runs in the training process, or in ``sampler_workers`` worker processes (a
PyTorch DataLoader) that hand over finished subgraphs, as DGL's and PyG's loaders do. All draw
the same batches (the sampler's random numbers depend only on seeds), so their loss curves match.
"""

from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from harness.arguments import cpu_or_cuda, whole_number
from harness.errors import NeedsGpuError, UserError
from harness.machine import usable_cores
from harness.registry import Entry, Registry
from systems.sampling.sampler import NeighborSampler, SampledSubgraph, check_csr_types, stream_seed
from workloads.graphs.shared import shared_anonymous_copy

MAX_SEED = MAX_EPOCH = 2**62  # the range taken: (seed, epoch) keys the shuffle (shuffle_seed) and the draws
MAX_BATCH = 2**40  # seed nodes in a batch: beyond any graph, and within what torch can split by
WORKER_TIMEOUT_S = 600  # a sampling worker that delivers nothing for this long is stuck: fail, never hang
OVERLAP_GATHER_THREADS = 10_240  # the zero-copy gather's thread cap while training runs beside it
PREFETCH_BATCHES = 2  # batches zero_copy_overlap prepares ahead of the one training
WORKER_PREFETCH = 4  # batches each loader worker keeps ready (DataLoader's prefetch_factor)
SAMPLING_PLACES = ("cpu", "uva", "cuda")


@dataclass
class Minibatch:
    x: torch.Tensor
    edge_index: torch.Tensor
    y: torch.Tensor
    batch_size: int
    # Bytes of feature rows this batch moved over PCIe: an int, or a 0-d tensor on the GPU when
    # only the GPU knows (a cache's misses), summed without waiting and read once per epoch.
    feature_bytes: int | torch.Tensor


PYTORCH_DIRECT = "PyTorch-Direct"  # the technique of the zero-copy, UVA-sampling and hot-cache pipelines


@dataclass(frozen=True)
class PipelineKind(Entry):
    """One way of feeding minibatches, and the hooks that make it differ from the plain path
    (sample, then ``gather`` each batch in the training process).

    ``gather(pipeline, item)`` returns (rows on the training device, feature bytes moved), where
    ``item`` is what the sampling step hands over: a ``SampledSubgraph``, or a
    :class:`GatheredBatch` when ``worker_gathers``. ``prepare(pipeline)`` runs once when the
    pipeline is made (registering the table, filling a cache); ``batches(pipeline, items,
    count)`` replaces the plain loop over the epoch's items (a prefetch thread, a copy stream).
    ``epoch_metrics(pipeline)`` returns what it counted since the last call (a cache's hit rate).
    ``options`` are the keyword options it takes, each needed (``Pipeline(..., options={...})``).
    """

    gather: Callable[[Pipeline, object], tuple[torch.Tensor, int | torch.Tensor]] | None = None
    sampling: str = "cpu"  # where it samples: "cpu" (in workers or in process), "uva" or "cuda"
    worker_gathers: bool = False  # the sampling workers also gather the rows and labels
    prepare: Callable[[Pipeline], None] | None = None
    batches: Callable[[Pipeline, Iterator, int], Iterator[Minibatch]] | None = None
    # What it measured since the last call (one epoch), beyond the common metrics: {metric: (value, unit)}.
    epoch_metrics: Callable[[Pipeline], dict[str, tuple[float, str]]] | None = None
    options: tuple[str, ...] = ()
    crosses_pcie: bool = True  # its feature rows cross PCIe (all_in_gpu's do not)
    # What it keeps in GPU memory beyond what its sampling place implies, from the graph's sizes
    # (a workloads.gnn.gpu_memory.GraphSizes) and its options: {what: bytes}.
    resident: Callable[[object, dict], dict[str, int]] | None = None
    # A loader whose workers' split within a CPU budget is swept per case (loader_workers in the
    # config): None: not swept; (): the config's threads per worker; else these threads per worker.
    swept_worker_threads: tuple[int, ...] | None = None
    # The published technique it implements ("" for none): figures draw a paper's numbers only
    # beside that paper's pipelines, so a user's own optimized pipeline is never taken for it.
    technique: str = ""
    # It draws each batch's neighbours with a sampler of its own (another random number
    # generator): the suite's seeds, other neighbours, so its losses follow the others' only
    # approximately (a PyG loader). False: the suite's sampler, the same batches as every pipeline.
    own_sampler: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.gather is None:
            raise ValueError(f"pipeline {self.name}: give gather(pipeline, item)")
        if self.sampling not in SAMPLING_PLACES:
            raise ValueError(f"pipeline {self.name}: sampling must be one of {SAMPLING_PLACES}")


PIPELINE_KINDS: Registry[PipelineKind] = Registry("pipeline", __name__)


# Every pipeline the suite has, in the order figures list them, those this machine cannot run too:
# a table rendered here lists the rows measured elsewhere in the same places.
ORDER: list[str] = []


def register(kind: PipelineKind) -> PipelineKind:
    ORDER.append(kind.name)
    return PIPELINE_KINDS.register(kind)


def unavailable(name: str, why: str) -> None:
    """A pipeline of the suite that cannot be registered here (a package it needs is missing)."""
    ORDER.append(name)
    UNAVAILABLE_PIPELINES[name] = why


def in_order(names) -> list[str]:
    """``names`` (pipelines of some results) in the suite's order; any the suite does not know (a
    plugin's) after them, by name."""
    names = set(names)
    return [n for n in ORDER if n in names] + sorted(names - set(ORDER))


def workers_of(pipeline: str, sampler_workers: int, cores: int | None = None) -> int:
    """The sampling workers ``pipeline`` uses: GPU sampling stays in the training process; with a
    budget of ``cores``, at most half of them go to workers (the other half trains)."""
    if PIPELINE_KINDS[pipeline].sampling != "cpu":
        return 0
    return sampler_workers if cores is None else min(sampler_workers, cores // 2)


def _cpu_or_current_cuda(device) -> str:
    """``device`` as the name the pipelines compare with, ``"cpu"`` or ``"cuda"``. The pipelines
    sample, pin and launch on the current CUDA device, so another GPU is refused, not half used."""
    chosen = cpu_or_cuda(device)
    if chosen is None:
        raise UserError(f"device must be 'cpu' or 'cuda' (or 'cuda:N'), got {device!r}")
    if chosen.type == "cpu":
        return "cpu"
    if not torch.cuda.is_available():  # else it fails at the first batch's pinning
        raise NeedsGpuError(f"device={device!r} needs a CUDA GPU, and torch sees none here: use device='cpu'")
    if chosen.index is not None and chosen.index != torch.cuda.current_device():
        raise UserError(
            f"device={device!r} is not the current CUDA device (cuda:{torch.cuda.current_device()}): "
            f"call torch.cuda.set_device({chosen.index}) first, as each training process does"
        )
    return "cuda"


def training_threads(sampler_workers: int, processes: int = 1) -> int:
    """torch's threads in a training process: its share of the cores (``processes`` training
    processes on this machine) less its sampling workers.

    More would oversubscribe the cores: a parallel op (a gather, a range check, a copy into
    pinned memory) then waits at its barrier for threads descheduled by busy workers; measured
    on the H200 box with 8 workers and 16 threads, a 1.3 MB range check took 14 ms, not 0.14."""
    return max(1, usable_cores() // processes - sampler_workers)


class Graph:
    """A graph's tensors, placed once for all the pipelines of a run."""

    ARRAYS = ("indptr", "indices", "features", "labels", "train_idx", "val_idx")

    def __init__(self, arrays: dict, device: str | torch.device, features: torch.Tensor | None = None):
        """``arrays``: numpy arrays or host tensors by name (:data:`ARRAYS`); ``device``: ``"cpu"``
        or the current CUDA GPU (``"cuda"``, ``"cuda:N"``, a ``torch.device``); ``features``: a host
        tensor that stands for ``arrays["features"]`` (one the caller shares between processes)."""
        given = set(arrays) | ({"features"} if features is not None else set())
        missing = [name for name in self.ARRAYS if name not in given]
        if missing:
            raise UserError(f"the graph's arrays lack {', '.join(missing)} (a Graph takes {', '.join(self.ARRAYS)})")
        device = _cpu_or_current_cuda(device)
        host = {name: _host_tensor(arrays[name], name) for name in self.ARRAYS if name in given - {"features"}}
        self.indptr, self.indices = host["indptr"], host["indices"]
        check_csr_types(self.indptr, self.indices)  # here, not when the first pipeline is made
        if features is not None and not isinstance(features, torch.Tensor):
            raise UserError(f"features= must be a torch tensor in host memory, got {type(features).__name__}")
        given_shape = tuple(getattr(arrays.get("features"), "shape", ()))
        if features is not None and "features" in arrays and tuple(features.shape) != given_shape:
            raise UserError(
                f"features= (shape {tuple(features.shape)}) stands for arrays['features'], whose shape is "
                f"{given_shape}: give the same table, or one of them"
            )
        # The table is pinned in place for zero-copy: shared anonymous memory, not the
        # copy-on-write file mapping, nor private memory (a fork copies pinned private pages into
        # each sampling worker); or a table the caller shares between processes.
        self.features = features if features is not None else _host_tensor(arrays["features"], "features")
        _check_features(self.features)  # before a copy of a table of the wrong type
        if features is None:
            self.features = shared_anonymous_copy(self.features.numpy(), pinned=device == "cuda")
        self.labels, self.train_idx, self.val_idx = host["labels"], host["train_idx"], host["val_idx"]
        self.device = device
        self._unified = None
        self._check_sizes()

    def _check_sizes(self) -> None:
        """Refuse tables that do not cover the graph's nodes, in one line, before any batch reads
        past them (a short feature table would otherwise surface as an index error mid-epoch)."""
        nodes = self.indptr.numel() - 1
        # The models train in float32 and the loss takes int64 classes: another type would fail
        # at the first step, deep inside the model or the loss.
        if self.labels.dtype != torch.int64 or self.labels.dim() != 1:
            got = f"{self.labels.dtype} {tuple(self.labels.shape)}"
            raise UserError(f"labels must be a 1-D int64 tensor, one class per node, got {got}")
        for name, table in (("features", self.features), ("labels", self.labels)):
            if table.shape[0] != nodes:
                raise UserError(f"{name} has {table.shape[0]} rows for a graph of {nodes} nodes: give one per node")
        self.train_idx = _as_node_ids(self.train_idx, "train_idx", nodes)
        self.val_idx = _as_node_ids(self.val_idx, "val_idx", nodes)
        if not self.train_idx.numel():
            raise UserError("train_idx is empty: there is nothing to train on")
        # Each split's node of the largest label, (node, label), or None for an empty split: checked
        # against a model's classes when training or validation first sees its output width.
        self.largest_label: dict[str, tuple[int, int] | None] = {}
        for name, ids in (("train_idx", self.train_idx), ("val_idx", self.val_idx)):
            values, counts = ids.unique(return_counts=True)
            if bool((counts > 1).any()):  # a batch's seeds must be distinct: refused here, not mid-epoch
                raise UserError(f"{name} names node {int(values[counts > 1][0])} more than once")
            labels = self.labels[ids]
            if ids.numel() and int(labels.min()) < 0:  # OGB marks nodes without a label -1
                node = int(ids[labels < 0][0])
                raise UserError(f"{name} names node {node}, whose label is {int(self.labels[node])}: no class")
            node = int(ids[labels.argmax()]) if ids.numel() else None
            self.largest_label[name] = (node, int(self.labels[node])) if node is not None else None
        # A validation node trained on would inflate the accuracy without a word.
        shared = self.val_idx[torch.isin(self.val_idx, self.train_idx)]
        if shared.numel():
            raise UserError(
                f"val_idx and train_idx share {_count(shared.numel(), 'node')} (node {int(shared[0])} first): "
                "a node is in one split"
            )

    def unified_features(self):
        if self._unified is None:
            from systems.pytorch_direct import UnifiedTensor

            # The path is the one measured fastest for this table's row and table size on this
            # GPU (feature_gather's measurements; systems/pytorch_direct/dispatch.py).
            self._unified = UnifiedTensor(self.features)
        return self._unified

    def pinned_csr(self):
        if not self.indptr.is_pinned():
            self.indptr, self.indices = self.indptr.pin_memory(), self.indices.pin_memory()
        return self.indptr, self.indices

    def close(self) -> None:
        if self._unified is not None:
            self._unified.close()


def _node_ids(t) -> bool:
    """Whether ``t`` is a 1-D tensor of integer ids (not a boolean mask, not floats)."""
    return (
        isinstance(t, torch.Tensor)
        and t.dim() == 1
        and not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)
    )


def _as_node_ids(ids, name: str, nodes: int) -> torch.Tensor:
    """``ids`` as int64 node ids of a graph of ``nodes`` nodes, refused in one line otherwise.
    Converted before anything indexes with them: torch reads a uint8 tensor as a boolean mask,
    and has no min() of a uint64 one (numpy's is read instead)."""
    if not _node_ids(ids):
        raise UserError(
            f"{name} must be a 1-D array of integer node ids (the nonzero() of a mask), "
            f"got {ids.dtype} {tuple(ids.shape)}"
        )
    if ids.numel():
        low, high = int(ids.numpy().min()), int(ids.numpy().max())
        if not 0 <= low <= high < nodes:
            raise UserError(f"{name} holds node ids {low}..{high}, outside the graph's {nodes} nodes")
    return ids.to(torch.int64)


FINITE_CHECK_BYTES = 256 << 20  # rows checked for NaN at a time: a mask of the whole table would double it


def _check_features(table: torch.Tensor) -> None:
    """The models train in float32, on at least one feature (PyG makes a layer of 0 inputs lazy,
    its weights left uninitialised), on finite values (one NaN turns every loss after it NaN)."""
    if table.dtype != torch.float32 or table.dim() != 2 or not table.shape[1]:
        got = f"{table.dtype} {tuple(table.shape)}"
        raise UserError(f"features must be a 2-D float32 table [nodes, features >= 1], got {got}")
    if table.requires_grad:  # the table is data: a graph of gradients through it would grow with every batch
        raise UserError("features must be a plain tensor, got one that requires grad: pass features.detach()")
    rows = max(1, FINITE_CHECK_BYTES // (table.shape[1] * table.element_size()))
    bad, first = 0, None
    for start in range(0, table.shape[0], rows):
        non_finite = ~torch.isfinite(table[start : start + rows]).all(dim=1)
        if first is None and bool(non_finite.any()):
            first = start + int(non_finite.nonzero()[0])
        bad += int(non_finite.sum())
    if bad:
        raise UserError(f"features hold NaN or infinite values in {_count(bad, 'row')} (row {first} first): clean them")


def _count(number: int, what: str) -> str:
    return f"{number} {what}{'s' if number != 1 else ''}"


def _host_tensor(array, name: str) -> torch.Tensor:
    """One of a graph's arrays as a host tensor sharing its memory: a numpy array or a tensor."""
    if isinstance(array, np.ndarray):
        if array.dtype.kind not in "biuf":
            raise UserError(f"{name} must be a numeric array, got dtype {array.dtype}")
        if not array.dtype.isnative:  # torch takes the machine's byte order only
            raise UserError(
                f"{name} has dtype {array.dtype.str}, the other byte order than this machine's: convert it once "
                f"(array.astype(array.dtype.newbyteorder('=')))"
            )
        return torch.from_numpy(np.ascontiguousarray(array))
    if isinstance(array, torch.Tensor):
        if array.device.type != "cpu":
            raise UserError(f"{name} is on {array.device}: a Graph takes host arrays, and places them itself")
        return array
    raise UserError(f"{name} must be a numpy array or a host tensor, got {type(array).__name__}")


def shuffle_seed(seed: int, epoch: int) -> int:
    """The seed of one epoch's shuffle, its own stream for each (seed, epoch) (``seed + epoch``
    would give run 1's epoch 0 the order of run 0's epoch 1)."""
    return stream_seed("shuffle", seed, epoch)


def epoch_seeds(
    train_idx: torch.Tensor, batch_size: int, seed: int, epoch: int, shard: tuple[int, int] = (0, 1)
) -> list[torch.Tensor]:
    """The epoch's batches of training seeds: shuffled by (seed, epoch), the same for every pipeline.

    With ``shard=(rank, world)`` (data-parallel training), the shuffled seeds form global batches
    of ``world * batch_size`` (an incomplete last one is dropped, so every rank takes every step)
    and this rank's batch i is slice ``rank`` of global batch i.
    """
    rank, world = shard
    shuffle = torch.Generator().manual_seed(shuffle_seed(seed, epoch))
    order = train_idx[torch.randperm(train_idx.numel(), generator=shuffle)]
    if world == 1:
        return list(order.split(batch_size)) if order.numel() else []  # no seeds: no batch (not one empty one)
    steps = order.numel() // (world * batch_size)
    return [order[(i * world + rank) * batch_size : (i * world + rank + 1) * batch_size] for i in range(steps)]


BATCHES_PER_EPOCH = 2**32  # batch numbers an epoch owns: no epoch's batches ever reach the next one's


def batch_number(epoch: int, index: int) -> int:
    """What picks a batch's random draws: batch ``index`` of ``epoch`` always gets the same ones,
    and no other training batch of any epoch gets them (batches of given seeds, as evaluation
    passes them, are numbered as the training batches of the epoch they are asked for). Ranks of
    a data-parallel run share the numbers and draw from streams of their own (the sampler's seed)."""
    if not 0 <= index < BATCHES_PER_EPOCH or epoch < 0:
        raise ValueError(
            f"batch {index} of epoch {epoch}: an epoch has batches 0..{BATCHES_PER_EPOCH - 1}, from epoch 0"
        )
    return epoch * BATCHES_PER_EPOCH + index


@dataclass
class GatheredBatch:
    """A sampled subgraph with its rows and the seeds' labels gathered in host memory, as a loader
    worker hands it over (through shared memory)."""

    subgraph: SampledSubgraph
    x: torch.Tensor
    y: torch.Tensor

    def pin_memory(self) -> GatheredBatch:
        """Pinned copies, for an asynchronous copy (the DataLoader's pin-memory thread calls this)."""
        sub = self.subgraph
        pinned = SampledSubgraph(
            sub.n_id, sub.edge_index.pin_memory(), sub.num_sampled_nodes, sub.num_sampled_edges, sub.batch_size
        )
        return GatheredBatch(pinned, self.x.pin_memory(), self.y.pin_memory())


def _shared_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor in shared memory: handed to another process without a copy (a
    tensor in private memory is copied into shared memory when it is sent), as DataLoader's
    own collation allocates its batches."""
    numel = 1
    for size in shape:
        numel *= size
    storage = torch.empty(0, dtype=dtype).untyped_storage()._new_shared(numel * torch.empty(0, dtype=dtype).itemsize)
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


class _TrainingBatches(torch.utils.data.Dataset):
    """Batch ``index`` of ``epoch`` (the key), sampled wherever this runs: in the training process
    or in a DataLoader worker, which computes the epoch's seeds itself (once per epoch). With
    ``rows_from`` (the feature table and the labels) it also gathers the batch's rows and labels,
    in a loader worker on ``gather_threads`` threads."""

    def __init__(
        self,
        sampler: NeighborSampler,
        train_idx: torch.Tensor,
        batch_size: int,
        seed: int,
        shard: tuple[int, int],
        rows_from: tuple[torch.Tensor, torch.Tensor] | None = None,
        gather_threads: int = 1,
    ):
        self.sampler, self.train_idx, self.batch_size, self.seed = sampler, train_idx, batch_size, seed
        self.shard, self.rows_from, self.gather_threads = shard, rows_from, gather_threads
        self._pool = None
        self._epoch, self._seeds = None, []

    def __getitem__(self, key: tuple[int, int]):
        epoch, index = key
        if epoch != self._epoch:
            self._epoch = epoch
            self._seeds = epoch_seeds(self.train_idx, self.batch_size, self.seed, epoch, self.shard)
        return self.finish(self.sampler.sample(self._seeds[index], batch_number(epoch, index)))

    def finish(self, sub: SampledSubgraph):
        """What the sampling step hands over: the subgraph, or the subgraph with its rows."""
        if self.rows_from is None:
            return sub
        features, labels = self.rows_from
        x = _shared_empty((sub.n_id.numel(), features.shape[1]), features.dtype)
        if self.gather_threads > 1 and torch.utils.data.get_worker_info() is not None:
            self._gather_in_threads(features, sub.n_id, x)
        else:  # in the training process torch's own threads gather
            torch.index_select(features, 0, sub.n_id, out=x)
        return GatheredBatch(sub, x, labels[sub.n_id[: sub.batch_size]])

    def _gather_in_threads(self, features: torch.Tensor, ids: torch.Tensor, x: torch.Tensor) -> None:
        """Gather on ``gather_threads`` threads of this worker, each an equal block of rows.

        Not torch's intra-op threads: OpenMP's thread pool, started in the training process
        before the fork, deadlocks a forked worker that asks it for more than one thread."""
        if self._pool is None:  # made in the worker itself: threads do not survive a fork
            self._pool = ThreadPoolExecutor(self.gather_threads, thread_name_prefix="gather")
        pairs = zip(ids.tensor_split(self.gather_threads), x.tensor_split(self.gather_threads))
        done = self._pool.map(lambda pair: torch.index_select(features, 0, pair[0], out=pair[1]), pairs)
        for _ in done:  # raises a block's error here
            pass


def _as_is(item):
    return item


class _EpochKeys(torch.utils.data.Sampler):
    """The keys of one epoch's batches; set ``epoch`` and ``batches`` before iterating."""

    def __init__(self):
        self.epoch = self.batches = 0

    def __iter__(self):
        return ((self.epoch, index) for index in range(self.batches))

    def __len__(self) -> int:
        return self.batches


def _worker_error(error: BaseException) -> str:
    """What went wrong in a worker, in one line: ``ExceptionType: first line of its message``. A
    worker's error arrives with its whole traceback in the message, the worker's exception last
    (its type, then its message, whose first line is the one that says what failed)."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.rstrip().endswith("Traceback (most recent call last):")]
    if not starts:  # no traceback: an error of the loader itself (a worker that died, a timeout)
        said = f"{type(error).__name__}: {lines[0].strip()}" if lines else type(error).__name__
        if isinstance(error, EOFError | ConnectionError):  # the pipe to a worker closed mid-batch
            return f"a worker process died (killed, or out of memory?): {said}"
        return said
    # After the last traceback's header, its frames are indented; the first line that is not
    # names the worker's exception, as "module.Type: message".
    raised = next((line for line in lines[starts[-1] + 1 :] if not line[0].isspace()), type(error).__name__)
    kind, colon, message = raised.partition(": ")
    return f"{kind.rsplit('.', 1)[-1]}{colon}{message}" if " " not in kind else raised


class Pipeline:
    """One pipeline kind (``name``) feeding one graph: makes the epoch's minibatches."""

    def __init__(
        self,
        name: str,
        graph: Graph,
        fanouts: list[int],
        batch_size: int,
        *,
        seed: int,
        sampler_workers: int = 0,
        worker_threads: int = 1,
        clock=None,
        shard: tuple[int, int] = (0, 1),
        options: dict | None = None,
    ):
        if not isinstance(name, str):  # a list is no key of the registries (a TypeError there)
            raise UserError(f"pipeline must be one of {PIPELINE_KINDS.names()}, got {name!r}")
        if not isinstance(graph, Graph):
            raise UserError(f"graph must be a Graph (Graph(arrays, device) of its arrays), got {type(graph).__name__}")
        if name in UNAVAILABLE_PIPELINES:  # a pipeline of the suite that this machine cannot run: say why
            raise UserError(f"pipeline {name!r} is not available here: {UNAVAILABLE_PIPELINES[name]}")
        if name not in PIPELINE_KINDS:
            raise UserError(f"pipeline must be one of {PIPELINE_KINDS.names()}, got {name!r}")
        self.kind = kind = PIPELINE_KINDS[name]
        if options is not None and not isinstance(options, dict):
            raise UserError(f"options must be a dict of the pipeline's options by name, got {type(options).__name__}")
        if kind.needs_gpu and graph.device != "cuda":  # before its options: none makes it run here
            raise UserError(f"pipeline {name!r} needs a GPU")
        self.options = dict(options or {})
        unknown = set(self.options) - set(kind.options)
        if unknown:
            raise UserError(f"pipeline {name!r} takes the options {list(kind.options)}, not {sorted(unknown)}")
        missing = [option for option in kind.options if option not in self.options]  # each is read
        if missing:
            raise UserError(f"pipeline {name!r} needs the options {', '.join(missing)} (options={{...}})")
        if whole_number(batch_size, at_least=1, at_most=MAX_BATCH) is None:
            raise UserError(f"batch_size must be a whole number of seed nodes in 1..2**40, got {batch_size!r}")
        if whole_number(seed, at_most=MAX_SEED) is None:  # with the epoch, it keys each epoch's shuffle
            raise UserError(f"seed must be a whole number in 0..2**62, got {seed!r}")
        self.name, self.graph, self.batch_size, self.seed = name, graph, whole_number(batch_size), whole_number(seed)
        whole = lambda v: whole_number(v) is not None  # noqa: E731
        if not (isinstance(shard, tuple | list) and len(shard) == 2 and all(map(whole, shard))):
            raise UserError(f"shard must be (rank, world), two whole numbers, got {shard!r}")
        shard = tuple(map(whole_number, shard))
        if not (shard[1] >= 1 and 0 <= shard[0] < shard[1]):
            raise UserError(f"shard must be (rank, world) with 0 <= rank < world, got {shard}")
        self.shard = shard  # (rank, world): this process's slice of every global batch
        if shard[1] > 1 and graph.train_idx.numel() < shard[1] * batch_size:
            raise UserError(
                f"{graph.train_idx.numel()} training nodes do not fill one global batch of "
                f"{shard[1]} ranks x {batch_size}; use a smaller batch or fewer ranks"
            )
        self.clock = clock  # a harness.timing.PhaseClock for a breakdown, or None
        self.device = torch.device(graph.device)
        csr = graph.pinned_csr() if kind.sampling == "uva" else (graph.indptr, graph.indices)
        # Each rank draws from its own stream: ranks take the same batch numbers in a step, and a
        # node sampled on two ranks would otherwise get the same neighbours on both.
        draws = self.seed if shard[1] == 1 else stream_seed("rank", self.seed, *shard)
        self.sampler = NeighborSampler(*csr, fanouts, place=kind.sampling, seed=draws)
        self.labels = graph.labels.to(self.sampler.device)  # indexed where the sampler puts the ids
        if not whole(sampler_workers):
            raise UserError(f"sampler_workers must be a whole number >= 0, got {sampler_workers!r}")
        if whole_number(worker_threads, at_least=1) is None:
            raise UserError(f"worker_threads must be a whole number >= 1, got {worker_threads!r}")
        sampler_workers, worker_threads = whole_number(sampler_workers), whole_number(worker_threads)
        self.table = None  # the feature table registered for zero-copy reads, where a kind uses one
        self.side_stream = None  # where a prefetch thread prepares batches, where a kind uses one
        self.cache = None  # a hot-row cache in GPU memory, where a kind keeps one
        rows_from = (graph.features, self.labels) if kind.worker_gathers else None
        self.training_batches = _TrainingBatches(
            self.sampler, graph.train_idx, self.batch_size, self.seed, shard, rows_from, worker_threads
        )
        self.sampler_workers = workers_of(name, sampler_workers)
        self.worker_threads = worker_threads
        self._keys = _EpochKeys()
        self._epoch_from_workers: int | None = None  # the epoch whose batches the workers hand out now
        self._loader = self._make_loader() if self.sampler_workers else None
        # What the kind's one-time preparation measured (a cache's fill): {metric: (value, unit)}.
        self.setup_metrics: dict[str, tuple[float, str]] = {}
        if kind.prepare is not None:
            kind.prepare(self)
        # The graph's tensors as the pipeline read them: its workers (forked copies), device copies
        # and caches hold these values, so a change in place afterwards is refused, not half seen.
        self._graph_read = [(name, t, t._version) for name in Graph.ARRAYS if (t := getattr(graph, name)) is not None]

    def _make_loader(self) -> torch.utils.data.DataLoader:
        # Worker processes, kept for the whole run (persistent), so an epoch does not pay for
        # starting them; fork, so the CSR and the feature table are shared, not pickled.
        return torch.utils.data.DataLoader(
            self.training_batches,
            sampler=self._keys,
            batch_size=None,
            collate_fn=_as_is,
            num_workers=self.sampler_workers,
            prefetch_factor=WORKER_PREFETCH,
            persistent_workers=True,
            pin_memory=self.kind.worker_gathers and self.device.type == "cuda",
            timeout=WORKER_TIMEOUT_S,
            multiprocessing_context="fork",
            # Its own generator for the workers' base seed: drawn from the global one, it would
            # shift the model's dropout masks, and the loss curves would differ from cpu_gather's.
            generator=torch.Generator(),
        )

    def worker_pids(self) -> list[int]:
        """The process ids of the running loader workers (none before the first epoch)."""
        iterator = getattr(self._loader, "_iterator", None)
        return [w.pid for w in getattr(iterator, "_workers", [])] if iterator is not None else []

    def _stop_workers(self) -> None:
        """Stop the loader workers now (not when the loader is garbage-collected): after an error
        or an epoch left unfinished. The next epoch starts new ones."""
        iterator = getattr(self._loader, "_iterator", None)
        try:
            if iterator is not None:
                iterator._shutdown_workers()
        except RuntimeError as error:
            # A worker that died while being stopped (torch's SIGCHLD handler raises in the join;
            # its shutdown still ends every worker): what was asked is done, so say it and go on.
            warnings.warn(f"{self.name}: {_worker_error(error)} (while its workers were being stopped)", stacklevel=2)
        finally:
            # A new loader either way: the old one's workers cannot be restarted.
            self._loader = self._make_loader() if self._loader is not None else None

    def close(self) -> None:
        """Stop the sampling workers and let go of what the pipeline keeps in GPU memory."""
        self._stop_workers()
        self._loader = None
        self.table = self.side_stream = self.cache = self.sampler = self.training_batches = None

    def refuse_if_closed(self) -> None:
        if self.sampler is None:
            raise UserError(f"pipeline {self.name} is closed: make a new one to train or evaluate")

    def refuse_if_graph_changed(self) -> None:
        """Refuse, in one line, an epoch over a graph whose tensors were changed in place since the
        pipeline was made: worker processes would read their copies of the old values, the
        in-process paths the new ones (not seen: writes through ``.numpy()`` or ``.data``)."""
        changed = [name for name, t, version in self._graph_read if t._version != version]
        if changed:
            raise UserError(
                f"pipeline {self.name}: the graph's {', '.join(changed)} changed in place since the pipeline was "
                "made (its workers, device copies and caches hold the old values): make a new pipeline"
            )

    def epoch_metrics(self) -> dict[str, tuple[float, str]]:
        """The kind's own measurements of the epoch just trained ({metric: (value, unit)}); call
        once after each epoch."""
        return self.kind.epoch_metrics(self) if self.kind.epoch_metrics is not None else {}

    def _phase(self, name: str):
        return self.clock.phase(name) if self.clock is not None else nullcontext()

    def seeds(self, epoch: int) -> list[torch.Tensor]:
        """The epoch's batches of training seeds (the same for every pipeline)."""
        return epoch_seeds(self.graph.train_idx, self.batch_size, self.seed, epoch, self.shard)

    def _items(self, epoch: int, seeds: list[torch.Tensor] | None) -> Iterator:
        """What the sampling step hands over for each batch, in order: for the epoch's training
        batches, or for batches of the given seeds (sampled here)."""
        if seeds is not None:
            finish = self.training_batches.finish
            return (finish(self.sampler.sample(s, batch_number(epoch, i))) for i, s in enumerate(seeds))
        if self._loader is None:
            return (self.training_batches[epoch, i] for i in range(len(self.seeds(epoch))))
        return self._from_workers(epoch)

    def _from_workers(self, epoch: int) -> Iterator:
        # The workers serve one epoch's keys at a time: a second epoch started while the first is
        # being handed out would re-key the loader under the first's iterator (it would go on with
        # the second's batches, unnoticed).
        if self._epoch_from_workers is not None:
            raise ValueError(
                f"{self.name}: epoch {self._epoch_from_workers}'s batches are still being handed out by the "
                f"sampling workers: finish or close() its iterator before epoch {epoch}'s"
            )
        self._keys.epoch, self._keys.batches = epoch, len(self.seeds(epoch))
        self._epoch_from_workers = epoch
        delivered = 0
        try:
            iterator = iter(self._loader)
            while delivered < self._keys.batches:
                try:
                    item = next(iterator)
                except Exception as error:  # the worker's traceback is long: say what failed in a line
                    raise RuntimeError(f"{self.name}: a loader worker failed: {_worker_error(error)}") from None
                delivered += 1
                yield item
        finally:
            # Stopped before the epoch's last batch was handed over (an error here or in training,
            # a consumer that stopped early): the workers would go on preparing it.
            self._epoch_from_workers = None
            if delivered < self._keys.batches:
                self._stop_workers()

    def _next(self, items: Iterator) -> Minibatch:
        with self._phase("sample"):  # with workers: the wait for the next finished batch
            item = next(items)
        with self._phase("gather"):
            x, moved = self.gathered(item)
            if isinstance(item, GatheredBatch):
                sub, y = item.subgraph, item.y
            else:
                sub, y = item, self.labels[item.n_id[: item.batch_size]]
            edge_index = self._to_device(sub.edge_index)
            y = self._to_device(y)
        return Minibatch(x, edge_index, y, sub.batch_size, moved)

    def gathered(self, item) -> tuple[torch.Tensor, int | torch.Tensor]:
        """The kind's ``gather`` of ``item``, refused in one line naming the pipeline where it is
        not (rows, feature bytes moved): unpacked as it comes, two rows would pass for the pair."""
        result = self.kind.gather(self, item)
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.Tensor)):
            got = f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
            raise UserError(
                f"pipeline {self.name}: gather(pipeline, item) returned {got}; it returns (rows on the training "
                "device, feature bytes moved)"
            )
        return result

    def row_bytes(self) -> int:
        return self.graph.features.shape[1] * self.graph.features.element_size()

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """A copy on the training device that does not block: CPU tensors go through pinned memory
        (a copy from pageable memory would wait for the stream, stalling the overlap)."""
        if t.device == self.device:
            return t
        if t.device.type == "cpu":
            return (t if t.is_pinned() else t.pin_memory()).to(self.device, non_blocking=True)
        return t.to(self.device, non_blocking=True)

    def batches(self, epoch: int, seeds: torch.Tensor | None = None) -> Iterator[Minibatch]:
        """The epoch's minibatches (training seeds shuffled by epoch, or the given seeds in order)."""
        self.refuse_if_closed()
        self.refuse_if_graph_changed()
        if whole_number(epoch, at_most=MAX_EPOCH) is None:
            raise UserError(f"epoch must be a whole number in 0..2**62, got {epoch!r}")
        epoch = whole_number(epoch)
        if seeds is not None and not _node_ids(seeds):
            kind = f"{seeds.dtype} {tuple(seeds.shape)}" if isinstance(seeds, torch.Tensor) else type(seeds).__name__
            raise UserError(f"seeds must be a 1-D tensor of integer node ids (mask.nonzero() of a mask), got {kind}")
        if seeds is not None:
            # All of them, here: checked batch by batch, a bad id would surface after the batches
            # before it were handed out, and a node named in two batches would pass.
            self.sampler.check_seeds(seeds)
            seeds = list(seeds.split(self.batch_size)) if seeds.numel() else []
        return self._epoch(epoch, seeds)  # checked here, at the call; the batches come as they are asked

    def _epoch(self, epoch: int, seeds: list[torch.Tensor] | None) -> Iterator[Minibatch]:
        self.refuse_if_closed()  # closed between the call and the first batch
        items = self._items(epoch, seeds)
        count = len(self.seeds(epoch)) if seeds is None else len(seeds)
        try:
            if self.kind.batches is not None:
                yield from self.kind.batches(self, items, count)
                return
            for _ in range(count):
                yield self._next(items)
        finally:
            if hasattr(items, "close"):
                items.close()  # stops the loader workers at once when the epoch did not finish

    def prefetched(self, items: Iterator, count: int) -> Iterator[Minibatch]:
        """Batches prepared by a background thread on the side stream, up to PREFETCH_BATCHES
        ahead: their CPU work (waiting for the sampler, checking ids, launching the gather) runs
        while this thread launches the training of the batch before, and their gather kernels
        (with capped threads) run beside the training kernels."""
        if self.clock is not None:
            # A breakdown is of the work, one phase after another: prepare on the side stream in turn.
            for _ in range(count):
                with torch.cuda.stream(self.side_stream):
                    batch = self._next(items)
                torch.cuda.current_stream().wait_stream(self.side_stream)
                yield self.used_on_current_stream(batch)
            return
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
                        batch = self._next(items)
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
                yield self.used_on_current_stream(batch)
        finally:
            stop.set()
            producer.join(timeout=WORKER_TIMEOUT_S)  # it checks `stop` between batches
            if producer.is_alive():  # it would go on reading the sampler that the next epoch resets
                raise RuntimeError(f"the prefetch thread did not stop within {WORKER_TIMEOUT_S} s")

    @staticmethod
    def used_on_current_stream(batch: Minibatch) -> Minibatch:
        """Tell the caching allocator that a side stream's tensors are now used on this one."""
        for t in (batch.x, batch.edge_index, batch.y):
            t.record_stream(torch.cuda.current_stream())
        return batch


# Pipelines whose module could not register them here (a package they need is missing): {name: why}.
UNAVAILABLE_PIPELINES: dict[str, str] = {}

# The suite's pipelines, imported in the order figures list them (the registry keeps it).
from workloads.gnn.pipelines import cpu_gather, cpu_gather_workers, pyg_neighbor_loader  # noqa: E402,F401,I001
from workloads.gnn.pipelines import zero_copy, gpu_sampling, hot_cache  # noqa: E402,F401,I001

PIPELINES = PIPELINE_KINDS.names()
GPU_PIPELINES = tuple(k.name for k in PIPELINE_KINDS if k.needs_gpu)
# The results' ``role`` of each pipeline, in one table so both GNN topics label a pipeline alike.
ROLE = {k.name: k.role for k in PIPELINE_KINDS}
