"""The forms of relational GNN layers that the relational_gnn topic compares: one registry,
:data:`FORMS`, that every module of this package adds to (``baselines``: the plain-PyTorch forms
and PyG's layers; ``compiled``: torch.compile of some of them; ``hector``: Hector's variants). A
new form is one new module here.

A :class:`Form` is a way to compute a model's layer from the model's shared weight set and a
graph: ``form.build(model, weights, graph)`` gives a callable of the node features, which the topic
checks against the model's reference form and then times. Each form says its role (``baseline``:
what the paper compares against; ``peer``: what a user picks today; ``optimized``: the technique),
the precision of its products, the models it computes, and whether it gathers a weight matrix per
edge (on a CPU such a form is not attempted past a memory limit).

Three ways to say how a form builds a layer:

* :class:`Form` with ``make`` and ``models``: the form's own code, for the models it names;
* :class:`LayerForm`: each model implements the form itself (``Model.layers``), so a new model
  joins the form by declaring a layer for it;
* a subclass that overrides :meth:`Form.supports` and ``Form._build`` (Hector's variants build
  any model that has a program; ``compiled``'s forms compile another form's layers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from harness.errors import UserError
from harness.registry import Entry, Registry

if TYPE_CHECKING:
    from torch import nn

    from systems.relgraph.graph import RelGraph
    from systems.rgnn.models import Model

    Layer = Callable[[torch.Tensor], torch.Tensor]

# The precisions a form may multiply in, each with the tolerance of its check against the
# reference form (relative, and absolute as a share of the reference's largest magnitude):
# float32 with TF32 off (the comparison's precision) only sums in another order; TF32 rounds the
# products' inputs to 10 mantissa bits; bfloat16 keeps 8 in every tensor (inputs, weights and
# results; products accumulate in float32).
TOLERANCE = {"float32": 1e-3, "tf32": 1e-2, "bfloat16": 3e-2}
EXACT = "float32"
ELEMENT_TYPES = ("float32", "bfloat16")  # the tensors' types a layer is measured in


@dataclass(frozen=True)
class Form(Entry):
    """One way to compute relational layers.

    ``precision``: that of its products (:data:`TOLERANCE`); a form not in float32 is measured
    and shown beside the others, kept out of the float32 comparison. ``computes``: the form this
    one is in another precision (``hector_best_tf32`` computes ``hector_best``); empty: itself.
    ``models``, ``make(model, weights, graph)`` and ``per_edge_weights`` (models for which it
    gathers a weight matrix per edge): how a form written as its own code builds its layers.
    """

    precision: str = EXACT
    computes: str = ""
    models: tuple[str, ...] = ()
    make: Callable[[Model, nn.Module, RelGraph], Layer] | None = None
    per_edge_weights: tuple[str, ...] = ()

    def __post_init__(self):
        super().__post_init__()
        if self.precision not in TOLERANCE:
            raise ValueError(f"form {self.name}: precision {self.precision!r} is not one of {', '.join(TOLERANCE)}")
        # A plain Form is its own code: without ``make`` its first build would call None, and
        # without ``models`` it would compute nothing and be listed under no model.
        if type(self)._build is Form._build and self.make is None:
            raise ValueError(f"form {self.name}: give make(model, weights, graph), or subclass Form with _build")
        if type(self).supports is Form.supports and not self.models:
            raise ValueError(f"form {self.name}: name the models it computes (models=...), or subclass with supports")

    @property
    def form(self) -> str:
        """What the results' ``form`` column says: the computation, whatever its precision."""
        return self.computes or self.name

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.precision]

    def supports(self, model: Model) -> bool:
        """Whether this form can compute ``model``'s layer."""
        return model.name in self.models

    def missing_element_type(self, element_type: str) -> str | None:
        """Why this form does not compute on tensors of ``element_type`` (a name in
        :data:`ELEMENT_TYPES`), or None. A float32 form written in torch computes in the type of
        its tensors; a form of another precision has its own."""
        if element_type == EXACT or self.precision == EXACT:
            return None
        return f"{self.name} multiplies in {self.precision}, on float32 tensors only"

    def precision_on(self, element_type: str) -> str:
        """The precision of this form's products on tensors of ``element_type``."""
        return self.precision if element_type == EXACT else element_type

    def gathers_edge_weights(self, model: Model) -> bool:
        """Whether ``model`` in this form gathers a weight matrix per edge ([edges, in, out])."""
        return model.name in self.per_edge_weights

    def build(self, model: Model, weights: nn.Module, graph: RelGraph) -> Layer:
        """``model``'s layer in this form over ``graph``, computing with ``weights``; a model the
        form does not compute is refused in one line naming the model's forms."""
        self._check_supports(model)
        # A layer built while evaluating (under inference mode) may be trained later: the index
        # tensors it prepares are saved for backward, which inference tensors cannot be.
        with torch.inference_mode(False):
            return self._build(model, weights, graph)

    def _build(self, model: Model, weights: nn.Module, graph: RelGraph) -> Layer:
        """The layer, ``model`` being one this form computes (what a subclass overrides)."""
        return self.make(model, weights, graph)

    def _check_supports(self, model: Model) -> None:
        if not self.supports(model):
            known = ", ".join(form.name for form in forms_of(model))
            raise UserError(f"form {self.name} does not compute {model.name}; its forms: {known}")


@dataclass(frozen=True)
class LayerForm(Form):
    """A form each model implements itself: ``model.layers[name]``, made as ``(weights, graph)``."""

    def supports(self, model: Model) -> bool:
        return self.name in model.layers

    def gathers_edge_weights(self, model: Model) -> bool:
        return self.name in model.per_edge_weights

    def _build(self, model: Model, weights: nn.Module, graph: RelGraph) -> Layer:
        return model.layers[self.name](weights, graph)


FORMS: Registry[Form] = Registry("relational-GNN form", __name__)


def forms_of(model: Model) -> list[Form]:
    """The registered forms that compute ``model``, the model's reference first."""
    found = [form for form in FORMS if form.supports(model)]
    return sorted(found, key=lambda form: form.name != model.reference)


# Every module of the package registers now, in name order, so the entries' order (the order forms
# are measured and shown in) does not depend on which of them some caller imported first.
FORMS.names()
