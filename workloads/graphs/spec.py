"""Published statistics of the datasets PyTorch-Direct was evaluated on (REFERENCE.md, §1).

Edge counts are the numbers of stored (directed) edges the generated CSR holds. The real datasets
cannot be downloaded on the machines this suite was built on; graphs with these statistics are
generated instead and named "<name>-like".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class GraphSpec:
    name: str
    nodes: int
    edges: int
    feature_dim: int
    classes: int

    def scaled(self, factor: float) -> "GraphSpec":
        """The same graph shape at ``factor`` of the nodes and edges (average degree kept)."""
        if not 0 < factor <= 1:
            raise ValueError(f"scale factor must be in (0, 1], got {factor}")
        nodes = max(self.classes * 4, round(self.nodes * factor))
        return GraphSpec(self.name, nodes, max(nodes, round(self.edges * factor)), self.feature_dim, self.classes)

    def as_dict(self) -> dict:
        return asdict(self)


DATASETS = {
    "reddit": GraphSpec("reddit", 232_965, 114_615_892, 602, 41),
    "ogbn-products": GraphSpec("ogbn-products", 2_449_029, 61_859_140, 100, 47),
    "ogbn-papers100M": GraphSpec("ogbn-papers100M", 111_059_956, 1_615_685_872, 128, 172),
}
