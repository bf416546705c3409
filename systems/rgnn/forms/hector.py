"""Hector's variants as forms beside the baselines: a model's program (``Model.program``) after
some of Hector's passes, as a differentiable operator (systems/hector/op.py) computing with the
model's shared weights, so the topic checks and times it the same way. On a GPU it runs the
generated kernels; on any other device Hector's reference backend (stock torch operators).

The ablation: ``hector_unopt`` applies no pass, ``hector_compact`` and ``hector_reorder`` one
each, ``hector_best`` both. ``hector_best_tf32`` is ``hector_best`` on tensor cores (TF32 inputs,
fp32 accumulate): not the exact float32 of the paper's comparison, so labelled by its precision,
checked at TF32's tolerance and run on GPUs only.

On bfloat16 features and weights the variants but the TF32 one compute in bf16 like the peers:
bf16 rows and results, products on bf16 tensor cores, the traversal arithmetic, softmax and sums
in float32 (systems/hector/codegen.py); on a CPU the reference in float32, rounded to bf16. The
TF32 variant multiplies float32 tensors only (:meth:`Form.missing_element_type` says so).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from systems.hector import op, passes
from systems.rgnn.forms import FORMS, Form


@dataclass(frozen=True)
class HectorForm(Form):
    """``passes``: Hector's passes applied to the model's program, in order."""

    passes: tuple[str, ...] = ()

    def __post_init__(self):
        super().__post_init__()
        passes.check_names(self.passes)  # a misspelled pass is refused when the variant is declared

    def supports(self, model) -> bool:
        return model.program is not None

    def _build(self, model, weights, graph):
        return HectorLayer(model, self, weights, graph)

    def missing(self, device: str = "cpu") -> str | None:
        """Beside the GPU a tensor-core variant needs: on a GPU, the generated kernels are built
        with CuPy's NVRTC (systems/nvrtc.py)."""
        if str(device).startswith("cuda") and importlib.util.find_spec("cupy") is None:
            return f"{self.name} builds its kernels with cupy, which is not installed"
        return super().missing(device)


class HectorLayer:
    """A model's program after a form's passes, as a differentiable callable of ``x``."""

    def __init__(self, model, form: HectorForm, weights, graph):
        self.model, self.weights, self.graph = model, weights, graph
        program = passes.optimize(model.program(), *form.passes)
        self.layer = op.Layer(program, tensor_cores=form.precision == "tf32")

    def __call__(self, x):
        return self.layer(self.graph, x=x, **self.model.bind(self.weights))


for form in (
    HectorForm("hector_unopt", "optimized", notes="Hector, no pass"),
    HectorForm("hector_compact", "optimized", passes=("compact",), notes="Hector, compact materialization"),
    HectorForm("hector_reorder", "optimized", passes=("reorder",), notes="Hector, linear-operator reordering"),
    HectorForm("hector_best", "optimized", passes=("reorder", "compact"), notes="Hector, both passes"),
    HectorForm(
        "hector_best_tf32",
        "optimized",
        needs_gpu=True,
        precision="tf32",
        computes="hector_best",
        passes=("reorder", "compact"),
        notes="Hector, both passes, products on TF32 tensor cores",
    ),
):
    FORMS.register(form)
