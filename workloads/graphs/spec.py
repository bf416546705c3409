"""Published statistics of the datasets PyTorch-Direct was evaluated on (arXiv 2101.07956 and
PVLDB 14(11): reddit, ogbn-products, ogbn-papers100M, as distributed by PyG and OGB), and
the shape of a graph: its sizes and, for a heterograph, its node types and relations.

Edge counts are the numbers of stored (directed) edges the generated CSR holds; the train and
validation shares are those of the published splits (PyG's reddit, OGB's official splits), so an
epoch at full size has as many batches as on the real dataset. The real datasets cannot be
downloaded on the machines this suite was built on; graphs with these statistics are generated
instead and named "<name>-like".

A heterograph (for RGCN, RGAT, HGT) has node types and relations (edge types), each with its
count; a homogeneous graph is the one-type case: it declares no types, and its
``node_type_counts`` and ``relation_counts`` hold one count each. A homogeneous spec's
``as_dict`` is what it was before types existed, so the store's folder names, and the graphs
cached under them, stay valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from harness.errors import UserError


@dataclass(frozen=True)
class NodeType:
    name: str
    count: int  # nodes of this type


@dataclass(frozen=True)
class Relation:
    """Edges from ``source`` nodes to ``target`` nodes: in the CSR, a ``target`` node lists its
    ``source`` neighbours (the sampler's direction, messages flow source -> target)."""

    name: str
    source: str  # a node type
    target: str  # a node type
    count: int  # stored edges of this relation


@dataclass(frozen=True)
class GraphSpec:
    name: str
    nodes: int
    edges: int
    feature_dim: int
    classes: int
    train_fraction: float
    val_fraction: float
    # Empty for a homogeneous graph; otherwise every node type and relation, counts summing to
    # nodes and edges. Type and relation ids are positions in these tuples.
    node_types: tuple[NodeType, ...] = field(default=())
    relations: tuple[Relation, ...] = field(default=())

    def __post_init__(self):
        object.__setattr__(self, "node_types", tuple(self.node_types))
        object.__setattr__(self, "relations", tuple(self.relations))
        if bool(self.node_types) != bool(self.relations):
            raise ValueError(
                f"{self.name}: a heterograph declares both node types and relations, a homogeneous graph neither"
            )
        if not self.node_types:
            return
        names = [t.name for t in self.node_types]
        if len(set(names)) != len(names) or len({r.name for r in self.relations}) != len(self.relations):
            raise ValueError(f"{self.name}: node type and relation names must be distinct")
        if any(t.count < 0 for t in self.node_types) or any(r.count < 0 for r in self.relations):
            raise ValueError(f"{self.name}: type and relation counts must be >= 0")
        if sum(t.count for t in self.node_types) != self.nodes or sum(r.count for r in self.relations) != self.edges:
            raise ValueError(
                f"{self.name}: node type counts must sum to {self.nodes} nodes and relation counts to "
                f"{self.edges} edges"
            )
        count = {t.name: t.count for t in self.node_types}
        for r in self.relations:
            if r.source not in count or r.target not in count:
                raise ValueError(
                    f"{self.name}: relation {r.name} joins {r.source} and {r.target}; "
                    f"the node types are {', '.join(names)}"
                )
            if r.count and not (count[r.source] and count[r.target]):
                raise ValueError(
                    f"{self.name}: relation {r.name} has {r.count} edges but no {r.source} or no {r.target} nodes"
                )

    @property
    def homogeneous(self) -> bool:
        return not self.node_types

    @property
    def node_type_counts(self) -> tuple[int, ...]:
        """Nodes of each type, by type id; one type (all nodes) for a homogeneous graph."""
        return tuple(t.count for t in self.node_types) or (self.nodes,)

    @property
    def relation_counts(self) -> tuple[int, ...]:
        """Edges of each relation, by relation id; one relation (all edges) for a homogeneous graph."""
        return tuple(r.count for r in self.relations) or (self.edges,)

    def scaled(self, factor: float) -> GraphSpec:
        """The same graph shape at ``factor`` of the nodes and edges (average degree kept; a
        heterograph's types and relations keep their shares)."""
        if not 0 < factor <= 1:
            raise ValueError(f"scale factor must be in (0, 1], got {factor}")
        nodes = max(self.classes * 4, round(self.nodes * factor))
        edges = max(nodes, round(self.edges * factor))
        if self.homogeneous:
            return replace(self, nodes=nodes, edges=edges)
        node_counts = apportion([t.count for t in self.node_types], nodes)
        edge_counts = apportion([r.count for r in self.relations], edges)
        kept = {t.name: c for t, c in zip(self.node_types, node_counts)}
        for relation, count in zip(self.relations, edge_counts):
            emptied = [end for end in (relation.source, relation.target) if count and not kept[end]]
            if emptied:
                # Every node type a relation uses needs a node: about 1 / its size of the whole.
                smallest = min(t.count for t in self.node_types if t.name in emptied)
                raise UserError(
                    f"{self.name}: scale factor {factor:g} leaves node type {emptied[0]} without nodes while "
                    f"relation {relation.name} keeps {count} edges; use a factor of about {1 / smallest:.2g} or more"
                )
        return replace(
            self,
            nodes=nodes,
            edges=edges,
            node_types=tuple(replace(t, count=c) for t, c in zip(self.node_types, node_counts)),
            relations=tuple(replace(r, count=c) for r, c in zip(self.relations, edge_counts)),
        )

    def as_dict(self) -> dict:
        """JSON-able (lists, not tuples: it is compared with the store's meta.json as read back).
        A homogeneous graph's has no type fields, as before types existed."""
        d = {
            "name": self.name,
            "nodes": self.nodes,
            "edges": self.edges,
            "feature_dim": self.feature_dim,
            "classes": self.classes,
            "train_fraction": self.train_fraction,
            "val_fraction": self.val_fraction,
        }
        if not self.homogeneous:
            d["node_types"] = [{"name": t.name, "count": t.count} for t in self.node_types]
            d["relations"] = [
                {"name": r.name, "source": r.source, "target": r.target, "count": r.count} for r in self.relations
            ]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> GraphSpec:
        return cls(
            **{k: v for k, v in d.items() if k not in ("node_types", "relations")},
            node_types=tuple(NodeType(**t) for t in d.get("node_types", ())),
            relations=tuple(Relation(**r) for r in d.get("relations", ())),
        )


def apportion(counts: list[int], total: int) -> list[int]:
    """``total`` split in proportion to ``counts`` (largest remainders), summing exactly to it."""
    whole = sum(counts)
    if whole == 0:
        raise ValueError(f"cannot share {total} among counts that are all 0")
    shares = [c * total / whole for c in counts]
    result = [int(s) for s in shares]
    by_remainder = sorted(range(len(counts)), key=lambda i: result[i] - shares[i])
    for i in by_remainder[: total - sum(result)]:
        result[i] += 1
    return result


def _published(name: str, nodes: int, edges: int, feature_dim: int, classes: int, train: int, val: int) -> GraphSpec:
    return GraphSpec(name, nodes, edges, feature_dim, classes, train / nodes, val / nodes)


# name, nodes, edges, feature dim, classes, training nodes, validation nodes
DATASETS = {
    "reddit": _published("reddit", 232_965, 114_615_892, 602, 41, 153_431, 23_831),
    "ogbn-products": _published("ogbn-products", 2_449_029, 61_859_140, 100, 47, 196_615, 39_323),
    "ogbn-papers100M": _published("ogbn-papers100M", 111_059_956, 1_615_685_872, 128, 172, 1_207_179, 125_265),
}
# The datasets' short names, as the topics' parts and configs name them.
SHORT_NAMES = {"reddit": "reddit", "products": "ogbn-products", "papers": "ogbn-papers100M"}
