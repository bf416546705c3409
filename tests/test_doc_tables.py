"""The measured tables of docs/ are what their renderers make of the committed results.

A re-measured results file that changes a number fails here until `python -m analysis.doc_tables`
(or `make doc_tables`) rewrites the docs. Numbers next to an "x" (speedups) in the docs that
quote measurements stand inside generated blocks only, so none is left to go stale by hand.
"""

import json
import random
import re
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from analysis import doc_tables
from analysis.doc_tables import blocks
from harness.errors import UserError
from harness.results import load_provenance

DOCS = sorted((REPO_ROOT / "docs").glob("*.md"))
PLACED = [(doc, block.name) for doc in DOCS for block in blocks.blocks(doc.read_text(), str(doc))]
# Docs whose measured tables are generated: a speedup written by hand there fails the prose check.
GENERATED_DOCS = [
    "ceilings.md",
    "feature_gather.md",
    "gnn_multi_gpu.md",
    "gnn_training.md",
    "hector.md",
    "llm_offload.md",
    "relational_gnn.md",
]
# Renderers that read many large files (seconds each): the complete tier checks them.
SLOW_TABLES = (
    "feature_gather-",
    "relational_gnn-",
    "hector-h200-headline",
    "hector-h200-ablation",
    "hector-h200-captured_step",
    "hector-h200-shapes",
)


def slow_if_large(name, *values):
    marks = [pytest.mark.full] if name.startswith(SLOW_TABLES) else []
    return pytest.param(*values, marks=marks, id=f"{name}")


# --- the blocks of a doc --------------------------------------------------------------------------


def test_blocks_are_found_rewritten_and_the_rest_is_kept():
    words = [f"word{random.randrange(10**6)}" for _ in range(4)]
    text = (
        f"# Doc\n\n{words[0]}\n\n<!-- generated: one -->\nold 1.5x\n<!-- /generated -->\n{words[1]}\n"
        f"<!-- generated: two -->\n\n<!-- /generated -->\n\n{words[2]} 3.0x\n"
    )
    found = blocks.blocks(text)
    assert [(b.name, b.body) for b in found] == [("one", "old 1.5x"), ("two", "")]
    new = blocks.rewrite(text, lambda name: f"table {name}\n\n{words[3]}")
    assert [b.body for b in blocks.blocks(new)] == [f"table one\n\n{words[3]}", f"table two\n\n{words[3]}"]
    assert blocks.outside(new).split() == blocks.outside(text).split()  # only block bodies changed
    assert blocks.rewrite(new, lambda name: f"table {name}\n\n{words[3]}") == new  # idempotent


@pytest.mark.parametrize(
    "text, message",
    [
        ("<!-- generated: a -->\nx\n", "is never closed"),
        ("<!-- generated: a -->\n<!-- generated: b -->\n<!-- /generated -->\n", "opens inside block 'a'"),
        ("x\n<!-- /generated -->\n", "closes no generated block"),
        ("<!-- generated a -->\n<!-- /generated -->\n", "malformed marker"),
    ],
)
def test_broken_markers_are_refused_in_one_line(text, message):
    with pytest.raises(UserError, match=message) as err:
        blocks.blocks(text, "doc.md")
    assert "\n" not in str(err.value) and str(err.value).startswith("doc.md:")


def test_a_changed_number_in_a_block_is_stale(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- generated: t -->\n| a |\n|---|\n| 51.3 |\n<!-- /generated -->\n")
    table = "| a |\n|---|\n| 51.3 |"
    assert blocks.stale(doc, lambda name: table) == []
    assert blocks.stale(doc, lambda name: table.replace("51.3", "51.4")) == ["t"]


# --- the registry ---------------------------------------------------------------------------------


def test_every_placed_block_has_a_renderer():
    registered = doc_tables.registry()
    unknown = [f"{doc.name}: {name}" for doc, name in PLACED if name not in registered]
    assert not unknown, f"generated blocks without a renderer: {unknown}"
    assert PLACED, "no doc has a generated block"
    assert {doc.name for doc, _ in PLACED} >= set(GENERATED_DOCS)


def test_an_unknown_table_is_refused_with_the_registered_names():
    with pytest.raises(UserError, match="no doc table named 'nosuch'; registered: ceilings-h200"):
        doc_tables.render("nosuch")


def test_a_missing_results_file_is_refused():
    with pytest.raises(UserError, match="results/h200/ceilings/nosuch-h200.csv"):
        doc_tables.results_files("h200", "ceilings", ["pcie_copy", "nosuch"], "h200")


def test_the_source_line_names_each_file_its_commit_and_the_scale():
    files = doc_tables.results_files("h200", "ceilings", ["pcie_copy", "uva_read"], "h200")
    line = doc_tables.source_line(files)
    for path in files:
        record = load_provenance(path)
        assert f"`{path.relative_to(REPO_ROOT)}`" in line
        assert f"commit `{record['git']['commit'][:7]}" in line
    assert line.endswith("scale `h200`.")


# --- the docs against the committed results -------------------------------------------------------


@pytest.mark.parametrize(
    "doc, name", [slow_if_large(name, doc, name) for doc, name in PLACED if doc_tables.registry().get(name)]
)
def test_a_generated_block_is_what_its_renderer_makes_of_the_committed_results(doc, name):
    body = next(b.body for b in blocks.blocks(doc.read_text()) if b.name == name)
    expected = doc_tables.render(name)
    assert body == expected, (
        f"docs/{doc.name}: generated table {name} differs from the committed results; "
        "run `python -m analysis.doc_tables` (make doc_tables) and commit the doc"
    )


@pytest.mark.full
@pytest.mark.parametrize("name", sorted(doc_tables.registry()))
def test_every_renderer_renders_a_table_with_its_source(name):
    body = doc_tables.render(name)
    table = [line for line in body.splitlines() if line.startswith("|")]
    assert len(table) >= 3 and re.fullmatch(r"\|(---\|)+", table[1])
    widths = {line.count("|") for line in table}
    assert len(widths) == 1, f"{name}: rows of different widths"
    # Not yet measured: a part of a topic, or a tool's profile, that has not run on the H200.
    if re.search(r"^Source: none yet \((?:part `\w+`|`tools/\w+\.py`) has not run on the H200\)\.$", body, re.M):
        assert "not measured" in body  # a table of no results says so in its rows too
        return
    assert re.search(r"^Source: `results/[^`]+\.csv(\.gz)?`.* \(commit `[0-9a-f]{7}", body, re.M)


# --- speedups written by hand -------------------------------------------------------------------

SPEEDUP = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:[–-]\d+(?:\.\d+)?)?x(?![\w])")


def speedups_outside_blocks(text: str) -> list[str]:
    """Speedups (``1.62x``, ``0.97–1.10x``) outside generated blocks and code, with their line."""
    kept = blocks.outside(text)
    kept = re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), kept, flags=re.S | re.M)
    kept = re.sub(r"`[^`\n]*`", "", kept)
    return [
        f"line {number}: {match}" for number, line in enumerate(kept.splitlines(), 1) for match in SPEEDUP.findall(line)
    ]


def test_speedups_outside_blocks_are_found():
    text = (
        "A 1.62x gain, 0.97–1.10x there; PCIe Gen5 x16, 4x4 grid, `3.0x` in code.\n"
        "<!-- generated: t -->\n| 2.5x |\n<!-- /generated -->\n"
        "```\nspeed = 9.9x\n```\nthen 12x.\n"
    )
    assert speedups_outside_blocks(text) == ["line 1: 1.62x", "line 1: 0.97–1.10x", "line 8: 12x"]


@pytest.mark.parametrize("name", GENERATED_DOCS)
def test_measured_speedups_stand_in_generated_blocks_only(name):
    found = speedups_outside_blocks((REPO_ROOT / "docs" / name).read_text())
    assert not found, (
        f"docs/{name} writes speedups by hand (put them in a generated table, analysis/doc_tables):\n"
        + "\n".join(found)
    )


def test_docs_with_blocks_are_the_ones_the_command_refreshes():
    from analysis.doc_tables.__main__ import docs_with_blocks

    assert {Path(p).name for p in docs_with_blocks()} == {doc.name for doc, _ in PLACED}


# --- the relational GNN renderers' reductions -----------------------------------------------------


def test_relational_gnn_processes_are_the_committed_run_and_its_same_code_reruns():
    from analysis.doc_tables import relational_gnn

    for part in ("datasets", "more_knowledge_graphs", "gemm_template"):
        committed = doc_tables.results_files("h200", "relational_gnn", [part], "h200")[0]
        files = relational_gnn.process_files(part)
        assert files[0] == committed and len(files) >= 2
        digest = load_provenance(committed)["code"]["digest"]
        assert all(load_provenance(f)["code"]["digest"] == digest for f in files)
        other = [f for f in committed.parent.glob(f"reruns/*/{part}-h200.csv") if f not in files]
        assert all(load_provenance(f)["code"]["digest"] != digest for f in other)
    # processes of one code at two commits (docs-only apart) count together: the digests decide
    # (test_same_code_is_the_same_digest_or_without_one_the_same_commit)


def test_same_code_is_the_same_digest_or_without_one_the_same_commit():
    from analysis.common import same_code

    def record(commit, digest=None):
        return {"git": {"commit": commit}} | ({"code": {"digest": digest}} if digest else {})

    assert same_code(record("a", "d1"), record("b", "d1"))  # docs-only commits apart
    assert not same_code(record("a", "d1"), record("a", "d2"))  # a dirty tree at one commit
    assert same_code(record("a"), record("a", "d1")) and not same_code(record("a"), record("b", "d1"))
    assert same_code(record("a"), record("a")) and not same_code(record("a"), record("b"))
    assert same_code(record("a") | {"code": None}, record("a", "d1"))  # a record that could not take a digest
    for incomplete in ("loaded_outside_scope", "changed_during_run"):  # its digest does not name all that ran
        partial = {"git": {"commit": "a"}, "code": {"digest": "d1", incomplete: ["systems/x.py"]}}
        assert not same_code(partial, record("a", "d1")) and not same_code(record("a", "d1"), partial)
    # Out-of-tree entries (SUITE_PLUGINS) ran too: other plugin code is other code.
    mine = record("a", "d1") | {"code": {"digest": "d1", "plugins": {"my_variants": "p1"}}}
    assert same_code(mine, json.loads(json.dumps(mine)))
    assert not same_code(mine, record("a", "d1")) and not same_code(record("a", "d1"), mine)
    other = record("a", "d1") | {"code": {"digest": "d1", "plugins": {"my_variants": "p2"}}}
    assert not same_code(mine, other)


def test_a_speedup_is_hectors_time_against_the_fastest_competitor_of_its_own_process():
    import pandas as pd

    from analysis.doc_tables import relational_gnn

    rng = random.Random(7)
    forms = [("baseline", "segment_mm"), ("peer", "dense"), ("peer", "pyg"), ("optimized", "hector_unopt")]
    forms.append(("optimized", relational_gnn.HECTOR))
    rows = [
        dict(source=source, role=role, variant=variant, model=model, mode="training", dataset=graph, edges=5)
        | {"median": rng.uniform(1e-4, 1e-2)}
        for source in ("one.csv", "two.csv")
        for model in ("rgcn", "hgt")
        for graph in ("a-like", "b-like")
        for role, variant in forms
    ]
    rows = [r for r in rows if not (r["source"] == "two.csv" and r["variant"] == "dense")]  # not measured there
    times = pd.DataFrame(rows)
    found = relational_gnn.speedups(times)
    assert len(found) == 8
    for (source, model, _, graph), row in found.iterrows():
        same = times[(times.source == source) & (times.model == model) & (times.dataset == graph)]
        rivals = same[same.role.isin(["baseline", "peer"])]
        ours = same[same.variant == relational_gnn.HECTOR]["median"].item()
        assert row.variant == rivals.loc[rivals["median"].idxmin(), "variant"]
        assert row.speedup == pytest.approx(rivals["median"].min() / ours)


@pytest.mark.parametrize(
    "values, expected", [([1.034, 1.57], "1.03–1.57x"), ([0.981], "0.98x"), ([2.004, 1.996], "2.00x")]
)
def test_a_range_over_processes_collapses_when_it_rounds_to_one_number(values, expected):
    from analysis.doc_tables import relational_gnn

    assert relational_gnn.span(values) == expected


# --- gnn_training ---------------------------------------------------------------------------------


def test_gnn_training_doc_tables_are_rendered_and_its_speedups_generated():
    from analysis.doc_tables import gnn_training  # noqa: F401  (registers its tables)

    doc = REPO_ROOT / "docs" / "gnn_training.md"
    placed = {block.name: block.body for block in blocks.blocks(doc.read_text(), str(doc))}
    assert {"gnn_training-h200", "gnn_training-h200-targets", "gnn_training-h200-cost"} <= set(placed)
    for name, body in placed.items():
        assert body == doc_tables.render(name), (
            f"docs/gnn_training.md: {name} differs; run python -m analysis.doc_tables"
        )
    assert not speedups_outside_blocks(doc.read_text())


# --- the activation offloading renderers' reductions ----------------------------------------------


@pytest.mark.parametrize("values, expected", [([1.0004, 0.9996], "1.000"), ([1.171, 1.197], "1.171–1.197"), ([], "")])
def test_llm_offload_spans_collapse_when_they_round_alike(values, expected):
    from analysis.doc_tables import llm_offload

    assert llm_offload.span(values) == expected


def test_llm_offload_ratios_are_taken_within_each_process():
    import pandas as pd

    from analysis.doc_tables import llm_offload

    files = llm_offload.process_files("shapes")
    assert files[0] == doc_tables.results_files("h200", "llm_offload", ["shapes"], "h200")[0] and len(files) > 1
    # The committed policies run's reruns measured other code: they are not its processes.
    assert llm_offload.process_files("policies") == doc_tables.results_files(
        "h200", "llm_offload", ["policies"], "h200"
    )
    ratios = llm_offload.per_process(files, "time")
    assert (ratios.xs("keep", level="variant") == 1).all().all()
    for file in files:  # each column: that process's median over that process's keep, per model
        frame = doc_tables.load([file], "llm_offload")
        medians = frame[frame.metric == "time"].groupby(["dataset", "variant"]).value.median()
        keep = medians.xs("keep", level="variant")
        expected = medians / keep.reindex(medians.index.get_level_values("dataset")).to_numpy()
        got = ratios[str(file)].dropna()
        pd.testing.assert_series_equal(got.sort_index(), expected.sort_index(), check_names=False)


def test_a_plan_dominates_a_torch_budget_only_where_it_is_both_as_fast_and_as_small_in_a_process():
    import pandas as pd

    from analysis.doc_tables import llm_offload

    processes = ["run1", "run2", "run3"]
    nan = float("nan")
    time = pd.DataFrame(
        {"torch_budget_0.5": [1.00, 1.00, 1.00], "fast_big": [0.90, 0.95, 0.90], "ties": [1.00, 1.00, 1.00],
         "slow_in_one": [0.90, 1.01, 0.90], "missing": [0.5, nan, 0.5]},
        index=processes,
    ).T  # fmt: skip
    peak = pd.DataFrame(
        {"torch_budget_0.5": [0.50, 0.50, 0.50], "fast_big": [0.51, 0.40, 0.40], "ties": [0.50, 0.50, 0.50],
         "slow_in_one": [0.30, 0.30, 0.30], "missing": [0.2, 0.2, 0.2]},
        index=processes,
    ).T  # fmt: skip
    counts = llm_offload.dominating(time, peak, "torch_budget_0.5", ["fast_big", "ties", "slow_in_one", "missing"])
    assert counts.to_dict() == {"fast_big": 2, "ties": 3, "slow_in_one": 2, "missing": 2}


def _raw_medians(file, metric):
    """Per (model, variant) median of ``metric`` in one results file, read without the suite's loader."""
    import pandas as pd

    frame = pd.read_csv(file)
    return frame[frame.metric == metric].groupby(["dataset", "variant"]).value.median()


def test_llm_offload_speedups_are_the_other_policys_time_over_the_policys_within_each_process():
    from analysis.doc_tables import llm_offload

    files = llm_offload.process_files("shapes")
    time = llm_offload.per_process(files, "time")
    dataset = sorted(set(time.index.get_level_values("dataset")))[0]
    found = llm_offload.speedups(time, dataset, "offload_all_host", "recompute")
    expected = []
    for file in files:
        medians = _raw_medians(file, "time").loc[dataset]
        expected.append(medians["recompute"] / medians["offload_all_host"])
    assert found == pytest.approx(expected, rel=1e-12) and len(found) == len(files) > 1
    assert llm_offload.speedups(time, dataset, "offload_all_host", "nosuch") == []


def test_llm_offload_a_comparison_measured_nowhere_is_refused():
    from analysis.doc_tables import llm_offload

    with pytest.raises(ValueError, match="keep against nosuch is measured on no model of part shapes"):
        llm_offload.versus("shapes", [("keep", "nosuch")])


@pytest.mark.parametrize(
    "values, expected", [([0.1234], "12%"), ([0.021, 0.04], "2–4%"), ([0.449, 0.451], "45%"), ([0.0, 0.004], "0%")]
)
def test_llm_offload_percent_ranges_collapse_when_they_round_alike(values, expected):
    from analysis.doc_tables import llm_offload

    assert llm_offload.percent(values) == expected


def test_llm_offload_best_cut_is_the_largest_worst_process_cut_within_the_overhead_in_every_process():
    import pandas as pd

    from analysis.doc_tables import llm_offload

    rng = random.Random(3)
    processes = ["one.csv", "two.csv", "three.csv"]
    within = llm_offload.OVERHEAD - 0.01
    times = {
        "keep": [1.0] * 3,
        "fast_small_cut": [rng.uniform(1.0, within) for _ in processes],
        "fast_big_cut_once": [rng.uniform(1.0, within) for _ in processes],
        "slow_in_one_process": [1.01, llm_offload.OVERHEAD + 0.02, 1.0],
        "baseline_cut": [1.0] * 3,
    }
    peaks = {
        "keep": [1.0] * 3,
        "fast_small_cut": [0.80, 0.82, 0.81],  # worst process: 18% cut
        "fast_big_cut_once": [0.50, 0.85, 0.60],  # worst process: 15% cut
        "slow_in_one_process": [0.30] * 3,
        "baseline_cut": [0.20] * 3,
    }
    roles = {v: ("baseline" if v in ("keep", "baseline_cut") else "optimized") for v in times}
    setups = pd.DataFrame({"role": roles})
    frame = lambda values: pd.DataFrame(values, index=processes).T  # noqa: E731
    variant, cuts, found_times = llm_offload.best_cut(frame(times), frame(peaks), setups)
    assert variant == "fast_small_cut"
    assert cuts == pytest.approx([0.20, 0.18, 0.19]) and found_times == times["fast_small_cut"]
    slow = {v: [llm_offload.OVERHEAD + 0.1] * 3 for v in times}
    assert llm_offload.best_cut(frame(slow), frame(peaks), setups) is None


def test_llm_offload_targets_turn_met_when_the_thresholds_are_lowered(monkeypatch):
    from analysis.doc_tables import llm_offload

    def rows(body, target):
        lines = body.splitlines()
        start = next(i for i, line in enumerate(lines) if target in line)
        return [line for line in lines[start + 1 :] if line.startswith("| ") and "**" not in line][:4]

    as_committed = "\n".join(llm_offload.targets().lines)
    assert all(r.endswith("| no |") for r in rows(as_committed, "activation peak"))
    assert all(r.endswith("| no |") for r in rows(as_committed, "planner ≥"))
    monkeypatch.setattr(llm_offload, "PEAK_CUT", 0.10)
    monkeypatch.setattr(llm_offload, "PLANNER_GAIN", 1.0)
    monkeypatch.setattr(llm_offload, "EQUAL_PEAK", 2.0)
    lowered = "\n".join(llm_offload.targets().lines)
    peak_rows, planner_rows = rows(lowered, "activation peak"), rows(lowered, "planner ≥")
    # micro-batch 4: a 12% cut within the overhead; the planner ahead of recompute in every process there
    assert peak_rows[0].startswith("| 8192x4, micro-batch 4 |") and peak_rows[0].endswith("| yes |")
    assert sum(r.endswith("| yes |") for r in peak_rows) == 1
    assert planner_rows[0].startswith("| 8192x4, micro-batch 4 |") and planner_rows[0].endswith("| yes |")
    assert [r for r in planner_rows if r.startswith("| 16384x2")][0].endswith("| no |")  # 0.995: not ahead


def test_llm_offload_exact_checks_count_every_timed_ssdtrain_variant():
    import pandas as pd

    from analysis.doc_tables import llm_offload

    files = [llm_offload.process_files(part)[0] for part in ("policies", "shapes")]
    files += doc_tables.results_files("h200", "llm_offload", ["models"], "h200")
    pairs = set()
    for file in files:
        raw = pd.read_csv(file)
        pairs |= set(map(tuple, raw[raw.role == "optimized"][["dataset", "variant"]].drop_duplicates().values))
    frames = [doc_tables.load([f], "llm_offload") for f in files]
    assert llm_offload.checked_exactly(frames) == (len(pairs), len({d for d, _ in pairs}))
    no_optimized = [frame[frame.role != "optimized"] for frame in frames]
    assert llm_offload.checked_exactly(no_optimized) == (0, 0)


def test_llm_offload_cpu_table_is_each_models_median_over_keeps():
    from analysis.doc_tables import llm_offload

    files = doc_tables.results_files("cpu-2core", "llm_offload", ["policies", "models"], "cpu")
    body = llm_offload.cpu()
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in body.lines[2:]}
    assert len(rows) >= 4
    for file in files:
        time, kept = _raw_medians(file, "time"), _raw_medians(file, "activation_bytes")
        for dataset in set(time.index.get_level_values(0)):
            cell = rows[dataset][2 + [v for _, v in llm_offload.CPU_COLUMNS].index("offload_all_host")]
            expected = (
                f"{time[(dataset, 'offload_all_host')] / time[(dataset, 'keep')]:.2f}, "
                f"{kept[(dataset, 'offload_all_host')] / kept[(dataset, 'keep')]:.2f}"
            )
            assert cell.strip(" |") == expected


def test_gnn_training_cpu_table_is_each_pipelines_median_epoch_and_its_ratio_to_cpu_gather():
    import pandas as pd

    from analysis.doc_tables import gnn_training

    body = gnn_training.epochs_cpu()
    cells = {}
    for line in body.lines[2:]:
        graph, pipeline, _, epoch, ratio = (c.strip() for c in line.strip("|").split("|"))
        cells[(graph.split(" (")[0], graph.rsplit(", ", 1)[1], pipeline)] = (float(epoch), float(ratio))
    seen = 0
    for file in doc_tables.results_files("cpu-2core", "gnn_training", gnn_training.CPU_PARTS, "cpu"):
        frame = pd.read_csv(file)
        epochs = frame[frame.metric == "epoch_time"].groupby(["dataset", "model", "variant"]).value.median()
        for (dataset, model, variant), median in epochs.items():
            label = "GAT 2" if model == "gat" else "SAGE 2"
            epoch, ratio = cells[(dataset.removeprefix("ogbn-"), label, variant)]
            assert epoch == pytest.approx(median, abs=5e-4)
            assert ratio == pytest.approx(median / epochs[(dataset, model, "cpu_gather")], abs=5e-3)
            seen += 1
    assert seen == len(cells) and "pyg_neighbor_loader" in {k[2] for k in cells}


def test_the_captured_geomean_is_taken_per_process_and_left_blank_for_a_model_missing_a_graph():
    import pandas as pd

    from analysis.doc_tables import relational_gnn as rg

    rows = []
    for source, factor in (("results/x/datasets-h200.csv", 1.0), ("results/x/reruns/run2/datasets-h200.csv", 2.0)):
        rows += [dict(source=source, model="rgcn", dataset=g, speedup=s * factor) for g, s in (("a", 2.0), ("b", 8.0))]
        rows += [dict(source=source, model="hgt", dataset="a", speedup=3.0)]  # never measured on b
    rows.append(dict(source="results/x/knowledge_graphs-h200.csv", model="rgcn", dataset="k", speedup=0.1))
    row = rg._captured_geomean_row(pd.DataFrame(rows), ["rgcn", "hgt"])
    assert row == "| geomean over the 2 `datasets` graphs (2) | 4.00–8.00x |  |"  # sqrt(2*8), sqrt(4*16); no k
    one_process_short = pd.DataFrame([r for r in rows if not (r["model"] == "rgcn" and "run2" in r["source"])])
    assert rg._captured_geomean_row(one_process_short, ["rgcn"]).endswith("|  |")  # run2 measured no rgcn


def test_llm_offload_memory_bound_ratios_are_within_each_process_and_met_only_in_every_one():
    import pandas as pd

    from analysis.doc_tables import llm_offload

    def speeds(**tokens):
        """One process: tokens/s per variant, with the policy and the role each variant has."""
        policy = {"keep": "keep", "recompute": "recompute", "torch_budget_0.2": "torch_budget"}
        policy |= {"torch_budget_0.5": "torch_budget", "offload_all_host": "offload_all", "planner_host": "planner"}
        rows = [
            {
                "dataset": "llama-x",
                "variant": v,
                "role": "optimized" if policy[v] in ("offload_all", "planner") else "baseline",
                "policy": policy[v],
                "micro_batch": 4.0,
                "memory_cap_gib": 32.0,
                "median": t,
            }
            for v, t in tokens.items()
        ]
        return pd.DataFrame(rows)

    first = speeds(keep=100, recompute=200, **{"torch_budget_0.2": 210, "torch_budget_0.5": 220},
                   offload_all_host=240, planner_host=260)  # fmt: skip
    second = speeds(keep=90, recompute=250, **{"torch_budget_0.2": 200, "torch_budget_0.5": 230},
                    offload_all_host=300, planner_host=290)  # fmt: skip
    committed = first.assign(hidden=8192, layers=4, store=None, emulated_gbps=None, metric="tokens_per_second")
    committed = committed.assign(activation_budget=None, budget_fraction=None, value=None)
    committed.loc[committed.variant.str.endswith("_host"), "store"] = "host"
    committed.loc[committed.variant == "torch_budget_0.2", "activation_budget"] = 0.2
    committed.loc[committed.variant == "torch_budget_0.5", "activation_budget"] = 0.5
    rows = {line.split(" | ")[1]: line.split(" | ")[2:] for line in llm_offload.capped_rows([first, second], committed)}
    # offload_all: 240/200 and 300/250 = 1.20x recompute; over torch's best budget of each process
    # (220, then 230): 1.09x and 1.30x. Both targets in both processes: met.
    assert rows["offload_all, host"] == ["4", "240–300", "1.20x", "1.09–1.30x", "yes |"]
    # The planner: 1.30x and 1.16x recompute, 1.18x and 1.26x torch's best: met; with the second
    # process's recompute faster (a ratio under 1.15 in one process), not met.
    assert rows["planner, host"][-1] == "yes |"
    slower = second.assign(median=second["median"].where(second.variant != "recompute", 260))
    rows = {line.split(" | ")[1]: line.split(" | ")[2:] for line in llm_offload.capped_rows([first, slower], committed)}
    assert rows["planner, host"][2:] == ["1.12–1.30x", "1.18–1.26x", "no |"]
    assert rows["keep"][2:] == ["", "", " |"]  # a baseline's row: its own speed, no ratio, no verdict
    # A budget missing from one process (out of memory there) leaves the other budgets as its best.
    partial = second[second.variant != "torch_budget_0.2"]
    rows = {
        line.split(" | ")[1]: line.split(" | ")[2:] for line in llm_offload.capped_rows([first, partial], committed)
    }
    assert rows["offload_all, host"][2:] == ["1.20x", "1.09–1.30x", "yes |"]
    # Every micro-batch that fits is timed: a variant's row is its fastest, its largest said where
    # that is another (from the committed run's fits rows), and its ratios are at its fastest.
    larger = first[first.variant == "offload_all_host"].assign(micro_batch=8.0, median=230)
    fits = larger.assign(metric="fits", value=1.0, hidden=8192, layers=4, store="host")
    lines = llm_offload.capped_rows([pd.concat([first, larger]), second], pd.concat([committed, fits]))
    offloading = [line.split(" | ")[2:] for line in lines if line.split(" | ")[1] == "offload_all, host"]
    assert offloading == [["4 (largest 8)", "240–300", "1.20x", "1.09–1.30x", "yes |"]]
    # Processes whose fastest micro-batches differ: the cell names each, as the range spans them.
    faster = second[second.variant == "offload_all_host"].assign(micro_batch=8.0, median=310)
    lines = llm_offload.capped_rows(
        [pd.concat([first, larger]), pd.concat([second, faster])], pd.concat([committed, fits])
    )
    offloading = [line.split(" | ")[2:] for line in lines if line.split(" | ")[1] == "offload_all, host"]
    assert offloading == [["4, 8", "240–310", "1.20–1.24x", "1.09–1.35x", "yes |"]]


# --- the command line: python -m analysis.doc_tables ----------------------------------------------


def run_command(capsys, *argv) -> tuple[int, str, str]:
    """The command's exit status, standard output and standard error."""
    from analysis.doc_tables.__main__ import main

    try:
        code = main([str(a) for a in argv])
    except SystemExit as ended:
        code = ended.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def stale_doc(tmp_path, monkeypatch):
    """A doc outside the repository whose one block (table ``t``) renders otherwise than it reads."""
    from analysis.doc_tables import __main__ as command

    monkeypatch.setattr(command, "render", lambda name: f"| {name} |\n|---|\n| 2.0 |")
    doc = tmp_path / "doc.md"
    doc.write_text("# Doc\n\n<!-- generated: t -->\n| t |\n|---|\n| 1.0 |\n<!-- /generated -->\n")
    return doc


@pytest.mark.parametrize("check", [[], ["--check"]])
def test_a_folder_given_as_a_doc_is_refused_in_one_line(tmp_path, capsys, check):
    code, out, err = run_command(capsys, *check, tmp_path)
    assert (code, out) == (2, "")
    assert err == f"error: {tmp_path} is a folder: name the docs themselves (e.g. {tmp_path}/*.md)\n"


def test_a_doc_that_is_not_utf8_is_refused_before_any_doc_is_rewritten(tmp_path, capsys, stale_doc):
    before = stale_doc.read_text()
    latin1 = tmp_path / "latin1.md"
    latin1.write_bytes("# Caf\u00e9\n".encode("latin-1"))
    for check in ([], ["--check"]):
        code, out, err = run_command(capsys, *check, stale_doc, latin1)
        assert (code, out) == (2, "")
        assert err == f"error: {latin1} is not UTF-8 text (byte 5: invalid continuation byte)\n"
    assert stale_doc.read_text() == before


def test_a_doc_outside_the_repository_is_rewritten_and_named_as_given(capsys, stale_doc):
    code, out, err = run_command(capsys, stale_doc)
    assert (code, out, err) == (0, f"rewrote the generated tables of {stale_doc}\n", "")
    assert "| 2.0 |" in stale_doc.read_text() and "| 1.0 |" not in stale_doc.read_text()
    assert run_command(capsys, "--check", stale_doc)[0] == 0  # nothing stale, no number quoted


def test_llm_offload_frontier_and_memory_bound_tables_say_not_measured_for_a_machine_without_the_parts():
    """The tables taken per machine: one whose results lack the parts gets a row and a source line
    saying so, never an error (the CPU machine has neither part)."""
    from analysis.doc_tables import llm_offload

    frontier = llm_offload.frontier_on("cpu-2core", ("frontier_models",))
    assert not frontier.sources and "not measured" in frontier.lines[-1]
    assert "no part of frontier_models on cpu-2core" in frontier.not_measured
    bound = llm_offload.memory_bound_on("cpu-2core", "CPU")
    assert not bound.sources and "has not run on the CPU" in bound.not_measured
