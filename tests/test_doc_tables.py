"""The measured tables of docs/ are what their renderers make of the committed results.

A re-measured results file that changes a number fails here until `python -m analysis.doc_tables`
(or `make doc_tables`) rewrites the docs. Numbers next to an "x" (speedups) in the docs that
quote measurements stand inside generated blocks only, so none is left to go stale by hand.
"""

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
    assert re.search(r"^Source: `results/[^`]+\.csv`.* \(commit `[0-9a-f]{7}", body, re.M)


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

    committed = doc_tables.results_files("h200", "relational_gnn", ["datasets"], "h200")[0]
    files = relational_gnn.process_files("datasets")
    assert files[0] == committed
    commit = load_provenance(committed)["git"]["commit"]
    assert all(load_provenance(f)["git"]["commit"] == commit for f in files)
    other = [f for f in committed.parent.glob("reruns/*/datasets-h200.csv") if f not in files]
    assert other and all(load_provenance(f)["git"]["commit"] != commit for f in other)


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

    files = llm_offload.process_files("policies")
    assert files[0] == doc_tables.results_files("h200", "llm_offload", ["policies"], "h200")[0] and len(files) > 1
    ratios = llm_offload.per_process(files, "time")
    assert (ratios.xs("keep", level="variant") == 1).all().all()
    for file in files:  # each column: that process's median over that process's keep
        frame = doc_tables.load([file], "llm_offload")
        medians = frame[frame.metric == "time"].groupby("variant").value.median()
        expected = (medians / medians["keep"]).rename_axis("variant")
        got = ratios[str(file)].droplevel("dataset")
        pd.testing.assert_series_equal(got.sort_index(), expected.sort_index(), check_names=False)
