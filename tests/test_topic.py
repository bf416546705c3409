"""Topic declarations (harness/topic.py): which parts run where, and the refusals."""

import pytest

from harness.errors import UserError
from harness.results import Schema
from harness.topic import Part, Topic, discover

SCHEMA = Schema(topic="demo", config={})


def demo(*parts, technique=None, **kw):
    return Topic(name="demo", title="Demo", technique=technique, schema=SCHEMA, parts=parts, **kw)


def test_parts_run_by_gpu_count():
    topic = demo(Part("cpu_and_gpu"), Part("gpu_only", cpu=False), Part("two_gpus", gpus=2), Part("host", gpus=0))
    names = lambda gpus: [p.name for p in topic.parts_on(gpus)]  # noqa: E731
    assert names(0) == ["cpu_and_gpu", "two_gpus", "host"]
    assert names(1) == ["cpu_and_gpu", "gpu_only", "host"]
    assert names(2) == ["cpu_and_gpu", "gpu_only", "two_gpus", "host"]
    assert topic.part("two_gpus").gpus_held(0) == 0 and topic.part("two_gpus").gpus_held(4) == 2


def test_a_part_that_needs_more_cores_than_the_process_may_use_does_not_run(monkeypatch, tmp_path):
    from harness import entry, machine

    monkeypatch.setattr(machine, "usable_cores", lambda: 4)
    topic = demo(Part("four", cores=4), Part("eight", cores=8, cpu=False))
    assert [p.name for p in topic.parts_on(0)] == ["four"] and [p.name for p in topic.parts_on(1)] == ["four"]
    from workloads.gnn_training import TOPIC as GNN

    out = tmp_path / "papers_8_cores-tiny.csv"
    monkeypatch.setattr(machine, "gpu_count", lambda: 0)
    with pytest.raises(UserError, match="needs 1 CUDA GPU"):  # on a machine without one: the GPU it lacks
        entry.measure(GNN, "papers_8_cores", "tiny", out, entry.suite_config.DEFAULT_CONFIG)
    monkeypatch.setattr(machine, "gpu_count", lambda: 1)
    with pytest.raises(UserError, match="part 'papers_8_cores' runs on 8 CPU cores and this process may use 4"):
        entry.measure(GNN, "papers_8_cores", "tiny", out, entry.suite_config.DEFAULT_CONFIG)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: demo(), "non-empty list of distinct names"),
        (lambda: demo(Part("a"), Part("a")), "distinct names"),
        (lambda: demo(Part("a"), technique="magic"), "technique must be one of"),
        (lambda: Topic(name="other", title="", technique=None, schema=SCHEMA, parts=(Part("a"),)), "declared for"),
        (lambda: demo(Part("a"), reads=("demo",)), "lists itself in reads"),
        (lambda: demo(Part("Part-1")), "need names of"),
        (lambda: demo(Part("a", gpus=-1)), "gpus >= 0"),
        (lambda: demo(Part("a", cores=0)), "cores >= 1"),
    ]
    + [
        (
            lambda name=name: Topic(
                name=name, title="", technique=None, schema=Schema(topic=name, config={}), parts=(Part("a"),)
            ),
            "the workflow uses them",
        )
        for name in ("measure", "figures", "items", "ceilings_figure", "Bad-Name")
    ],
)
def test_malformed_declarations_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_unknown_part_names_the_known_ones():
    with pytest.raises(UserError, match="topic demo has no part 'c'; its parts: a, b"):
        demo(Part("a"), Part("b")).part("c")


def test_every_shipped_topic_has_a_measuring_function_per_part_and_its_files():
    topics = discover()
    assert {"ceilings", "feature_gather", "gnn_training", "gnn_multi_gpu"} <= set(topics)
    for topic in topics.values():
        for part in topic.parts:
            assert callable(topic.measure_function(part.name)), (topic.name, part.name)
        for path in (topic.config_file, topic.schema_file):
            assert path.exists(), path
        for relative in (topic.notebook, topic.caption):
            assert (topic.config_file.parent.parent / relative).exists(), relative


def test_a_part_without_a_block_at_a_scale_is_not_measured_there(monkeypatch, tmp_path):
    """A topic that gives its parts blocks measures at a scale only the parts listed there (a GPU
    part left out of the small scales): planned by no workflow, refused in one line by the entry,
    never run without its parameters (relational_gnn's gemm_template at scale cpu on a GPU machine
    failed with KeyError: 'cases'). A topic that configures its parts in common runs them all."""
    from harness import config as suite_config
    from harness import entry, machine
    from workloads.gnn_multi_gpu import TOPIC as MULTI
    from workloads.relational_gnn import TOPIC as RGNN

    config = suite_config.load()
    assert suite_config.part_configured(config, RGNN, "h200", "gemm_template")
    assert not suite_config.part_configured(config, RGNN, "cpu", "gemm_template")
    assert suite_config.part_configured(config, RGNN, "cpu", "datasets")
    assert all(suite_config.part_configured(config, MULTI, "cpu", p.name) for p in MULTI.parts)
    monkeypatch.setattr(machine, "gpu_count", lambda: 1)
    with pytest.raises(UserError, match="part 'gemm_template' is not measured at scale 'cpu': config/relational"):
        entry.measure(RGNN, "gemm_template", "cpu", tmp_path / "gemm_template-cpu.csv", suite_config.DEFAULT_CONFIG)
    # The parts listed for a scale are the ones measured there, as the workflow plans them.
    listed = entry.listed_parts(RGNN, "cpu", suite_config.DEFAULT_CONFIG)
    assert "datasets" in listed and "gemm_template" not in listed
    assert "gemm_template" in entry.listed_parts(RGNN, None, suite_config.DEFAULT_CONFIG)  # this machine's parts
    with pytest.raises(UserError, match="unknown scale 'huge'"):
        entry.listed_parts(RGNN, "huge", suite_config.DEFAULT_CONFIG)
