"""GraphSAGE and GAT for node classification, from PyG's conv layers.

Each model has one conv layer per sampling hop; it runs on a sampled subgraph (all its nodes'
features, its edges) and the caller keeps the first ``batch_size`` outputs (the seeds).

A model's forward is ``forward_layers(x, edges_for_layers(edge_index, nodes))``. The first part
is what the edges need once per subgraph, and may wait for the GPU (GAT's self-loops: a boolean
mask, whose result's size only the GPU knows); ``forward_layers`` is the rest, which never waits
and whose shapes follow the inputs' alone. The ``cuda_graph`` model form
(workloads/gnn/model_forms/) runs the first eagerly and captures the second.
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import GATConv, SAGEConv
from torch_geometric.utils import add_self_loops, remove_self_loops

from harness.arguments import whole_number

MODELS = ("sage", "gat")


class GraphSAGE(nn.Module):
    def __init__(self, in_dim: int, hidden: int, classes: int, layers: int, dropout: float = 0.5):
        super().__init__()
        dims = [in_dim] + [hidden] * (layers - 1) + [classes]
        self.convs = nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = dropout
        self.hops, self.in_dim = layers, in_dim  # what the training loop checks its batches against

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.forward_layers(x, self.edges_for_layers(edge_index, x.size(0)))

    def edges_for_layers(self, edge_index: torch.Tensor, nodes: int) -> torch.Tensor:
        return edge_index  # SAGE's layers take the sampled edges as they are

    def forward_layers(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = nn.functional.dropout(x.relu(), self.dropout, self.training)
        return x


class GAT(nn.Module):
    def __init__(self, in_dim: int, hidden: int, classes: int, layers: int, heads: int = 4, dropout: float = 0.5):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"GAT hidden size {hidden} must be a multiple of its {heads} heads")
        dims = [in_dim] + [hidden] * (layers - 1)
        # PyG's GATConv by default removes the edges' self-loops and adds one per node in every
        # layer; here the model does it once for all its layers (edges_for_layers): the same edges
        # in the same order, so the same numbers, and the layers never wait for the GPU.
        self.convs = nn.ModuleList(
            [GATConv(a, hidden // heads, heads=heads, add_self_loops=False) for a in dims[:-1]]
            + [GATConv(dims[-1], classes, heads=1, add_self_loops=False)]
        )
        self.dropout = dropout
        self.hops, self.in_dim = layers, in_dim  # what the training loop checks its batches against

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.forward_layers(x, self.edges_for_layers(edge_index, x.size(0)))

    def edges_for_layers(self, edge_index: torch.Tensor, nodes: int) -> torch.Tensor:
        """Every node attends to itself once: the subgraph's self-loops removed, one per node added
        after the other edges (what GATConv's ``add_self_loops`` does in each layer)."""
        return add_self_loops(remove_self_loops(edge_index)[0], num_nodes=nodes)[0]

    def forward_layers(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = nn.functional.dropout(nn.functional.elu(x), self.dropout, self.training)
        return x


def check(name: str, layers: int, fanouts: list[int]) -> None:
    """Refuse a model that :func:`build` could not make: callers check before a long set-up."""
    if name not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {name!r}")
    if whole_number(layers) is None or not isinstance(fanouts, list | tuple):
        raise TypeError(f"layers must be a whole number and fanouts a list, got {layers!r} and {fanouts!r}")
    if layers < 1 or len(fanouts) != layers:
        raise ValueError(f"a {layers}-layer {name} needs one fan-out per layer, got fan-outs {list(fanouts)}")


def build(
    name: str, in_dim: int, hidden: int, classes: int, layers: int, fanouts: list[int], dropout: float = 0.5
) -> nn.Module:
    """The model ``name`` with ``layers`` layers; sampling must have one fan-out per layer."""
    check(name, layers, fanouts)
    for what, size in (("in_dim", in_dim), ("hidden", hidden), ("classes", classes)):
        # PyG takes a size <= 0 for a lazy layer: its weights would stay uninitialised memory
        if whole_number(size, at_least=1) is None:
            raise ValueError(f"{what} must be a whole number >= 1, got {size!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout <= 1:
        raise ValueError(f"dropout must be a probability in [0, 1], got {dropout!r}")
    return (GraphSAGE if name == "sage" else GAT)(in_dim, hidden, classes, layers, dropout=dropout)
