"""Synthetic graphs: their statistics, their determinism, and the on-disk cache's refusals."""

import json

import numpy as np
import pytest

from workloads.graphs import store
from workloads.graphs.generate import GeneratorParams, generate
from workloads.graphs.spec import DATASETS, GraphSpec

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
    return {node: sorted(indices[indptr[node]:indptr[node + 1]].tolist()) for node in range(len(indptr) - 1)}


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
    np.savez(raw / "reddit_data.npz", feature=rng.standard_normal((n, d)), label=rng.integers(0, 4, n), node_types=types)
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
    np.savez(root / "raw" / "data.npz", edge_index=rng.integers(0, n, (2, 15)),
             node_feat=rng.standard_normal((n, 4)).astype(np.float16), num_nodes_list=np.array([n]))
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
