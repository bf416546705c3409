"""The model as written: the baseline form, every operator launched as Python reaches it."""

from __future__ import annotations

from workloads.gnn.model_forms import MODEL_FORMS, ModelForm

MODEL_FORMS.register(
    ModelForm("eager", "baseline", label="eager", wrap=lambda model: model, notes="the model as written, run eagerly")
)
