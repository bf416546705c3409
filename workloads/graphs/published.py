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
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.errors import UserError, exit_on_user_error
from workloads.graphs import store

SPLIT_FOLDER = {"ogbn-products": "sales_ranking", "ogbn-papers100M": "time"}


@dataclass(frozen=True)
class PublishedParams:
    """What identifies an imported dataset: its name and the sizes and modification times of the
    files it came from."""

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


# What reading a file that is not the (compressed) text it is named as raises.
UNREADABLE = (UnicodeDecodeError, gzip.BadGzipFile, EOFError)


def csv_gz(path: Path, dtype, columns: int | None = None) -> np.ndarray:
    """A gzip-compressed CSV of numbers (no header row), refused in one line where it cannot be
    read as such: a table (rows by columns); with ``columns``, of exactly that many columns (one
    column: a vector), so that an extra column (a weight) is refused, not read as more rows."""
    try:
        with gzip.open(_need(path), "rt", encoding="utf-8-sig") as f, warnings.catch_warnings():
            warnings.filterwarnings("ignore", "loadtxt: input contained no data")  # an empty file: no rows
            table = np.loadtxt(f, delimiter=",", dtype=dtype, ndmin=2)
    except UNREADABLE as err:
        raise UserError(f"{path}: not a gzip-compressed CSV file ({err})") from None
    except ValueError as err:  # a header row, another separator, a float where integers are expected
        raise UserError(f"{path}: not a CSV of {np.dtype(dtype).name} values separated by commas ({err})") from None
    if columns is None:
        return table
    if table.size and table.shape[1] != columns:
        raise UserError(f"{path}: {table.shape[1]} columns, expected {columns}")
    table = table.reshape(-1, columns)
    return table.ravel() if columns == 1 else table


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
    rows, cols = graph["row"].astype(np.int64), graph["col"].astype(np.int64)
    _check_ids(folder / "reddit_graph.npz", np.concatenate([rows, cols]), n)
    # Messages flow col -> row: node `row` lists neighbour `col`.
    indptr, indices = _csr(rows, cols, n)
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
        edges = csv_gz(raw / "edge.csv.gz", np.int64, columns=2).T
        features = csv_gz(raw / "node-feat.csv.gz", np.float32)
        labels = csv_gz(raw / "node-label.csv.gz", np.int64, columns=1)
    else:
        data = np.load(_need(raw / "data.npz"))
        edges, features = data["edge_index"].astype(np.int64), data["node_feat"].astype(np.float32)
        label = np.load(_need(raw / "node-label.npz"))["node_label"].reshape(-1)
        labels = np.where(np.isnan(label), -1, label).astype(np.int64)  # -1: unlabelled
    n = features.shape[0]
    _check_ids(raw / ("edge.csv.gz" if name == "ogbn-products" else "data.npz"), edges.ravel(), n)
    rows = np.concatenate([edges[1], edges[0]])
    cols = np.concatenate([edges[0], edges[1]])
    indptr, indices = _csr(rows, cols, n)
    return {
        "indptr": indptr,
        "indices": indices,
        "features": features,
        "labels": labels,
        "train_idx": csv_gz(split / "train.csv.gz", np.int64, columns=1),
        "val_idx": csv_gz(split / "valid.csv.gz", np.int64, columns=1),
        "test_idx": csv_gz(split / "test.csv.gz", np.int64, columns=1),
    }


def _check_ids(where, ids: np.ndarray, nodes: int) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= nodes):
        raise UserError(f"{where}: a node id outside 0..{nodes - 1} (the graph has {nodes} nodes)")


def _check_arrays(name: str, folder: Path, arrays: dict[str, np.ndarray]) -> None:
    """What a reader read, refused in one line where the files disagree with each other: features
    and labels for every node, splits of distinct nodes of the graph, in one split each."""
    nodes = arrays["labels"].shape[0]
    if arrays["features"].ndim != 2 or arrays["features"].shape[0] != nodes:
        raise UserError(f"{folder}: {name}'s features have shape {arrays['features'].shape}, labels {nodes} rows")
    seen = {}
    for split in ("train_idx", "val_idx", "test_idx"):
        ids = arrays[split]
        _check_ids(f"{folder}: {name}'s {split}", ids, nodes)
        if len(np.unique(ids)) != len(ids):
            raise UserError(f"{folder}: {name}'s {split} names a node more than once")
        for other, before in seen.items():
            if np.intersect1d(ids, before).size:
                raise UserError(f"{folder}: {name}'s {split} and {other} share nodes: a node is in one split")
        seen[split] = ids


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
    # Size and modification time: a file rewritten with the same size (a new split) is read again.
    files = {str(p.relative_to(folder)): _stamp(p) for p in sorted(folder.rglob("*")) if p.is_file()}
    done = _imported_before(name, files, root)
    if done is not None:
        return done
    with store.writing(root / name):  # one import of a dataset at a time; the others then reuse it
        return _imported_before(name, files, root) or _import(name, folder, files, root)


def _stamp(path: Path) -> list[int]:
    status = path.stat()
    return [status.st_size, status.st_mtime_ns]


def _imported_before(name: str, files: dict, root: Path) -> Path | None:
    """The folder of ``name`` already imported from the same files, if there is one."""
    for done in sorted(Path(root).glob(f"{name}-*/meta.json")):
        meta = json.loads(done.read_text())
        if meta.get("params", {}).get("files") == files:
            return done.parent
    return None


def _import(name: str, folder: Path, files: dict, root: Path) -> Path:
    arrays = READERS[name](folder)
    _check_arrays(name, folder, arrays)
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
