"""Hector's real datasets read from their published files, opt-in (the suite never downloads:
fetch the files yourself and point a ``datasets`` entry's ``published_dir`` at them).

* N-Triples (aifb, mutag, bgs, am as RDF dumps): ``*.nt`` or ``*.nt.gz`` files in the folder, one
  ``subject predicate object .`` triple per line. Every IRI, blank node and literal that appears
  is a node; every triple an edge of its predicate's relation, subject -> object. A node's type is
  the first (in sorted order) object of its ``rdf:type`` triples, ``literal`` for literals and
  ``untyped`` otherwise. (DGL's loaders, which Hector used, also drop each dataset's label
  predicate and some literals; this loader keeps every triple and says so.) The graph is the files'
  set of triples: a triple written twice is one edge; a term spelled two ways (``\\u`` escapes, a
  language tag's case, ``xsd:string``) is one node; a blank node's label is local to its file. A
  folder holding both ``x.nt`` and ``x.nt.gz`` is refused (the same triples, twice).
* OGB's raw layout (mag, biokg: heterographs; wikikg2: one node type): ``raw/num-node-dict.csv.gz``
  and ``raw/relations/<source type>___<relation>___<target type>/edge.csv.gz``, or
  ``raw/num-node-list.csv.gz``, ``raw/edge.csv.gz`` and ``raw/edge_reltype.csv.gz``.

Both give what workloads/graphs/knowledge.py gives: a spec and the store's arrays (a CSR by target).
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import numpy as np

from harness.errors import UserError
from workloads.graphs.published import UNREADABLE, csv_gz
from workloads.graphs.spec import GraphSpec, NodeType, Relation

RDF_TYPE = "<http://www.w3.org/1999/02/22-rdf-syntax-ns#type>"
# subject (IRI or blank node), predicate (IRI), object (IRI, blank node or literal with an optional
# language tag or datatype), then a full stop.
_TRIPLE = re.compile(
    r'^(<[^>]*>|_:\S+)\s+(<[^>]*>)\s+(<[^>]*>|_:\S+|"(?:[^"\\]|\\.)*"(?:@[\w-]+|\^\^<[^>]*>)?)\s*\.\s*(?:#.*)?$'
)


def heterograph(name, src, dst, kind, relation_names, node_type, type_names) -> tuple[GraphSpec, dict]:
    """A spec and the store's arrays from edge lists (``kind``: each edge's relation id) and node
    types; edges ordered by target, then source and relation."""
    src, dst, kind, node_type = (np.asarray(a, dtype=np.int64) for a in (src, dst, kind, node_type))
    nodes = len(node_type)
    order = np.lexsort((kind, src, dst))
    indptr = np.zeros(nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=nodes), out=indptr[1:])
    counts = np.bincount(kind, minlength=len(relation_names))
    type_sizes = np.bincount(node_type, minlength=len(type_names))

    def ends(r):  # a relation's (source type, target type): its first edge's, or the first type
        first = np.flatnonzero(kind == r)[:1]
        return (
            (type_names[node_type[src[first[0]]]], type_names[node_type[dst[first[0]]]])
            if len(first)
            else (type_names[0],) * 2
        )

    spec = GraphSpec(
        name,
        nodes,
        len(src),
        feature_dim=0,
        classes=1,
        train_fraction=0.0,
        val_fraction=0.0,
        node_types=tuple(NodeType(t, int(n)) for t, n in zip(type_names, type_sizes)),
        relations=tuple(Relation(label, *ends(r), int(c)) for r, (label, c) in enumerate(zip(relation_names, counts))),
    )
    return spec, {"indptr": indptr, "indices": src[order], "edge_type": kind[order], "node_type": node_type}


XSD_STRING = "<http://www.w3.org/2001/XMLSchema#string>"
_UCHAR = re.compile(r"\\u([0-9A-Fa-f]{4})|\\U([0-9A-Fa-f]{8})")


def _open_text(path: Path):
    # A byte order mark is read as one, not as part of the first subject.
    return gzip.open(path, "rt", encoding="utf-8-sig") if path.suffix == ".gz" else path.open(encoding="utf-8-sig")


def _canonical(term: str, file_index: int) -> str:
    """One spelling per RDF term: ``\\u`` escapes decoded, a language tag in lower case, a literal
    typed ``xsd:string`` written as the plain literal it equals, and a blank node's label kept to
    its file (labels are local to the document that holds them)."""
    if term.startswith("_:"):
        return f"_:{file_index}:{term[2:]}"
    term = _UCHAR.sub(lambda m: chr(int(m.group(1) or m.group(2), 16)), term)
    if term.startswith('"'):
        body, _, suffix = term.rpartition('"')
        if suffix == f"^^{XSD_STRING}":
            return f'{body}"'
        if suffix.startswith("@"):
            return f'{body}"{suffix.lower()}'
    return term


def _compression_hint(path: Path) -> str:
    return "; named .gz but not gzip-compressed?" if path.suffix == ".gz" else " (or compressed, without .gz)"


def ntriples(name: str, folder) -> tuple[GraphSpec, dict]:
    """The graph of the N-Triples files in ``folder``: its set of triples (a triple repeated, in a
    file or across files, is one edge, as RDF has it)."""
    files = sorted(Path(folder).glob("*.nt")) + sorted(Path(folder).glob("*.nt.gz"))
    if not files:
        raise UserError(f"{folder}: no .nt or .nt.gz files (N-Triples) for {name}")
    plain = {f.name for f in files if f.suffix == ".nt"}
    both = sorted(f.name for f in files if f.suffix == ".gz" and f.name[: -len(".gz")] in plain)
    if both:
        raise UserError(f"{folder}: {both[0]} and {both[0][: -len('.gz')]} are both there: keep one of the two")
    triples = set()
    for index, path in enumerate(files):
        try:
            with _open_text(path) as lines:
                for number, line in enumerate(lines, 1):
                    if not line.strip() or line.lstrip().startswith("#"):
                        continue
                    found = _TRIPLE.match(line.strip())
                    if not found:
                        raise UserError(f"{path}:{number}: not an N-Triples line (subject predicate object .)")
                    triples.add(tuple(_canonical(term, index) for term in found.groups()))
        except UNREADABLE as err:
            raise UserError(f"{path}: not N-Triples text in UTF-8{_compression_hint(path)} ({err})") from None
    if not triples:
        raise UserError(f"{folder}: the N-Triples files hold no triple")
    triples = sorted(triples)
    nodes = sorted({s for s, _, _ in triples} | {o for _, _, o in triples})
    node_id = {n: i for i, n in enumerate(nodes)}
    predicates = sorted({p for _, p, _ in triples})
    declared = {}
    for s, p, o in sorted(triples):
        if p == RDF_TYPE:
            declared.setdefault(s, o)
    kinds = [("literal" if n.startswith('"') else declared.get(n, "untyped")) for n in nodes]
    type_names = sorted(set(kinds))
    type_id = {t: i for i, t in enumerate(type_names)}
    predicate_id = {p: i for i, p in enumerate(predicates)}
    return heterograph(
        name,
        [node_id[s] for s, _, _ in triples],
        [node_id[o] for _, _, o in triples],
        [predicate_id[p] for _, p, _ in triples],
        predicates,
        [type_id[k] for k in kinds],
        type_names,
    )


def _node_counts(path: Path) -> dict[str, int]:
    """OGB's ``num-node-dict``: a header row of node types and a row of their node counts."""
    try:
        with gzip.open(path, "rt", encoding="utf-8-sig") as f:
            rows = [[cell.strip() for cell in line.split(",")] for line in f.read().strip().split("\n")]
    except UNREADABLE as err:
        raise UserError(f"{path}: not a gzip-compressed CSV file ({err})") from None
    if len(rows) < 2 or len(rows[0]) != len(rows[1]) or not all(rows[0]):
        raise UserError(f"{path}: expected a row of node types and a row of as many node counts")
    header, values = rows[0], rows[1]
    if len(set(header)) != len(header):
        raise UserError(f"{path}: a node type is named twice")
    if not all(v.isdigit() for v in values):
        raise UserError(f"{path}: node counts must be non-negative whole numbers, got {', '.join(values)}")
    return dict(zip(header, map(int, values)))


def ogb(name: str, folder) -> tuple[GraphSpec, dict]:
    raw = Path(folder) / "raw"
    if (raw / "relations").is_dir():  # a heterograph: one folder per (source type, relation, target type)
        counts_path = raw / "num-node-dict.csv.gz"
        if not counts_path.exists():
            raise UserError(f"{counts_path}: missing (OGB's raw layout)")
        size = _node_counts(counts_path)
        type_names = sorted(size)
        offset = dict(zip(type_names, np.cumsum([0] + [size[t] for t in type_names])))
        src, dst, kind, names = [], [], [], []
        for r, folder_r in enumerate(sorted(p for p in (raw / "relations").iterdir() if p.is_dir())):
            parts = folder_r.name.split("___")
            if len(parts) != 3 or parts[0] not in size or parts[2] not in size:
                raise UserError(f"{folder_r}: expected <source type>___<relation>___<target type> of known types")
            edges = csv_gz(folder_r / "edge.csv.gz", np.int64, columns=2)
            for column, node_type in ((0, parts[0]), (1, parts[2])):
                if len(edges) and (edges[:, column].min() < 0 or edges[:, column].max() >= size[node_type]):
                    raise UserError(f"{folder_r}: a {node_type} id outside 0..{size[node_type] - 1}")
            src.append(edges[:, 0] + offset[parts[0]])
            dst.append(edges[:, 1] + offset[parts[2]])
            kind.append(np.full(len(edges), r))
            names.append(folder_r.name)
        if not names:
            raise UserError(f"{raw / 'relations'}: no relation folders")
        node_type = np.repeat(np.arange(len(type_names)), [size[t] for t in type_names])
        return heterograph(
            name, np.concatenate(src), np.concatenate(dst), np.concatenate(kind), names, node_type, type_names
        )
    counts = csv_gz(raw / "num-node-list.csv.gz", np.int64, columns=1)
    if len(counts) != 1 or counts[0] < 0:
        raise UserError(f"{raw / 'num-node-list.csv.gz'}: expected one non-negative node count")
    nodes = int(counts[0])
    edges = csv_gz(raw / "edge.csv.gz", np.int64, columns=2)
    kind = csv_gz(raw / "edge_reltype.csv.gz", np.int64, columns=1)
    if not len(edges):
        raise UserError(f"{raw / 'edge.csv.gz'}: no edges")
    if kind.min(initial=0) < 0:
        raise UserError(f"{raw / 'edge_reltype.csv.gz'}: a negative relation id")
    if len(kind) != len(edges) or edges.min() < 0 or edges.max() >= nodes:
        raise UserError(f"{raw}: edge.csv.gz and edge_reltype.csv.gz disagree, or a node id is outside 0..{nodes - 1}")
    names = [f"r{r}" for r in range(int(kind.max()) + 1)]
    return heterograph(name, edges[:, 0], edges[:, 1], kind, names, np.zeros(nodes, dtype=np.int64), ["entity"])
