"""Real small knowledge graphs: Nations, Kinships and UMLS, read from the pykeen wheel's data files.

They are the relational GNN topic's real data for correctness (every implementation of a layer
must agree on them). pykeen is installed without its dependencies (envs/requirements-data.txt)
and never imported: the files are found through the package's installed metadata, so no network
and none of pykeen's own dependencies are needed. Each file holds one ``head<TAB>relation<TAB>tail``
triple per line; the graph is the union of the train, valid and test files, one node type, one
relation per relation label (ids in sorted label order), messages flowing head -> tail. The
result has the layout of workloads/graphs/store.py (a CSR by target node), without features:
the topic draws those itself.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np

from harness.errors import UserError
from workloads.graphs.published_heterographs import heterograph
from workloads.graphs.spec import GraphSpec

GRAPHS = ("nations", "kinships", "umls")
SPLITS = ("train", "valid", "test")


def triples(name: str) -> list[tuple[str, str, str]]:
    """Every (head, relation, tail) of ``name``, from the installed pykeen wheel's files."""
    if name not in GRAPHS:
        raise UserError(f"unknown knowledge graph {name!r}; one of {', '.join(GRAPHS)}")
    try:
        package = importlib.metadata.distribution("pykeen")
    except importlib.metadata.PackageNotFoundError:
        raise UserError(
            "the knowledge graphs are read from the pykeen wheel, which is not installed: "
            "pip install --no-deps -r envs/requirements-data.txt"
        ) from None
    return _read([package.locate_file(f"pykeen/datasets/{name}/{split}.txt") for split in SPLITS])


def triples_in_folder(folder) -> list[tuple[str, str, str]]:
    """Every triple of a knowledge graph published as ``train.txt``, ``valid.txt`` and
    ``test.txt`` of tab-separated head, relation and tail (FB15k-237's format, and pykeen's)."""
    return _read([Path(folder) / f"{split}.txt" for split in SPLITS])


def _read(paths) -> list[tuple[str, str, str]]:
    """Every triple of ``paths``: UTF-8 text (a byte order mark allowed), lines split at line feeds
    only (a form feed or a Unicode line separator inside a name is part of the name), each field
    without the spaces around it."""
    rows = []
    for path in paths:
        try:
            text = path.read_bytes().decode("utf-8-sig")
        except FileNotFoundError:
            raise UserError(f"{path}: missing (a knowledge graph needs {', '.join(SPLITS)} .txt files)") from None
        except UnicodeDecodeError as err:
            raise UserError(f"{path}: not UTF-8 text (byte {err.start}; a compressed file?)") from None
        for number, line in enumerate(text.split("\n"), 1):
            if not line.strip():
                continue
            fields = [field.strip() for field in line.split("\t")]
            if len(fields) != 3 or not all(fields):
                raise UserError(f"{path}:{number}: expected head, relation and tail separated by tabs")
            rows.append((fields[0], fields[1], fields[2]))
    if not rows:
        raise UserError(f"no triples in {', '.join(map(str, paths))}")
    return rows


def load(name: str, folder=None) -> tuple[GraphSpec, dict[str, np.ndarray]]:
    """The knowledge graph ``name`` as a spec and arrays: ``indptr``/``indices`` (each target's
    sources), ``edge_type`` and ``node_type`` (all 0); from pykeen's wheel, or from ``folder``
    holding the graph's published files."""
    rows = triples(name) if folder is None else triples_in_folder(folder)
    entities = sorted({h for h, _, _ in rows} | {t for _, _, t in rows})
    labels = sorted({r for _, r, _ in rows})
    entity_id = {e: i for i, e in enumerate(entities)}
    relation_id = {r: i for i, r in enumerate(labels)}
    return heterograph(
        name,
        [entity_id[h] for h, _, _ in rows],
        [entity_id[t] for _, _, t in rows],
        [relation_id[r] for _, r, _ in rows],
        labels,
        np.zeros(len(entities), dtype=np.int64),
        ["entity"],
    )
