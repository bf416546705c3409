"""Relational graphs: the dataset-shaped heterograph generator (counts, schema, pair ratio, long
tails, seeding, the disk cache and its checks) and the real knowledge graphs from pykeen's wheel."""

import numpy as np
import pytest

from harness.errors import UserError
from workloads.graphs import knowledge, relational, store
from workloads.graphs.spec import GraphSpec, NodeType, Relation


def pairs_of(arrays, relations: int) -> int:
    """Distinct (source, relation) pairs of a graph in the store's layout."""
    return np.unique(arrays["indices"].astype(np.int64) * relations + arrays["edge_type"]).size


def targets_of(arrays) -> np.ndarray:
    return np.repeat(np.arange(len(arrays["indptr"]) - 1), np.diff(arrays["indptr"]))


@pytest.mark.parametrize("name", list(relational.PUBLISHED))
def test_every_dataset_shape_has_the_published_totals(name):
    published = relational.PUBLISHED[name]
    spec = relational.dataset_spec(name)
    assert (spec.nodes, spec.edges) == (published.nodes, published.edges)
    types = published.node_types if isinstance(published.node_types, int) else len(published.node_types)
    relations = published.relations if isinstance(published.relations, int) else len(published.relations)
    assert (len(spec.node_types), len(spec.relations)) == (types, relations)
    assert min(spec.node_type_counts) > 0 and min(spec.relation_counts) > 0
    # Long-tailed relations: a tenth of them hold most edges (ogbn-mag has only four, all large).
    counts = sorted(spec.relation_counts, reverse=True)
    if len(counts) >= 10:
        assert sum(counts[: len(counts) // 10]) > 0.5 * spec.edges
        assert counts[-1] < spec.edges / len(counts) / 5


def test_mag_has_its_real_schema():
    spec = relational.dataset_spec("mag")
    assert [(r.name, r.source, r.target, r.count) for r in spec.relations] == [
        ("affiliated_with", "author", "institution", 1_043_998),
        ("writes", "author", "paper", 7_145_660),
        ("cites", "paper", "paper", 5_416_271),
        ("has_topic", "paper", "field_of_study", 7_505_078),
    ]


@pytest.mark.parametrize("name", ["aifb", "mutag", "fb15k"])
def test_generated_graphs_pass_the_stores_checks_and_keep_every_count(name, tmp_path):
    """Saved and loaded through the store, whose load checks every type and relation count and
    that every edge joins the node types its relation names."""
    params = relational.HeteroParams(relational.dataset_spec(name), relational.PUBLISHED[name].unique_pair_ratio)
    arrays = store.get(params, tmp_path)
    spec = params.spec
    assert np.array_equal(np.bincount(arrays["edge_type"], minlength=len(spec.relations)), spec.relation_counts)
    assert np.array_equal(np.bincount(arrays["node_type"], minlength=len(spec.node_types)), spec.node_type_counts)
    assert arrays["features"].shape == (spec.nodes, relational.FEATURE_DIM)
    assert store.folder_for(params, tmp_path).name.startswith(f"{name}-like-")
    # Power-law degrees: the largest in- and out-degrees are far above the mean.
    mean = spec.edges / spec.nodes
    assert np.diff(arrays["indptr"]).max() > 20 * mean
    assert np.bincount(arrays["indices"]).max() > 20 * mean
    again = store.get(params, tmp_path)  # from the cache: the same arrays
    assert all(np.array_equal(arrays[k], again[k]) for k in arrays)


def test_the_pair_ratio_is_exact_where_no_type_caps_it():
    """One type of 50,000 nodes and relations far smaller: every relation gets exactly
    round(ratio x edges) distinct sources, each with at least one edge."""
    counts = [9000, 3000, 1000, 301, 7]
    spec = GraphSpec(
        "flat", 50_000, sum(counts), 8, 2, 0.0, 0.0,
        node_types=(NodeType("n", 50_000),),
        relations=tuple(Relation(f"r{i}", "n", "n", c) for i, c in enumerate(counts)),
    )  # fmt: skip
    for ratio in (0.05, 0.3, 1.0):
        arrays = relational.generate(relational.HeteroParams(spec, ratio, seed=3))
        assert pairs_of(arrays, len(counts)) == sum(max(1, round(ratio * c)) for c in counts)


def test_a_small_source_type_caps_the_pairs_of_its_relations():
    spec = GraphSpec(
        "capped", 1010, 5000, 8, 2, 0.0, 0.0,
        node_types=(NodeType("few", 10), NodeType("many", 1000)),
        relations=(Relation("from_few", "few", "many", 5000),),
    )  # fmt: skip
    arrays = relational.generate(relational.HeteroParams(spec, 0.5))
    assert pairs_of(arrays, 1) == 10
    assert set(arrays["indices"].tolist()) == set(range(10))  # the "few" type's ids
    assert targets_of(arrays).min() >= 10


def test_generation_is_seeded():
    spec = relational.dataset_spec("aifb")
    a, b = (relational.generate(relational.HeteroParams(spec, 0.5, seed=1)) for _ in range(2))
    c = relational.generate(relational.HeteroParams(spec, 0.5, seed=2))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["indices"], c["indices"])
    assert relational.dataset_spec("aifb", seed=1) != relational.dataset_spec("aifb", seed=2)


def test_scaled_shapes_generate_too():
    spec = relational.dataset_spec("am").scaled(0.01)
    arrays = relational.generate(relational.HeteroParams(spec, 0.5))
    assert arrays["indices"].shape == (spec.edges,) and len(arrays["indptr"]) == spec.nodes + 1


def test_bad_input_is_refused_in_one_line():
    with pytest.raises(UserError, match="unknown relational dataset 'cora'; one of aifb"):
        relational.dataset_spec("cora")
    spec = relational.dataset_spec("aifb")
    with pytest.raises(ValueError, match=r"unique_pair_ratio must be in \(0, 1\]"):
        relational.HeteroParams(spec, 1.5)
    with pytest.raises(ValueError, match="gamma must be > 2"):
        relational.HeteroParams(spec, 0.5, gamma=2.0)
    homogeneous = GraphSpec("plain", 10, 20, 4, 2, 0.5, 0.2)
    with pytest.raises(ValueError, match="needs node types and relations"):
        relational.HeteroParams(homogeneous, 0.5)


def test_a_source_hub_is_a_hub_in_every_relation():
    """The extra power-law edges went to the chosen sources in draw order: a relation's heaviest
    source was whichever rank came first (rank 786 or 2720 of 5000), not the type's hub, and the
    out-degrees' tail was far thinner than the exponent asked. Now, as for targets, the heaviest
    source of every relation is among the type's first ranks."""
    nodes = np.arange(5000)  # a node's id is its rank in the type's shared order
    for seed in range(12):
        src, dst = relational._relation_edges(1000, nodes, nodes, 0.5, 2.5, np.random.default_rng(seed))
        assert np.bincount(src).argmax() < 10 and np.bincount(dst).argmax() < 10, seed


def test_a_scale_factor_that_empties_a_node_type_a_relation_uses_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"^bgs: scale factor 0.0001 leaves node type \w+ without nodes while relation"):
        relational.dataset_spec("bgs").scaled(1e-4)
    found = str(pytest.raises(UserError, relational.dataset_spec("bgs").scaled, 1e-4).value)
    suggested = float(found.rsplit("about ", 1)[1].split()[0])
    relational.dataset_spec("bgs").scaled(suggested)  # the factor it suggests works


def test_the_store_refuses_a_saved_edge_whose_ends_are_not_its_relations_types(tmp_path):
    """The docs said the store's load checks the edges' endpoint types; only saving did."""
    params = relational.HeteroParams(relational.dataset_spec("aifb").scaled(0.05), 0.5)
    arrays = store.get(params, tmp_path)
    folder = store.folder_for(params, tmp_path)
    indices = np.load(folder / "indices.npy")
    node_type = np.asarray(arrays["node_type"])
    indices[0] = np.flatnonzero(node_type != node_type[indices[0]])[0]  # a source of another type
    np.save(folder / "indices.npy", indices)
    with pytest.raises(store.GraphFileError, match="edges join other node types than their relation's"):
        store.get(params, tmp_path)


@pytest.mark.parametrize(
    "name, entities, relations, triples",
    [("nations", 14, 55, 1992), ("kinships", 104, 25, 10686), ("umls", 135, 46, 6529)],
)
def test_the_knowledge_graphs_have_their_published_sizes(name, entities, relations, triples):
    spec, arrays = knowledge.load(name)
    assert (spec.nodes, len(spec.relations), spec.edges) == (entities, relations, triples)
    assert np.array_equal(np.bincount(arrays["edge_type"], minlength=relations), spec.relation_counts)
    assert arrays["indptr"][-1] == triples and arrays["indices"].max() < entities
    # The CSR holds the file's triples: spot-check one by its labels.
    first = knowledge.triples(name)[0]
    entity = sorted({h for h, _, _ in knowledge.triples(name)} | {t for _, _, t in knowledge.triples(name)})
    labels = [r.name for r in spec.relations]
    head, tail, kind = entity.index(first[0]), entity.index(first[2]), labels.index(first[1])
    lo, hi = arrays["indptr"][tail], arrays["indptr"][tail + 1]
    assert any(arrays["indices"][i] == head and arrays["edge_type"][i] == kind for i in range(lo, hi))


def test_an_unknown_knowledge_graph_is_refused():
    with pytest.raises(UserError, match="unknown knowledge graph 'wordnet'; one of nations"):
        knowledge.load("wordnet")
