"""HGT (Hu et al.), one layer, one head, in every baseline form, from one set of weights: PyG's
``HGTConv`` with ``heads=1``:

    k, q, v = split(x[n] @ Wkqv[type(n)].T + bkqv[type(n)])          per node n
    for an edge u -> w of relation r:
        a = (q[w] . (k[u] @ Krel[r])) * p[r] / sqrt(out)
        alpha = softmax of a over all edges into w
    h[w] = gelu(sum over edges of alpha * (v[u] @ Vrel[r])) @ Wout[type(w)].T + bout[type(w)]
    out[w] = s * h[w] + (1 - s) * x[w], s = sigmoid(skip[type(w)])   (where in = out)

Each weight is one parameter: the per-type ones stacked over node types, in ``torch.nn.Linear``'s
[out, in] layout, and the relation priorities one vector. (PyG keeps one parameter per type and
per relation; its form here reads views of these. A parameter per relation, 104 on aifb-like,
made every form's training step pay for a gradient, a zeroing and an optimizer update per tensor.)
PyG returns no output for node types no edge leads to; its form here gives them what every other
form does (the output of a node without incoming edges), so forms compare row by row. The same
layer in Hector's model language is :func:`hgt_layer`.

Where in != out the layer has no skip, as PyG's: the gate mixes the output with the input itself,
and a projection of the input to ``out`` (which PyG does not have) would be another layer. Every
form computes that but Hector's variants: the program has the gated skip, so it takes in = out,
and a weight set of other widths is refused in one line naming them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from harness.errors import UserError
from systems.hector.lang import model
from systems.relgraph.graph import RelGraph
from systems.relgraph.ops import edge_softmax, grouped_products, segment_products, take_rows
from systems.rgnn.layer import GraphNotSupported, RelationalLayer, glorot, pair_rows, side_by_side
from systems.rgnn.models import MODELS, Model


class HGTWeights(nn.Module):
    def __init__(self, num_relations: int, in_dim: int, out_dim: int, seed: int = 0, num_node_types: int = 1):
        super().__init__()
        self.num_relations, self.in_dim, self.out_dim = num_relations, in_dim, out_dim
        self.num_node_types = num_node_types
        g = torch.Generator().manual_seed(seed)
        types = num_node_types
        self.kqv_weight = glorot((types, 3 * out_dim, in_dim), g)
        self.kqv_bias = nn.Parameter(torch.rand(types, 3 * out_dim, generator=g) * 0.1)
        self.out_weight = glorot((types, out_dim, out_dim), g)
        self.out_bias = nn.Parameter(torch.rand(types, out_dim, generator=g) * 0.1)
        self.skip = nn.Parameter(torch.randn(types, generator=g))
        self.k_rel = glorot((num_relations, out_dim, out_dim), g)
        self.v_rel = glorot((num_relations, out_dim, out_dim), g)
        # PyG keeps one [1, heads] priority per relation; 0.5 to 1.5 here, so that it matters.
        self.p_rel = nn.Parameter(0.5 + torch.rand(num_relations, generator=g))

    def stacked(self, name: str) -> torch.Tensor:
        """A per-type weight as [types, in, out] (a view)."""
        return getattr(self, name).transpose(1, 2)


class _Form(RelationalLayer):
    def __init__(self, weights: HGTWeights, graph: RelGraph):
        super().__init__(weights, graph)
        if weights.num_node_types != graph.num_node_types:
            raise UserError(f"the weights have {weights.num_node_types} node types, the graph {graph.num_node_types}")

    def _typed(self, rows, weight, bias) -> torch.Tensor:
        """``rows[n] @ weight[type(n)] + bias[type(n)]`` for every node (rows in node order)."""
        raise NotImplementedError

    def _related(self, rows, weight) -> torch.Tensor:
        """``rows[i] @ weight[relation of edge i]``, rows in this form's edge order."""
        raise NotImplementedError

    def _from_sources(self, nodes, src, weight) -> torch.Tensor:
        """``nodes[src[i]] @ weight[relation of edge i]``, ``src`` in this form's edge order."""
        return self._related(take_rows(nodes, src), weight)

    order = None  # the edge order of _related's rows: None is edge order

    def forward(self, x):
        self._check(x)
        g, w = self.graph, self.w
        kqv = self._typed(x, w.stacked("kqv_weight"), w.kqv_bias)
        k, q, v = torch.tensor_split(kqv, 3, dim=1)
        src = g.src if self.order is None else g.src[self.order]
        dst = g.dst if self.order is None else g.dst[self.order]
        etype = g.etype if self.order is None else g.etype[self.order]
        keys, values = self._from_sources(k, src, w.k_rel), self._from_sources(v, src, w.v_rel)
        # The logits in float32 at least, as Hector computes them: a query-key product of float16
        # rows passes 65504 (features of magnitude 300 do), and inf - inf in the softmax is NaN.
        wide = torch.promote_types(keys.dtype, torch.float32)
        dots = (take_rows(q, dst).to(wide) * keys.to(wide)).sum(1)
        scores = dots * take_rows(w.p_rel, etype).to(wide) / math.sqrt(w.out_dim)
        alpha = edge_softmax(scores, dst, g.num_nodes)
        summed = torch.zeros_like(q).index_add(0, dst, (alpha.unsqueeze(1) * values).to(q.dtype))
        out = self._typed(F.gelu(summed), w.stacked("out_weight"), w.out_bias)
        if w.in_dim != w.out_dim:
            return out
        share = take_rows(w.skip.sigmoid(), g.node_type).unsqueeze(1)
        return share * out + (1 - share) * x


class PerEdge(_Form):
    """Each node's typed weight and each edge's relation weight gathered and applied one by one
    (the UDF style): [nodes, in, 3 out] and [edges, out, out] materialized."""

    def _typed(self, rows, weight, bias):
        t = self.graph.node_type
        return torch.bmm(rows.unsqueeze(1), take_rows(weight, t)).squeeze(1) + take_rows(bias, t)

    def _related(self, rows, weight):
        return torch.bmm(rows.unsqueeze(1), take_rows(weight, self.graph.etype)).squeeze(1)


class Dense(_Form):
    """Every node under every node type in one GEMM and under every relation in one more, each
    node's or edge's row then gathered by its (node, type) or (source, relation) pair: what a user
    writes today in a few lines of torch, computing the pairs nothing uses too."""

    def __init__(self, weights: HGTWeights, graph: RelGraph):
        super().__init__(weights, graph)
        every_node = torch.arange(graph.num_nodes, device=graph.node_type.device)
        self.type_rows = pair_rows(every_node, graph.node_type, graph.num_node_types)
        self.source_rows = pair_rows(graph.src, graph.etype, graph.num_relations)

    def _typed(self, rows, weight, bias):
        table = (rows @ side_by_side(weight)).view(-1, weight.shape[2])
        return take_rows(table, self.type_rows) + take_rows(bias, self.graph.node_type)

    def _from_sources(self, nodes, src, weight):
        table = (nodes @ side_by_side(weight)).view(-1, weight.shape[2])
        return take_rows(table, self.source_rows)


class _Segmented(_Form):
    """Nodes in type order and edges in relation order (both sorted once, in RelGraph), one
    product per segment; ``products`` says how."""

    products = None

    @property
    def order(self):
        return self.graph.by_relation

    def _typed(self, rows, weight, bias):
        g = self.graph
        product = type(self).products(take_rows(rows, g.by_type), weight, g.type_offsets)
        product = product + take_rows(bias, g.node_type[g.by_type])
        return torch.empty_like(product).index_copy(0, g.by_type, product)  # back to node order

    def _related(self, rows, weight):
        return type(self).products(rows, weight, self.graph.offsets)


class SegmentMM(_Segmented):
    products = staticmethod(segment_products)


class GroupedMM(_Segmented):
    products = staticmethod(grouped_products)


class PyG(RelationalLayer):
    """PyG's ``HGTConv`` (one head) computing with the shared weights: its per-type linear layers'
    weights, its skip gates and its relation priorities are views of them, made at each call; node
    types and relations become PyG's typed dictionaries once, here."""

    def __init__(self, weights: HGTWeights, graph: RelGraph):
        super().__init__(weights, graph)
        from torch_geometric.nn import HGTConv

        if graph.num_relations == 0:  # PyG concatenates the relations' messages: none fails
            raise GraphNotSupported("PyG's HGTConv cannot take a graph with no relations; use another form")
        self.types = [f"t{i}" for i in range(graph.num_node_types)]
        ends = []  # (source type, name, target type) of each relation, from its edges (type 0 if none)
        for r in range(graph.num_relations):
            mask = graph.etype == r
            kinds = [graph.node_type[ids[mask]].unique().tolist() for ids in (graph.src, graph.dst)]
            if any(len(k) > 1 for k in kinds):
                raise GraphNotSupported(
                    f"relation {r} joins several node types ({kinds[0]} to {kinds[1]}): PyG's heterographs "
                    "need one source and one target type per relation"
                )
            ends.append(tuple(self.types[k[0]] if k else "t0" for k in kinds))
        ends = [(s, f"r{r}", t) for r, (s, t) in enumerate(ends)]
        self.relations = ends
        self.layer = HGTConv(weights.in_dim, weights.out_dim, (self.types, ends), heads=1)
        # PyG's own parameters go; the views put in their place at each call are not parameters.
        for t in self.types:
            for lin in (self.layer.kqv_lin.lins[t], self.layer.out_lin.lins[t]):
                del lin.weight, lin.bias
        del self.layer.skip, self.layer.p_rel
        self.layer.k_rel.weight, self.layer.v_rel.weight = weights.k_rel, weights.v_rel
        # Local ids within each type, and each relation's edges in them.
        self.members = [torch.nonzero(graph.node_type == i).flatten() for i in range(graph.num_node_types)]
        local = torch.empty_like(graph.node_type)
        for ids in self.members:
            local[ids] = torch.arange(len(ids), device=ids.device)
        self.edges = {
            relation: torch.stack([local[graph.src[graph.etype == r]], local[graph.dst[graph.etype == r]]])
            for r, relation in enumerate(ends)
        }

    def _bind(self) -> None:
        """PyG's per-type and per-relation weights as views of the shared ones, made in this call
        so that each call's gradients reach the shared parameters."""
        w, kqv, out = self.w, self.layer.kqv_lin.lins, self.layer.out_lin.lins
        # unbind, not indexing per type: one operator whose gradient is one stack
        for t, weight, bias in zip(self.types, w.kqv_weight.unbind(0), w.kqv_bias.unbind(0), strict=True):
            kqv[t].weight, kqv[t].bias = weight, bias
        for t, weight, bias in zip(self.types, w.out_weight.unbind(0), w.out_bias.unbind(0), strict=True):
            out[t].weight, out[t].bias = weight, bias
        self.layer.skip = dict(zip(self.types, w.skip.unbind(0), strict=True))
        # A plain dict keyed by relation: construct_bipartite_edge_index reads it by edge type.
        self.layer.p_rel = dict(zip(self.relations, w.p_rel.view(-1, 1, 1).unbind(0), strict=True))

    def forward(self, x):
        self._check(x)
        w = self.w
        self._bind()
        out = self.layer({t: take_rows(x, ids) for t, ids in zip(self.types, self.members)}, self.edges)
        rows = torch.empty(x.shape[0], w.out_dim, dtype=x.dtype, device=x.device)
        for i, (t, ids) in enumerate(zip(self.types, self.members)):
            if out.get(t) is None:  # a type no edge leads to: a node without incoming edges
                alone = self.layer.out_lin.lins[t](torch.zeros(len(ids), w.out_dim, device=x.device, dtype=x.dtype))
                share = w.skip[i].sigmoid() if w.in_dim == w.out_dim else None
                out[t] = alone if share is None else share * alone + (1 - share) * take_rows(x, ids)
            rows = rows.index_copy(0, ids, out[t])
        return rows


@model
def hgt_layer(m):
    """PyG's HGTConv with one head, in = out (so the gated skip applies)."""
    x = m.input("x", "out")

    def typed(rows, name, width_in):  # rows @ W[type] + b[type], per node type
        w, b = m.weight(f"W{name}", (width_in, "out"), per="node_type"), m.weight(f"b{name}", ("out",), per="node_type")
        return rows @ w[m.node_type] + b[m.node_type]

    k, q, v = typed(x, "k", "out"), typed(x, "q", "out"), typed(x, "v", "out")
    keys = m.src(k) @ m.weight("K", ("out", "out"), per="relation")[m.relation]
    values = m.src(v) @ m.weight("V", ("out", "out"), per="relation")[m.relation]
    score = m.dot(m.dst(q), keys) * m.weight("p", (1,), per="relation")[m.relation] * m.rsqrt("out", keys)
    h = typed(m.gelu(m.sum_into_dst(m.edge_softmax(score) * values)), "out", "out")
    gate = m.sigmoid(m.each_node(m.weight("skip", (1,), per="node_type")[m.node_type]))
    return gate * h + (1 - gate) * x


def bind(weights: HGTWeights) -> dict[str, torch.Tensor]:
    """The program's weights as views of the weight set (gradients reach it): the per-type
    [types, in, 3 out] key-query-value weight split into its three parts, in HGTConv's order."""
    if weights.in_dim != weights.out_dim:
        raise UserError(
            f"hgt in Hector's language has the gated skip, so it needs in_dim = out_dim; got in_dim "
            f"{weights.in_dim} and out_dim {weights.out_dim} (the other forms compute it without the skip)"
        )
    out = weights.out_dim
    kqv, kqv_bias = weights.stacked("kqv_weight"), weights.kqv_bias
    parts = {name: i * out for i, name in enumerate("kqv")}  # HGTConv's order: keys, queries, values
    bound = {f"W{n}": kqv[:, :, s : s + out] for n, s in parts.items()}
    bound |= {f"b{n}": kqv_bias[:, s : s + out] for n, s in parts.items()}
    return bound | {
        "K": weights.k_rel,
        "V": weights.v_rel,
        "p": weights.p_rel.unsqueeze(1),
        "Wout": weights.stacked("out_weight"),
        "bout": weights.out_bias,
        "skip": weights.skip.unsqueeze(1),
    }


HGT = MODELS.register(
    Model(
        "hgt",
        HGTWeights,
        layers={"pyg": PyG, "per_edge": PerEdge, "segment_mm": SegmentMM, "grouped_mm": GroupedMM, "dense": Dense},
        # Gathers two [out, out] relation matrices per edge (k_rel and v_rel).
        per_edge_weights=frozenset({"per_edge"}),
        edge_matrices=2,
        program=hgt_layer,
        bind=bind,
    )
)
