"""RGAT, one layer, one head, in every baseline form, from one set of weights: PyG's ``RGATConv``
with its defaults (attention across relations, additive self-attention, no root term):

    for an edge u -> v of relation r:  a = leaky_relu((x[v] @ W[r]) @ q + (x[u] @ W[r]) @ k, 0.2)
    alpha = softmax of a over all edges into v;  out[v] = bias + sum over edges of alpha * (x[u] @ W[r])

Both ends are transformed with the edge's relation weight; the baselines compute ``x @ W[r]``
once per edge end, as the frameworks do (computing it once per (node, relation) pair, and ``W[r]
@ q`` once per relation, are Hector's compact materialization and reordering). The same layer
in Hector's model language is :func:`rgat_layer`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from systems.hector.lang import model
from systems.relgraph.ops import edge_softmax, grouped_products, segment_products, take_rows
from systems.rgnn.layer import RelationalLayer, glorot, pair_rows, side_by_side
from systems.rgnn.models import MODELS, Model

NEGATIVE_SLOPE = 0.2  # PyG's default


class RGATWeights(nn.Module):
    """One weight set for every node type (``num_node_types`` is taken, like HGT's, and not used)."""

    def __init__(self, num_relations: int, in_dim: int, out_dim: int, seed: int = 0, num_node_types: int = 1):
        super().__init__()
        self.num_relations, self.in_dim, self.out_dim = num_relations, in_dim, out_dim
        g = torch.Generator().manual_seed(seed)
        self.weight = glorot((num_relations, in_dim, out_dim), g)
        self.q = glorot((out_dim, 1), g)
        self.k = glorot((out_dim, 1), g)
        self.bias = nn.Parameter(torch.rand(out_dim, generator=g) * 0.1)


class _Form(RelationalLayer):
    def _attend(self, target_side, source_side, order=None) -> torch.Tensor:
        """The attention-weighted sum of the transformed sources into each target; row i of both
        sides is edge ``order[i]`` (edge order if None)."""
        g = self.graph
        dst = g.dst if order is None else g.dst[order]
        scores = F.leaky_relu(target_side @ self.w.q + source_side @ self.w.k, NEGATIVE_SLOPE).squeeze(1)
        alpha = edge_softmax(scores, dst, g.num_nodes)
        out = self.w.bias.expand(g.num_nodes, -1)
        # Summed in the bias's type: under autocast the products are bfloat16 and the bias float32.
        return out.index_add(0, dst, (alpha.unsqueeze(1) * source_side).to(out.dtype))


class PerEdge(_Form):
    """Each edge's two products with its own gathered weight: [edges, in, out] materialized."""

    def forward(self, x):
        self._check(x)
        g = self.graph
        weight = take_rows(self.w.weight, g.etype)
        return self._attend(
            torch.bmm(take_rows(x, g.dst).unsqueeze(1), weight).squeeze(1),
            torch.bmm(take_rows(x, g.src).unsqueeze(1), weight).squeeze(1),
        )


class Dense(_Form):
    """Every node under every relation in one GEMM, then each edge's two ends gathered from that
    table by their (node, relation) rows: the plain form of Hector's compact materialization, but
    over every pair, those no edge uses too (nodes x relations x out)."""

    def __init__(self, weights, graph):
        super().__init__(weights, graph)
        self.target_rows = pair_rows(graph.dst, graph.etype, graph.num_relations)
        self.source_rows = pair_rows(graph.src, graph.etype, graph.num_relations)

    def forward(self, x):
        self._check(x)
        table = (x @ side_by_side(self.w.weight)).view(-1, self.w.out_dim)
        return self._attend(take_rows(table, self.target_rows), take_rows(table, self.source_rows))


class _Segmented(_Form):
    """Edges in relation order (sorted once, in RelGraph), one product per relation's segment;
    ``products`` says how."""

    products = None

    def forward(self, x):
        self._check(x)
        g, products = self.graph, type(self).products
        order = g.by_relation
        return self._attend(
            products(take_rows(x, g.dst[order]), self.w.weight, g.offsets),
            products(take_rows(x, g.src[order]), self.w.weight, g.offsets),
            order,
        )


class SegmentMM(_Segmented):
    products = staticmethod(segment_products)


class GroupedMM(_Segmented):
    products = staticmethod(grouped_products)


class PyG(RelationalLayer):
    """PyG's ``RGATConv`` (defaults) whose parameters are the shared weights themselves."""

    def __init__(self, weights, graph):
        super().__init__(weights, graph)
        from torch_geometric.nn import RGATConv

        r, i, o = weights.weight.shape
        self.layer = RGATConv(i, o, r, negative_slope=NEGATIVE_SLOPE)
        self.layer.weight, self.layer.q, self.layer.k = weights.weight, weights.q, weights.k
        self.layer.bias = weights.bias
        self.edge_index = torch.stack([graph.src, graph.dst])

    def forward(self, x):
        self._check(x)
        return self.layer(x, self.edge_index, self.graph.etype)


@model
def rgat_layer(m):
    """PyG's RGATConv with its defaults: additive self-attention across relations, one head."""
    x = m.input("x", "in")
    W = m.weight("W", ("in", "out"), per="relation")
    source, target = m.src(x) @ W[m.relation], m.dst(x) @ W[m.relation]
    score = m.leaky_relu(target @ m.weight("q", ("out", 1)) + source @ m.weight("k", ("out", 1)), NEGATIVE_SLOPE)
    return m.weight("bias", ("out",)) + m.sum_into_dst(m.edge_softmax(score) * source)


def bind(weights: RGATWeights) -> dict[str, torch.Tensor]:
    """The program's weights, as the weight set's own parameters."""
    return {"W": weights.weight, "q": weights.q, "k": weights.k, "bias": weights.bias}


RGAT = MODELS.register(
    Model(
        "rgat",
        RGATWeights,
        layers={"pyg": PyG, "per_edge": PerEdge, "segment_mm": SegmentMM, "grouped_mm": GroupedMM, "dense": Dense},
        # Each gathers one [in, out] weight matrix per edge (and in training its gradient too).
        per_edge_weights=frozenset({"pyg", "per_edge"}),
        program=rgat_layer,
        bind=bind,
    )
)
