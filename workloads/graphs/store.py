"""Graphs on disk: one folder per (dataset, parameters), arrays as .npy files, memory-mapped.

``data/graphs/<name>-like-<hash>/`` holds ``meta.json`` (the generator parameters and, for each
array, its dtype, shape and size) and one ``.npy`` per array. The folder name carries a hash of
the parameters, so a graph is regenerated whenever its parameters change; the meta record is
checked against the parameters asked for and every file against its recorded size, so a cached
graph is never silently reused with other parameters or with a truncated file. A folder is
written under a temporary name and renamed when complete. Processes that ask for the same
missing graph at once (parallel Snakemake jobs, test workers) take turns on a lock file beside
it (``.<folder>.lock``): the first generates it, the others then find it complete and load it.

A heterograph (its spec declares node types and relations, see spec.py) has two more arrays:
``node_type`` (one type id per node) and ``edge_type`` (one relation id per stored edge, in the
order of ``indices``), int16 where the ids fit, else int32, memory-mapped like the others. On
load their lengths are checked, and their ids counted in chunks: every id must be in range and
every type and relation must have the count its spec records. Saving also checks that every
edge joins the node types its relation names. A homogeneous graph has neither array (one type,
one relation) and is stored exactly as before types existed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from harness.errors import UserError
from harness.progress import progress
from workloads.graphs import relational
from workloads.graphs.generate import GeneratorParams, generate

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ROOT = REPO_ROOT / "data" / "graphs"
# Unchanged by heterographs (their arrays are an addition that a homogeneous graph lacks), so
# graphs cached before keep their folder names (the version is part of the hash) and still load.
FORMAT_VERSION = 1
ARRAYS = ("indptr", "indices", "features", "labels", "train_idx", "val_idx", "test_idx")
TYPE_ARRAYS = ("node_type", "edge_type")  # a heterograph's only
CHECK_CHUNK = 1 << 24  # type ids counted per step: bounds the temporary memory of the count


class GraphFileError(UserError):
    """A cached graph that cannot be used as it is."""


def _key(params) -> str:
    text = json.dumps({"format": FORMAT_VERSION, **params.as_dict()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def folder_for(params, root: Path = DEFAULT_ROOT) -> Path:
    """Generated graphs: ``<name>-like-<hash>``; published ones (see published.py): ``<name>-<hash>``."""
    return Path(root) / f"{params.label}-{_key(params)}"


def type_dtype(count: int) -> np.dtype:
    """The dtype of ids 0..count-1 in a type array: int16 where they fit (half the bytes to map
    and check), else int32."""
    return np.dtype(np.int16) if count <= np.iinfo(np.int16).max + 1 else np.dtype(np.int32)


def _array_names(spec: dict) -> tuple[str, ...]:
    return ARRAYS + (TYPE_ARRAYS if spec.get("node_types") else ())


def save(arrays: dict[str, np.ndarray], params, folder: Path) -> None:
    spec = params.as_dict()["spec"]
    if spec.get("node_types"):
        arrays = _typed(arrays, spec)
    tmp = folder.with_name(f".{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    meta = {"format": FORMAT_VERSION, "params": params.as_dict(), "arrays": {}}
    for name in _array_names(spec):
        array = np.ascontiguousarray(arrays[name])
        np.save(tmp / f"{name}.npy", array)
        meta["arrays"][name] = {
            "dtype": str(array.dtype),
            "shape": list(array.shape),
            "file_bytes": (tmp / f"{name}.npy").stat().st_size,
        }
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)


def load(folder: Path, params=None) -> dict[str, np.ndarray]:
    """The arrays of a cached graph, memory-mapped (copy-on-write), after checking the folder."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except FileNotFoundError:
        raise GraphFileError(f"{folder}: no meta.json; not a complete cached graph (delete the folder)") from None
    except json.JSONDecodeError:
        raise GraphFileError(f"{folder}/meta.json is not valid JSON; delete the folder to regenerate") from None
    if meta.get("format") != FORMAT_VERSION:
        raise GraphFileError(
            f"{folder}: format {meta.get('format')} is not {FORMAT_VERSION}; delete the folder to regenerate"
        )
    if params is not None and meta.get("params") != params.as_dict():
        raise GraphFileError(
            f"{folder}: cached with other parameters than asked for "
            f"({meta.get('params')} vs {params.as_dict()}); delete the folder to regenerate"
        )
    arrays = {}
    for name in _array_names(meta["params"]["spec"]):
        path, record = folder / f"{name}.npy", meta["arrays"].get(name)
        if record is None or not path.exists():
            raise GraphFileError(f"{path}: missing; delete {folder} to regenerate")
        if path.stat().st_size != record["file_bytes"]:
            raise GraphFileError(
                f"{path}: {path.stat().st_size} bytes on disk, {record['file_bytes']} recorded "
                f"(truncated or replaced); delete {folder} to regenerate"
            )
        array = np.load(path, mmap_mode="c")
        if str(array.dtype) != record["dtype"] or list(array.shape) != record["shape"]:
            raise GraphFileError(
                f"{path}: holds {array.dtype} {array.shape}, recorded {record['dtype']} {record['shape']}"
            )
        arrays[name] = array
    _check_structure(folder, arrays, meta["params"]["spec"])
    return arrays


def _check_structure(folder: Path, arrays: dict, spec: dict) -> None:
    indptr, indices = arrays["indptr"], arrays["indices"]
    n = spec["nodes"]
    problems = []
    if indptr.shape != (n + 1,) or indptr[0] != 0 or indptr[-1] != indices.shape[0]:
        problems.append("indptr does not span the indices")
    if indices.shape[0] != spec["edges"]:
        problems.append(f"{indices.shape[0]} edges, the name promises {spec['edges']}")
    if arrays["features"].shape != (n, spec["feature_dim"]) or arrays["labels"].shape != (n,):
        problems.append("features or labels do not have one row per node")
    if spec.get("node_types"):
        problems += _type_problems(arrays, spec)
        if not problems:  # (ids in range: each edge's ends can be looked up)
            problems += _endpoint_problems(arrays, spec)
    if problems:
        raise GraphFileError(f"{folder}: {'; '.join(problems)}; delete the folder to regenerate")


def _typed(arrays: dict, spec: dict) -> dict:
    """A heterograph's arrays with its type arrays checked and in their stored dtype; raises
    ValueError (the graph's maker is wrong) before anything is written."""
    missing = [name for name in TYPE_ARRAYS if name not in arrays]
    if missing:
        raise ValueError(f"{spec['name']}: a heterograph needs the arrays {', '.join(missing)}")
    problems = _type_problems(arrays, spec)  # before the cast, which could wrap a wrong id into range
    if not problems:
        arrays = arrays | {
            "node_type": arrays["node_type"].astype(type_dtype(len(spec["node_types"])), copy=False),
            "edge_type": arrays["edge_type"].astype(type_dtype(len(spec["relations"])), copy=False),
        }
        problems = _endpoint_problems(arrays, spec)
    if problems:
        raise ValueError(f"{spec['name']}: {'; '.join(problems)}")
    return arrays


def _type_problems(arrays: dict, spec: dict) -> list[str]:
    """What is wrong with a heterograph's type arrays: dtype, length, ids out of range, counts
    other than the spec's."""
    problems = []
    for name, kinds, length in (
        ("node_type", spec["node_types"], spec["nodes"]),
        ("edge_type", spec["relations"], spec["edges"]),
    ):
        array = arrays[name]
        expected = [kind["count"] for kind in kinds]
        if not np.issubdtype(array.dtype, np.integer):
            problems.append(f"{name} holds {array.dtype}, not integer ids")
        elif array.shape != (length,):
            problems.append(
                f"{name} has shape {array.shape}, the graph has {length} {'nodes' if name == 'node_type' else 'edges'}"
            )
        else:
            counts, low = _count_ids(array, len(expected))
            if low < 0 or len(counts) > len(expected):
                problems.append(f"{name} holds ids outside 0..{len(expected) - 1}")
            elif counts.tolist() != expected:
                problems.append(f"{name} counts {counts.tolist()} per id, the spec records {expected}")
    return problems


def _count_ids(array: np.ndarray, kinds: int) -> tuple[np.ndarray, int]:
    """(occurrences of each id >= 0, the smallest id), a chunk at a time: a memory-mapped array is
    read once, with no full-length temporary."""
    counts, low = np.zeros(kinds, dtype=np.int64), 0
    for start in range(0, array.shape[0], CHECK_CHUNK):
        chunk = np.asarray(array[start : start + CHECK_CHUNK], dtype=np.int64)
        low = min(low, int(chunk.min()))
        if low < 0:
            break
        found = np.bincount(chunk, minlength=kinds)
        if found.shape[0] > counts.shape[0]:
            counts = np.pad(counts, (0, found.shape[0] - counts.shape[0]))
        counts[: found.shape[0]] += found
    return counts, low


def _endpoint_problems(arrays: dict, spec: dict) -> list[str]:
    """Edges whose ends are not of the node types their relation joins (row: target, neighbour:
    source), counted a chunk of edges at a time."""
    source = np.array([type_id(spec, r["source"]) for r in spec["relations"]], dtype=np.int64)
    target = np.array([type_id(spec, r["target"]) for r in spec["relations"]], dtype=np.int64)
    indptr, indices, node_type, edge_type = (arrays[k] for k in ("indptr", "indices", "node_type", "edge_type"))
    wrong = 0
    for start in range(0, indices.shape[0], CHECK_CHUNK):
        stop = min(start + CHECK_CHUNK, indices.shape[0])
        relation = np.asarray(edge_type[start:stop], dtype=np.int64)
        rows = np.searchsorted(indptr, np.arange(start, stop), side="right") - 1
        wrong += int(
            np.count_nonzero(
                (node_type[rows] != target[relation]) | (node_type[indices[start:stop]] != source[relation])
            )
        )
    return [f"{wrong} edges join other node types than their relation's"] if wrong else []


def type_id(spec: dict, name: str) -> int:
    """The id of node type ``name`` in a spec (as stored: ``GraphSpec.as_dict``)."""
    for i, t in enumerate(spec["node_types"]):
        if t["name"] == name:
            return i
    raise KeyError(f"{spec['name']} has no node type {name!r}")


GENERATORS = {GeneratorParams: generate, relational.HeteroParams: relational.generate}


@contextlib.contextmanager
def writing(folder: Path) -> Iterator[None]:
    """Hold the lock of ``folder`` in the store: one process at a time writes it. The lock file
    stays (removing it would let a third process lock a fresh file while the second still
    holds the old one); it is empty and hidden."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(f".{folder.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def get(params: GeneratorParams | relational.HeteroParams, root: Path = DEFAULT_ROOT) -> dict[str, np.ndarray]:
    """The graph for ``params``: loaded from the cache, or generated and cached first."""
    folder = folder_for(params, root)
    if not (folder / "meta.json").exists():
        with writing(folder):
            if not (folder / "meta.json").exists():  # not written by another process while this one waited
                make = GENERATORS[type(params)]
                arrays = make(params, progress=lambda items, desc, total: progress(items, desc=desc, total=total))
                save(arrays, params, folder)
    return load(folder, params)
