"""The label every figure and summary carries: where it was measured, and which of its topic's
parts were not (analysis/common.py)."""

import gzip
import json
import shutil
from pathlib import Path

import pytest

from analysis.common import lacking, load_results, machine_label, parts_not_measured, same_code_reruns
from harness import config as suite_config
from harness.errors import UserError
from harness.topic import discover
from workloads.gnn_training.schema import SCHEMA as GNN_SCHEMA

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


def test_the_parts_missing_are_those_the_measuring_machines_cores_run_not_the_readers(monkeypatch):
    """A 16-core machine runs the 8-core CPU-budget parts: a figure of its results names them as
    missing wherever it is drawn (here on a reader with 2 cores); a 2-core machine's do not."""
    from harness import machine

    monkeypatch.setattr(machine, "usable_cores", lambda: 2)
    wide = [
        record(
            "gnn_training",
            "products",
            "h200",
            1,
            machine={"gpus": [{"name": "GPU", "driver": "1"}], "cpu_model": "CPU", "usable_cpus": 16},
        )
    ]
    assert {"products_4_cores", "products_8_cores", "papers_8_cores"} <= set(parts_not_measured(wide))
    narrow = [record("gnn_training", "products", "h200", 1)]  # usable_cpus 2
    assert not {"products_4_cores", "products_8_cores"} & set(parts_not_measured(narrow))
    assert "products_2_cores" in parts_not_measured(narrow)


def test_the_parts_missing_are_those_of_the_config_the_run_was_given(tmp_path, monkeypatch):
    """A workflow run with its own config (a part left out at a scale) labels its figures against
    that config: the part it does not measure is not called missing."""
    import yaml

    import analysis.common as common

    parts = configured("relational_gnn", "h200", 1)
    dropped = "width_sweep"  # a part the topic's schema does not require
    assert dropped in parts
    config = suite_config.load()
    config["topics"]["relational_gnn"]["h200"].pop(dropped)
    own = tmp_path / "mine.yaml"
    own.write_text(yaml.safe_dump(config))
    measured = [record("relational_gnn", part, "h200", 1) for part in parts if part not in (dropped, "datasets")]
    assert parts_not_measured(measured) == [p for p in parts if p in ("datasets", dropped)]  # the default config's
    monkeypatch.setenv(suite_config.CONFIG_FILE_VARIABLE, str(own))
    common._suite_config.cache_clear()
    try:
        assert parts_not_measured(measured) == ["datasets"]
    finally:
        monkeypatch.undo()
        common._suite_config.cache_clear()


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


# -- files whose record does not match them -------------------------------------------------------
COMMITTED = Path(__file__).resolve().parents[1] / "results" / "h200" / "gnn_training"


def copy_part(folder: Path, name: str, source: str = "reddit-h200", record_of: Path | None = None) -> Path:
    """A copy of a committed results file named ``name`` (and its record, or ``record_of``'s)."""
    committed = COMMITTED / f"{source}.csv.gz"  # results are committed compressed
    csv = folder / f"{name}.csv"
    csv.write_bytes(gzip.decompress(committed.read_bytes()))
    shutil.copy(record_of or COMMITTED / f"{source}.provenance.json", folder / f"{name}.provenance.json")
    return csv


def test_a_copy_of_a_part_under_another_name_is_refused_naming_it(tmp_path):
    csv = copy_part(tmp_path, "reddit_old-h200")
    with pytest.raises(
        UserError, match=r"reddit_old-h200.csv: its provenance record is of part reddit, not reddit_old"
    ):
        load_results([str(csv)], GNN_SCHEMA)


def test_a_record_of_another_topic_is_refused_naming_it(tmp_path):
    ceilings = COMMITTED.parent / "ceilings" / "matmul-h200.provenance.json"
    csv = copy_part(tmp_path, "reddit-h200", record_of=ceilings)
    with pytest.raises(
        UserError, match=r"reddit-h200.csv: its provenance record is of topic ceilings, not gnn_training"
    ):
        load_results([str(csv)], GNN_SCHEMA)


def test_a_rerun_on_other_hardware_is_not_a_process_of_this_machine(tmp_path):
    committed = copy_part(tmp_path, "reddit-h200")
    same, other = (tmp_path / "reruns" / run for run in ("run2", "run3"))
    for folder in (same, other):
        folder.mkdir(parents=True)
        csv = copy_part(folder, "reddit-h200")
        rows = csv.read_text().splitlines(keepends=True)
        csv.write_text("".join(rows[:-1] if folder is same else rows[:-2]))  # other processes: other rows
    record = other / "reddit-h200.provenance.json"
    changed = json.loads(record.read_text())
    changed["machine"]["gpus"] = [{"name": "NVIDIA A100-SXM4-80GB", "driver": "550.1", "memory_mib": 81920}]
    record.write_text(json.dumps(changed))
    kept, left_out = same_code_reruns(
        [str(same / "reddit-h200.csv"), str(record.with_name("reddit-h200.csv"))], [str(committed)]
    )
    assert kept == [str(same / "reddit-h200.csv")] and left_out == [str(other / "reddit-h200.csv")]
    label = machine_label([json.loads((same / "reddit-h200.provenance.json").read_text()), changed])
    assert label.startswith("MIXED MACHINES: NVIDIA H200") and "| NVIDIA A100-SXM4-80GB (driver 550.1);" in label


def test_a_loaded_machine_is_named_on_the_label_with_the_largest_share():
    quiet = record("llm_offload", "policies", cpu_share_of_other_processes=0.04)
    loaded = record("llm_offload", "models", cpu_share_of_other_processes=0.37)
    assert "LOADED" not in machine_label([quiet, record("llm_offload", "stores")], missing_parts=False)
    label = machine_label([quiet, loaded], missing_parts=False)
    assert label.endswith("; LOADED MACHINE: other processes used up to 37% of its CPU time while measuring")


def test_a_group_lacking_a_competitor_is_found_wherever_its_key_holds_the_graph():
    """Claims key groups (dataset, model, layers, fanouts): the graph first. Products measured the
    worker baseline, reddit did not: reddit is the group measured against a slower field, whatever
    the last item of the key is."""
    tried = {
        ("products", "sage", 2, "15,10"): {"cpu_gather", "cpu_gather_workers"},
        ("reddit", "sage", 2, "15,10"): {"cpu_gather"},
        ("reddit", "sage", 2, "25,10"): {"cpu_gather"},  # no sibling of another graph: nothing lacks
    }
    assert lacking(tried, graph=0) == {("reddit", "sage", 2, "15,10"): frozenset({"cpu_gather_workers"})}
    # Read with the last item as the graph, the two reddit groups would be siblings and none would lack.
    assert lacking(tried) == {}


def test_a_fresh_rerun_beside_a_compressed_committed_file_is_a_process_of_the_same_part(tmp_path):
    """Committed results are kept compressed (``X.csv.gz``), a re-run is written as ``X.csv``:
    the two are one part, and a re-run of the same code counts."""
    record = Path(__file__).parents[1] / "results" / "h100" / "relational_gnn" / "shapes-h200.provenance.json"
    rerun = tmp_path / "reruns" / "run2"
    rerun.mkdir(parents=True)
    for folder in (tmp_path, rerun):
        shutil.copy(record, folder / record.name)
    committed, fresh = tmp_path / "shapes-h200.csv.gz", rerun / "shapes-h200.csv"
    assert same_code_reruns([str(fresh)], [str(committed)]) == ([str(fresh)], [])
    shutil.copy(record, tmp_path / "datasets-h200.provenance.json")  # another part: no match
    assert same_code_reruns([str(fresh)], [str(tmp_path / "datasets-h200.csv.gz")]) == ([], [str(fresh)])


def test_a_copied_rerun_is_refused_not_counted_as_another_process(tmp_path):
    """A copy of the committed file (or of another re-run) in reruns/runN would make a range and an
    "in every process" count one process twice."""
    part = Path(__file__).parents[1] / "results" / "h100" / "relational_gnn"
    committed = tmp_path / "shapes-h200.csv.gz"
    for name in ("shapes-h200.csv.gz", "shapes-h200.provenance.json"):
        shutil.copy(part / name, tmp_path / name)
    runs = []
    for n, source in ((2, part / "reruns" / "run2"), (3, part / "reruns" / "run3")):
        folder = tmp_path / "reruns" / f"run{n}"
        folder.mkdir(parents=True)
        for name in ("shapes-h200.csv.gz", "shapes-h200.provenance.json"):
            shutil.copy(source / name, folder / name)
        runs.append(str(folder / "shapes-h200.csv.gz"))
    assert same_code_reruns(runs, [str(committed)]) == (runs, [])  # three processes
    copy = tmp_path / "reruns" / "run4"
    copy.mkdir()
    for name in ("shapes-h200.csv.gz", "shapes-h200.provenance.json"):
        shutil.copy(tmp_path / "reruns" / "run2" / name, copy / name)
    with pytest.raises(
        UserError, match=r"run4/shapes-h200\.csv\.gz holds the same rows as .*run2/shapes-h200\.csv\.gz"
    ):
        same_code_reruns([*runs, str(copy / "shapes-h200.csv.gz")], [str(committed)])
    # A copy of the committed file is refused too.
    for name in ("shapes-h200.csv.gz", "shapes-h200.provenance.json"):
        shutil.copy(tmp_path / name, copy / name)
    with pytest.raises(UserError, match=r"run4/shapes-h200\.csv\.gz holds the same rows as [^ ]*/shapes-h200\.csv\.gz"):
        same_code_reruns([*runs, str(copy / "shapes-h200.csv.gz")], [str(committed)])
    # The same rows from another process (another record date: a seeded curve without timings) count.
    record = json.loads((copy / "shapes-h200.provenance.json").read_text())
    record["date_utc"] = "2030-01-01T00:00:00+00:00"
    (copy / "shapes-h200.provenance.json").write_text(json.dumps(record))
    kept, _ = same_code_reruns([*runs, str(copy / "shapes-h200.csv.gz")], [str(committed)])
    assert kept[-1] == str(copy / "shapes-h200.csv.gz")


def test_a_rerun_with_other_parameters_is_not_a_process_of_the_same_measurement(tmp_path):
    """The digest covers the config file, not a run's overrides of it: a re-run at repeat 9 and
    warm-up 0 (or another seed) counted as another process of the same measurement."""
    record = Path(__file__).parents[1] / "results" / "h100" / "relational_gnn" / "shapes-h200.provenance.json"
    rerun = tmp_path / "reruns" / "run2"
    rerun.mkdir(parents=True)
    shutil.copy(record, tmp_path / record.name)
    changed = json.loads(record.read_text())
    changed["shared_parameters"] = {**changed.get("shared_parameters", {}), "repeat": 9, "warmup": 0}
    (rerun / record.name).write_text(json.dumps(changed))
    committed, fresh = tmp_path / "shapes-h200.csv.gz", rerun / "shapes-h200.csv"
    assert same_code_reruns([str(fresh)], [str(committed)]) == ([], [str(fresh)])
