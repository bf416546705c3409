"""``pyg_neighbor_loader``: PyG's own ``NeighborLoader``, as a PyG user feeds a GPU with it.

``NeighborLoader(data, num_neighbors=fanouts, batch_size=..., num_workers=W, pin_memory=True,
persistent_workers=True)`` over the suite's graph: ``data`` holds the feature table in host
memory (``x``), the labels (``y``) and the edges, converted once from the suite's CSR when the
pipeline is made (outside the timed epochs); each loader worker samples with PyG's backend
(pyg-lib, or torch-sparse) and gathers the batch's rows and labels itself, the pin-memory thread
pins the batch, and the training process copies ``x``, ``edge_index`` and the seeds' labels to
the GPU with ``non_blocking`` on the current stream (``batch.to(device, non_blocking=True)``).
Without a GPU it trains on the CPU and nothing is copied.

The seed batches are the suite's (the loader's sampler hands it each epoch's order), so this
pipeline trains on the same seeds as the others; only the neighbours drawn differ (another
random number generator). Validation uses the suite's sampled batches, as every pipeline does,
so accuracy compares training only. ``sampler_workers`` sets W (0: sampling in the training
process); PyG's workers run one torch thread each.

Registered only where a sampling backend imports: PyG's NeighborLoader needs pyg-lib or
torch-sparse, which the suite's environments do not pin (PyPI has no pyg-lib wheels; torch-sparse
builds from its source release). Elsewhere :data:`UNAVAILABLE_PIPELINES` says why.

With torch-sparse (PyG's fallback where pyg-lib is missing) the neighbours drawn are not uniform:
its CPU sampler (0.6.18) draws k of a node's n neighbours by Floyd's method with each random
index one value short of its range, so with a fan-out of 1 a node's last neighbour is never drawn,
and with other fan-outs below n the later neighbours are drawn less often than the earlier. It
also seeds C's ``rand()`` from the clock, so its draws do not repeat under torch's seed. pyg-lib
draws uniformly. :func:`backend` says which of them PyG uses here.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import torch

from workloads.gnn.pipelines import Minibatch, Pipeline, PipelineKind, epoch_seeds, register, unavailable
from workloads.gnn.pipelines.cpu_gather import gather_in_process

NAME = "pyg_neighbor_loader"
BACKENDS = ("pyg_lib", "torch_sparse")


def backend_missing() -> str | None:
    """Why NeighborLoader cannot sample here (one line), or None where it can."""
    if backend() is not None:
        return None
    why = []
    for module in BACKENDS:
        try:
            importlib.import_module(module)
        except Exception as error:  # not installed, or built for another torch: its own words
            why.append(f"{module}: {str(error).splitlines()[0] if str(error) else type(error).__name__}")
        else:
            why.append(f"{module}: imports, but PyG does not use it")
    return "PyG's NeighborLoader needs pyg-lib or torch-sparse, which are not installed here: " + "; ".join(why)


def backend() -> str | None:
    """The backend NeighborLoader samples with here (PyG prefers pyg-lib), or None."""
    import torch_geometric.typing as pyg_typing

    if pyg_typing.WITH_PYG_LIB:
        return "pyg_lib"
    return "torch_sparse" if pyg_typing.WITH_TORCH_SPARSE else None


def graph_data(graph):
    """The graph as PyG ``Data``: the feature table and labels as they lie in host memory, and the
    edges as ``edge_index`` (row 0 the neighbour, row 1 the node it is a neighbour of), sorted by
    that node, so PyG builds its CSC without sorting. Made once per pipeline."""
    from torch_geometric.data import Data

    nodes = graph.indptr.numel() - 1
    of_node = torch.repeat_interleave(torch.arange(nodes), graph.indptr.diff())
    return Data(x=graph.features, y=graph.labels, edge_index=torch.stack([graph.indices, of_node]), num_nodes=nodes)


class EpochOrder(torch.utils.data.Sampler):
    """The seed ids of one epoch in the suite's order (``epoch_seeds``): what the loader's batch
    sampler cuts into batches of ``batch_size``. Set ``epoch`` before iterating the loader."""

    def __init__(self, pipeline: Pipeline):
        self.pipeline, self.epoch = pipeline, 0

    def _seeds(self) -> list[torch.Tensor]:
        p = self.pipeline
        return epoch_seeds(p.graph.train_idx, p.batch_size, p.seed, self.epoch, p.shard)

    def __iter__(self) -> Iterator[int]:
        seeds = self._seeds()
        return iter(torch.cat(seeds).tolist() if seeds else [])

    def __len__(self) -> int:
        return sum(s.numel() for s in self._seeds())


def make_loader(pipeline: Pipeline) -> None:
    """Build the NeighborLoader (its workers start with the first epoch and persist) and route the
    pipeline's training epochs through it."""
    from torch_geometric.loader import NeighborLoader

    order = EpochOrder(pipeline)
    workers = pipeline.sampler_workers
    loader = NeighborLoader(
        graph_data(pipeline.graph),
        num_neighbors=list(pipeline.sampler.fanouts),
        batch_size=pipeline.batch_size,
        sampler=order,  # the suite's shuffled order of the seeds, in place of shuffle=True
        is_sorted=True,
        num_workers=workers,
        pin_memory=pipeline.device.type == "cuda",
        persistent_workers=workers > 0,
    )
    pipeline.neighbor_loader = loader  # its batches (PyG Data, with n_id) for a test to read
    # The pipeline's worker loader, where it has workers: close() stops them (worker_pids() lists them).
    pipeline._loader = loader if workers else None
    in_suite_order = pipeline.batches  # validation: the suite's batches, gathered in the process

    def batches(epoch: int, seeds: torch.Tensor | None = None) -> Iterator[Minibatch]:
        pipeline.refuse_if_closed()
        if seeds is not None:
            return in_suite_order(epoch, seeds)
        order.epoch = epoch
        return _from_loader(pipeline, loader)

    pipeline.batches = batches


def _from_loader(pipeline: Pipeline, loader) -> Iterator[Minibatch]:
    device = pipeline.device
    row_bytes = pipeline.row_bytes()
    batches = iter(loader)
    while True:
        with pipeline._phase("sample"):  # with workers: the wait for the next finished batch
            batch = next(batches, None)
        if batch is None:
            return
        with pipeline._phase("gather"):  # the rows were gathered by the loader: this is the copy
            size = batch.batch_size
            x = batch.x.to(device, non_blocking=True)
            edge_index = batch.edge_index.to(device, non_blocking=True)
            y = batch.y[:size].to(device, non_blocking=True)
        yield Minibatch(x, edge_index, y, size, batch.x.shape[0] * row_bytes)


if (_missing := backend_missing()) is None:
    register(
        PipelineKind(
            NAME,
            "baseline",
            label="PyG NeighborLoader",
            gather=gather_in_process,  # the validation batches' rows (the suite's sampler)
            swept_worker_threads=(1,),  # PyG's workers run one torch thread each
            own_sampler=True,
            prepare=make_loader,
            notes="PyG's NeighborLoader (pyg-lib or torch-sparse) in loader workers, pinned, copied non-blocking",
        )
    )
else:
    unavailable(NAME, _missing)
