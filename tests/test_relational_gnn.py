"""relational_gnn: both parts end to end at the tiny scale (every model, form and mode, validated
results, graph statistics in the notes), a form that disagrees refused before anything is timed,
an out-of-memory recorded as an outcome with the failed allocation, and the CPU's limit on
per-edge weights."""

import pytest
import torch

from harness.entry import main as entry
from harness.errors import UserError
from harness.results import load, load_provenance
from systems.hector.forms import TENSOR_CORE_VARIANTS, VARIANTS, HectorForm
from workloads.relational_gnn import parts
from workloads.relational_gnn.schema import SCHEMA
from workloads.rgnn import hgt, rgat, rgcn

HERE = set(VARIANTS) if torch.cuda.is_available() else set(VARIANTS) - TENSOR_CORE_VARIANTS  # tensor cores: GPUs
FORMS = {name: set(module.FORMS) | HERE for name, module in {"rgcn": rgcn, "rgat": rgat, "hgt": hgt}.items()}


def run(part, out):
    entry(["relational_gnn", "--part", part, "--scale", "tiny", "--out", str(out)])
    return load([out], SCHEMA), load_provenance(out)


@pytest.mark.parametrize(
    "part, dataset, models, modes",
    [
        ("knowledge_graphs", "nations", set(FORMS), {"inference", "training"}),
        ("datasets", "aifb-like-0.05", set(FORMS), {"inference", "training"}),
        ("large_datasets", "am-like-0.002", {"rgcn"}, {"inference"}),
    ],
)
def test_every_model_form_and_mode_is_timed(part, dataset, models, modes, tmp_path):
    frame, notes = run(part, tmp_path / f"{part}-tiny.csv")
    assert set(frame.dataset) == {dataset} and set(frame.role) == {"baseline", "optimized"}
    # Hector's, beside the baselines; the tensor-core variant only on GPU machines, with the reason
    assert set(frame[frame.role == "optimized"].variant) == HERE
    if not torch.cuda.is_available():
        assert any(name.startswith("hector_best_tf32") for name in notes["skipped"])
    times = frame[frame.metric == "time"]
    assert set(times.model) == models
    for model in models:
        rows = times[times.model == model]
        assert set(rows.variant) == FORMS[model], model
        assert (rows.groupby(["variant", "mode"]).size() == 3).all()  # repeat: 3 per mode
        assert set(rows["mode"]) == modes
    assert (times.value > 0).all()
    stats = notes["graphs"][dataset]
    assert 0 < stats["unique_pairs"] <= stats["edges"] == int(frame.edges.iloc[0])
    assert not (frame.metric == "out_of_memory").any()
    for metric in ("breakdown_time", "breakdown_bytes"):
        split = frame[frame.metric == metric]
        assert set(split.kernel_class) == {"gemm", "aggregation", "gather_scatter", "elementwise", "other"}
        assert (split.groupby(["model", "variant", "mode"]).size() == 5).all() and (split.value >= 0).all()
        assert (split.groupby(["model", "variant", "mode"]).value.sum() > 0).all(), metric


def test_a_form_that_disagrees_is_refused_before_timing(tmp_path, monkeypatch):
    real = rgcn.PerEdge.forward
    monkeypatch.setattr(rgcn.PerEdge, "forward", lambda self, x: real(self, x) * 1.01)
    monkeypatch.setattr(parts, "measure", lambda *a, **k: pytest.fail("timed before every form was checked"))
    out = tmp_path / "knowledge_graphs-tiny.csv"
    with pytest.raises(parts.FormsDisagree, match="rgcn per_edge on nations at 8: differs from segment_mm"):
        run("knowledge_graphs", out)
    assert not out.exists()


def test_a_hector_variant_that_disagrees_is_refused_before_timing(tmp_path, monkeypatch):
    real = HectorForm.__call__
    monkeypatch.setattr(HectorForm, "__call__", lambda self, x: real(self, x) * (1.01 if self.model == "rgcn" else 1))
    monkeypatch.setattr(parts, "measure", lambda *a, **k: pytest.fail("timed before every form was checked"))
    with pytest.raises(parts.FormsDisagree, match="rgcn hector_unopt on nations at 8: differs from segment_mm"):
        run("knowledge_graphs", tmp_path / "knowledge_graphs-tiny.csv")


def test_out_of_memory_is_an_outcome_with_the_failed_allocation(tmp_path, monkeypatch):
    def too_big(self, x):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 86.50 GiB. GPU 0 has ...")

    monkeypatch.setattr(rgat.PerEdge, "forward", too_big)
    frame, _ = run("knowledge_graphs", tmp_path / "knowledge_graphs-tiny.csv")
    gone = frame[(frame.model == "rgat") & (frame.variant == "per_edge")]
    assert set(gone.metric) == {"out_of_memory", "failed_allocation_bytes"}
    assert set(gone["mode"]) == {"inference", "training"}
    assert (gone[gone.metric == "failed_allocation_bytes"].value == 86.5 * 2**30).all()
    assert (frame[(frame.model == "rgat") & (frame.variant == "pyg")].metric == "time").any()


def test_per_edge_weights_over_the_cpu_limit_are_not_attempted(tmp_path, monkeypatch):
    params = {
        "seed": 0,
        "graphs": ["nations"],
        "models": ["rgcn"],
        "dims": [8],
        "modes": ["inference"],
        "cpu_materialize_limit_gib": 1e-6,  # ~1 KiB: nations' 1992 edges x 8 x 8 floats do not fit
        "variants": ["hector_best"],
    }
    writer = parts_writer()
    notes = parts.knowledge_graphs(params, writer, repeat=1, warmup=0, device="cpu")
    timed = {row["variant"] for row in writer.rows if row["metric"] == "time"}
    assert timed == {"pyg", "segment_mm", "grouped_mm", "hector_best"}
    assert set(notes["skipped"]) == {"dgl", "rgcn pyg_fast on nations at 8", "rgcn per_edge on nations at 8"}
    assert "dgl does not import here (ModuleNotFoundError" in notes["skipped"]["dgl"]  # not in the requirements
    assert "would gather 0.00095 GiB of per-edge weights" in notes["skipped"]["rgcn per_edge on nations at 8"]


def parts_writer():
    from harness.results import ResultsWriter

    return ResultsWriter(SCHEMA, scale="tiny")


def test_a_published_dataset_is_read_from_its_files(tmp_path):
    """The opt-in loader on a tiny fixture in FB15k-237's format: three tab-separated files."""
    folder = tmp_path / "fb15k-237"
    folder.mkdir()
    rows = {
        "train": ["/m/a\t/r/x\t/m/b", "/m/b\t/r/y\t/m/c", "/m/c\t/r/x\t/m/a"],
        "valid": ["/m/a\t/r/y\t/m/c"],
        "test": ["/m/b\t/r/x\t/m/a", "/m/b\t/r/x\t/m/c", ""],  # (b, x) twice: 6 edges, 5 pairs
    }
    for split, lines in rows.items():
        (folder / f"{split}.txt").write_text("\n".join(lines) + "\n")
    params = {
        "seed": 0,
        "graph_seed": 0,
        "datasets": [{"name": "fb15k", "scale_factor": 1.0, "published_dir": str(folder)}],
        "models": ["rgcn"],
        "dims": [4],
        "modes": ["inference"],
        "cpu_materialize_limit_gib": 1,
    }
    writer = parts_writer()
    notes = parts.datasets(params, writer, repeat=1, warmup=0, device="cpu")
    assert notes["graphs"]["fb15k"] == {"nodes": 3, "edges": 6, "relations": 2, "unique_pairs": 5}
    assert {row["dataset"] for row in writer.rows} == {"fb15k"}
    (folder / "valid.txt").write_text("/m/a\t/r/y\n")
    with pytest.raises(UserError, match=r"valid.txt:1: expected head, relation and tail separated by tabs"):
        parts.datasets(params, parts_writer(), repeat=1, warmup=0, device="cpu")
    (folder / "valid.txt").unlink()
    with pytest.raises(UserError, match="valid.txt: missing"):
        parts.datasets(params, parts_writer(), repeat=1, warmup=0, device="cpu")
    params["datasets"] = [{"name": "am", "scale_factor": 1.0, "published_dir": str(folder)}]
    with pytest.raises(UserError, match="no .nt or .nt.gz files"):
        parts.datasets(params, parts_writer(), repeat=1, warmup=0, device="cpu")
    params["datasets"] = [{"name": "am", "scale_factor": 1.0, "published_dir": str(tmp_path / "nowhere")}]
    with pytest.raises(UserError, match="am: published_dir .*nowhere is not a folder"):
        parts.datasets(params, parts_writer(), repeat=1, warmup=0, device="cpu")


def test_rdf_datasets_are_read_from_n_triples(tmp_path):
    """aifb, mutag, bgs and am as N-Triples: IRIs, a blank node, literals (typed and tagged),
    rdf:type giving node types, plain and gzipped files."""
    import gzip

    from workloads.graphs.published_heterographs import ntriples

    rdf_type = "<http://www.w3.org/1999/02/22-rdf-syntax-ns#type>"
    (tmp_path / "a.nt").write_text(
        "# a comment\n"
        f"<http://x/alice> {rdf_type} <http://x/Person> .\n"
        "<http://x/alice> <http://x/knows> <http://x/bob> .\n"
        '<http://x/bob> <http://x/name> "Bob \\"B\\" Smith"@en .\n'
        "\n"
    )
    with gzip.open(tmp_path / "b.nt.gz", "wt") as f:
        f.write('_:n1 <http://x/age> "42"^^<http://www.w3.org/2001/XMLSchema#integer> .\n')
        f.write("_:n1 <http://x/knows> <http://x/alice> .\n")
    spec, arrays = ntriples("aifb", tmp_path)
    assert (spec.nodes, spec.edges, len(spec.relations)) == (6, 5, 4)
    types = {t.name: t.count for t in spec.node_types}
    assert types == {"<http://x/Person>": 1, "literal": 2, "untyped": 3}  # bob, _:n1 and the class itself
    knows = [r for r in spec.relations if r.name == "<http://x/knows>"][0]
    assert knows.count == 2 and arrays["indptr"][-1] == 5 and len(arrays["node_type"]) == 6
    (tmp_path / "a.nt").write_text("<http://x/alice> <http://x/knows> .\n")
    with pytest.raises(UserError, match=r"a.nt:1: not an N-Triples line"):
        ntriples("aifb", tmp_path)


def test_ogb_datasets_are_read_from_their_raw_layout(tmp_path):
    """mag and biokg as OGB heterographs (one folder per typed relation), wikikg2 as OGB's
    homogeneous layout with a relation per edge."""
    import gzip

    from workloads.graphs.published_heterographs import ogb

    def write(path, lines):
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            f.write("\n".join(lines) + "\n")

    hetero = tmp_path / "mag" / "raw"
    write(hetero / "num-node-dict.csv.gz", ["paper,author", "3,2"])
    write(hetero / "relations" / "author___writes___paper" / "edge.csv.gz", ["0,0", "1,2", "1,0"])
    write(hetero / "relations" / "paper___cites___paper" / "edge.csv.gz", ["0,1", "2,1"])
    spec, arrays = ogb("mag", tmp_path / "mag")
    assert (spec.nodes, spec.edges) == (5, 5)
    assert {(r.name, r.source, r.target, r.count) for r in spec.relations} == {
        ("author___writes___paper", "author", "paper", 3),
        ("paper___cites___paper", "paper", "paper", 2),
    }
    assert list(arrays["node_type"]) == [0, 0, 1, 1, 1]  # types in sorted order: author, paper
    write(hetero / "relations" / "paper___cites___paper" / "edge.csv.gz", ["0,3"])
    with pytest.raises(UserError, match="a paper id outside 0..2"):
        ogb("mag", tmp_path / "mag")

    homo = tmp_path / "wikikg2" / "raw"
    write(homo / "num-node-list.csv.gz", ["4"])
    write(homo / "edge.csv.gz", ["0,1", "1,2", "3,0"])
    write(homo / "edge_reltype.csv.gz", ["0", "2", "2"])
    spec, arrays = ogb("wikikg2", tmp_path / "wikikg2")
    assert (spec.nodes, spec.edges, [r.count for r in spec.relations]) == (4, 3, [1, 0, 2])
    write(homo / "edge_reltype.csv.gz", ["0", "2"])
    with pytest.raises(UserError, match="edge.csv.gz and edge_reltype.csv.gz disagree"):
        ogb("wikikg2", tmp_path / "wikikg2")
