"""GNN training: model/fan-out agreement, the pipelines' batches, a tiny run end to end; on a
GPU, every pipeline trains on the same batches as the baseline (same loss curve)."""

import time
from dataclasses import replace

import pytest
import torch

from harness.entry import main as entry
from harness.results import load, load_provenance
from workloads.gnn.epoch import timed_epochs, train_epoch
from workloads.gnn.models import build
from workloads.gnn.pipelines import GPU_PIPELINES, PIPELINES, Graph, Pipeline
from workloads.gnn_training.schema import SCHEMA
from workloads.graphs import store
from workloads.graphs.generate import GeneratorParams
from workloads.graphs.spec import DATASETS


@pytest.fixture(scope="module")
def arrays(tmp_path_factory):
    # More training nodes than ogbn-products' 8%, for several batches per epoch in a small graph.
    params = GeneratorParams(replace(DATASETS["ogbn-products"].scaled(0.001), train_fraction=0.6), seed=2)
    return store.get(params, root=tmp_path_factory.mktemp("graphs"))


@pytest.mark.parametrize("layers, fanouts", [(2, [10]), (2, [10, 25, 5]), (3, [15, 10])])
def test_fanouts_must_match_model_depth(layers, fanouts):
    with pytest.raises(ValueError, match=f"a {layers}-layer sage needs one fan-out per layer"):
        build("sage", 16, 32, 4, layers, fanouts)


def test_unknown_model_and_pipeline_are_refused(arrays):
    with pytest.raises(ValueError, match="model must be one of"):
        build("gcn", 16, 32, 4, 1, [5])
    with pytest.raises(ValueError, match="pipeline must be one of"):
        Pipeline("magic", Graph(arrays, "cpu"), [5], 64, seed=0)
    with pytest.raises(ValueError, match="needs a GPU"):
        Pipeline("zero_copy", Graph(arrays, "cpu"), [5], 64, seed=0)


def test_cpu_pipeline_batches_cover_the_training_nodes_with_their_rows(arrays):
    graph = Graph(arrays, "cpu")
    pipeline = Pipeline("cpu_gather", graph, [5, 5], 100, seed=3)
    seen = []
    for batch, seeds in zip(pipeline.batches(epoch=0), pipeline.seeds(0)):
        assert torch.equal(batch.x[: batch.batch_size], graph.features[seeds])
        assert torch.equal(batch.y, graph.labels[seeds])
        assert batch.edge_index.max() < batch.x.shape[0]
        seen.append(seeds)
    assert torch.equal(torch.cat(seen).sort().values, graph.train_idx.sort().values)


def test_training_lowers_the_loss(arrays):
    torch.manual_seed(0)
    graph = Graph(arrays, "cpu")
    model = build("sage", graph.features.shape[1], 32, int(graph.labels.max()) + 1, 2, [10, 10])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    pipeline = Pipeline("cpu_gather", graph, [10, 10], 128, seed=0)
    first, _ = train_epoch(model, optimizer, pipeline, 0)
    later, _ = train_epoch(model, optimizer, pipeline, 1)
    assert sum(later) / len(later) < sum(first) / len(first)


def test_the_epoch_loop_times_from_its_opening_wait_to_its_closing_one(arrays):
    """One loop for one process and for data-parallel ranks: what the two ends wait for is a
    parameter (a barrier in rank.py); warm-up epochs are yielded but carry no repetition."""
    torch.manual_seed(0)
    graph = Graph(arrays, "cpu")
    model = build("sage", graph.features.shape[1], 16, int(graph.labels.max()) + 1, 1, [5])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    pipeline = Pipeline("cpu_gather", graph, [5], 256, seed=0)
    waits = []
    epochs = []
    for epoch in timed_epochs(
        model,
        optimizer,
        pipeline,
        warmup=1,
        repeat=2,
        device="cpu",
        before=lambda: waits.append("before"),
        after=lambda: (waits.append("after"), time.sleep(0.05)),
    ):
        waits.append("caller")
        epochs.append(epoch)
        assert epoch.cpu_seconds() > 0
    assert waits == ["before", "after", "caller"] * 3
    assert [(e.index, e.repetition) for e in epochs] == [(0, None), (1, 0), (2, 1)]
    assert all(e.seconds >= 0.05 for e in epochs)  # the closing wait is inside the time
    assert [len(e.losses) for e in epochs] == [len(pipeline.seeds(i)) for i in range(3)]
    assert all(e.feature_bytes > 0 for e in epochs)


def test_cpu_part_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_HIDE_GPU", "1")
    from harness import machine

    machine.forget()
    try:
        out = tmp_path / "papers-tiny.csv"
        entry(["gnn_training", "--part", "papers", "--scale", "tiny", "--out", str(out)])
    finally:
        machine.forget()
    frame, prov = load([out], SCHEMA), load_provenance(out)
    assert set(frame.variant) == {"cpu_gather"}
    assert {"epoch_time", "cpu_time", "phase_time", "loss", "accuracy"} <= set(frame.metric)
    assert set(prov["skipped_pipelines"]) == set(GPU_PIPELINES)
    assert set(frame[frame.metric == "phase_time"].phase) == {"sample", "gather", "train"}


@pytest.mark.gpu
def test_every_pipeline_sees_the_same_batches_and_loss_curve(arrays):
    graph = Graph(arrays, "cuda")
    curves = {}
    for name in PIPELINES:
        torch.manual_seed(0)
        model = build("sage", graph.features.shape[1], 32, int(graph.labels.max()) + 1, 2, [10, 10]).cuda()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        pipeline = Pipeline(name, graph, [10, 10], 128, seed=5)
        curves[name], gathered = train_epoch(model, optimizer, pipeline, 0)
        assert gathered > 0
    graph.close()
    base = torch.tensor(curves["cpu_gather"])
    for name, curve in curves.items():
        # Same batches and weights; only the order of floating-point sums on the GPU differs.
        torch.testing.assert_close(torch.tensor(curve), base, rtol=1e-3, atol=1e-3, msg=f"pipeline {name}")


@pytest.mark.gpu
@pytest.mark.parametrize("workers", [0, 2])
def test_prefetch_thread_hands_over_exactly_the_batches_in_order(arrays, workers):
    graph = Graph(arrays, "cuda")
    plain = list(Pipeline("zero_copy", graph, [5, 5], 64, seed=8).batches(epoch=2))
    overlapped = Pipeline("zero_copy_overlap", graph, [5, 5], 64, seed=8, sampler_workers=workers)
    prepare = overlapped._next

    def slow_prepare(subgraphs):  # the side stream spins before each gather: a missing wait shows
        torch.cuda._sleep(20_000_000)
        return prepare(subgraphs)

    overlapped._next = slow_prepare
    # Copied on the consumer's stream the moment they arrive, as training would read them.
    got = [(b.x.clone(), b.edge_index.clone(), b.y.clone()) for b in overlapped.batches(epoch=2)]
    del overlapped._next
    assert len(got) == len(plain) > 2
    for a, (x, edge_index, y) in zip(plain, got):
        assert torch.equal(a.x, x) and torch.equal(a.edge_index, edge_index) and torch.equal(a.y, y)
    # A consumer that stops early stops the thread; the next epoch starts clean.
    early = overlapped.batches(epoch=2)
    next(early)
    early.close()
    assert torch.equal(next(iter(overlapped.batches(epoch=2))).x, plain[0].x)
    overlapped.close()
    graph.close()


@pytest.mark.gpu
def test_prefetch_thread_errors_reach_the_caller(arrays, monkeypatch):
    from workloads.gnn import pipelines

    monkeypatch.setattr(pipelines, "WORKER_TIMEOUT_S", 5)  # a broken handover fails in seconds
    graph = Graph(arrays, "cuda")
    pipeline = Pipeline("zero_copy_overlap", graph, [5], 64, seed=8)
    monkeypatch.setattr(pipeline, "_next", lambda subgraphs: (_ for _ in ()).throw(IndexError("bad id 99")))
    with pytest.raises(IndexError, match="bad id 99"):
        list(pipeline.batches(epoch=0))
    graph.close()


@pytest.mark.gpu
def test_gpu_part_end_to_end(tmp_path):
    out = tmp_path / "products-tiny.csv"
    entry(["gnn_training", "--part", "products", "--scale", "tiny", "--out", str(out)])
    frame = load([out], SCHEMA)
    assert set(frame.variant) == set(PIPELINES)
    assert (frame[(frame.metric == "pcie_bytes") & (frame.variant == "all_in_gpu")].value == 0).all()


def test_sampler_workers_hand_over_the_same_batches(arrays):
    graph = Graph(arrays, "cpu")
    in_process = Pipeline("cpu_gather", graph, [5, 5], 100, seed=6)
    workers = Pipeline("cpu_gather", graph, [5, 5], 100, seed=6, sampler_workers=2)
    for epoch in (1, 2):  # the same (persistent) workers serve the next epoch its own batches
        expected, got = list(in_process.batches(epoch)), list(workers.batches(epoch))
        assert len(expected) == len(got) == len(in_process.seeds(epoch))
        for a, b in zip(expected, got):
            assert torch.equal(a.x, b.x) and torch.equal(a.edge_index, b.edge_index) and torch.equal(a.y, b.y)
    assert not torch.equal(expected[0].y, list(in_process.batches(1))[0].y)  # epochs differ
    workers.close()
    with pytest.raises(ValueError, match="sampler_workers"):
        Pipeline("cpu_gather", graph, [5], 100, seed=6, sampler_workers=-1)


def test_training_on_an_imported_published_dataset(tmp_path, monkeypatch):
    import numpy as np

    from harness import config as suite_config
    from harness.results import ResultsWriter
    from workloads.gnn_training.train import run_dataset
    from workloads.graphs import published

    rng = np.random.default_rng(3)
    n = 300
    row, col = rng.integers(0, n, 3000), rng.integers(0, n, 3000)
    raw = tmp_path / "reddit"
    raw.mkdir()
    np.savez(
        raw / "reddit_graph.npz", row=np.concatenate([row, col]), col=np.concatenate([col, row]), shape=np.array([n, n])
    )
    np.savez(
        raw / "reddit_data.npz",
        feature=rng.standard_normal((n, 16)),
        label=rng.integers(0, 3, n),
        node_types=rng.choice([1, 2, 3], n, p=[0.6, 0.2, 0.2]),
    )
    monkeypatch.setattr(published.store, "DEFAULT_ROOT", tmp_path / "graphs")
    shared = suite_config.load()["topics"]["gnn_training"]["tiny"]
    writer = ResultsWriter(SCHEMA, scale="tiny")
    notes = run_dataset(
        "reddit",
        {"scale_factor": 1.0, "published_dir": str(raw)},
        writer,
        shared=shared,
        repeat=1,
        warmup=0,
        device="cpu",
    )
    assert notes["graph_source"] == str(raw) and notes["graph"]["nodes"] == n
    assert {row["dataset"] for row in writer.rows} == {"reddit"}  # the real one, not "reddit-like"
    folders = list((tmp_path / "graphs").glob("reddit-*"))
    run_dataset(
        "reddit",
        {"scale_factor": 1.0, "published_dir": str(raw)},
        ResultsWriter(SCHEMA, scale="tiny"),
        shared=shared,
        repeat=1,
        warmup=0,
        device="cpu",
    )
    assert list((tmp_path / "graphs").glob("reddit-*")) == folders  # imported once, then reused
