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
    "hector_best_tf32": ("reorder", "compact"),
}
# Variants whose products run on tensor cores (TF32 inputs, fp32 accumulate): not the exact
# float32 of the paper's comparison, so labelled, checked at TF32's tolerance and run on GPUs only.
TENSOR_CORE_VARIANTS = {"hector_best_tf32"}


class HectorForm:
    """``model``'s program after ``VARIANTS[variant]``, as a differentiable callable of ``x``."""

    def __init__(self, model: str, variant: str, weights, graph):
        self.model, self.weights, self.graph = model, weights, graph
        program = passes.optimize(models.PROGRAMS[model](), *VARIANTS[variant])
        self.layer = op.Layer(program, tensor_cores=variant in TENSOR_CORE_VARIANTS)

    def __call__(self, x):
        return self.layer(self.graph, x=x, **models.bind(self.model, self.weights))
