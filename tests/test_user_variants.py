"""A user's own variants, as docs/adding_a_variant.md has them added: checked for correctness like
the suite's own before anything of them is measured."""

import numpy as np
import pytest

from harness.errors import WrongResult
from workloads.gnn.pipelines import PIPELINE_KINDS, Graph, Pipeline, PipelineKind
from workloads.gnn.pipelines.cpu_gather import gather_in_process
from workloads.gnn_training import train


def _ring(nodes: int = 40) -> Graph:
    """A ring of ``nodes`` nodes with distinct feature rows, the first half training."""
    return Graph(
        {
            "indptr": np.arange(nodes + 1),
            "indices": (np.arange(nodes) + 1) % nodes,
            "features": np.arange(nodes * 4, dtype=np.float32).reshape(nodes, 4),
            "labels": np.arange(nodes) % 2,
            "train_idx": np.arange(nodes // 2),
            "val_idx": np.arange(nodes // 2, nodes),
        },
        "cpu",
    )


def _perturbed(pipeline, sub):
    x, moved = gather_in_process(pipeline, sub)
    x = x.clone()
    x[0, 0] += 1e-3
    return x, moved


def _refused_before_timing(name: str, gather) -> None:
    """A pipeline of ``gather``, registered as ``name`` for the test, fails the check before timing."""
    PIPELINE_KINDS.register(PipelineKind(name, "baseline", gather=gather))
    try:
        with pytest.raises(WrongResult):
            train.check_rows(Pipeline(name, _ring(), [2, 2], 8, seed=0), "before")
    finally:
        PIPELINE_KINDS.unregister(name)


@pytest.fixture
def wrong_pipeline():
    name = "user_wrong_rows"
    PIPELINE_KINDS.register(PipelineKind(name, "baseline", gather=_perturbed, notes="rows slightly off"))
    yield name
    PIPELINE_KINDS.unregister(name)


@pytest.mark.parametrize("name", ["cpu_gather", "cpu_gather_workers"])
def test_the_suites_pipelines_pass_the_row_check(name):
    pipeline = Pipeline(name, _ring(), [2, 2], 8, seed=0)
    train.check_rows(pipeline, "before")


def test_a_pipeline_whose_rows_differ_is_refused_in_one_line_and_never_timed(wrong_pipeline, monkeypatch):
    monkeypatch.setattr(train, "measure_pipeline", lambda *a, **k: pytest.fail("a wrong pipeline was timed"))
    rows = []
    writer = type("Writer", (), {"add": lambda self, **row: rows.append(row)})()
    spec = type("Spec", (), {"feature_dim": 4, "classes": 2, "nodes": 40, "edges": 40})()
    shared = {
        "batch_size": 8,
        "graph_seed": 0,
        "hidden": 8,
        "sampler_workers": 0,
        "hot_cache": {"share": 0.1, "warmup_batches": 1},
        "learning_rate": 0.01,
        "loss_steps": 2,
    }
    model = {"name": "sage", "layers": 2, "fanouts": [2, 2]}
    with pytest.raises(WrongResult, match=f"pipeline '{wrong_pipeline}' gave feature rows that differ") as refused:
        train.train_case(_ring(), spec, "ring", model, wrong_pipeline, 1, writer, shared, 1, 1, "cpu")
    assert "\n" not in str(refused.value) and not rows


def test_rows_that_go_wrong_after_timing_are_refused_too(wrong_pipeline):
    pipeline = Pipeline(wrong_pipeline, _ring(), [2, 2], 8, seed=0)
    with pytest.raises(WrongResult, match=r"\(after timing\)"):
        train.check_rows(pipeline, "after")


def test_the_check_reads_every_row_of_a_batch_not_only_the_seeds():
    """A pipeline that gets the seeds' rows right and their neighbours' wrong is refused."""

    def neighbours_off(pipeline, sub):
        x, moved = gather_in_process(pipeline, sub)
        x = x.clone()
        x[sub.batch_size :] += 1
        return x, moved

    _refused_before_timing("user_neighbours_off", neighbours_off)


def test_the_check_leaves_no_count_in_the_first_epochs_metrics(monkeypatch):
    counted = {"calls": 0}

    def metrics(pipeline):
        counted["calls"] += 1
        return {}

    PIPELINE_KINDS.register(PipelineKind("user_counting", "baseline", gather=gather_in_process, epoch_metrics=metrics))
    try:
        train.check_rows(Pipeline("user_counting", _ring(), [2, 2], 8, seed=0), "before")
    finally:
        PIPELINE_KINDS.unregister("user_counting")
    assert counted["calls"] == 1  # read once after the check: its counts are dropped


def test_figures_name_a_users_entry_by_the_label_it_registers():
    """llm_offload's figure did; feature_gather's, relational_gnn's and the GNN figures showed the
    bare name, whatever label the entry gave."""
    from analysis import style
    from analysis.doc_tables.gnn_training import pipeline_label
    from harness.registry import Registry
    from systems.pytorch_direct.gather_variants import GatherVariant

    gathers = Registry("gather variant")
    gathers.register(GatherVariant("user_sorted", "optimized", label="my sorted gather", make=lambda b: None))
    style.entry_labels(gathers)
    assert style.readable("user_sorted") == "my sorted gather"
    assert style.readable("cpu_gather") == style.READABLE["cpu_gather"]  # the suite's own words stay
    PIPELINE_KINDS.register(PipelineKind("user_labelled", "baseline", label="my plain gather", gather=_perturbed))
    try:
        assert pipeline_label("user_labelled") == "my plain gather"
    finally:
        PIPELINE_KINDS.unregister("user_labelled")


def test_the_check_leaves_no_id_map_on_the_training_thread():
    """The sampler keeps an id map of every node per sampling thread (on the GPU where it samples
    there): one the check left on the training thread would stay through the timed epochs of a
    pipeline that samples on its prefetch thread, and count in their GPU memory peak."""
    pipeline = Pipeline("cpu_gather", _ring(), [2, 2], 8, seed=0)
    train.check_rows(pipeline, "before")
    assert getattr(pipeline.sampler._per_thread, "position", None) is None
    made = pipeline.sampler.position  # one the training thread made itself (a cache's fill) is kept
    train.check_rows(pipeline, "after")
    assert pipeline.sampler.position is made


def test_rows_of_another_type_are_refused_even_where_their_values_are_equal():
    def half_rows(pipeline, sub):
        x, moved = gather_in_process(pipeline, sub)
        return x.half(), moved  # the ring's values are whole numbers, exact in float16

    _refused_before_timing("user_half_rows", half_rows)


@pytest.mark.parametrize(
    "gather, got",
    [
        (lambda pipeline, sub: gather_in_process(pipeline, sub)[0], "Tensor"),  # the rows alone
        (lambda pipeline, sub: (*gather_in_process(pipeline, sub), 0), "a tuple of 3"),
        (lambda pipeline, sub: None, "NoneType"),
    ],
    ids=["rows alone", "three items", "none"],
)
def test_a_gather_that_returns_no_pair_is_refused_in_one_line_naming_the_pipeline(gather, got):
    """Unpacked as it came, the rows of a batch of two nodes would pass for the pair."""
    from harness.errors import UserError

    PIPELINE_KINDS.register(PipelineKind("user_no_pair", "baseline", gather=gather))
    try:
        with pytest.raises(UserError, match=rf"^pipeline user_no_pair: gather\(pipeline, item\) returned {got};"):
            train.check_rows(Pipeline("user_no_pair", _ring(), [2, 2], 8, seed=0), "before")
    finally:
        PIPELINE_KINDS.unregister("user_no_pair")
