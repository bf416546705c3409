"""Synthetic graphs: their statistics, their determinism, and the on-disk cache's refusals;
heterographs' node types and relations in the spec and the store."""

import json
from dataclasses import replace

import numpy as np
import pytest

from workloads.graphs import store
from workloads.graphs.generate import GeneratorParams, generate
from workloads.graphs.spec import DATASETS, GraphSpec, NodeType, Relation

SMALL = DATASETS["ogbn-products"].scaled(0.002)


def test_scaled_spec_keeps_shape_and_average_degree():
    spec = DATASETS["reddit"].scaled(0.01)
    assert spec.feature_dim == 602 and spec.classes == 41
    assert spec.edges / spec.nodes == pytest.approx(DATASETS["reddit"].edges / DATASETS["reddit"].nodes, rel=0.01)
    with pytest.raises(ValueError):
        DATASETS["reddit"].scaled(0)


def test_generated_graph_has_the_spec_statistics_and_a_signal():
    params = GeneratorParams(SMALL, seed=3)
    g = generate(params)
    n, m = SMALL.nodes, SMALL.edges
    assert g["indptr"].shape == (n + 1,) and g["indptr"][-1] == m and g["indices"].shape == (m,)
    assert g["indices"].min() >= 0 and g["indices"].max() < n
    assert g["features"].shape == (n, SMALL.feature_dim) and g["features"].dtype == np.float32
    assert set(np.unique(g["labels"])) <= set(range(SMALL.classes))
    degrees = np.diff(g["indptr"])
    assert degrees.max() > 10 * degrees.mean()  # power law: hubs far above the mean
    # Hubs are scattered over the id range (random ids), not packed at the start.
    hubs = np.argsort(degrees)[-20:]
    assert hubs.min() < n // 2 < hubs.max()
    src = np.repeat(np.arange(n), degrees)
    same_class = (g["labels"][src] == g["labels"][g["indices"]]).mean()
    assert 0.55 < same_class < 0.7  # homophily 0.6 plus chance
    # Features predict labels: nearest class mean beats chance by far.
    means = np.stack([g["features"][g["labels"] == c].mean(0) for c in range(SMALL.classes)])
    predicted = np.argmax(g["features"] @ means.T - 0.5 * (means**2).sum(1), axis=1)
    assert (predicted == g["labels"]).mean() > 5.0 / SMALL.classes
    split = np.concatenate([g["train_idx"], g["val_idx"], g["test_idx"]])
    assert np.array_equal(np.sort(split), np.arange(n))


def test_generation_is_deterministic_per_seed():
    a, b, c = (generate(GeneratorParams(SMALL, seed=s)) for s in (1, 1, 2))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["indices"], c["indices"])


def test_cache_round_trip_and_reuse(tmp_path):
    params = GeneratorParams(SMALL, seed=4)
    g = store.get(params, root=tmp_path)
    folder = store.folder_for(params, tmp_path)
    mtime = (folder / "indices.npy").stat().st_mtime_ns
    again = store.get(params, root=tmp_path)
    assert (folder / "indices.npy").stat().st_mtime_ns == mtime  # reused, not regenerated
    assert all(np.array_equal(g[k], again[k]) for k in g)
    assert isinstance(again["features"], np.memmap)


def test_a_graph_another_process_is_writing_is_waited_for_and_then_loaded(tmp_path, monkeypatch):
    """Two workers asking for one missing graph at once: the second waits on the folder's lock,
    then loads what the first wrote instead of generating it again over the first's files."""
    import fcntl
    import threading
    import types

    params = GeneratorParams(SMALL, seed=8)
    folder = store.folder_for(params, tmp_path)
    asked = threading.Event()

    def flock(file, operation):
        if operation == fcntl.LOCK_EX:
            asked.set()
        fcntl.flock(file, operation)

    def never(*args, **kwargs):
        raise AssertionError("generated a graph that another process had written")

    monkeypatch.setattr(
        store, "fcntl", types.SimpleNamespace(flock=flock, LOCK_EX=fcntl.LOCK_EX, LOCK_UN=fcntl.LOCK_UN)
    )
    got = {}
    with store.writing(folder):  # the first worker, still generating
        asked.clear()
        monkeypatch.setitem(store.GENERATORS, GeneratorParams, never)

        def second_worker():
            try:
                got["arrays"] = store.get(params, root=tmp_path)
            except BaseException as err:  # handed to the test's thread
                got["error"] = err

        second = threading.Thread(target=second_worker)
        second.start()
        # Generous bounds: they only decide how long a broken lock takes to be reported.
        assert asked.wait(timeout=120), "the second worker never asked for the lock"
        store.save(generate(params), params, folder)
    second.join(timeout=120)
    assert not second.is_alive() and "error" not in got, got.get("error")
    assert set(got["arrays"]) == set(store.ARRAYS)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([folder.name, f".{folder.name}.lock"])


def test_other_parameters_get_their_own_folder_and_are_never_reused(tmp_path):
    a = GeneratorParams(SMALL, seed=5)
    b = GeneratorParams(SMALL, seed=5, homophily=0.3)
    assert store.folder_for(a, tmp_path) != store.folder_for(b, tmp_path)
    store.get(a, root=tmp_path)
    with pytest.raises(store.GraphFileError, match="cached with other parameters"):
        store.load(store.folder_for(a, tmp_path), b)


def test_truncated_or_tampered_files_are_refused(tmp_path):
    params = GeneratorParams(SMALL, seed=6)
    store.get(params, root=tmp_path)
    folder = store.folder_for(params, tmp_path)
    indices = folder / "indices.npy"
    data = indices.read_bytes()
    indices.write_bytes(data[: len(data) // 2])
    with pytest.raises(store.GraphFileError, match="truncated or replaced"):
        store.load(folder, params)
    indices.write_bytes(data)
    meta = json.loads((folder / "meta.json").read_text())
    meta["params"]["spec"]["edges"] += 1
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(store.GraphFileError, match="edges, the name promises"):
        store.load(folder)
    (folder / "meta.json").unlink()
    with pytest.raises(store.GraphFileError, match="no meta.json"):
        store.load(folder)


# --- the published formats, on tiny fixtures written in them ----------------------------------


def _gz_csv(path, rows):
    import gzip

    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for row in rows:
            f.write(",".join(str(v) for v in np.atleast_1d(row)) + "\n")


def _expected_csr(rows, cols, n):
    return {node: sorted(cols[rows == node].tolist()) for node in range(n)}


def _csr_as_dict(arrays):
    indptr, indices = arrays["indptr"], arrays["indices"]
    return {node: sorted(indices[indptr[node] : indptr[node + 1]].tolist()) for node in range(len(indptr) - 1)}


def test_reddit_files_import(tmp_path):
    from workloads.graphs.published import import_published

    rng = np.random.default_rng(0)
    n, d = 12, 5
    row, col = rng.integers(0, n, 40), rng.integers(0, n, 40)
    row, col = np.concatenate([row, col]), np.concatenate([col, row])  # both directions, as published
    raw = tmp_path / "reddit"
    raw.mkdir()
    np.savez(raw / "reddit_graph.npz", row=row, col=col, data=np.ones(row.size), shape=np.array([n, n]), format=b"coo")
    types = np.array([1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    np.savez(
        raw / "reddit_data.npz", feature=rng.standard_normal((n, d)), label=rng.integers(0, 4, n), node_types=types
    )
    arrays = store.load(import_published("reddit", raw, root=tmp_path / "graphs"))
    assert _csr_as_dict(arrays) == _expected_csr(row, col, n)
    assert arrays["features"].shape == (n, d) and arrays["features"].dtype == np.float32
    assert arrays["train_idx"].tolist() == list(range(6)) and arrays["test_idx"].tolist() == [9, 10, 11]


def test_ogb_products_files_import_as_an_undirected_graph(tmp_path):
    from workloads.graphs.published import import_published

    rng = np.random.default_rng(1)
    n, d = 10, 3
    edges = rng.integers(0, n, (25, 2))
    root = tmp_path / "ogbn_products"
    _gz_csv(root / "raw" / "edge.csv.gz", edges)
    _gz_csv(root / "raw" / "node-feat.csv.gz", rng.standard_normal((n, d)).round(4))
    _gz_csv(root / "raw" / "node-label.csv.gz", rng.integers(0, 3, n))
    for split, ids in (("train", [0, 1, 2, 3]), ("valid", [4, 5]), ("test", [6, 7, 8, 9])):
        _gz_csv(root / "split" / "sales_ranking" / f"{split}.csv.gz", ids)
    arrays = store.load(import_published("ogbn-products", root, root=tmp_path / "graphs"))
    rows = np.concatenate([edges[:, 1], edges[:, 0]])
    cols = np.concatenate([edges[:, 0], edges[:, 1]])
    assert _csr_as_dict(arrays) == _expected_csr(rows, cols, n)
    assert arrays["val_idx"].tolist() == [4, 5]


def test_ogb_papers_files_import_with_unlabelled_nodes(tmp_path):
    from workloads.graphs.published import import_published

    rng = np.random.default_rng(2)
    n = 8
    root = tmp_path / "ogbn_papers100M"
    (root / "raw").mkdir(parents=True)
    np.savez(
        root / "raw" / "data.npz",
        edge_index=rng.integers(0, n, (2, 15)),
        node_feat=rng.standard_normal((n, 4)).astype(np.float16),
        num_nodes_list=np.array([n]),
    )
    label = rng.integers(0, 5, (n, 1)).astype(np.float32)
    label[3] = np.nan
    np.savez(root / "raw" / "node-label.npz", node_label=label)
    for split, ids in (("train", [0, 1]), ("valid", [2]), ("test", [4])):
        _gz_csv(root / "split" / "time" / f"{split}.csv.gz", ids)
    arrays = store.load(import_published("ogbn-papers100M", root, root=tmp_path / "graphs"))
    assert arrays["labels"][3] == -1 and arrays["labels"][0] == int(label[0, 0])
    assert arrays["indices"].shape == (30,)  # both directions


def test_published_import_refuses_missing_files(tmp_path):
    from harness.errors import UserError
    from workloads.graphs.published import import_published

    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="reddit_data.npz is missing"):
        import_published("reddit", tmp_path / "empty", root=tmp_path / "graphs")
    with pytest.raises(UserError, match="unknown dataset"):
        import_published("cora", tmp_path / "empty", root=tmp_path / "graphs")


# --- heterographs: node types and relations in the spec and the store --------------------------

PAPER_AUTHOR = (NodeType("paper", 0), NodeType("author", 0))
# In the CSR a target node lists its source neighbours: a paper lists the authors who write it.
RELATIONS = (
    Relation("writes", "author", "paper", 0),
    Relation("cites", "paper", "paper", 0),
    Relation("written_by", "paper", "author", 0),
)


class _Params:
    """Store parameters for a hand-made graph (the store needs a label and as_dict only)."""

    def __init__(self, spec: GraphSpec):
        self.spec = spec

    @property
    def label(self) -> str:
        return self.spec.name

    def as_dict(self) -> dict:
        return {"source": "test", "spec": self.spec.as_dict()}


def _heterograph(seed: int = 0, n: int = 40) -> tuple[GraphSpec, dict]:
    """Papers and authors; every node lists neighbours of the types its relations allow."""
    rng = np.random.default_rng(seed)
    node_type = rng.integers(0, 2, n).astype(np.int64)
    node_type[:2] = [0, 1]  # both types present
    papers, authors = np.flatnonzero(node_type == 0), np.flatnonzero(node_type == 1)
    indptr, indices, edge_type = [0], [], []
    for v in range(n):
        if node_type[v] == 0:  # a paper: its authors, then the papers it cites
            chosen = [(int(a), 0) for a in rng.choice(authors, 2)] + [(int(p), 1) for p in rng.choice(papers, 3)]
        else:
            chosen = [(int(p), 2) for p in rng.choice(papers, 2)]
        indices += [u for u, _ in chosen]
        edge_type += [r for _, r in chosen]
        indptr.append(len(indices))
    m = len(indices)
    spec = GraphSpec(
        "toy-hetero",
        n,
        m,
        4,
        3,
        0.5,
        0.25,
        node_types=tuple(NodeType(t.name, int((node_type == i).sum())) for i, t in enumerate(PAPER_AUTHOR)),
        relations=tuple(Relation(r.name, r.source, r.target, edge_type.count(i)) for i, r in enumerate(RELATIONS)),
    )
    perm = rng.permutation(n)
    arrays = {
        "indptr": np.array(indptr, dtype=np.int64),
        "indices": np.array(indices, dtype=np.int64),
        "features": rng.standard_normal((n, 4)).astype(np.float32),
        "labels": rng.integers(0, 3, n).astype(np.int64),
        "train_idx": np.sort(perm[:20]),
        "val_idx": np.sort(perm[20:30]),
        "test_idx": np.sort(perm[30:]),
        "node_type": node_type,
        "edge_type": np.array(edge_type, dtype=np.int64),
    }
    return spec, arrays


def _saved_heterograph(tmp_path):
    spec, arrays = _heterograph()
    params = _Params(spec)
    folder = store.folder_for(params, tmp_path)
    store.save(arrays, params, folder)
    return spec, arrays, params, folder


def test_a_heterograph_round_trips_through_the_store_with_its_types(tmp_path):
    spec, arrays, params, folder = _saved_heterograph(tmp_path)
    loaded = store.load(folder, params)
    assert set(loaded) == set(store.ARRAYS) | {"node_type", "edge_type"}
    for name, array in arrays.items():
        assert np.array_equal(loaded[name], array), name
    for name in ("node_type", "edge_type"):
        assert loaded[name].dtype == np.int16 and isinstance(loaded[name], np.memmap)  # few types: 2 bytes each
    # Ids in range, counted as the spec records them (which the meta record holds).
    assert np.bincount(loaded["node_type"]).tolist() == list(spec.node_type_counts) and spec.node_type_counts[1] > 0
    assert np.bincount(loaded["edge_type"], minlength=3).tolist() == list(spec.relation_counts)
    meta = json.loads((folder / "meta.json").read_text())
    assert GraphSpec.from_dict(meta["params"]["spec"]) == spec
    assert [t["count"] for t in meta["params"]["spec"]["node_types"]] == list(spec.node_type_counts)
    assert store.type_id(meta["params"]["spec"], "author") == 1


def test_wide_type_ids_are_stored_as_int32():
    assert store.type_dtype(2) == np.int16 and store.type_dtype(32768) == np.int16
    assert store.type_dtype(32769) == np.int32


def test_a_truncated_or_out_of_range_type_array_is_refused_on_load(tmp_path):
    spec, _, params, folder = _saved_heterograph(tmp_path)
    path = folder / "edge_type.npy"
    data = path.read_bytes()
    path.write_bytes(data[:-6])
    with pytest.raises(store.GraphFileError, match=r"edge_type.npy: .*\(truncated or replaced\); delete"):
        store.load(folder, params)
    path.write_bytes(data)
    # Same size and dtype, one id past the last node type.
    node_type = np.load(folder / "node_type.npy")
    bad = node_type.copy()
    bad[5] = 2
    np.save(folder / "node_type.npy", bad)
    with pytest.raises(store.GraphFileError, match=r"node_type holds ids outside 0\.\.1; delete the folder"):
        store.load(folder, params)
    bad[5] = -1
    np.save(folder / "node_type.npy", bad)
    with pytest.raises(store.GraphFileError, match=r"node_type holds ids outside 0\.\.1"):
        store.load(folder, params)
    # In range, but a node moved to the other type: the counts no longer match the spec.
    bad[5] = 1 - node_type[5]
    np.save(folder / "node_type.npy", bad)
    with pytest.raises(store.GraphFileError, match="node_type counts .* the spec records"):
        store.load(folder, params)
    np.save(folder / "node_type.npy", node_type)
    # A whole array, consistently recorded, but one entry short of the edges.
    np.save(path, np.load(path)[:-1])
    meta = json.loads((folder / "meta.json").read_text())
    meta["arrays"]["edge_type"].update(shape=[spec.edges - 1], file_bytes=path.stat().st_size)
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(store.GraphFileError, match=f"edge_type has shape .* the graph has {spec.edges} edges"):
        store.load(folder, params)
    (folder / "edge_type.npy").unlink()
    with pytest.raises(store.GraphFileError, match="edge_type.npy: missing"):
        store.load(folder, params)


def test_a_wrong_heterograph_is_never_written(tmp_path):
    spec, arrays = _heterograph(seed=1)
    params = _Params(spec)
    folder = store.folder_for(params, tmp_path)
    wrong = arrays | {"edge_type": arrays["edge_type"].copy()}
    wrong["edge_type"][0] = 7
    with pytest.raises(ValueError, match=r"edge_type holds ids outside 0\.\.2"):
        store.save(wrong, params, folder)
    # A paper's "writes" edge (author -> paper) relabelled "cites" (paper -> paper): counts change
    # too, so the spec is adjusted to match; only the endpoints are wrong.
    wrong["edge_type"] = arrays["edge_type"].copy()
    first_writes = int(np.flatnonzero(arrays["edge_type"] == 0)[0])
    wrong["edge_type"][first_writes] = 1
    counts = list(spec.relation_counts)
    counts[0], counts[1] = counts[0] - 1, counts[1] + 1
    shifted = _Params(replace(spec, relations=tuple(replace(r, count=c) for r, c in zip(spec.relations, counts))))
    with pytest.raises(ValueError, match="1 edges join other node types than their relation's"):
        store.save(wrong, shifted, folder)
    with pytest.raises(ValueError, match="needs the arrays node_type"):
        store.save({k: v for k, v in arrays.items() if k != "node_type"}, params, folder)
    assert not folder.exists() and not list(tmp_path.iterdir())


def test_heterograph_specs_check_their_types_and_scale_them():
    spec, _ = _heterograph()
    with pytest.raises(ValueError, match="must sum to"):
        replace(spec, nodes=spec.nodes + 1)
    with pytest.raises(ValueError, match="joins venue and paper"):
        replace(spec, relations=(Relation("at", "venue", "paper", spec.edges),))
    with pytest.raises(ValueError, match="both node types and relations"):
        replace(spec, relations=())
    big = GraphSpec(
        "big",
        10_000,
        100_000,
        8,
        5,
        0.5,
        0.1,
        node_types=(NodeType("paper", 7_001), NodeType("author", 2_999)),
        relations=(Relation("writes", "author", "paper", 30_001), Relation("cites", "paper", "paper", 69_999)),
    )
    small = big.scaled(0.1)
    assert sum(small.node_type_counts) == small.nodes == 1_000 and small.node_type_counts == (700, 300)
    assert sum(small.relation_counts) == small.edges == 10_000 and small.relation_counts == (3_000, 7_000)
    assert GraphSpec.from_dict(json.loads(json.dumps(small.as_dict()))) == small
    with pytest.raises(ValueError, match="homogeneous graphs only"):
        GeneratorParams(big)


def test_homogeneous_graphs_are_the_one_type_case_and_keep_their_cache(tmp_path):
    assert SMALL.homogeneous and SMALL.node_type_counts == (SMALL.nodes,) and SMALL.relation_counts == (SMALL.edges,)
    assert "node_types" not in SMALL.as_dict() and "relations" not in SMALL.as_dict()
    # The folder name computed before node and edge types existed: caches written then stay valid.
    params = GeneratorParams(SMALL, seed=0)
    assert store.folder_for(params, tmp_path).name == "ogbn-products-like-f80b585b00c5"
    arrays = store.get(params, root=tmp_path)
    assert set(arrays) == set(store.ARRAYS)
    assert not (store.folder_for(params, tmp_path) / "node_type.npy").exists()
