"""The label every figure and summary carries: where it was measured, and which of its topic's
parts were not (analysis/common.py)."""

import pytest

from analysis.common import machine_label, parts_not_measured
from harness import config as suite_config
from harness.topic import discover

TOPICS = discover()


def record(topic, part, scale="cpu", gpus=0, **extra):
    return {
        "topic": topic,
        "part": part,
        "scale": scale,
        "date_utc": "2026-12-01T00:00:00",
        "git": {"commit": "0123456789abcdef", "dirty": False},
        "packages": {"torch": "2.0"},
        "machine": {
            "gpus": [{"name": "GPU", "driver": "1"}] * gpus,
            "cpu_model": "CPU",
            "usable_cpus": 2,
        },
        **extra,
    }


def configured(topic, scale, gpus):
    config = suite_config.load()
    return [
        p.name
        for p in TOPICS[topic].parts_on(gpus)
        if suite_config.part_configured(config, TOPICS[topic], scale, p.name)
    ]


@pytest.mark.parametrize("topic, scale, gpus", [("llm_offload", "cpu", 0), ("relational_gnn", "h200", 1)])
def test_the_parts_without_a_record_are_named_in_the_configs_order(topic, scale, gpus):
    parts = configured(topic, scale, gpus)
    assert len(parts) >= 3
    measured = [record(topic, part, scale, gpus) for part in parts[1::2]]
    assert parts_not_measured(measured) == parts[0::2]
    label = machine_label(measured)
    assert label.endswith(f"; not measured: {', '.join(parts[0::2])}")
    assert "not measured" not in machine_label(measured, missing_parts=False)
    every = [record(topic, part, scale, gpus) for part in parts]
    assert parts_not_measured(every) == [] and "not measured" not in machine_label(every)


def test_a_gpu_part_is_not_missing_from_a_machine_without_a_gpu():
    gpu_only = set(configured("llm_offload", "h200", 1)) - set(configured("llm_offload", "h200", 0))
    assert gpu_only  # the check means something only if the topic has GPU-only parts
    assert not gpu_only & set(parts_not_measured([record("llm_offload", "policies", "h200", 0)]))


@pytest.mark.parametrize(
    "records",
    [
        [record("llm_offload", "policies"), record("ceilings", "disk")],  # a table reading several topics
        [record("llm_offload", "policies", scale="mine")],  # a scale of another config
        [record("no_such_topic", "policies")],  # another code's topic
        [{key: value for key, value in record("ceilings", "disk").items() if key != "part"}],  # too old to say
    ],
    ids=["several_topics", "unknown_scale", "unknown_topic", "no_part"],
)
def test_nothing_is_called_missing_where_the_records_cannot_say(records):
    assert parts_not_measured(records) == []
    assert "not measured" not in machine_label(records)
