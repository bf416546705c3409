"""Numbers quoted in the prose of the README and docs/ are what the committed results say.

A time, size, bandwidth or percentage written in a sentence (outside the generated tables) carries
its source in a comment after it (analysis/doc_tables/quoted.py); this fails when one has none,
when its source no longer reads, and when the results it reads say something else.
"""

import pytest
from conftest import REPO_ROOT

from analysis.doc_tables import quoted

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def test_numbers_without_a_source_are_found():
    text = "A step takes 2.3 ms, with 41 GB/s and 12%, 1.4-4.9 s and 3 to 5 GiB.\n"
    assert [str(q) for q in quoted.quoted_numbers(text)] == [
        "line 1: 2.3 ms",
        "line 1: 41 GB/s",
        "line 1: 12 %",
        "line 1: 1.4-4.9 s",
        "line 1: 3 to 5 GiB",
    ]
    assert len(quoted.problems(text)) == 5


def test_tables_code_and_ordinary_counts_are_not_quoted_numbers():
    text = (
        "<!-- generated: t -->\n| 2.5 ms |\n<!-- /generated -->\n"
        "```\nsleep(3 s)\n```\nin `0.5 s` code, 16 cores, 4 layers, sm_90, v1.2s, x/4 ms\n"
    )
    assert quoted.quoted_numbers(text) == []


@pytest.mark.parametrize(
    "written, source, supported",
    [
        ("0.48 ms", "= 0.4849", True),
        ("0.48 ms", "= 0.4851", False),  # rounds to 0.49
        ("30 ms", "= 29.6", True),
        ("30 ms", "= 31", False),
        ("1,234 MiB", "= 1233.7", True),
        ("1.4-4.9 s", "= (1.37, 4.94)", True),
        ("1.4-4.9 s", "= (1.37, 4.96)", False),
        ("1.4-4.9 s", "= 1.4", False),  # a range needs both ends
        ("0.7 s", "~ 0.76", True),
        ("0.7 s", "~ 0.8", False),  # more than 10% away
        ("12 %", "given: the paper, table 3", True),
        ("5 GiB", "= rows('h200/ceilings/pcie_copy-h200').repetition.max() - 4", True),  # a numpy integer
        ("12 %", "= float('nan')", False),  # builtins are not reachable: the source fails
        ("12 %", "= 12 if 1 else", False),  # a broken expression
        ("12 %", "maybe 12", False),  # not a source's form
    ],
)
def test_a_source_supports_the_number_as_written(written, source, supported):
    found = quoted.problems(f"It was {written}<!-- {source} --> there.")
    assert (found == []) is supported, found


def test_a_number_written_twice_needs_its_source_once():
    assert quoted.problems("First 55 GB/s<!-- = 55.2 -->, later 55 GB/s again.") == []
    assert quoted.problems("First 55 GB/s<!-- = 56 -->, later 55 GB/s again.") != []


def test_a_source_reads_the_committed_results_and_names_a_missing_row():
    path = "h200/relational_gnn/knowledge_graphs-h200"
    value = quoted.median(path, model="rgcn", dataset="nations", variant="hector_best", mode="inference")
    assert 0 < value < 1
    shown = f"{value * 1e3:.3f} ms"
    where = 'model="rgcn", dataset="nations", variant="hector_best", mode="inference"'
    assert quoted.problems(f"{shown}<!-- = 1e3 * median({path!r}, {where}) -->") == []
    poisoned = f"{value * 1e3 + 0.01:.3f} ms"  # the same source, a different number
    assert quoted.problems(f"{poisoned}<!-- = 1e3 * median({path!r}, {where}) -->") != []
    [missing] = quoted.problems(f"{shown}<!-- = median({path!r}, model='no_such_model') -->")
    assert "no row of results/" in missing
    [no_file] = quoted.problems("1 s<!-- = median('h200/no_such_topic/part') -->")
    assert "no results file" in no_file
    [local] = quoted.problems("1 s<!-- = median('local/relational_gnn/datasets-cpu') -->")
    assert "not committed" in local  # results/local/ is ignored by git: a fresh clone has none


def test_a_numeric_filter_matches_a_column_read_as_floats():
    path = "h200/ceilings/uva_read-h200"
    where = dict(variant="random", host_memory="pinned", granularity_bytes=128)
    as_float = quoted.values(path, "bandwidth", table_bytes=2**30 / 4, **where)  # 268435456.0
    as_int = quoted.values(path, "bandwidth", table_bytes=2**28, **where)
    assert as_float == as_int and len(as_int) >= 3
    assert quoted.values(path, "bandwidth", table_bytes=2**30, **where) != as_int


def test_a_median_over_several_measurements_is_refused_unless_taken_on_purpose():
    path = "h200/ceilings/uva_read-h200"
    where = dict(variant="random", host_memory="pinned", table_bytes=2**30)  # every row size matches
    with pytest.raises(LookupError, match="differ in granularity_bytes"):
        quoted.median(path, "bandwidth", **where)
    [mixed] = quoted.problems(
        f"50 GB/s<!-- = median({path!r}, 'bandwidth', variant='random', host_memory='pinned') -->"
    )
    assert "several measurements" in mixed
    every = quoted.all_values(path, "bandwidth", **where)
    one = quoted.values(path, "bandwidth", granularity_bytes=128, **where)
    assert len(every) > len(one) >= 3 and set(one) <= set(every)


def test_a_source_may_restate_a_constant_of_the_code():
    assert quoted.problems("256 MiB<!-- = const('harness.errors:__name__') and 256 -->") == []
    with pytest.raises(AttributeError):
        quoted.const("harness.errors:NO_SUCH_NAME")


def test_the_readme_claims_rows_are_left_to_their_own_test():
    text = "| technique | claim | paper |\n|---|---|---|\n| Hector | up to 9.9x | 45% |\n\nThen 3 ms.\n"
    found = quoted.quoted_numbers(text, quoted.claims_table_rows(text))
    assert [str(q) for q in found] == ["line 5: 3 ms"]
    assert [p.split(":")[0] for p in quoted.problems(text)] == ["line 5"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_number_quoted_in_a_doc_is_what_its_source_says(doc):
    text = doc.read_text()
    found = quoted.problems(text)
    assert not found, f"{doc.relative_to(REPO_ROOT)}: numbers the committed results do not support:\n" + "\n".join(
        found
    )
