"""The real datasets, read from their published files into the suite's on-disk format.

Opt-in: the files are not downloaded here (these machines reach no network beyond package
registries); put them under a folder and import them once:

    python -m workloads.graphs.published reddit ~/datasets/reddit

Formats read:
* ``reddit`` (the archive PyG and DGL use): ``reddit_data.npz`` (``feature``, ``label``,
  ``node_types``: 1 train, 2 validation, 3 test) and ``reddit_graph.npz`` (a SciPy COO matrix:
  ``row``, ``col``, ``shape``), already holding both directions of every edge.
* ``ogbn-products`` (OGB's raw CSV): ``raw/edge.csv.gz``, ``raw/node-feat.csv.gz``,
  ``raw/node-label.csv.gz``, ``split/sales_ranking/{train,valid,test}.csv.gz``.
* ``ogbn-papers100M`` (OGB's raw binary): ``raw/data.npz`` (``edge_index``, ``node_feat``),
  ``raw/node-label.npz`` (``node_label``, NaN where unlabelled), ``split/time/{...}.csv.gz``.
OGB's edge lists hold each edge once; both directions go into the CSR, as the usual training
scripts make the graphs undirected.
"""

from __future__ import annotations

import argparse
import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.errors import UserError, exit_on_user_error
from workloads.graphs import store

SPLIT_FOLDER = {"ogbn-products": "sales_ranking", "ogbn-papers100M": "time"}


@dataclass(frozen=True)
class PublishedParams:
    """What identifies an imported dataset: its name and the sizes of the files it came from."""

    name: str
    files: dict = field(default_factory=dict)
    spec: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.name

    def as_dict(self) -> dict:
        return {"source": "published", "name": self.name, "files": self.files, "spec": self.spec}


def _need(path: Path) -> Path:
    if not path.exists():
        raise UserError(f"{path} is missing; see workloads/graphs/published.py for the files each dataset needs")
    return path


def csv_gz(path: Path, dtype) -> np.ndarray:
    with gzip.open(_need(path), "rt") as f:
        return np.loadtxt(f, delimiter=",", dtype=dtype, ndmin=1)


def _csr(rows: np.ndarray, cols: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR listing, for every node in ``rows``, its neighbours ``cols``."""
    order = np.argsort(rows, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    return indptr, cols[order].astype(np.int64)


def read_reddit(folder: Path) -> dict[str, np.ndarray]:
    data = np.load(_need(folder / "reddit_data.npz"))
    graph = np.load(_need(folder / "reddit_graph.npz"))
    n = int(data["label"].shape[0])
    # Messages flow col -> row: node `row` lists neighbour `col`.
    indptr, indices = _csr(graph["row"].astype(np.int64), graph["col"], n)
    types = data["node_types"]
    return {
        "indptr": indptr,
        "indices": indices,
        "features": data["feature"].astype(np.float32),
        "labels": data["label"].astype(np.int64),
        "train_idx": np.flatnonzero(types == 1),
        "val_idx": np.flatnonzero(types == 2),
        "test_idx": np.flatnonzero(types == 3),
    }


def read_ogb(name: str, folder: Path) -> dict[str, np.ndarray]:
    raw, split = folder / "raw", folder / "split" / SPLIT_FOLDER[name]
    if name == "ogbn-products":
        edges = csv_gz(raw / "edge.csv.gz", np.int64).reshape(-1, 2).T
        features = csv_gz(raw / "node-feat.csv.gz", np.float32)
        labels = csv_gz(raw / "node-label.csv.gz", np.int64).reshape(-1)
    else:
        data = np.load(_need(raw / "data.npz"))
        edges, features = data["edge_index"].astype(np.int64), data["node_feat"].astype(np.float32)
        label = np.load(_need(raw / "node-label.npz"))["node_label"].reshape(-1)
        labels = np.where(np.isnan(label), -1, label).astype(np.int64)  # -1: unlabelled
    n = features.shape[0]
    rows = np.concatenate([edges[1], edges[0]])
    cols = np.concatenate([edges[0], edges[1]])
    indptr, indices = _csr(rows, cols, n)
    return {
        "indptr": indptr,
        "indices": indices,
        "features": features,
        "labels": labels,
        "train_idx": csv_gz(split / "train.csv.gz", np.int64),
        "val_idx": csv_gz(split / "valid.csv.gz", np.int64),
        "test_idx": csv_gz(split / "test.csv.gz", np.int64),
    }


READERS = {
    "reddit": read_reddit,
    "ogbn-products": lambda f: read_ogb("ogbn-products", f),
    "ogbn-papers100M": lambda f: read_ogb("ogbn-papers100M", f),
}


def import_published(name: str, folder: Path, root: Path | None = None) -> Path:
    """Read a published dataset and store it in the suite's format (once per set of files);
    returns the graph's folder under ``root`` (default: the suite's graph store)."""
    root = Path(root) if root is not None else store.DEFAULT_ROOT
    if name not in READERS:
        raise UserError(f"unknown dataset {name!r}; one of {', '.join(READERS)}")
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder")
    files = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
    done = _imported_before(name, files, root)
    if done is not None:
        return done
    with store.writing(root / name):  # one import of a dataset at a time; the others then reuse it
        return _imported_before(name, files, root) or _import(name, folder, files, root)


def _imported_before(name: str, files: dict, root: Path) -> Path | None:
    """The folder of ``name`` already imported from the same files, if there is one."""
    for done in sorted(Path(root).glob(f"{name}-*/meta.json")):
        meta = json.loads(done.read_text())
        if meta.get("params", {}).get("files") == files:
            return done.parent
    return None


def _import(name: str, folder: Path, files: dict, root: Path) -> Path:
    arrays = READERS[name](folder)
    spec = {
        "name": name,
        "nodes": int(arrays["labels"].shape[0]),
        "edges": int(arrays["indices"].shape[0]),
        "feature_dim": int(arrays["features"].shape[1]),
        "classes": int(arrays["labels"].max()) + 1,
    }
    params = PublishedParams(name, files, spec)
    target = store.folder_for(params, root)
    store.save(arrays, params, target)
    store.load(target, params)  # the same checks as for generated graphs
    return target


@exit_on_user_error
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(READERS))
    parser.add_argument("folder", type=Path, help="folder holding the published files")
    args = parser.parse_args(argv)
    print(import_published(args.name, args.folder))


if __name__ == "__main__":
    main()
