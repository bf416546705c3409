"""What every layer a model implements itself shares: its weights (which say their
``num_relations`` and ``in_dim``) and graph, checked against each other and the input; and the two
helpers of the dense forms, which transform every node under every relation (or node type) in one
GEMM and gather each edge's (node, relation) row from it."""

from __future__ import annotations

import torch
from torch import nn

from harness.errors import UserError
from systems.relgraph.graph import RelGraph


class GraphNotSupported(UserError):
    """A form that cannot take this graph (a limit of the library it wraps: PyG's layers need a
    relation and one node type at each end of a relation): the topic notes it and goes on with the
    other forms; a user calling the form gets the line."""


class RelationalLayer(nn.Module):
    """A layer over one graph with one weight set; call it with the node features."""

    def __init__(self, weights: nn.Module, graph: RelGraph):
        super().__init__()
        if weights.num_relations != graph.num_relations:
            raise UserError(f"the weights have {weights.num_relations} relations, the graph {graph.num_relations}")
        self.w, self.graph = weights, graph
        # Its dtype follows the weights' through .to(): what the features must match.
        self._a_weight = next(weights.parameters(), None)

    def _check(self, x: torch.Tensor) -> None:
        self.graph.check_unchanged()  # the forms' cached orders and norm describe the built edges
        if not isinstance(x, torch.Tensor):
            raise UserError(f"features must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 2 or x.shape[0] != self.graph.num_nodes or x.shape[1] != self.w.in_dim:
            raise UserError(f"features must be [{self.graph.num_nodes} nodes, {self.w.in_dim}], got {tuple(x.shape)}")
        # PyG reads integer features as node ids (its featureless mode): a wrong result, not an error.
        wanted = self._a_weight.dtype if self._a_weight is not None else None
        if not x.is_floating_point() or (wanted is not None and x.dtype != wanted):
            raise UserError(f"features must be floating-point, of the weights' type {wanted}, got {x.dtype}")


def glorot(shape, generator: torch.Generator) -> nn.Parameter:
    """Glorot-uniform over the last two dimensions, as PyG initializes."""
    scale = (6.0 / (shape[-2] + shape[-1])) ** 0.5
    return nn.Parameter((torch.rand(*shape, generator=generator) * 2 - 1) * scale)


def side_by_side(weight: torch.Tensor) -> torch.Tensor:
    """A stack of weights [k, in, out] as one [in, k x out] matrix, so that one GEMM transforms
    every row under all k: row n of the product, read as [k, out], holds row n under each."""
    count, rows, cols = weight.shape
    return weight.permute(1, 0, 2).reshape(rows, count * cols)


def pair_rows(ids: torch.Tensor, kinds: torch.Tensor, count: int) -> torch.Tensor:
    """Where the pair (``ids[i]``, ``kinds[i]``) is in a product by :func:`side_by_side` read as
    [ids x count, out]: row ``ids[i] x count + kinds[i]``."""
    return ids * count + kinds
