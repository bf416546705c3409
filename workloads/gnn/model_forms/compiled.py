"""``compiled``: the model under ``torch.compile`` (inductor, default mode) with dynamic shapes.

A sampled subgraph's node and edge counts change at every batch. ``dynamic=True`` makes them
symbols from the first compile, so one compile serves every batch (without it dynamo would compile
the first batch's sizes as constants and compile again at the second). Sizes of 0 or 1 are still
specialised, a recompile, which sampled batches of hundreds of nodes never meet. Parameters keep
static shapes (dynamo's default), so the layers' matrix products are compiled for their widths.

GAT's ``edges_for_layers`` (workloads/gnn/models.py) keeps the edges that are not self-loops: an
output whose size depends on the data, where dynamo breaks the graph and runs that part eagerly;
the layers after it compile whole.

Dropout: inductor draws its random numbers with its own generator, not eager's, so with the same
seed a compiled model's dropout masks (and its loss curve) differ from eager's, with the same
distribution. With dropout off, or with ``torch._inductor.config.fallback_random``, the compiled
model gives eager's loss and gradients within float tolerance (tests/test_gnn_model_forms.py).

``setups``: the frames dynamo has compiled in this process since the form was made (a compile per
graph between breaks, and one more for each recompile: a switch to evaluation mode is one).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch._dynamo.exc import TorchDynamoException
from torch._dynamo.utils import counters

from workloads.gnn.model_forms import MODEL_FORMS, FormFailed, ModelForm, RunsModel


def _compiled_frames() -> int:
    return counters["frames"]["ok"]


def _why(err: BaseException) -> str:
    """The first line of ``err`` and, where it wraps another error (a backend's), of the error at
    the end of its chain: what failed under dynamo's wrapping."""

    def first_line(error: BaseException) -> str:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        return lines[0].rstrip(":") if lines else type(error).__name__

    cause = err
    while (cause.__cause__ or cause.__context__) is not None:
        cause = cause.__cause__ or cause.__context__
    return first_line(err) if cause is err else f"{first_line(err)}: {type(cause).__name__}: {first_line(cause)}"


class CompiledModel(RunsModel):
    """``model`` under ``torch.compile(dynamic=True)``; called as the model is, training its
    parameters. ``backend``: torch.compile's (inductor; tests may pass another)."""

    def __init__(self, model: nn.Module, backend: str | Callable = "inductor"):
        super().__init__()
        self.model = model
        # The bound forward, not the module: the module tree (and state_dict) stays the model's.
        self._compiled = torch.compile(model.forward, dynamic=True, backend=backend)
        self._frames_before = _compiled_frames()

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        try:
            return self._compiled(x, edge_index)
        except TorchDynamoException as err:  # dynamo or the backend failed: one line, not pages
            raise FormFailed(f"compiled: {type(self.model).__name__} does not compile: {_why(err)}") from err

    @property
    def setups(self) -> int:
        return _compiled_frames() - self._frames_before


MODEL_FORMS.register(
    ModelForm(
        "compiled",
        "peer",
        label="torch.compile",
        wrap=CompiledModel,
        notes="torch.compile (inductor, default mode) with dynamic shapes: one compile for every batch size",
    )
)
