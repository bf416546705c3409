"""A relational graph and the segment operations on it, below every system that computes on one.

``graph.RelGraph`` holds a graph's edges (source, target, relation; node types where there are
several) and what every layer precomputes once from them: relation order, segment offsets, mean
normalization. ``ops`` holds the operations the plain-PyTorch layers and Hector's reference
backend share: gathering rows, one matrix product per relation segment (a loop, or one grouped
GEMM), and the softmax of edge scores over each target's incoming edges.

Hector (systems/hector) and the relational-GNN forms it is compared with (systems/rgnn) both build
on this package; it imports neither.
"""

from systems.relgraph.graph import RelGraph, segment_offsets
from systems.relgraph.ops import edge_softmax, grouped_products, segment_products, take_rows

__all__ = ["RelGraph", "edge_softmax", "grouped_products", "segment_offsets", "segment_products", "take_rows"]
