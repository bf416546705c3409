"""RGCN (Schlichtkrull et al.), one layer, in every baseline form, from one set of weights:

    out[v] = x[v] @ root + bias + sum over relations r of  mean over r-edges u -> v of  x[u] @ weight[r]

(PyG's ``RGCNConv`` with ``aggr="mean"``, no bases or blocks). Each form is a module built from
the shared :class:`RGCNWeights` and a :class:`RelGraph`; calling it with the node features gives
the output, and gradients reach the shared weights whichever form computed them. The same layer
in Hector's model language is :func:`rgcn_layer`.
"""

from __future__ import annotations

import torch
from torch import nn

from systems.hector.lang import model
from systems.relgraph.ops import grouped_products, segment_products, take_rows
from systems.rgnn.layer import GraphNotSupported, RelationalLayer, glorot, pair_rows, side_by_side
from systems.rgnn.models import MODELS, Model


class RGCNWeights(nn.Module):
    """One weight set for every node type (``num_node_types`` is taken, like HGT's, and not used)."""

    def __init__(self, num_relations: int, in_dim: int, out_dim: int, seed: int = 0, num_node_types: int = 1):
        super().__init__()
        self.num_relations, self.in_dim, self.out_dim = num_relations, in_dim, out_dim
        g = torch.Generator().manual_seed(seed)
        self.weight = glorot((num_relations, in_dim, out_dim), g)
        self.root = glorot((in_dim, out_dim), g)
        self.bias = nn.Parameter(torch.rand(out_dim, generator=g) * 0.1)


class _Form(RelationalLayer):
    def _finish(self, x, messages, order=None) -> torch.Tensor:
        """Root term and bias plus the normalized messages summed into their targets; ``order``
        (edges ordered by relation) says which edge each message row is, when not edge order."""
        g = self.graph
        norm = g.norm_as(messages.dtype)  # in float64 made there, not widened from float32
        norm = norm if order is None else norm[order]
        dst = g.dst if order is None else g.dst[order]
        out = torch.addmm(self.w.bias, x, self.w.root)
        return out.index_add(0, dst, messages * norm.unsqueeze(1))


class PerEdge(_Form):
    """Each edge's message with its own gathered weight: [edges, in, out] materialized."""

    def forward(self, x):
        self._check(x)
        g = self.graph
        messages = torch.bmm(take_rows(x, g.src).unsqueeze(1), take_rows(self.w.weight, g.etype)).squeeze(1)
        return self._finish(x, messages)


class Dense(_Form):
    """Every node under every relation in one GEMM, then each edge's message gathered from that
    table by its (source, relation) row: what a user writes today in a few lines of torch. It
    computes the pairs no edge uses too (nodes x relations x out, however few edges)."""

    def __init__(self, weights, graph):
        super().__init__(weights, graph)
        self.source_rows = pair_rows(graph.src, graph.etype, graph.num_relations)

    def forward(self, x):
        self._check(x)
        table = (x @ side_by_side(self.w.weight)).view(-1, self.w.out_dim)
        return self._finish(x, take_rows(table, self.source_rows))


class _Segmented(_Form):
    """Edges in relation order (sorted once, in RelGraph), one product per relation's segment;
    ``products`` says how: a loop of matrix products, or one grouped GEMM."""

    products = None

    def forward(self, x):
        self._check(x)
        g = self.graph
        messages = type(self).products(take_rows(x, g.src[g.by_relation]), self.w.weight, g.offsets)
        return self._finish(x, messages, g.by_relation)


class SegmentMM(_Segmented):
    products = staticmethod(segment_products)


class GroupedMM(_Segmented):
    products = staticmethod(grouped_products)


class _PyG(_Form):
    """A PyG layer whose parameters are the shared weights themselves (so gradients reach them)."""

    layer_class = None

    def __init__(self, weights, graph):
        super().__init__(weights, graph)
        import torch_geometric.nn as pyg

        r, i, o = weights.weight.shape
        if self.layer_class == "RGCNConv" and graph.num_relations == 0:  # its max over no edge types fails
            raise GraphNotSupported("PyG's RGCNConv cannot take a graph with no relations; use another form (pyg_fast)")
        self.layer = getattr(pyg, self.layer_class)(i, o, r, aggr="mean")
        self.layer.weight, self.layer.root, self.layer.bias = weights.weight, weights.root, weights.bias
        self.edge_index = torch.stack([graph.src, graph.dst])

    def forward(self, x):
        self._check(x)
        return self.layer(x, self.edge_index, self.graph.etype)


class PyG(_PyG):
    layer_class = "RGCNConv"


class PyGFast(_PyG):
    layer_class = "FastRGCNConv"


@model
def rgcn_layer(m):
    """PyG's RGCNConv: root term, bias, and per relation the mean of the sources' transforms."""
    x = m.input("x", "in")
    W = m.weight("W", ("in", "out"), per="relation")
    message = m.src(x) @ W[m.relation] * m.graph_data("norm")
    return x @ m.weight("root", ("in", "out")) + m.weight("bias", ("out",)) + m.sum_into_dst(message)


def bind(weights: RGCNWeights) -> dict[str, torch.Tensor]:
    """The program's weights, as the weight set's own parameters."""
    return {"W": weights.weight, "root": weights.root, "bias": weights.bias}


RGCN = MODELS.register(
    Model(
        "rgcn",
        RGCNWeights,
        layers={
            "pyg": PyG,
            "pyg_fast": PyGFast,
            "per_edge": PerEdge,
            "segment_mm": SegmentMM,
            "grouped_mm": GroupedMM,
            "dense": Dense,
        },
        # Each gathers one [in, out] weight matrix per edge (and in training its gradient too).
        per_edge_weights=frozenset({"pyg_fast", "per_edge"}),
        program=rgcn_layer,
        bind=bind,
    )
)
