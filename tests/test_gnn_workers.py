"""The PyG-style loader pipeline (``cpu_gather_workers``) and CPU budgets: the workers hand over
``cpu_gather``'s batches, in order, with their rows; a failure in a worker or in training stops
every worker; a budget confines the workers; the split of a budget is picked from candidates
that leave training a core. On a GPU, the copy one batch ahead hands over the same batches."""

import os
import signal
from dataclasses import replace

import psutil
import pytest
import torch

from harness.errors import UserError
from workloads.gnn.epoch import train_epoch
from workloads.gnn.models import build
from workloads.gnn.pipelines import GatheredBatch, Graph, Pipeline, _TrainingBatches
from workloads.gnn.worker_split import budget_cores, candidate_splits, cpu_budget, pick_split
from workloads.graphs import store
from workloads.graphs.generate import GeneratorParams
from workloads.graphs.spec import DATASETS


@pytest.fixture(scope="module")
def arrays(tmp_path_factory):
    # An odd batch size over 60% training nodes: several batches, the last one short.
    params = GeneratorParams(replace(DATASETS["ogbn-products"].scaled(0.001), train_fraction=0.6), seed=4)
    return store.get(params, root=tmp_path_factory.mktemp("graphs"))


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie has ended: it only waits to be reaped)."""
    running = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
        except psutil.NoSuchProcess:
            pass
    return running


def check_same_batches(graph, workers: int, threads: int, epochs=(0, 3)):
    baseline = Pipeline("cpu_gather", graph, [5, 4], 97, seed=6)
    loader = Pipeline("cpu_gather_workers", graph, [5, 4], 97, seed=6, sampler_workers=workers, worker_threads=threads)
    try:
        for epoch in epochs:  # the same persistent workers serve the next epoch its own batches
            items = list(loader._items(epoch, None))
            assert len(items) == len(baseline.seeds(epoch)) > 2
            for index, item in enumerate(items):
                expected = baseline.training_batches[epoch, index]
                assert isinstance(item, GatheredBatch)
                assert torch.equal(item.subgraph.n_id, expected.n_id)
                assert torch.equal(item.subgraph.edge_index, expected.edge_index)
                # Rows and labels against the table itself, not against another pipeline's gather.
                assert torch.equal(item.x, graph.features[expected.n_id])
                assert torch.equal(item.y, graph.labels[expected.n_id[: expected.batch_size]])
            got, want = list(loader.batches(epoch)), list(baseline.batches(epoch))
            for a, b in zip(got, want, strict=True):
                assert torch.equal(a.x, b.x) and torch.equal(a.edge_index, b.edge_index) and torch.equal(a.y, b.y)
                assert a.batch_size == b.batch_size and a.feature_bytes == b.feature_bytes
    finally:
        loader.close()


def test_loader_workers_hand_over_the_baselines_batches_in_order(arrays):
    check_same_batches(Graph(arrays, "cpu"), workers=2, threads=1)


@pytest.mark.full
@pytest.mark.parametrize("workers, threads", [(0, 1), (1, 2), (3, 1)])
def test_loader_workers_hand_over_the_baselines_batches_for_every_split(arrays, workers, threads):
    check_same_batches(Graph(arrays, "cpu"), workers, threads, epochs=(1, 2, 5))


def test_the_loader_pipeline_trains_like_the_baseline(arrays):
    graph = Graph(arrays, "cpu")
    curves = {}
    for name, workers in (("cpu_gather", 0), ("cpu_gather_workers", 2)):
        torch.manual_seed(0)
        # With dropout: the loader's workers take their seed from a generator of their own, so
        # the model's dropout masks are drawn as without workers.
        model = build("sage", graph.features.shape[1], 16, int(graph.labels.max()) + 1, 2, [5, 4], dropout=0.5)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        pipeline = Pipeline(name, graph, [5, 4], 97, seed=2, sampler_workers=workers)
        curves[name], _ = train_epoch(model, optimizer, pipeline, 0)
        pipeline.close()
    torch.testing.assert_close(torch.tensor(curves["cpu_gather_workers"]), torch.tensor(curves["cpu_gather"]))


def test_a_worker_error_mid_epoch_raises_one_line_and_stops_every_worker(arrays, monkeypatch):
    sample = _TrainingBatches.__getitem__

    def fails_at_batch_3(self, key):
        if key[1] == 3:
            raise ValueError("corrupt row block 17\nhint: rebuild the graph")  # its first line says what failed
        return sample(self, key)

    # Patched before the workers fork, so they run it.
    monkeypatch.setattr(_TrainingBatches, "__getitem__", fails_at_batch_3)
    pipeline = Pipeline("cpu_gather_workers", Graph(arrays, "cpu"), [5], 97, seed=1, sampler_workers=2)
    batches = pipeline.batches(0)
    next(batches)
    pids = pipeline.worker_pids()
    assert len(pids) == 2 and alive(pids) == pids
    with pytest.raises(RuntimeError) as raised:
        list(batches)
    message = str(raised.value)
    assert message == "cpu_gather_workers: a loader worker failed: ValueError: corrupt row block 17"
    assert "\n" not in message
    assert alive(pids) == []
    # The next epoch starts new workers and, past the failing batch, delivers.
    monkeypatch.setattr(_TrainingBatches, "__getitem__", sample)
    assert len(list(pipeline.batches(1))) == len(pipeline.seeds(1))
    pipeline.close()


def test_an_error_of_the_loader_itself_keeps_its_type_and_first_line():
    from workloads.gnn.pipelines import _worker_error

    died = RuntimeError("DataLoader worker (pid(s) 123) exited unexpectedly\nsee dmesg")
    assert _worker_error(died) == "RuntimeError: DataLoader worker (pid(s) 123) exited unexpectedly"


def test_a_worker_whose_pipe_closed_is_said_to_have_died():
    """A worker killed mid-epoch surfaced as a bare EOFError or ConnectionResetError."""
    from workloads.gnn.pipelines import _worker_error

    for error in (EOFError(), ConnectionResetError(104, "Connection reset by peer")):
        said = _worker_error(error)
        assert said.startswith("a worker process died (killed, or out of memory?): ") and type(error).__name__ in said


def test_a_worker_killed_mid_epoch_is_reported_as_a_dead_worker(arrays):
    """Which error says so depends on where the main process is when the worker's end is seen
    (torch's SIGCHLD handler, its queue's timeout check, the pipe): each names the death."""
    pipeline = Pipeline("cpu_gather_workers", Graph(arrays, "cpu"), [5], 7, seed=1, sampler_workers=2)
    batches = pipeline.batches(0)
    try:
        next(batches)
        assert len(pipeline.seeds(0)) > 50  # more than the workers can have prepared ahead
        with pytest.raises(RuntimeError, match=r"exited unexpectedly|killed by signal|a worker process died"):
            os.kill(pipeline.worker_pids()[0], signal.SIGKILL)
            list(batches)
    finally:
        pipeline.close()


def test_a_worker_that_dies_while_the_workers_are_stopped_leaves_a_pipeline_that_trains(arrays, monkeypatch):
    """An epoch left early stops the workers; one of them dying meanwhile (killed for memory) makes
    torch's shutdown raise from its SIGCHLD handler, after it has ended every worker. That is said
    in one warning, and the next epoch gets new workers (the old loader's cannot be restarted)."""
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter as Iterator

    shutdown = Iterator._shutdown_workers
    raised = []

    def a_worker_dies_in_the_join(self):
        shutdown(self)
        if not raised:
            raised.append(True)
            raise RuntimeError("DataLoader worker (pid 4242) exited unexpectedly with exit code 137.\nmore")

    monkeypatch.setattr(Iterator, "_shutdown_workers", a_worker_dies_in_the_join)
    pipeline = Pipeline("cpu_gather_workers", Graph(arrays, "cpu"), [5], 97, seed=1, sampler_workers=2)
    try:
        batches = pipeline.batches(0)
        next(batches)
        pids = pipeline.worker_pids()
        with pytest.warns(UserWarning) as warned:
            batches.close()  # left early: the workers are stopped
        assert raised and alive(pids) == []
        assert [str(w.message) for w in warned] == [
            "cpu_gather_workers: RuntimeError: DataLoader worker (pid 4242) exited unexpectedly with exit code 137."
            " (while its workers were being stopped)"
        ]
        assert len(list(pipeline.batches(1))) == len(pipeline.seeds(1))
        assert len(list(pipeline.batches(2))) == len(pipeline.seeds(2))
    finally:
        pipeline.close()


def test_an_interrupt_in_training_stops_every_worker(arrays):
    graph = Graph(arrays, "cpu")
    model = build("sage", graph.features.shape[1], 16, int(graph.labels.max()) + 1, 1, [5])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    pipeline = Pipeline("cpu_gather_workers", graph, [5], 97, seed=1, sampler_workers=2)
    steps = []

    def interrupted_at_step_2(module, inputs):
        steps.append(pipeline.worker_pids())
        if len(steps) == 2:
            raise KeyboardInterrupt

    model.register_forward_pre_hook(interrupted_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        train_epoch(model, optimizer, pipeline, 0)
    assert len(steps[0]) == 2 and alive(steps[0]) == []
    pipeline.close()


def test_a_cpu_budget_confines_the_workers_and_is_given_back(arrays):
    before = psutil.Process().cpu_affinity()
    pipeline = Pipeline("cpu_gather_workers", Graph(arrays, "cpu"), [5], 97, seed=1, sampler_workers=1)
    with cpu_budget(1):
        batches = pipeline.batches(0)
        next(batches)
        (worker,) = pipeline.worker_pids()
        assert psutil.Process(worker).cpu_affinity() == before[:1]
        batches.close()
    assert psutil.Process().cpu_affinity() == before
    pipeline.close()
    with pytest.raises(UserError, match="exceeds"):
        with cpu_budget(len(before) + 1):
            pass
    for bad in (0, -2, "half", 1.5, True):
        with pytest.raises(UserError, match="CPU budget"):
            budget_cores(bad)
    assert budget_cores("all") == len(before) and budget_cores(3) == 3


def test_candidate_splits_leave_training_a_core():
    assert candidate_splits(8, [1, 2, 4, 8], [1, 2]) == [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)]
    assert candidate_splits(2, [1, 2], [1, 2]) == [(1, 1)]
    assert candidate_splits(1, [2], [2]) == [(1, 1)]  # nothing fits: one worker shares the core


def test_the_split_is_picked_from_what_each_candidate_measured(arrays):
    graph = Graph(arrays, "cpu")
    model = build("sage", graph.features.shape[1], 16, int(graph.labels.max()) + 1, 1, [5])
    weights = [p.detach().clone() for p in model.parameters()]
    made = []

    def make(workers, threads):
        made.append((workers, threads))
        return Pipeline("cpu_gather_workers", graph, [5], 97, seed=1, sampler_workers=workers, worker_threads=threads)

    torch.manual_seed(3)
    before = torch.get_rng_state()
    split, timings = pick_split(make, model, 2, [(1, 1), (2, 1)], 0.01)
    assert torch.equal(torch.get_rng_state(), before)  # the trials' dropout drew from a fork
    assert made == [(1, 1), (2, 1)] and set(timings) == {"1x1", "2x1"}
    assert timings[f"{split[0]}x{split[1]}"] == min(timings.values()) > 0
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))  # trained copies only
    assert pick_split(make, model, 2, [(1, 1)], 0.01) == ((1, 1), {})  # one candidate: nothing to time
    assert len(made) == 2


def test_bad_loader_settings_are_refused(arrays):
    graph = Graph(arrays, "cpu")
    with pytest.raises(UserError, match="worker_threads"):
        Pipeline("cpu_gather_workers", graph, [5], 97, seed=1, sampler_workers=1, worker_threads=0)
    with pytest.raises(UserError, match="takes the options"):
        Pipeline("cpu_gather_workers", graph, [5], 97, seed=1, options={"rows": 4})


@pytest.mark.gpu
def test_the_copy_ahead_hands_over_the_baselines_batches_on_the_gpu(arrays):
    graph = Graph(arrays, "cuda")
    baseline = list(Pipeline("cpu_gather", graph, [5, 4], 97, seed=6).batches(2))
    loader = Pipeline("cpu_gather_workers", graph, [5, 4], 97, seed=6, sampler_workers=2)
    got = []
    for batch in loader.batches(2):
        torch.cuda._sleep(20_000_000)  # training that is slow on this stream: a missing wait shows
        assert batch.x.device.type == "cuda" and batch.x.is_contiguous()
        got.append((batch.x.clone(), batch.edge_index.clone(), batch.y.clone()))
    assert len(got) == len(baseline)
    for a, (x, edge_index, y) in zip(baseline, got):
        assert torch.equal(a.x, x) and torch.equal(a.edge_index, edge_index) and torch.equal(a.y, y)
    loader.close()


@pytest.mark.parametrize("name, workers", [("cpu_gather", 0), ("cpu_gather", 1), ("cpu_gather_workers", 1)])
@pytest.mark.parametrize("changed", ["labels", "indices", "features", "train_idx"])
def test_a_graph_changed_in_place_after_the_pipeline_was_made_is_refused_not_half_seen(arrays, name, workers, changed):
    """Forked workers keep the graph as it was when they started: cpu_gather_workers trained on the
    old labels and edges while cpu_gather in-process saw the new ones, without a word."""
    graph = Graph(arrays, "cpu")
    pipeline = Pipeline(name, graph, [3, 2], 97, seed=1, sampler_workers=workers)
    try:
        list(pipeline.batches(0))
        tensor = getattr(graph, changed)
        tensor[:1] = tensor[:1].clone()  # any in-place write counts: the values may now differ
        with pytest.raises(UserError, match=rf"^pipeline {name}: the graph's {changed} changed in place since"):
            pipeline.batches(1)
    finally:
        pipeline.close()
        graph.close()
