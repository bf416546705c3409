"""Relational GNN models, each declared once by the module of its name in this package: RGCN
(``rgcn``), RGAT (``rgat``) and HGT (``hgt``), one layer, one head.

A :class:`Model` says everything the comparison needs of a model: the weight set every form of it
shares, the layers it implements itself by form name (the baseline forms of
systems/rgnn/forms/baselines.py build them), which of those gather a weight matrix per edge, the
form every other is checked against, and the layer in Hector's model language with the binding of
the weight set to the program's names. A new model is one new module here that registers one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness.registry import Registry

if TYPE_CHECKING:
    import torch
    from torch import nn

    from systems.hector.ir import Program
    from systems.relgraph.graph import RelGraph


@dataclass(frozen=True)
class Model:
    """One relational layer, declared once.

    ``weights``: the weight set's class, made as ``weights(num_relations, in_dim, out_dim, seed=,
    num_node_types=)``; every form of the model computes with one such set, so gradients reach it
    whichever form ran. ``layers``: the forms the model implements itself, form name -> a class
    made as ``layer(weights, graph)`` whose call on the node features gives the output.
    ``reference``: the form every other form's output is checked against. ``per_edge_weights``:
    the forms of ``layers`` that gather a weight matrix per edge (memory grows with edges x in x
    out). ``program``: a function tracing the layer in Hector's model language
    (systems/hector/lang.py), None if it has none; ``bind``: the program's weights by name, as
    views of a weight set.
    """

    name: str
    weights: type
    layers: Mapping[str, type] = field(default_factory=dict)
    reference: str = "segment_mm"
    per_edge_weights: frozenset[str] = frozenset()
    edge_matrices: int = 1  # weight matrices a per_edge_weights form gathers per edge
    program: Callable[[], Program] | None = None
    bind: Callable[[nn.Module], dict[str, torch.Tensor]] | None = None
    label: str = ""

    def __post_init__(self):
        if not self.name or not self.name.replace("_", "").isalnum() or not self.name.islower():
            raise ValueError(f"model name {self.name!r}: use lowercase letters, digits and _")
        if unknown := set(self.per_edge_weights) - set(self.layers):
            raise ValueError(f"model {self.name}: per_edge_weights names forms it has no layer for: {sorted(unknown)}")
        if (self.program is None) != (self.bind is None):
            raise ValueError(f"model {self.name}: a program needs its binding of the weights, and a binding a program")

    @property
    def display(self) -> str:
        return self.label or self.name.upper()

    def make_weights(self, graph: RelGraph, in_dim: int, out_dim: int, seed: int = 0) -> nn.Module:
        """A seeded weight set for ``graph``'s relations and node types."""
        return self.weights(graph.num_relations, in_dim, out_dim, seed=seed, num_node_types=graph.num_node_types)


MODELS: Registry[Model] = Registry("relational model", __name__)
# Every module of the package registers now, in name order, so the entries' order (the order forms
# are measured and shown in) does not depend on which of them some caller imported first.
MODELS.names()
