"""Published statistics of the datasets PyTorch-Direct was evaluated on (REFERENCE.md, §1).

Edge counts are the numbers of stored (directed) edges the generated CSR holds; the train and
validation shares are those of the published splits (PyG's reddit, OGB's official splits), so an
epoch at full size has as many batches as on the real dataset. The real datasets cannot be
downloaded on the machines this suite was built on; graphs with these statistics are generated
instead and named "<name>-like".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class GraphSpec:
    name: str
    nodes: int
    edges: int
    feature_dim: int
    classes: int
    train_fraction: float
    val_fraction: float

    def scaled(self, factor: float) -> "GraphSpec":
        """The same graph shape at ``factor`` of the nodes and edges (average degree kept)."""
        if not 0 < factor <= 1:
            raise ValueError(f"scale factor must be in (0, 1], got {factor}")
        nodes = max(self.classes * 4, round(self.nodes * factor))
        return replace(self, nodes=nodes, edges=max(nodes, round(self.edges * factor)))

    def as_dict(self) -> dict:
        return asdict(self)


def _published(name: str, nodes: int, edges: int, feature_dim: int, classes: int, train: int, val: int) -> GraphSpec:
    return GraphSpec(name, nodes, edges, feature_dim, classes, train / nodes, val / nodes)


# name, nodes, edges, feature dim, classes, training nodes, validation nodes
DATASETS = {
    "reddit": _published("reddit", 232_965, 114_615_892, 602, 41, 153_431, 23_831),
    "ogbn-products": _published("ogbn-products", 2_449_029, 61_859_140, 100, 47, 196_615, 39_323),
    "ogbn-papers100M": _published("ogbn-papers100M", 111_059_956, 1_615_685_872, 128, 172, 1_207_179, 125_265),
}
