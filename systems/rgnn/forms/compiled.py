"""torch.compile (inductor) of other forms, as peers: what a user tries first to make a plain form
fast. ``dense_compiled`` is ``dense`` under ``torch.compile`` with its defaults, and so on for
``grouped_mm``, ``per_edge`` and PyG's layers (``pyg``). Each computes what its eager form does, so
the topic checks it against the reference like any form.

A compiled layer compiles on its first call in each mode (without gradients: inference; with:
training) and records the graph breaks dynamo met there (``graph_breaks``, by mode), so the topic
reports compile time and breaks apart from the timed steps. A form that does not compile (dynamo
or inductor fails) raises :class:`CompileFailed` in one line, which the topic notes and moves on.

Dynamo keeps compiled code per Python code object, at most ``recompile_limit`` (8) versions each,
and past that runs the frame eagerly with only a log line. Every compiled layer runs the same
code objects (the forms' ``forward``, PyG's methods), so a process that compiles many graphs,
models and widths would fall back to eager without a word. So here:

* one compiled layer holds dynamo's caches at a time: a layer called after another resets them
  first (its first call in each mode then compiles again, outside any timed call);
* a first call that hits the limit anyway raises (``fail_on_recompile_limit_hit``);
* once a layer has compiled for a mode, a call that makes dynamo look at a frame again (a
  recompile, or a frame past the limit turned eager) raises, so a timed call never includes
  compilation and never runs eagerly unnoticed.

On a CPU inductor writes and compiles C++ for each graph: 5 to 50 s a compile on two cores, for
kernels no faster than eager there. The compiled forms need a GPU (``needs_gpu``) so that the CPU
scales keep to their time; the tests compile them on a CPU directly.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch._dynamo.exc import FailOnRecompileLimitHit, TorchDynamoException
from torch._dynamo.utils import counters

from systems.rgnn.forms import FORMS, Form
from systems.rgnn.forms.baselines import PYG


class CompileFailed(RuntimeError):
    """A compiled form did not compile, or would have compiled again (or run eagerly) in a call
    after its first in that mode."""


@dataclass(frozen=True)
class CompiledForm(Form):
    """``compiles``: the registered form whose layers this one compiles; ``backend``: torch.compile's
    (the tests give dynamo alone, ``"eager"``, where inductor's code generation would be slow)."""

    compiles: str = ""
    backend: str | Callable = "inductor"

    @property
    def eager(self) -> Form:
        return FORMS[self.compiles]

    def supports(self, model) -> bool:
        return self.eager.supports(model)

    def gathers_edge_weights(self, model) -> bool:
        return self.eager.gathers_edge_weights(model)

    def _build(self, model, weights, graph):
        return CompiledLayer(self.eager.build(model, weights, graph), f"{model.name} {self.name}", self.backend)


def _dynamo_looked_at_frames() -> int:
    """Frames dynamo has tried to compile (each compile and recompile, each turned eager)."""
    return counters["frames"]["total"]


def _graph_breaks() -> int:
    return sum(counters["graph_break"].values())


def _reason(err: BaseException) -> str:
    """One line: the error's first line, and that of the error at the bottom of its chain (what
    failed under dynamo's wrapping: an operator's check, a compiler's message)."""
    first = lambda e: next((s.strip().rstrip(":") for s in str(e).splitlines() if s.strip()), type(e).__name__)  # noqa: E731
    root = err
    while (root.__cause__ or root.__context__) is not None:
        root = root.__cause__ or root.__context__
    return first(err) if root is err else f"{first(err)}: {first(root)}"


# The compiled layer whose code dynamo's caches hold (see the module's docstring), weakly: a layer
# the caller has dropped keeps neither its graph nor its weights alive through it.
_holder: weakref.ref | None = None


class CompiledLayer:
    """``layer`` under ``torch.compile`` (inductor, defaults), called as the layer is."""

    def __init__(self, layer, name: str, backend: str | Callable = "inductor"):
        self.eager, self.name = layer, name
        self.compiled = torch.compile(layer, backend=backend)
        self.graph_breaks: dict[str, int] = {}  # by mode: those of the mode's first compile
        self._ready: set[str] = set()  # the modes compiled since this layer took dynamo's caches

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        global _holder
        # Here, outside the compiled code: the eager layer's own check is skipped while dynamo traces.
        if (graph := getattr(self.eager, "graph", None)) is not None:
            graph.check_unchanged()
        if _holder is None or _holder() is not self:
            torch._dynamo.reset()
            _holder, self._ready = weakref.ref(self), set()
        mode = "training" if torch.is_grad_enabled() else "inference"
        if mode not in self._ready:
            return self._compile(x, mode)
        frames = _dynamo_looked_at_frames()
        out = self.compiled(x)
        if _dynamo_looked_at_frames() != frames:
            raise CompileFailed(
                f"{self.name} compiled again in a later {mode} call (a guard failed), so a timed call "
                "would include compilation or run eagerly"
            )
        return out

    def _compile(self, x: torch.Tensor, mode: str) -> torch.Tensor:
        breaks = _graph_breaks()
        try:
            with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
                out = self.compiled(x)
        except (TorchDynamoException, FailOnRecompileLimitHit) as err:
            raise CompileFailed(f"{self.name} does not compile ({mode}): {_reason(err)}") from err
        self.graph_breaks.setdefault(mode, _graph_breaks() - breaks)
        self._ready.add(mode)
        return out


for eager, packages in (("dense", ()), ("grouped_mm", ()), ("per_edge", ()), ("pyg", PYG)):
    FORMS.register(
        CompiledForm(
            f"{eager}_compiled",
            "peer",
            needs_gpu=True,  # see the module's docstring: a CPU compile takes 5 to 50 s
            packages=packages,
            compiles=eager,
            notes=f"torch.compile (inductor, defaults) of {eager}",
        )
    )
