"""How a GNN model runs its steps: one registry, :data:`MODEL_FORMS`, one entry per way of running
the same model (same weights, the same numbers within float tolerance).

``eager``       the model as written: PyTorch runs each operator as Python reaches it, one kernel
                launch or more per operator (the baseline).
``compiled``    ``torch.compile`` (inductor) with dynamic shapes: sampled subgraphs differ in
                nodes and edges from batch to batch, so sizes are symbols in the compiled code
                and one compile serves every batch; fewer, fused kernels, launched from Python
                still.
``cuda_graph``  each subgraph padded to a bucketed size (a few sizes per doubling) and the
                layers' forward and backward captured once per bucket as CUDA graphs, then
                replayed: one launch each way for the whole model (GPU only).

A form wraps a built model: ``in_form(model, "compiled")`` returns a module called as the model
is (``out = wrapped(x, edge_index)``) that trains the model's own parameters, so any training loop
takes it (``tools/gnn_step_profile.py`` profiles a step in each). Each wrapped module counts its
``setups`` (compiles, captures): a step that makes one is not a steady-state step.

A new form is one module of this package that registers a :class:`ModelForm` (every module whose
name does not start with ``_`` is imported when the registry is first read), or a module of your
own named in ``SUITE_PLUGINS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from harness.errors import UserError
from harness.registry import Entry, Registry


class FormFailed(UserError):
    """A form could not run this model (a compile or a capture failed): said in one line."""


@dataclass(frozen=True)
class ModelForm(Entry):
    """One way to run a model. ``wrap(model)`` returns the module that runs it so, sharing its
    parameters; it may compile or capture lazily, at its first calls."""

    wrap: Callable[[nn.Module], nn.Module] | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.wrap is None:
            raise ValueError(f"model form {self.name}: give wrap(model)")


MODEL_FORMS: Registry[ModelForm] = Registry("model form", __name__)


class RunsModel(nn.Module):
    """A form's module, which runs ``self.model``: it says what the model takes (``hops``,
    ``in_dim``) as the model does, so the training loop checks a model in a form as it checks
    the model itself."""

    model: nn.Module

    @property
    def hops(self) -> int | None:
        return getattr(self.model, "hops", None)

    @property
    def in_dim(self) -> int | None:
        return getattr(self.model, "in_dim", None)


def in_order(names) -> list[str]:
    """Form names as tables list them: the baseline (eager) first, then the others by name (the
    registry's own order is the order its modules were imported in)."""
    return sorted(names, key=lambda name: (name not in MODEL_FORMS or MODEL_FORMS[name].role != "baseline", name))


def in_form(model: nn.Module, form: str) -> nn.Module:
    """``model`` run in ``form``, refused in one line where the form cannot run on the model's
    device (a CUDA graph on the CPU) or a package it needs is missing."""
    entry = MODEL_FORMS[form]
    parameter = next(model.parameters(), None)
    device = parameter.device.type if parameter is not None else "cpu"
    why = entry.missing(device)
    if why is not None:
        raise UserError(f"model form {why} (the model is on {device})")
    return entry.wrap(model)


def setups(module: nn.Module) -> int:
    """How many compiles or captures ``module`` (a model in a form) has made so far; 0 for a
    module that makes none."""
    return int(getattr(module, "setups", 0))
