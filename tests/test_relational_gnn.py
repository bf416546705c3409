"""relational_gnn: the parts end to end at the tiny scale (every model, registered form and mode,
validated results with each form's role, computation and precision, graph statistics in the
notes), a form that disagrees refused before anything is timed, an out-of-memory recorded as an
outcome with the failed allocation, the CPU's limit on per-edge weights, a form registered from
outside measured like the others, and unknown names refused in one line."""

import re

import pytest
import torch

from harness import config as suite_config
from harness.entry import main as entry
from harness.errors import UserError
from harness.results import ResultsWriter, load, load_provenance
from systems.relgraph.graph import RelGraph
from systems.rgnn.forms import FORMS, Form, forms_of
from systems.rgnn.forms.hector import HectorLayer
from systems.rgnn.models import MODELS, rgat, rgcn
from workloads.relational_gnn import parts
from workloads.relational_gnn.schema import SCHEMA

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The tiny knowledge graphs' modes that run here: a captured step needs a GPU
KNOWLEDGE_GRAPH_MODES = {"inference", "training"} | ({parts.GRAPHED} if DEVICE == "cuda" else set())
TINY = suite_config.topic_params(suite_config.load(), "relational_gnn", "tiny")["knowledge_graphs"]
# Each model's forms that run here (the tensor-core variant and compiled forms only on GPU
# machines), but those the tiny scale leaves out.
RUNS = {
    m.name: {f.name for f in forms_of(m) if f.missing(DEVICE) is None and f.name not in TINY.get("leave_out", [])}
    for m in MODELS
}


def run(part, out):
    entry(["relational_gnn", "--part", part, "--scale", "tiny", "--out", str(out)])
    return load([out], SCHEMA), load_provenance(out)


def only(*names: str) -> list[str]:
    """``leave_out`` for every registered form but ``names``."""
    return [name for name in FORMS.names() if name not in names]


@pytest.mark.parametrize(
    "part, dataset, models, modes",
    [
        ("knowledge_graphs", "nations", set(RUNS), KNOWLEDGE_GRAPH_MODES),
        pytest.param("datasets", "aifb-like-0.05", set(RUNS), {"inference", "training"}, marks=pytest.mark.full),
        pytest.param("large_datasets", "am-like-0.002", {"rgcn"}, {"inference"}, marks=pytest.mark.full),
    ],
)
def test_every_model_form_and_mode_is_timed(part, dataset, models, modes, tmp_path):
    frame, notes = run(part, tmp_path / f"{part}-tiny.csv")
    assert set(frame.dataset) == {dataset}
    # Each row says its form's role, what it computes and in which precision, as the registry does.
    for variant, rows in frame.groupby("variant"):
        form = FORMS[variant]
        assert {(form.role, form.form, form.precision)} == set(zip(rows.role, rows.form, rows.precision)), variant
    assert {"peer", "baseline", "optimized"} <= set(frame.role)
    # A form that cannot run here is not attempted, with the reason (tensor cores: GPU machines only).
    if not torch.cuda.is_available():
        assert notes["skipped"][f"hector_best_tf32 on {dataset}"] == "hector_best_tf32 needs a CUDA GPU"
        if part == "knowledge_graphs":
            assert "needs a GPU" in notes["skipped"][parts.GRAPHED]
    times = frame[frame.metric == "time"]
    assert set(times.model) == models
    skipped = notes["skipped"]
    for model in models:
        rows = times[times.model == model]
        # A form that does not compile under this torch, or whose step cannot be captured, is noted
        # (by mode) and not timed; every other form is timed in every mode.
        timed = {
            (form, mode) for form in RUNS[model] for mode in modes if not _noted_not_timed(skipped, model, form, mode)
        }
        assert set(zip(rows.variant, rows["mode"])) >= timed, (model, skipped)
        assert set(rows.variant) <= RUNS[model], model
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


def _noted_not_timed(skipped: dict, model: str, form: str, mode: str) -> bool:
    """Whether the part noted that ``model``'s ``form`` does not compile or cannot be captured, in
    ``mode`` or (a note without a mode) in every mode: what it leaves untimed by design."""
    for key, why in skipped.items():
        head, _, noted_mode = key.partition(", ")
        if (
            head.startswith(f"{model} {form} on ")
            and noted_mode in ("", mode)
            and ("does not compile" in why or "cannot be captured" in why)
        ):
            return True
    return False


def refused_in_one_line(capsys, part: str, out, message: str) -> None:
    """The part stops with one line (exit status 2) that matches ``message``, having written nothing."""
    with pytest.raises(SystemExit) as stopped:
        run(part, out)
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert re.search(message, lines[-1]) and lines[-1].startswith("error: "), lines[-3:]
    assert not out.exists()


def test_a_form_that_disagrees_is_refused_before_timing(tmp_path, monkeypatch, capsys):
    """The first model's per-edge form is off by 1%: the part stops, having timed nothing."""
    real = rgcn.PerEdge.forward
    monkeypatch.setattr(rgcn.PerEdge, "forward", lambda self, x: real(self, x) * 1.01)
    monkeypatch.setattr(parts, "measure", lambda *a, **k: pytest.fail("timed before every form was checked"))
    out = tmp_path / "knowledge_graphs-tiny.csv"
    refused_in_one_line(capsys, "knowledge_graphs", out, "rgcn per_edge on nations at 8: differs from segment_mm")


def test_a_form_whose_backward_is_wrong_is_refused_before_timing(tmp_path, monkeypatch, capsys):
    """Its forward is right, its training step would be timed: the gradients are checked too."""
    real = rgcn.PerEdge.forward

    def detached(self, x):  # the right rows, and no gradient for any weight
        with torch.no_grad():
            out = real(self, x)
        return out.requires_grad_(torch.is_grad_enabled())

    monkeypatch.setattr(rgcn.PerEdge, "forward", detached)
    monkeypatch.setattr(parts, "measure", lambda *a, **k: pytest.fail("timed before every form was checked"))
    out = tmp_path / "knowledge_graphs-tiny.csv"
    message = "rgcn per_edge on nations at 8: the gradient of .* differs from segment_mm's"
    refused_in_one_line(capsys, "knowledge_graphs", out, message)


def test_a_form_right_on_its_checked_calls_and_wrong_on_later_ones_is_refused_after_its_timing(
    tmp_path, monkeypatch, capsys
):
    """The per-edge form goes wrong once it has been timed (a cache gone stale): checked again
    after its timed calls, from the same weights, it stops the part; nothing is written."""
    real, calls = rgcn.PerEdge.forward, {"n": 0}

    def stale_after_checks(self, x):
        calls["n"] += 1
        return real(self, x) * (1.0 if calls["n"] <= 2 else 1.01)  # its two checked calls are right

    monkeypatch.setattr(rgcn.PerEdge, "forward", stale_after_checks)
    out = tmp_path / "knowledge_graphs-tiny.csv"
    message = "rgcn per_edge on nations at 8 after its timed calls, on other features: differs from segment_mm"
    refused_in_one_line(capsys, "knowledge_graphs", out, message)
    assert calls["n"] > 2


def test_a_form_that_hands_back_the_result_of_its_first_inference_is_refused_after_its_timing(
    tmp_path, monkeypatch, capsys
):
    """Its result memoised under no_grad: right on the checked calls, about a hundred times faster
    when timed; checked again on other features, it stops the part."""
    real, kept = rgcn.PerEdge.forward, {}

    def memoised(self, x):
        if torch.is_grad_enabled():
            return real(self, x)
        if self not in kept:
            kept[self] = real(self, x)
        return kept[self]

    monkeypatch.setattr(rgcn.PerEdge, "forward", memoised)
    out = tmp_path / "knowledge_graphs-tiny.csv"
    message = "rgcn per_edge on nations at 8 after its timed calls, on other features: differs from segment_mm"
    refused_in_one_line(capsys, "knowledge_graphs", out, message)


def test_a_form_whose_own_code_raises_keeps_its_traceback_and_its_last_line_names_it(tmp_path, monkeypatch):
    def broken(self, x):
        raise KeyError("a lookup in the user's own code")

    monkeypatch.setattr(rgcn.PerEdge, "forward", broken)
    with pytest.raises(KeyError) as error:
        run("knowledge_graphs", tmp_path / "knowledge_graphs-tiny.csv")
    assert error.value.__notes__ == ["(raised in form per_edge (rgcn per_edge on nations at 8))"]


def test_a_form_returning_another_dtype_on_float32_is_refused(tmp_path, monkeypatch, capsys):
    real = rgcn.PerEdge.forward
    monkeypatch.setattr(rgcn.PerEdge, "forward", lambda self, x: real(self, x).double())
    out = tmp_path / "knowledge_graphs-tiny.csv"
    message = "rgcn per_edge on nations at 8: returns torch.float64 on torch.float32 features and weights"
    refused_in_one_line(capsys, "knowledge_graphs", out, message)


def test_a_form_naming_a_model_no_model_is_is_refused(tmp_path, capsys):
    typo = Form("typo_form", "baseline", models=("rgcnn",), make=lambda model, weights, graph: None)
    FORMS.register(typo)
    try:
        out = tmp_path / "knowledge_graphs-tiny.csv"
        message = r"form typo_form names model rgcnn, which no registered model is \(models: .*rgcn"
        refused_in_one_line(capsys, "knowledge_graphs", out, message)
    finally:
        FORMS.unregister("typo_form")


def test_a_form_whose_bias_gets_no_gradient_is_refused_though_the_weights_dwarf_it(tmp_path, monkeypatch, capsys):
    """One weight's gradient wrong, the others right: each weight is checked on its own scale."""
    real = rgcn.PerEdge.forward

    def bias_left_out(self, x):  # the same output; the bias's gradient cancels to zero
        return real(self, x) + (self.w.bias.detach() - self.w.bias)

    monkeypatch.setattr(rgcn.PerEdge, "forward", bias_left_out)
    out = tmp_path / "knowledge_graphs-tiny.csv"
    message = "rgcn per_edge on nations at 8: the gradient of bias differs from segment_mm's"
    refused_in_one_line(capsys, "knowledge_graphs", out, message)


def test_a_hector_variant_that_disagrees_is_refused_before_timing(tmp_path, monkeypatch, capsys):
    real = HectorLayer.__call__
    scale = lambda self: 1.01 if self.model.name == "rgcn" else 1  # noqa: E731
    monkeypatch.setattr(HectorLayer, "__call__", lambda self, x: real(self, x) * scale(self))
    monkeypatch.setattr(parts, "measure", lambda *a, **k: pytest.fail("timed before every form was checked"))
    out = tmp_path / "knowledge_graphs-tiny.csv"
    refused_in_one_line(capsys, "knowledge_graphs", out, "rgcn hector_unopt on nations at 8: differs from segment_mm")


def test_out_of_memory_is_an_outcome_with_the_failed_allocation(monkeypatch):
    def too_big(self, x):
        raise torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 86.50 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
            "31.20 GiB is free. Including non-PyTorch memory, this process has 108.60 GiB memory in use. Of the "
            "allocated memory 104.37 GiB is allocated by PyTorch, and 3.12 GiB is reserved by PyTorch but unallocated."
        )

    monkeypatch.setattr(rgat.PerEdge, "forward", too_big)
    params = layers(models=["rgat"], modes=["inference", "training"], leave_out=only("segment_mm", "per_edge", "pyg"))
    writer = parts_writer()
    parts.knowledge_graphs(params, writer, repeat=1, warmup=0, device="cpu")
    gone = [row for row in writer.rows if row["variant"] == "per_edge"]
    said = {"failed_allocation_bytes", "process_memory_at_failure_bytes", "allocated_at_failure_bytes"}
    assert {row["metric"] for row in gone} == {"out_of_memory"} | said
    assert {row["mode"] for row in gone} == {"inference", "training"}
    assert {(row["role"], row["form"], row["precision"]) for row in gone} == {("baseline", "per_edge", "float32")}
    sizes = {metric: {row["value"] for row in gone if row["metric"] == metric} for metric in said}
    assert sizes == {
        "failed_allocation_bytes": {86.5 * 2**30},
        "process_memory_at_failure_bytes": {108.6 * 2**30},
        "allocated_at_failure_bytes": {104.37 * 2**30},
    }
    assert any(row["variant"] == "pyg" and row["metric"] == "time" for row in writer.rows)


def test_in_bfloat16_each_form_computes_in_it_or_is_noted_and_the_reference_is_checked_in_float32(monkeypatch):
    params = layers(
        models=["rgcn", "rgat"],
        dtypes=["float32", "bfloat16"],
        leave_out=only("segment_mm", "dense", "pyg", "hector_best"),
    )
    writer = parts_writer()
    notes = parts.knowledge_graphs(params, writer, repeat=1, warmup=0, device="cpu")
    timed = {(r["model"], r["variant"], r["dtype"], r["precision"]) for r in writer.rows if r["metric"] == "time"}
    assert ("rgat", "dense", "bfloat16", "bfloat16") in timed and (
        "rgcn",
        "segment_mm",
        "bfloat16",
        "bfloat16",
    ) in timed
    assert ("rgcn", "hector_best", "float32", "float32") in timed
    assert {("rgcn", "hector_best", "bfloat16", "bfloat16"), ("rgat", "hector_best", "bfloat16", "bfloat16")} <= timed
    assert "hector_best in bfloat16" not in notes["skipped"]
    # PyG's RGCNConv sums into a float32 buffer: its result is float32, so it is not a bf16 form
    assert notes["skipped"]["rgcn pyg on nations at 8 in bfloat16"].startswith("returns torch.float32")
    assert ("rgat", "pyg", "bfloat16", "bfloat16") in timed
    # A bfloat16 reference that is off from float32 on the same values stops the part.
    real = rgcn.SegmentMM.forward
    monkeypatch.setattr(
        rgcn.SegmentMM, "forward", lambda self, x: real(self, x) * (1.1 if x.dtype == torch.bfloat16 else 1)
    )
    with pytest.raises(parts.FormsDisagree, match="in bfloat16: differs from segment_mm in float32"):
        parts.knowledge_graphs(params | {"models": ["rgcn"]}, parts_writer(), repeat=1, warmup=0, device="cpu")


def layers(**given) -> dict:
    """A knowledge_graphs part's parameters on nations, at width 8, ``given`` replacing any."""
    return {
        "seed": 0,
        "graphs": ["nations"],
        "models": ["rgcn"],
        "dims": [8],
        "modes": ["inference"],
        "cpu_materialize_limit_gib": 1,
        "breakdown_dims": [],
    } | given


def test_per_edge_weights_over_the_cpu_limit_are_not_attempted(tmp_path, monkeypatch):
    # ~1 KiB: nations' 1992 edges x 8 x 8 floats do not fit
    leave_out = only("pyg", "pyg_fast", "per_edge", "segment_mm", "grouped_mm", "hector_best")
    params = layers(cpu_materialize_limit_gib=1e-6, leave_out=leave_out)
    writer = parts_writer()
    notes = parts.knowledge_graphs(params, writer, repeat=1, warmup=0, device="cpu")
    timed = {row["variant"] for row in writer.rows if row["metric"] == "time"}
    assert timed == {"pyg", "segment_mm", "grouped_mm", "hector_best"}
    # The forms compared are named (the reference first), those left out by the parameters not among them.
    assert notes["forms"] == {"rgcn": ["segment_mm", "pyg", "pyg_fast", "per_edge", "grouped_mm", "hector_best"]}
    assert set(notes["skipped"]) == {"dgl", "rgcn pyg_fast on nations at 8", "rgcn per_edge on nations at 8"}
    assert "dgl does not import here (ModuleNotFoundError" in notes["skipped"]["dgl"]  # not in the requirements
    assert "would gather 0.00095 GiB of per-edge weights" in notes["skipped"]["rgcn per_edge on nations at 8"]


def parts_writer():
    return ResultsWriter(SCHEMA, scale="tiny")


def test_a_form_registered_from_outside_is_checked_and_measured_like_the_others():
    """A form from a module of the user's (here, registered by the test): checked against the
    reference, timed, its rows saying its role, what it computes and its precision; one that
    disagrees is refused like any."""

    def doubled(model, weights, graph):
        inner = FORMS[model.reference].build(model, weights, graph)
        return lambda x: inner(x) * 2

    def rounded(model, weights, graph):  # within TF32's tolerance of the reference
        inner = FORMS[model.reference].build(model, weights, graph)
        return lambda x: inner(x) * (1 + 2e-3)

    forms = (
        Form("user_rounded", "optimized", precision="tf32", computes="segment_mm", models=("rgcn",), make=rounded),
        Form("user_doubled", "peer", models=("rgcn",), make=doubled),
    )
    for form in forms:
        FORMS.register(form)
    try:
        writer = parts_writer()
        params = layers(leave_out=only("segment_mm", "user_rounded"))
        parts.knowledge_graphs(params, writer, repeat=1, warmup=0, device="cpu")
        rows = {(r["variant"], r["role"], r["form"], r["precision"]) for r in writer.rows if r["metric"] == "time"}
        assert rows == {
            ("segment_mm", "baseline", "segment_mm", "float32"),
            ("user_rounded", "optimized", "segment_mm", "tf32"),
        }
        with pytest.raises(parts.FormsDisagree, match="rgcn user_doubled on nations at 8: differs from segment_mm"):
            parts.knowledge_graphs(
                layers(leave_out=only("segment_mm", "user_doubled")), parts_writer(), repeat=1, warmup=0, device="cpu"
            )
    finally:
        for form in forms:
            FORMS.unregister(form.name)


def test_unknown_models_and_forms_are_refused_in_one_line_naming_the_valid_ones():
    with pytest.raises(UserError, match=r"unknown relational model 'gcn'; one of (\w+, )*hgt, rgat, rgcn"):
        parts.knowledge_graphs(layers(models=["gcn"]), parts_writer(), repeat=1, warmup=0, device="cpu")
    with pytest.raises(UserError, match="unknown relational-GNN form 'hector_fast'; one of pyg, pyg_fast"):
        parts.knowledge_graphs(layers(leave_out=["hector_fast"]), parts_writer(), repeat=1, warmup=0, device="cpu")


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
        "leave_out": only("segment_mm"),
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


def test_the_shapes_part_generates_the_named_shapes_and_measures_them():
    """A shape of the user's own: generated with its totals (nodes, edges, types, relations), then
    checked and timed like a dataset's graph, its rows named by the shape."""
    shape = {"name": "odd-shape", "nodes": 97, "edges": 301, "node_types": 2, "relations": 7, "unique_pair_ratio": 0.6}
    params = layers(graph_seed=0, shapes=[shape], modes=["training"], leave_out=only("segment_mm", "dense"))
    writer = parts_writer()
    notes = parts.shapes(params, writer, repeat=1, warmup=0, device="cpu")
    assert notes["graphs"]["odd-shape"]["edges"] == 301 and notes["graphs"]["odd-shape"]["relations"] == 7
    rows = [r for r in writer.rows if r["metric"] == "time"]
    assert {(r["dataset"], r["variant"], r["edges"]) for r in rows} == {
        ("odd-shape", "segment_mm", 301),
        ("odd-shape", "dense", 301),
    }


@pytest.mark.parametrize("threshold, timed_calls", [(1e-9, 2), (1e9, 4)])
def test_a_form_slower_than_slow_call_is_timed_fewer_times_and_noted(threshold, timed_calls):
    """Over the threshold every form (here all, at 1 ns) gets slow_call's repetitions and a note;
    under it (1e9 s) the scale's own, and no note."""
    params = layers(
        modes=["inference", "training"],
        leave_out=only("segment_mm", "dense"),
        slow_call={"seconds": threshold, "repeat": 2, "warmup": 0},
    )
    writer = parts_writer()
    notes = parts.knowledge_graphs(params, writer, repeat=4, warmup=1, device="cpu")
    counts = {}
    for row in writer.rows:
        if row["metric"] == "time":
            counts[row["variant"], row["mode"]] = counts.get((row["variant"], row["mode"]), 0) + 1
    assert set(counts) == {(v, m) for v in ("segment_mm", "dense") for m in ("inference", "training")}
    assert set(counts.values()) == {timed_calls}
    noted = notes.get("fewer_repetitions", {})
    assert len(noted) == (4 if timed_calls == 2 else 0)
    assert all("timed 2 times after 0 warm-up calls, not 4 after 1" in why for why in noted.values())


def _gradient_like(seed: int = 0) -> torch.Tensor:
    """A [relations, in, out] gradient whose relations differ in scale by up to 10^4 (a rare
    relation's weights get a gradient of its few edges)."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(0, -4, 12).view(12, 1, 1)
    return torch.randn(12, 9, 7, generator=g) * scales


def test_a_rare_relations_wrong_gradient_is_caught_on_its_own_scale():
    """Judged on the whole gradient's largest value, a relation whose gradient is 10^-3 of the
    largest could be zero and pass; each relation's slice is judged on its own scale."""
    reference = _gradient_like()
    wrong = reference.clone()
    wrong[9] = 0  # a relation of a few edges, its gradient lost
    with pytest.raises(parts.FormsDisagree, match=r"by up to .* \(first in slice 9, on its own scale\)"):
        parts._check(wrong, reference, 1e-3, "g")
    # float32 rounding of a sum in another order, far below every slice's tolerance, passes
    noisy = reference * (1 + 1e-6 * torch.randn(reference.shape, generator=torch.Generator().manual_seed(1)))
    parts._check(noisy, reference, 1e-3, "g")
    # a slice whose true values are rounding noise, next to large ones, is judged on the floor
    quiet = reference.clone()
    quiet[11] = 1e-9 * torch.randn(9, 7, generator=torch.Generator().manual_seed(2))
    parts._check(quiet + 1e-9 * torch.randn(quiet.shape, generator=torch.Generator().manual_seed(3)), quiet, 1e-3, "g")


def test_a_lower_precision_result_with_rows_left_out_is_caught_though_its_norm_is_close():
    g = torch.Generator().manual_seed(4)
    reference = torch.randn(7000, 16, generator=g)
    rounded = reference.bfloat16()
    parts._check(rounded, reference, 3e-2, "x")  # rounding alone: within the norm-wise tolerance
    wrong = rounded.clone()
    wrong[[5, 900, 4000]] = 0  # three rows of 7000: 0.04% of the norm
    with pytest.raises(parts.FormsDisagree, match="slice 5 is off by 1 of its own norm"):
        parts._check(wrong, reference, 3e-2, "x")


@pytest.mark.parametrize("bad", ["inf", "shape", "nan_out", "nan_out_bf16"])
def test_a_reference_that_is_not_finite_or_a_result_of_another_shape_is_refused(bad):
    reference = _gradient_like()
    if bad == "inf":
        reference[3, 2, 1] = float("inf")
        out = torch.zeros_like(reference)
        message = "the reference form's own result is not finite"
    elif bad.startswith("nan_out"):  # a form's NaN is said as such, not as an infinite difference
        out = reference.clone()
        out[3, 2, 1], out[5, 0, 0] = float("nan"), float("-inf")
        out = out.bfloat16() if bad.endswith("bf16") else out
        message = r"^g: 2 of its 756 values are NaN or infinite, the reference's none$"
    else:
        out, message = reference[:-1], r"a result of shape \(11, 9, 7\), not \(12, 9, 7\)"
    with pytest.raises(parts.FormsDisagree, match=message):
        parts._check(out, reference, 1e-3, "g")


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64])
def test_a_form_refuses_features_that_are_not_of_its_weights_type(dtype):
    """PyG reads integer features as node ids (its featureless mode): a wrong result, silently."""
    graph = RelGraph.build([0, 1, 2, 3, 4, 1], [1, 2, 3, 4, 0, 0], [0, 1, 2, 0, 1, 2], num_nodes=5, num_relations=3)
    weights = MODELS["rgcn"].make_weights(graph, 4, 4, seed=0)
    x = torch.randint(0, 5, (graph.num_nodes, 4)).to(dtype)
    for name in ("segment_mm", "dense", *(["pyg"] if FORMS["pyg"].missing("cpu") is None else [])):
        with pytest.raises(
            UserError, match=f"features must be floating-point, of the weights' type torch.float32, got {dtype}"
        ):
            FORMS[name].build(MODELS["rgcn"], weights, graph)(x)


def test_a_bfloat16_form_wrong_for_one_relation_is_not_timed():
    """In bfloat16 a form was held to half of each row's own norm: one whose rarest relation's
    messages were scaled by 1.4 (a wrong norm) passed and was timed. Each slice is now also held to
    a few times the reference form's own bfloat16 rounding there; a form within it is timed."""
    from systems.relgraph.ops import segment_products, take_rows

    def scaled_rarest(factor):
        def make(model, weights, graph):
            counts = graph.offsets.diff()
            used = torch.nonzero(counts).flatten()
            rarest = int(used[counts[used].argmin()])
            order = graph.by_relation
            scale = torch.where(graph.etype[order] == rarest, factor, 1.0)

            def layer(x):
                messages = segment_products(take_rows(x, graph.src[order]), weights.weight, graph.offsets)
                messages = messages * (graph.norm[order] * scale).to(x.dtype)[:, None]
                return torch.addmm(weights.bias, x, weights.root).index_add(0, graph.dst[order], messages)

            return layer

        return make

    forms = (
        Form("user_wrong_norm", "peer", models=("rgcn",), make=scaled_rarest(1.4)),
        Form("user_right_norm", "peer", models=("rgcn",), make=scaled_rarest(1.0)),
    )
    for form in forms:
        FORMS.register(form)
    try:
        params = layers(
            dims=[16], dtypes=["bfloat16"], modes=["inference", "training"],
            leave_out=only("segment_mm", "user_wrong_norm", "user_right_norm"),
        )  # fmt: skip
        writer = parts_writer()
        notes = parts.knowledge_graphs(params, writer, repeat=1, warmup=0, device="cpu")
        timed = {row["variant"] for row in writer.rows if row["metric"] == "time"}
        assert timed == {"segment_mm", "user_right_norm"}
        skipped = notes["skipped"]["rgcn user_wrong_norm on nations at 16 in bfloat16"]
        assert "over 4x the reference form's own rounding there" in skipped
    finally:
        for form in forms:
            FORMS.unregister(form.name)


def test_a_form_that_cannot_take_the_graph_is_noted_and_the_part_goes_on(tmp_path):
    """On real RDF a predicate (rdf:type) joins several node-type pairs: PyG's HGT refused it with
    a UserError that stopped the whole part after other rows were measured, and nothing was kept."""
    rdf_type = "<http://www.w3.org/1999/02/22-rdf-syntax-ns#type>"
    (tmp_path / "a.nt").write_text(
        f"<http://x/alice> {rdf_type} <http://x/Person> .\n"
        f"<http://x/Person> {rdf_type} <http://x/Class> .\n"
        "<http://x/alice> <http://x/knows> <http://x/bob> .\n"
        "<http://x/bob> <http://x/knows> <http://x/alice> .\n"
        '<http://x/bob> <http://x/name> "Bob"@en .\n'
    )
    params = {
        "seed": 0,
        "graph_seed": 0,
        "datasets": [{"name": "aifb", "scale_factor": 1.0, "published_dir": str(tmp_path)}],
        "models": ["rgcn", "hgt"],
        "dims": [4],
        "modes": ["inference"],
        "cpu_materialize_limit_gib": 1,
        "leave_out": only("segment_mm", "per_edge", "pyg"),
    }
    writer = parts_writer()
    notes = parts.datasets(params, writer, repeat=1, warmup=0, device="cpu")
    timed = {(row["model"], row["variant"]) for row in writer.rows if row["metric"] == "time"}
    assert ("hgt", "segment_mm") in timed and ("rgcn", "pyg") in timed and ("hgt", "pyg") not in timed
    (why,) = [v for k, v in notes["skipped"].items() if k.startswith("hgt pyg on aifb")]
    assert "joins several node types" in why


def test_a_form_returning_no_tensor_is_refused_naming_it():
    def listed(model, weights, graph):
        inner = FORMS[model.reference].build(model, weights, graph)
        return lambda x: [inner(x)]

    FORMS.register(Form("user_listed", "peer", models=("rgcn",), make=listed))
    try:
        with pytest.raises(parts.FormsDisagree, match="rgcn user_listed on nations at 8: returns a list, not a tensor"):
            parts.knowledge_graphs(
                layers(leave_out=only("segment_mm", "user_listed")), parts_writer(), repeat=1, warmup=0, device="cpu"
            )
    finally:
        FORMS.unregister("user_listed")
