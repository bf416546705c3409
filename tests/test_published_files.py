"""The readers of published dataset files on the files users really have: a folder holding a file
both plain and compressed, an extra column, a byte order mark, a repeated triple, one RDF term
spelled two ways, splits that overlap, a re-written split. Each either gives the graph the files
say (counted here independently) or is refused in one line naming the file."""

from __future__ import annotations

import gzip
import os
import re

import numpy as np
import pytest

from harness.errors import UserError
from workloads.graphs import knowledge, store
from workloads.graphs.published import import_published
from workloads.graphs.published_heterographs import ntriples, ogb

KNOWS, NAME = "<http://x/knows>", "<http://x/name>"


def counts(spec) -> tuple[int, int, int]:
    return spec.nodes, spec.edges, len(spec.relations)


def one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


# -- N-Triples --------------------------------------------------------------------------------------
def test_a_triple_written_twice_is_one_edge_and_a_folder_holding_a_file_twice_is_refused(tmp_path):
    lines = [f"<http://x/a> {KNOWS} <http://x/b> .", f"<http://x/b> {KNOWS} <http://x/a> ."]
    (tmp_path / "x.nt").write_text("\n".join([*lines, lines[0]]) + "\n")  # the first triple twice
    assert counts(ntriples("aifb", tmp_path)[0]) == (2, 2, 1)
    with gzip.open(tmp_path / "x.nt.gz", "wt") as f:  # as `gunzip -k` leaves a folder
        f.write("\n".join(lines) + "\n")
    with pytest.raises(UserError) as error:
        ntriples("aifb", tmp_path)
    assert "x.nt.gz and x.nt are both there" in one_line(error)


def test_one_rdf_term_spelled_two_ways_is_one_node_and_blank_node_labels_are_local_to_a_file(tmp_path):
    (tmp_path / "a.nt").write_text(
        "\ufeff"  # a byte order mark: not part of the first subject
        f'<http://x/caf\\u00E9> {NAME} "v" .\n'
        f'<http://x/café> {NAME} "v"^^<http://www.w3.org/2001/XMLSchema#string> .  # a comment after the dot\n'
        f'<http://x/b> {NAME} "hi"@EN .\n'
        f'<http://x/b> {NAME} "hi"@en .\n'
        f"_:n {KNOWS} <http://x/b> .\n"
    )
    (tmp_path / "b.nt").write_text(f"_:n {KNOWS} <http://x/b> .\n")  # another document's _:n
    spec, _ = ntriples("aifb", tmp_path)
    # nodes: café, "v", b, "hi"@en, a's _:n, b's _:n; edges: one per distinct triple
    assert counts(spec) == (6, 4, 2)


# gzip data with mtime=0: a header stamped with the clock would give each pytest-xdist worker other
# test ids, collected a second apart.
@pytest.mark.parametrize(
    "name, content, message",
    [
        (
            "a.nt",
            gzip.compress(b"<http://x/a> <http://x/k> <http://x/b> .\n", mtime=0),
            "a compressed file without|compressed,",
        ),
        ("a.nt.gz", b"<http://x/a> <http://x/k> <http://x/b> .\n", "named .gz but not gzip-compressed"),
        ("a.nt", "<http://x/caf\xe9> <http://x/k> <http://x/b> .\n".encode("latin-1"), "not N-Triples text in UTF-8"),
        ("a.nt", b"# nothing but a comment\n", "hold no triple"),
    ],
)
def test_files_that_are_not_n_triples_text_are_refused_in_one_line(tmp_path, name, content, message):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(UserError) as error:
        ntriples("aifb", tmp_path)
    assert re.search(message, one_line(error))


# -- OGB's raw layout --------------------------------------------------------------------------------
def write_gz(path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")


def hetero(tmp_path, counts_lines=("paper,author", "3,2"), edges=("0,1", "2,0")):
    raw = tmp_path / "mag" / "raw"
    write_gz(raw / "num-node-dict.csv.gz", list(counts_lines))
    write_gz(raw / "relations" / "paper___cites___paper" / "edge.csv.gz", list(edges))
    return tmp_path / "mag"


def test_an_edge_file_with_a_weight_column_is_refused_not_read_as_more_edges(tmp_path):
    assert counts(ogb("mag", hetero(tmp_path))[0]) == (5, 2, 1)
    with pytest.raises(UserError) as error:
        ogb("mag", hetero(tmp_path, edges=("0,1,1", "2,0,1")))
    assert "edge.csv.gz: 3 columns, expected 2" in one_line(error)
    raw = tmp_path / "wikikg2" / "raw"
    write_gz(raw / "num-node-list.csv.gz", ["4"])
    write_gz(raw / "edge.csv.gz", ["0,1,5", "2,3,5"])
    write_gz(raw / "edge_reltype.csv.gz", ["0", "1"])
    with pytest.raises(UserError, match="3 columns, expected 2"):
        ogb("wikikg2", tmp_path / "wikikg2")


@pytest.mark.parametrize(
    "counts_lines, edges, message",
    [
        (("paper,paper", "3,2"), ("0,1",), "a node type is named twice"),
        (("paper,author", "3,-1"), ("0,1",), "non-negative whole numbers"),
        (("paper,author", "3"), ("0,1",), "a row of as many node counts"),
        (("paper,author", "3,2"), ("src,dst", "0,1"), "not a CSV of int64 values"),
    ],
)
def test_a_malformed_ogb_file_is_refused_in_one_line_naming_it(tmp_path, counts_lines, edges, message):
    with pytest.raises(UserError) as error:
        ogb("mag", hetero(tmp_path, counts_lines, edges))
    assert message in one_line(error)


# -- tab-separated knowledge graphs ------------------------------------------------------------------
def fb15k(tmp_path, train: bytes):
    (tmp_path / "train.txt").write_bytes(train)
    (tmp_path / "valid.txt").write_text("")
    (tmp_path / "test.txt").write_text("")
    return knowledge.load("fb15k", tmp_path)[0]


def test_a_byte_order_mark_and_spaces_around_names_do_not_make_new_entities(tmp_path):
    assert counts(fb15k(tmp_path, b"\xef\xbb\xbfa\tr\tb \r\nb\tr\t a\r\n")) == (2, 2, 1)


@pytest.mark.parametrize(
    "train, message",
    [
        ("a\tr\tb\u2028c\ts\td\n".encode(), "expected head, relation and tail"),  # one line, not two
        (gzip.compress(b"a\tr\tb\n", mtime=0), "not UTF-8 text"),
        (b"", "no triples"),
    ],
)
def test_a_knowledge_graph_file_that_is_not_triples_is_refused_in_one_line(tmp_path, train, message):
    with pytest.raises(UserError) as error:
        fb15k(tmp_path, train)
    assert message in one_line(error)


# -- node-classification datasets --------------------------------------------------------------------
def products(tmp_path, splits=None, edges=((0, 1), (2, 3), (3, 0))):
    root = tmp_path / "ogbn_products"
    write_gz(root / "raw" / "edge.csv.gz", [f"{a},{b}" for a, b in edges])
    write_gz(root / "raw" / "node-feat.csv.gz", ["0.5,1.5", "1,2", "3,4", "5,6"])
    write_gz(root / "raw" / "node-label.csv.gz", ["0", "1", "0", "1"])
    for split, ids in (splits or {"train": [0, 1], "valid": [2], "test": [3]}).items():
        write_gz(root / "split" / "sales_ranking" / f"{split}.csv.gz", [str(i) for i in ids])
    return root


@pytest.mark.parametrize(
    "splits, edges, message",
    [
        ({"train": [0, 1], "valid": [1], "test": [3]}, ((0, 1),), "val_idx and train_idx share nodes"),
        ({"train": [0, 0], "valid": [2], "test": [3]}, ((0, 1),), "train_idx names a node more than once"),
        ({"train": [0, 1], "valid": [2], "test": [9]}, ((0, 1),), "test_idx: a node id outside 0..3"),
        (None, ((0, 1), (-1, 2)), "edge.csv.gz: a node id outside 0..3"),
        (None, ((0, 7),), "edge.csv.gz: a node id outside 0..3"),
    ],
)
def test_splits_and_edges_the_graph_does_not_hold_are_refused_at_import(tmp_path, splits, edges, message):
    with pytest.raises(UserError) as error:
        import_published("ogbn-products", products(tmp_path, splits, edges), root=tmp_path / "graphs")
    assert message in one_line(error)


def test_a_split_rewritten_with_the_same_size_is_imported_again(tmp_path):
    root = products(tmp_path)
    first = store.load(import_published("ogbn-products", root, root=tmp_path / "graphs"))
    assert first["train_idx"].tolist() == [0, 1]
    split = root / "split" / "sales_ranking"
    before = {p.name: p.stat().st_size for p in split.iterdir()}
    write_gz(split / "train.csv.gz", ["0", "2"])  # the same byte count, other nodes
    write_gz(split / "valid.csv.gz", ["1"])
    assert {p.name: p.stat().st_size for p in split.iterdir()} == before
    stamp = (split / "train.csv.gz").stat()
    os.utime(split / "train.csv.gz", ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 10**9))  # a coarse clock
    again = store.load(import_published("ogbn-products", root, root=tmp_path / "graphs"))
    assert again["train_idx"].tolist() == [0, 2] and again["val_idx"].tolist() == [1]


def test_a_reddit_neighbour_outside_the_graph_is_refused_at_import(tmp_path):
    raw = tmp_path / "reddit"
    raw.mkdir()
    row, col = np.array([0, 1, 2, 9]), np.array([1, 0, 3, 2])
    np.savez(raw / "reddit_graph.npz", row=row, col=col, data=np.ones(4), shape=np.array([4, 4]), format=b"coo")
    np.savez(
        raw / "reddit_data.npz", feature=np.ones((4, 2)), label=np.arange(4) % 2, node_types=np.array([1, 1, 2, 3])
    )
    with pytest.raises(UserError) as error:
        import_published("reddit", raw, root=tmp_path / "graphs")
    assert "reddit_graph.npz: a node id outside 0..3" in one_line(error)
