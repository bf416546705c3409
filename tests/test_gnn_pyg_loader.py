"""The pyg_neighbor_loader pipeline: registered exactly where PyG can sample; its batches are the
suite's seed batches with the seeds' rows and labels; its sampling agrees with the suite's
sampler (exact where both are determined: fan-out caps, edges of the graph, the first hop's edge
count; within 5% in the mean where they are random) on a graph whose neighbour lists are
ordered by degree, so a sampler that does not draw uniformly is caught.

Needs pyg-lib or torch-sparse (not in the pinned environments): without them the tests of the
loader skip with the reason, and the registry says why it is missing."""

import os

import numpy as np
import pytest
import torch

from workloads.gnn.epoch import accuracy, train_epoch
from workloads.gnn.models import build
from workloads.gnn.pipelines import PIPELINES, ROLE, UNAVAILABLE_PIPELINES, Graph, Pipeline, batch_number
from workloads.gnn.pipelines.pyg_neighbor_loader import NAME, backend, backend_missing

MISSING = backend_missing()
needs_backend = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
BACKEND = backend() if MISSING is None else None
# torch-sparse's sampler never draws a node's last neighbour at fan-out 1 (the module's docstring):
# on these degree-ordered lists that raises the mean degree drawn far past the tolerance.
SKEWED_AT_FANOUT_1 = pytest.mark.xfail(
    BACKEND == "torch_sparse", reason="torch-sparse never draws a node's last neighbour at fan-out 1", strict=True
)
TOLERANCE = 0.05  # relative, on means over at least SEEDS seeds of two different random number generators
SEEDS = 4_000  # 200 batches of 20: enough that the heavy-tailed degrees' means settle within it


def random_graph(nodes: int, seed: int, max_degree: int = 60) -> dict:
    """A directed graph with heavy-tailed degrees (many nodes under a fan-out, many over it),
    distinct neighbours, each node's list ordered from the highest degree down (a sampler that
    takes the first k would pick the hubs), small-integer features (exact row checks)."""
    rng = np.random.default_rng(seed)
    degree = np.minimum(rng.zipf(1.8, nodes), max_degree)
    lists = [rng.choice(nodes, d, replace=False) for d in degree]
    lists = [ids[np.argsort(-degree[ids], kind="stable")] for ids in lists]
    indptr = np.concatenate([[0], np.cumsum(degree)]).astype(np.int64)
    order = rng.permutation(nodes)
    return {
        "indptr": indptr,
        "indices": np.concatenate(lists).astype(np.int64),
        "features": rng.integers(-8, 8, (nodes, 12)).astype(np.float32),
        "labels": rng.integers(0, 5, nodes).astype(np.int64),
        "train_idx": np.sort(order[: nodes * 3 // 4]).astype(np.int64),
        "val_idx": np.sort(order[nodes * 3 // 4 :]).astype(np.int64),
    }


def test_registered_exactly_where_a_sampling_backend_imports():
    if MISSING is None:
        assert NAME in PIPELINES and ROLE[NAME] == "baseline" and NAME not in UNAVAILABLE_PIPELINES
    else:
        assert NAME not in PIPELINES
        assert UNAVAILABLE_PIPELINES[NAME] == MISSING
        assert MISSING.startswith("PyG's NeighborLoader needs pyg-lib or torch-sparse, which are not installed here: ")
        assert "pyg_lib" in MISSING and "torch_sparse" in MISSING


def per_hop(n_id: torch.Tensor, edge_index: torch.Tensor, batch_size: int, hops: int) -> list[dict]:
    """Each hop's targets (local ids start..end), its edges and the nodes it added, read from the
    subgraph's layout (seeds first, then each hop's new nodes), which both samplers share."""
    src, dst = edge_index
    start, end, hops_seen, edges = 0, batch_size, [], 0
    for _ in range(hops):
        in_hop = (dst >= start) & (dst < end)
        new = src[in_hop]
        new = new[new >= end].unique()
        assert torch.equal(new, torch.arange(end, end + new.numel())), "a hop's new nodes follow the nodes before"
        hops_seen.append({"start": start, "end": end, "edges": in_hop, "new": new.numel()})
        edges += int(in_hop.sum())
        start, end = end, end + new.numel()
    assert end == n_id.numel() and edges == src.numel(), "every node and edge belongs to a hop"
    return hops_seen


def check_subgraph(n_id, edge_index, seeds, fanouts, arrays) -> dict[str, float]:
    """Assert what holds for any correct sampler; return the batch's random quantities."""
    indptr, indices = arrays["indptr"], arrays["indices"]
    nodes, degree = indptr.size - 1, np.diff(indptr)
    n_id, edge_index = n_id.cpu(), edge_index.cpu()
    assert torch.equal(n_id[: seeds.numel()], seeds), "the seeds come first, in order"
    assert n_id.unique().numel() == n_id.numel()
    src, dst = n_id[edge_index[0]].numpy(), n_id[edge_index[1]].numpy()
    keys = dst * nodes + src
    graph_keys = np.repeat(np.arange(nodes), degree) * nodes + indices
    assert np.isin(keys, graph_keys).all(), "every sampled edge is an edge of the graph"
    assert np.unique(keys).size == keys.size, "no neighbour drawn twice for one node"
    stats = {}
    for hop, (part, fanout) in enumerate(zip(per_hop(n_id, edge_index, seeds.numel(), len(fanouts)), fanouts), 1):
        targets = torch.arange(part["start"], part["end"])
        drawn = torch.bincount(edge_index[1][part["edges"]] - part["start"], minlength=targets.numel())
        expected = np.minimum(degree[n_id[targets].numpy()], fanout)
        assert np.array_equal(drawn.numpy(), expected), f"hop {hop}: min(degree, fan-out) neighbours per node"
        stats[f"hop {hop} new nodes"] = part["new"]
        stats[f"hop {hop} neighbour degree"] = float(degree[src[part["edges"].numpy()]].mean()) if drawn.sum() else 0.0
    return stats


def pyg_batches(pipeline: Pipeline, epoch: int):
    """The loader's own batches of an epoch (PyG ``Data``, with ``n_id``), before the pipeline
    turns them into minibatches."""
    pipeline.neighbor_loader.sampler.epoch = epoch
    return iter(pipeline.neighbor_loader)


def compare(fanouts: list[int], batch_size: int, workers: int, seed: int = 11) -> None:
    batches = -(-SEEDS // batch_size)
    arrays = random_graph(nodes=max(batches * batch_size * 4 // 3 + 8, 600), seed=seed)
    graph = Graph(arrays, "cpu")
    torch.manual_seed(seed)  # PyG's draws: a fixed seed, so the test gives the same verdict every run
    pipeline = Pipeline(NAME, graph, fanouts, batch_size, seed=seed, sampler_workers=workers)
    try:
        epoch, pyg, suite = 0, [], []
        for index, (batch, seeds) in enumerate(zip(pyg_batches(pipeline, epoch), pipeline.seeds(epoch))):
            if index == batches:
                break
            assert batch.batch_size == seeds.numel()
            pyg.append(check_subgraph(batch.n_id, batch.edge_index, seeds, fanouts, arrays))
            sub = pipeline.sampler.sample(seeds, batch_number(epoch, index))
            suite.append(check_subgraph(sub.n_id, sub.edge_index, seeds, fanouts, arrays))
        assert len(pyg) == batches
    finally:
        pipeline.close()
    for key in pyg[0]:
        ours, theirs = np.mean([s[key] for s in suite]), np.mean([s[key] for s in pyg])
        assert abs(theirs - ours) <= TOLERANCE * ours, f"{key}: NeighborLoader {theirs:.2f}, suite {ours:.2f}"
    # The check has the power to fail: a sampler taking each node's first k neighbours (the
    # hubs, in this graph's order) is off by far more than the tolerance in the first hop.
    degree = np.diff(arrays["indptr"])
    first_k = [
        degree[arrays["indices"][arrays["indptr"][v] : arrays["indptr"][v] + fanouts[0]]].mean()
        for v in graph.train_idx[: batches * batch_size].tolist()
        if degree[v] > fanouts[0]
    ]
    uniform = np.mean([s["hop 1 neighbour degree"] for s in suite])
    assert np.mean(first_k) > (1 + 3 * TOLERANCE) * uniform


@needs_backend
def test_sampling_agrees_with_the_suites_sampler():
    compare([5, 10], batch_size=20, workers=0)


@needs_backend
@pytest.mark.full
@pytest.mark.parametrize(
    "fanouts, batch_size, workers",
    [([15, 10, 5], 37, 2), ([3], 9, 1), pytest.param([25, 1], 16, 0, marks=SKEWED_AT_FANOUT_1)],
)
def test_sampling_agrees_with_the_suites_sampler_across_depths(fanouts, batch_size, workers):
    compare(fanouts, batch_size, workers)


def two_neighbour_graph(nodes: int) -> dict:
    """Node v's neighbours are v+1 and v+2 (mod nodes), in that order."""
    rng = np.random.default_rng(9)
    ids = np.arange(nodes)
    order = rng.permutation(nodes)
    return {
        "indptr": np.arange(0, 2 * nodes + 1, 2, dtype=np.int64),
        "indices": np.stack([(ids + 1) % nodes, (ids + 2) % nodes], axis=1).reshape(-1).astype(np.int64),
        "features": rng.integers(-8, 8, (nodes, 4)).astype(np.float32),
        "labels": rng.integers(0, 3, nodes).astype(np.int64),
        "train_idx": np.sort(order[: nodes * 3 // 4]).astype(np.int64),
        "val_idx": np.sort(order[nodes * 3 // 4 :]).astype(np.int64),
    }


def share_of_second_neighbours(n_id: torch.Tensor, edge_index: torch.Tensor, nodes: int) -> tuple[int, int]:
    """(edges to a node's second neighbour, edges) of a one-hop subgraph of two_neighbour_graph."""
    src, dst = n_id[edge_index[0].cpu()], n_id[edge_index[1].cpu()]
    second = src == (dst + 2) % nodes
    assert bool((second | (src == (dst + 1) % nodes)).all()), "every sampled edge is an edge of the graph"
    return int(second.sum()), src.numel()


@needs_backend
def test_at_fan_out_1_the_second_of_two_neighbours_is_drawn_as_the_backend_draws():
    """The suite's sampler draws each of two neighbours about half the time; so does pyg-lib,
    while torch-sparse never draws the second (what the docs say of it)."""
    nodes = 2_000
    graph = Graph(two_neighbour_graph(nodes), "cpu")
    pipeline = Pipeline(NAME, graph, [1], 50, seed=3)
    try:
        theirs, ours = [0, 0], [0, 0]
        for index, (batch, seeds) in enumerate(zip(pyg_batches(pipeline, 0), pipeline.seeds(0))):
            sub = pipeline.sampler.sample(seeds, batch_number(0, index))
            for counts, n_id, edge_index in ((theirs, batch.n_id, batch.edge_index), (ours, sub.n_id, sub.edge_index)):
                second, edges = share_of_second_neighbours(n_id, edge_index, nodes)
                counts[0], counts[1] = counts[0] + second, counts[1] + edges
    finally:
        pipeline.close()
    assert ours[1] == theirs[1] == nodes * 3 // 4, "one neighbour per seed"
    assert 0.45 < ours[0] / ours[1] < 0.55  # 1,500 fair draws: outside 0.05 of a half about 1 time in 10^4 (and seeded)
    if BACKEND == "torch_sparse":
        assert theirs[0] == 0, "torch-sparse drew a last neighbour at fan-out 1: its skew is gone, update the docs"
    else:
        assert 0.45 < theirs[0] / theirs[1] < 0.55


def check_batches(pipeline: Pipeline, graph: Graph, epoch: int) -> int:
    """The epoch's minibatches are the suite's seed batches with their rows and labels."""
    projection = torch.randint(1, 1_000, (graph.features.shape[1],), dtype=torch.float64)
    known_rows = set((graph.features.double() @ projection).tolist())
    batches = list(pipeline.batches(epoch))
    assert len(batches) == len(pipeline.seeds(epoch))
    for batch, seeds in zip(batches, pipeline.seeds(epoch)):
        x, y, edge_index = batch.x.cpu(), batch.y.cpu(), batch.edge_index.cpu()
        assert batch.batch_size == seeds.numel() and batch.x.device.type == pipeline.device.type
        assert torch.equal(x[: seeds.numel()], graph.features[seeds]) and torch.equal(y, graph.labels[seeds])
        assert set((x.double() @ projection).tolist()) <= known_rows, "every row is a row of the table"
        assert edge_index.shape[0] == 2 and 0 <= int(edge_index.min()) and int(edge_index.max()) < x.shape[0]
        assert batch.feature_bytes == x.shape[0] * pipeline.row_bytes()
    return len(batches)


def train_and_close(pipeline: Pipeline, graph: Graph, device: str) -> None:
    torch.manual_seed(0)
    model = build("sage", graph.features.shape[1], 16, int(graph.labels.max()) + 1, 2, [4, 6]).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses, gathered = train_epoch(model, optimizer, pipeline, epoch=2)
    assert len(losses) == len(pipeline.seeds(2)) and all(np.isfinite(losses)) and gathered > 0
    assert 0.0 <= accuracy(model, pipeline) <= 1.0  # on the suite's validation batches
    workers = pipeline.worker_pids()
    assert len(workers) == pipeline.sampler_workers
    pipeline.close()
    for pid in workers:  # close() stops the loader's persistent workers (and reaps them)
        assert not os.path.exists(f"/proc/{pid}")


@needs_backend
def test_batches_are_the_suites_seed_batches_and_train():
    arrays = random_graph(nodes=700, seed=3)
    graph = Graph(arrays, "cpu")
    pipeline = Pipeline(NAME, graph, [4, 6], 61, seed=5, sampler_workers=1)
    assert check_batches(pipeline, graph, epoch=1) == 9  # 525 training nodes: 8 of 61 and one of 37
    train_and_close(pipeline, graph, "cpu")


@needs_backend
@pytest.mark.full
def test_a_shard_gets_its_slice_of_every_global_batch():
    arrays = random_graph(nodes=700, seed=4)
    graph = Graph(arrays, "cpu")
    pipeline = Pipeline(NAME, graph, [3, 3], 40, seed=2, shard=(1, 3))
    try:
        assert check_batches(pipeline, graph, epoch=0) == 525 // 120
    finally:
        pipeline.close()


@needs_backend
@pytest.mark.gpu
def test_batches_reach_the_gpu_and_train():
    arrays = random_graph(nodes=700, seed=3)
    graph = Graph(arrays, "cuda")
    pipeline = Pipeline(NAME, graph, [4, 6], 61, seed=5, sampler_workers=2)
    assert check_batches(pipeline, graph, epoch=1) == 9
    train_and_close(pipeline, graph, "cuda")
