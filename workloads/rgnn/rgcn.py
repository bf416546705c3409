"""RGCN (Schlichtkrull et al.), one layer, in every baseline form, from one set of weights:

    out[v] = x[v] @ root + bias + sum over relations r of  mean over r-edges u -> v of  x[u] @ weight[r]

(PyG's ``RGCNConv`` with ``aggr="mean"``, no bases or blocks). Each form is a module built from
the shared :class:`RGCNWeights` and a :class:`RelGraph`; calling it with the node features gives
the output, and gradients reach the shared weights whichever form computed them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from harness.errors import UserError
from workloads.rgnn.graph import RelGraph


class RGCNWeights(nn.Module):
    def __init__(self, num_relations: int, in_dim: int, out_dim: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        scale = (6.0 / (in_dim + out_dim)) ** 0.5  # Glorot-uniform, as PyG initializes
        uniform = lambda *shape: nn.Parameter((torch.rand(*shape, generator=g) * 2 - 1) * scale)  # noqa: E731
        self.weight = uniform(num_relations, in_dim, out_dim)
        self.root = uniform(in_dim, out_dim)
        self.bias = nn.Parameter(torch.rand(out_dim, generator=g) * 0.1)


class _Form(nn.Module):
    def __init__(self, weights: RGCNWeights, graph: RelGraph):
        super().__init__()
        if weights.weight.shape[0] != graph.num_relations:
            raise UserError(f"the weights have {weights.weight.shape[0]} relations, the graph {graph.num_relations}")
        self.w, self.graph = weights, graph

    def _check(self, x: torch.Tensor) -> None:
        if x.dim() != 2 or x.shape[0] != self.graph.num_nodes or x.shape[1] != self.w.weight.shape[1]:
            raise UserError(
                f"features must be [{self.graph.num_nodes} nodes, {self.w.weight.shape[1]}], got {tuple(x.shape)}"
            )

    def _finish(self, x, messages, order=None) -> torch.Tensor:
        """Root term and bias plus the normalized messages summed into their targets; ``order``
        (edges ordered by relation) says which edge each message row is, when not edge order."""
        g = self.graph
        norm = g.norm if order is None else g.norm[order]
        dst = g.dst if order is None else g.dst[order]
        out = torch.addmm(self.w.bias, x, self.w.root)
        return out.index_add(0, dst, messages * norm.unsqueeze(1).to(messages.dtype))


class PerEdge(_Form):
    """Each edge's message with its own gathered weight: [edges, in, out] materialized."""

    def forward(self, x):
        self._check(x)
        g = self.graph
        messages = torch.bmm(x[g.src].unsqueeze(1), self.w.weight[g.etype]).squeeze(1)
        return self._finish(x, messages)


class SegmentMM(_Form):
    """Edges in relation order (sorted once, in RelGraph), one matrix product per relation."""

    def forward(self, x):
        self._check(x)
        g = self.graph
        gathered = x[g.src[g.by_relation]]
        bounds = g.offsets.tolist()  # one host read per call, not one per relation
        messages = torch.cat([gathered[bounds[r] : bounds[r + 1]] @ self.w.weight[r] for r in range(g.num_relations)])
        return self._finish(x, messages, g.by_relation)


class GroupedMM(_Form):
    """The relation segments in one ``torch.nn.functional.grouped_mm`` call. Its operands' rows
    must be multiples of 16 bytes, so odd feature sizes are zero-padded (which adds nothing)."""

    def forward(self, x):
        self._check(x)
        g = self.graph
        gathered = x[g.src[g.by_relation]]
        weight = self.w.weight
        align = 16 // x.element_size()
        pad_in, pad_out = -weight.shape[1] % align, -weight.shape[2] % align
        if pad_in or pad_out:
            gathered = F.pad(gathered, (0, pad_in))
            weight = F.pad(weight, (0, pad_out, 0, pad_in))
        messages = F.grouped_mm(gathered, weight, offs=g.offsets[1:].to(torch.int32))
        return self._finish(x, messages[:, : self.w.weight.shape[2]], g.by_relation)


class _PyG(_Form):
    """A PyG layer whose parameters are the shared weights themselves (so gradients reach them)."""

    layer_class = None

    def __init__(self, weights, graph):
        super().__init__(weights, graph)
        import torch_geometric.nn as pyg

        r, i, o = weights.weight.shape
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


FORMS = {"pyg": PyG, "pyg_fast": PyGFast, "per_edge": PerEdge, "segment_mm": SegmentMM, "grouped_mm": GroupedMM}


def form(name: str, weights: RGCNWeights, graph: RelGraph) -> nn.Module:
    if name not in FORMS:
        raise UserError(f"unknown RGCN form {name!r}; one of {', '.join(FORMS)}")
    return FORMS[name](weights, graph)
