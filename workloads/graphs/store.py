"""Graphs on disk: one folder per (dataset, parameters), arrays as .npy files, memory-mapped.

``data/graphs/<name>-like-<hash>/`` holds ``meta.json`` (the generator parameters and, for each
array, its dtype, shape and size) and one ``.npy`` per array. The folder name carries a hash of
the parameters, so a graph is regenerated whenever its parameters change; the meta record is
checked against the parameters asked for and every file against its recorded size, so a cached
graph is never silently reused with other parameters or with a truncated file. A folder is
written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from harness.errors import UserError
from harness.progress import progress
from workloads.graphs.generate import GeneratorParams, generate

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ROOT = REPO_ROOT / "data" / "graphs"
FORMAT_VERSION = 1
ARRAYS = ("indptr", "indices", "features", "labels", "train_idx", "val_idx", "test_idx")


class GraphFileError(UserError):
    """A cached graph that cannot be used as it is."""


def _key(params) -> str:
    text = json.dumps({"format": FORMAT_VERSION, **params.as_dict()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def folder_for(params, root: Path = DEFAULT_ROOT) -> Path:
    """Generated graphs: ``<name>-like-<hash>``; published ones (see published.py): ``<name>-<hash>``."""
    return Path(root) / f"{params.label}-{_key(params)}"


def save(arrays: dict[str, np.ndarray], params, folder: Path) -> None:
    tmp = folder.with_name(f".{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    meta = {"format": FORMAT_VERSION, "params": params.as_dict(), "arrays": {}}
    for name in ARRAYS:
        array = np.ascontiguousarray(arrays[name])
        np.save(tmp / f"{name}.npy", array)
        meta["arrays"][name] = {"dtype": str(array.dtype), "shape": list(array.shape),
                                "file_bytes": (tmp / f"{name}.npy").stat().st_size}
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
        raise GraphFileError(f"{folder}: format {meta.get('format')} is not {FORMAT_VERSION}; delete the folder to regenerate")
    if params is not None and meta.get("params") != params.as_dict():
        raise GraphFileError(f"{folder}: cached with other parameters than asked for "
                             f"({meta.get('params')} vs {params.as_dict()}); delete the folder to regenerate")
    arrays = {}
    for name in ARRAYS:
        path, record = folder / f"{name}.npy", meta["arrays"].get(name)
        if record is None or not path.exists():
            raise GraphFileError(f"{path}: missing; delete {folder} to regenerate")
        if path.stat().st_size != record["file_bytes"]:
            raise GraphFileError(f"{path}: {path.stat().st_size} bytes on disk, {record['file_bytes']} recorded "
                                 f"(truncated or replaced); delete {folder} to regenerate")
        array = np.load(path, mmap_mode="c")
        if str(array.dtype) != record["dtype"] or list(array.shape) != record["shape"]:
            raise GraphFileError(f"{path}: holds {array.dtype} {array.shape}, recorded {record['dtype']} {record['shape']}")
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
    if problems:
        raise GraphFileError(f"{folder}: {'; '.join(problems)}; delete the folder to regenerate")


def get(params: GeneratorParams, root: Path = DEFAULT_ROOT) -> dict[str, np.ndarray]:
    """The graph for ``params``: loaded from the cache, or generated and cached first."""
    folder = folder_for(params, root)
    if not (folder / "meta.json").exists():
        save(generate(params, progress=lambda items, desc, total: progress(items, desc=desc, total=total)), params, folder)
    return load(folder, params)
