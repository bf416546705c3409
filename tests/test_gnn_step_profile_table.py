"""The committed step profile (tools/gnn_step_profile.py) as the table of docs/gnn_training.md
(analysis/doc_tables/gnn_training.py): "not measured" without a profile; with one, a line per
model, pipeline and form in the suite's order, each step judged GPU-bound, waiting or launch-bound;
a profile whose rows were edited after its record was written is refused."""

import csv
import random

import pytest

import analysis.doc_tables as doc_tables
import analysis.doc_tables.gnn_training as tables
from harness.errors import UserError
from tools.gnn_step_profile import COLUMNS, write_with_record

NAME = "gnn_training-h200-step_profile"
RECORD = {  # what load_provenance asks of a record (the tool writes harness.provenance.collect's)
    "scale": "h200",
    "date_utc": "2025-01-01T00:00:00+00:00",
    "git": {"commit": "0123456789abcdef0123456789abcdef01234567", "dirty": False},
    "machine": {"cpu_model": "test", "usable_cpus": 16, "gpus": [{"name": "test"}]},
    "packages": {},
}


@pytest.fixture
def repository(tmp_path, monkeypatch):
    """An empty results tree in place of the repository's."""
    for module in (doc_tables, tables):
        monkeypatch.setattr(module, "REPO_ROOT", tmp_path)
    return tmp_path


def profile_row(model, pipeline, form, wall, busy, batch=0.0, host_wait=0.0, rng=None, **extra):
    """A row as the tool writes it: the given times (ms), the rest random."""
    rng = rng or random.Random(0)
    idle = round(max(wall - busy, 0) * rng.uniform(0.5, 1.0), 3)
    numbers = {
        "steps": 5,
        "wall_ms": wall,
        "batch_ms": batch,
        "kernel_ms": round(busy * rng.uniform(1.0, 1.2), 3),
        "kernels": rng.randint(50, 500),
        "launches": rng.randint(50, 500),
        "memcpy_ms": round(rng.uniform(0, 0.1), 3),
        "memcpys": rng.randint(1, 9),
        "gpu_busy_ms": busy,
        "gpu_idle_ms": idle,
        "largest_gap_ms": round(idle * rng.uniform(0.1, 0.9), 3),
        "host_waits": rng.randint(0, 3),
        "host_wait_ms": host_wait,
        "warmup_s": round(rng.uniform(0.5, 60), 1),
        "setups_in_profile": 0,
        "note": "",
    }
    return {"dataset": "ogbn-products-like", "model": model, "pipeline": pipeline, "form": form} | numbers | extra


def test_without_a_committed_profile_the_table_reads_not_measured(repository):
    body = doc_tables.render(NAME)
    assert "| SAGE 2, GAT 2 | every pipeline | every form | not measured |" in body
    assert body.endswith("Source: none yet (`tools/gnn_step_profile.py` has not run on the H200).")


def test_a_committed_profile_is_a_line_per_model_pipeline_and_form_with_what_bounds_each_step(repository):
    rng = random.Random(4)
    # Written out of order: the table lists SAGE first, pipelines and forms in the suite's orders.
    rows = [
        profile_row("gat2", "all_in_gpu", "cuda_graph", 4.1, 3.6, rng=rng),  # 88% busy: GPU-bound
        profile_row("sage2", "zero_copy_overlap", "eager", 6.0, 1.2, rng=rng),  # idle, host issuing: launch-bound
        profile_row("sage2", "all_in_gpu", "compiled", 3.0, 1.8, rng=rng),  # 60% busy: partly launch-bound
        profile_row("sage2", "cpu_gather", "eager", 9.0, 1.5, batch=6.0, rng=rng),  # waits for its batch
        profile_row("sage2", "all_in_gpu", "eager", 5.0, 2.0, host_wait=2.5, rng=rng),  # waits for the GPU
        profile_row("sage2", "all_in_gpu", "cuda_graph", 2.2, 1.9, rng=rng, setups_in_profile=1),
        {"dataset": "ogbn-products-like", "model": "gat2", "pipeline": "all_in_gpu", "form": "compiled", "steps": 0}
        | {"note": "compiled: GAT does not compile"},
    ]
    path = repository / "results" / "h200" / "gnn_training" / "step_profile" / "products-h200.csv"
    write_with_record(rows, path, RECORD)
    assert tuple(next(csv.reader(path.open()))) == COLUMNS
    body = doc_tables.render(NAME)
    lines = [line for line in body.splitlines() if line.startswith("| SAGE") or line.startswith("| GAT")]
    keys = [tuple(cell.strip() for cell in line.split("|")[1:4]) for line in lines]
    assert keys == [
        ("SAGE 2", "cpu_gather", "eager"),
        ("SAGE 2", "zero_copy_overlap", "eager"),
        ("SAGE 2", "all_in_gpu", "eager"),
        ("SAGE 2", "all_in_gpu", "compiled"),
        ("SAGE 2", "all_in_gpu", "cuda_graph"),
        ("GAT 2", "all_in_gpu", "compiled"),
        ("GAT 2", "all_in_gpu", "cuda_graph"),
    ]
    bounds = [line.rstrip(" |").rsplit("| ", 1)[1] for line in lines]
    assert bounds == [
        "waits for its batch",
        "launch-bound",
        "waits for the GPU",
        "partly launch-bound",
        "GPU-bound (1 compiles or captures in the profiled steps: not steady state)",
        "failed: compiled: GAT does not compile",
        "GPU-bound",
    ]
    launch_bound = lines[1].split("|")
    eager_row = rows[1]
    assert launch_bound[4].strip() == f"{eager_row['wall_ms']:.2f}" and launch_bound[9].strip() == str(
        eager_row["launches"]
    )
    assert (
        "Source: `results/h200/gnn_training/step_profile/products-h200.csv` (commit `0123456`); scale `h200`." in body
    )


def test_a_profile_edited_after_its_record_or_without_one_is_refused_in_one_line(repository):
    path = repository / "results" / "h200" / "gnn_training" / "step_profile" / "products-h200.csv"
    write_with_record([profile_row("sage2", "all_in_gpu", "eager", 3.0, 1.0)], path, RECORD)
    path.write_text(path.read_text().replace(",3.0,", ",2.0,"))
    with pytest.raises(UserError, match=r"products-h200.csv: its rows are not those its provenance record was written"):
        doc_tables.render(NAME)
    (path.parent / "products-h200.provenance.json").unlink()
    with pytest.raises(UserError, match="no provenance record beside it"):
        doc_tables.render(NAME)
