"""CompGCN (Vashishth et al.), one layer, subtraction composition: each neighbour's features are
composed with the embedding of the relation that links it, then transformed by the weight of
the edge's direction, and averaged:

    in[v]   = mean over edges u -> v of relation r of  (x[u] - z[r]) @ W_in
    out[v]  = mean over edges v -> w of relation r of  (x[w] - z[r]) @ W_out
    loop[v] = (x[v] - z_loop) @ W_loop
    h[v]    = tanh((in[v] + out[v] + loop[v]) / 3 + bias)

(a node with no incoming or no outgoing edge has a zero mean there). The relation embeddings are
the layer's input here and are not transformed for a next layer. The form every other is checked
against is :class:`PerEdge`, plain PyTorch: every edge's composed message computed per edge. The
layer is written in Hector's model language as :func:`compgcn_layer` (mean aggregation into both
ends, division, tanh), which has no kernel of its own.
"""

from __future__ import annotations

import torch
from torch import nn

from systems.hector.lang import model
from systems.rgnn.layer import RelationalLayer, glorot
from systems.rgnn.models import MODELS, Model


class CompGCNWeights(nn.Module):
    """One weight set for every node type (``num_node_types`` is taken, like HGT's, and not used)."""

    def __init__(self, num_relations: int, in_dim: int, out_dim: int, seed: int = 0, num_node_types: int = 1):
        super().__init__()
        self.num_relations, self.in_dim, self.out_dim = num_relations, in_dim, out_dim
        g = torch.Generator().manual_seed(seed)
        self.relation = glorot((num_relations, in_dim), g)
        self.loop = nn.Parameter(torch.rand(in_dim, generator=g) * 0.1)  # the self-loop relation's embedding
        self.w_in = glorot((in_dim, out_dim), g)
        self.w_out = glorot((in_dim, out_dim), g)
        self.w_loop = glorot((in_dim, out_dim), g)
        self.bias = nn.Parameter(torch.rand(out_dim, generator=g) * 0.1)


def mean_into(rows: torch.Tensor, ends: torch.Tensor, nodes: int) -> torch.Tensor:
    """Each node's mean of the rows whose ``ends`` entry is that node (0 where there are none)."""
    total = rows.new_zeros(nodes, rows.shape[1]).index_add(0, ends, rows)
    return total / torch.bincount(ends, minlength=nodes).clamp(min=1).unsqueeze(1).to(rows.dtype)


class PerEdge(RelationalLayer):
    """Every edge's composed message in both directions, plain PyTorch (no weight matrix per edge:
    the relation is a vector)."""

    def forward(self, x):
        self._check(x)
        g, w = self.graph, self.w
        relation = w.relation[g.etype]
        incoming = mean_into((x[g.src] - relation) @ w.w_in, g.dst, g.num_nodes)
        outgoing = mean_into((x[g.dst] - relation) @ w.w_out, g.src, g.num_nodes)
        loop = (x - w.loop) @ w.w_loop
        return torch.tanh((incoming + outgoing + loop) / 3 + w.bias)


@model
def compgcn_layer(m):
    """CompGCN, subtraction composition, mean aggregation in both directions, tanh."""
    x = m.input("x", "in")
    relation = m.weight("relation", ("in",), per="relation")[m.relation]
    w_in, w_out, w_loop = (m.weight(name, ("in", "out")) for name in ("W_in", "W_out", "W_loop"))
    incoming = m.mean_into_dst((m.src(x) - relation) @ w_in)
    outgoing = m.mean_into_src((m.dst(x) - relation) @ w_out)
    loop = (x - m.weight("loop", ("in",))) @ w_loop
    return m.tanh((incoming + outgoing + loop) / 3 + m.weight("bias", ("out",)))


def bind(weights: CompGCNWeights) -> dict[str, torch.Tensor]:
    """The program's weights, as the weight set's own parameters."""
    return {
        "relation": weights.relation,
        "loop": weights.loop,
        "W_in": weights.w_in,
        "W_out": weights.w_out,
        "W_loop": weights.w_loop,
        "bias": weights.bias,
    }


COMPGCN = MODELS.register(
    Model(
        "compgcn",
        CompGCNWeights,
        layers={"per_edge": PerEdge},
        reference="per_edge",
        program=compgcn_layer,
        bind=bind,
        label="CompGCN",
    )
)
