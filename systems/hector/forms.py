"""Hector's variants as layer forms beside the baselines of workloads/rgnn: the same weights, the
same call (``form(x)``), so the relational_gnn topic checks and times them the same way."""

from __future__ import annotations

from systems.hector import models, op, passes

# Variant name -> the passes applied (Hector's ablation); hector_best applies both.
VARIANTS = {
    "hector_unopt": (),
    "hector_compact": ("compact",),
    "hector_reorder": ("reorder",),
    "hector_best": ("reorder", "compact"),
}


class HectorForm:
    """``model``'s program after ``VARIANTS[variant]``, as a differentiable callable of ``x``."""

    def __init__(self, model: str, variant: str, weights, graph):
        self.model, self.weights, self.graph = model, weights, graph
        self.layer = op.Layer(passes.optimize(models.PROGRAMS[model](), *VARIANTS[variant]))

    def __call__(self, x):
        return self.layer(self.graph, x=x, **models.bind(self.model, self.weights))
