"""Blocks the user compiled with ``torch.compile``, composed with SSDTrain as the suite's compiled
policies compose them (policies/_compiled.py): each block's hooks run outside the compiled code and
its forward inside it, so the offloader knows which block is running while the compiled forward
saves its tensors, and a recomputed block is the compiled forward under ``torch.utils.checkpoint``
(backward runs the compiled forward again).

What a user may have written, and what becomes of it in a ``with`` block:

- ``layers[i] = torch.compile(layers[i])``: the block is torch's wrapper (``OptimizedModule``),
  whose own hooks run outside the compiled call (layers.find_layers takes the wrapper, and a
  wrapped module listed in ``layers=`` stands for its wrapper). Nothing else to do.
- ``block.compile()``: torch compiles the block's whole call, its hooks included, and Dynamo would
  trace the offloader's hooks (their bookkeeping replayed after the compiled code ran, a
  checkpoint wrapper run eagerly inside it). For the duration of the block the compiled call is
  set aside and the block's forward compiled instead, with the same ``torch.compile`` settings
  (backend, mode, options: the ones ``.compile()`` was given); both are put back when it ends.
- a model, or a module around its blocks, compiled as a whole (``torch.compile(model)``,
  ``model.compile()``): the blocks' hooks could only run inside the compiled graph. Refused in one
  line where ``offload()`` sees it (``refuse_compiled_around``); a block whose hook finds itself
  traced by Dynamo (a compiled model the loop calls, made outside the ``with`` block) raises in one
  line (``refuse_if_traced``).
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Callable, Iterator

import torch
from torch import nn

from harness.errors import UserError
from systems.ssdtrain.layers import InstalledForward, block_name, is_compiled_wrapper

COMPILE_BLOCKS = "compile each block instead (block.compile(), or layers[i] = torch.compile(layers[i]))"


def as_called(model: nn.Module, layers: list[nn.Module]) -> list[nn.Module]:
    """``layers`` with each module that ``torch.compile`` wrapped inside ``model`` replaced by its
    wrapper, the module the model calls (its hooks run outside the compiled code)."""
    wrappers = {id(m._orig_mod): m for m in model.modules() if is_compiled_wrapper(m)}
    called = []
    for layer in layers:
        while id(layer) in wrappers:
            layer = wrappers[id(layer)]
        called.append(layer)
    return called


def refuse_compiled_around(model: nn.Module, layers: list[nn.Module]) -> None:
    """A one-line UserError where the model or a module around one of ``layers`` (its blocks, as
    :func:`as_called` gives them) is compiled as a whole: the hooks on the blocks would run inside
    the compiled graph."""
    parents = {id(child): module for module in model.modules() for child in module.children()}
    for layer in layers:
        outer = parents.get(id(layer))
        while outer is not None:
            how = _compiled_whole(outer)
            if how:
                what = "the model" if outer is model else f"a {block_name(outer)} around its blocks"
                raise UserError(
                    f"{what} is compiled as a whole ({how}): the hooks SSDTrain puts on its {block_name(layer)} "
                    f"blocks would run inside the compiled graph; leave it uncompiled and {COMPILE_BLOCKS}"
                )
            outer = parents.get(id(outer))


def _compiled_whole(module: nn.Module) -> str | None:
    """How ``module`` is compiled as a whole, if it is."""
    if is_compiled_wrapper(module):
        return "torch.compile(...)"
    if vars(module).get("_compiled_call_impl") is not None:
        return ".compile()"
    return None


@contextlib.contextmanager
def hooks_outside_compiled(layers: list[nn.Module]) -> Iterator[None]:
    """Within it, each of ``layers`` compiled by ``block.compile()`` runs its hooks eagerly and its
    forward compiled with the same settings (see the module); afterwards, as before."""
    note_graph_break_signature()
    moved = []
    try:
        for index, layer in enumerate(layers):
            compiled = vars(layer).get("_compiled_call_impl")
            if compiled is None:
                continue
            context = _compile_context(compiled)
            if context is None:
                raise UserError(
                    f"block {index} ({block_name(layer)}) was compiled by .compile() in a way SSDTrain cannot take "
                    "apart (this torch keeps its settings elsewhere): compile it as layers[i] = "
                    "torch.compile(layers[i])"
                )
            before = vars(layer).get("forward")  # an instance forward of another wrapper, or None: the class's
            layer.forward = InstalledForward(context(layer.forward), layer, before)
            layer._compiled_call_impl = None  # nn.Module.__call__ then runs the hooks, then the forward
            moved.append((layer, compiled, before))
        yield
    finally:
        for layer, compiled, before in reversed(moved):
            if before is None:
                vars(layer).pop("forward", None)
            else:
                layer.forward = before
            layer._compiled_call_impl = compiled


def _compile_context(compiled: Callable):
    """The ``torch.compile`` context (its backend and options) that made ``compiled``, a function
    ``torch.compile`` returned; None where it cannot be found (another torch)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    code, cells = getattr(compiled, "__code__", None), getattr(compiled, "__closure__", None)
    if eval_frame is None or code is None or not cells:
        return None
    context = dict(zip(code.co_freevars, cells)).get("self")
    try:
        context = context.cell_contents if context is not None else None
    except ValueError:  # an empty cell
        return None
    return context if isinstance(context, eval_frame._TorchDynamoContext) else None


def holds_compiled_code(layer: nn.Module) -> bool:
    """Whether ``layer`` runs code ``torch.compile`` made (it or a module in it compiled): its first
    forward compiles, so it is no measure of its later ones."""
    return any(runs_compiled(module) for module in layer.modules())


def runs_compiled(module: nn.Module) -> bool:
    """Whether ``module`` itself is compiled (its forward, its call, or it wrapped): what its whole
    forward saves for backward reaches the saved-tensor hooks when that forward returns."""
    forward = vars(module).get("forward")
    return (
        is_compiled_wrapper(module)
        or vars(module).get("_compiled_call_impl") is not None
        or getattr(forward, "_torchdynamo_orig_callable", None) is not None
    )


TRACED = f"SSDTrain: a block's hooks ran inside the graph of a model compiled as a whole; {COMPILE_BLOCKS}"


@torch._disable_dynamo  # never traced: Dynamo breaks the graph before it and runs it as it is
def _refuse_traced(what: str) -> None:
    raise UserError(
        f"SSDTrain: {what} inside torch.compile's graph of a model compiled as a whole, where the offloader cannot "
        f"tell what it saves; call the uncompiled model and {COMPILE_BLOCKS}"
    )


def refuse_if_traced(layer: nn.Module | None) -> None:
    """Called by a block's hook (``layer``) or by the saved-tensor hook (None: a tensor saved before
    the first block, in the model's stem): a one-line UserError if Dynamo is tracing it (the model
    around it is compiled as a whole). An error raised in traced code would only make Dynamo run
    the frame uncompiled, where nothing raises: the graph breaks here instead (under
    ``fullgraph=True`` Dynamo's error gives the reason), and the error is raised by a function
    Dynamo runs untraced."""
    if torch.compiler.is_dynamo_compiling():
        if _break_message["takes_one"]:
            torch._dynamo.graph_break(msg=TRACED)
        else:
            torch._dynamo.graph_break()
        _refuse_traced("a saved-tensor hook ran" if layer is None else f"a {block_name(layer)} block ran")


# Whether this torch's graph_break takes a message (older releases' does not; the error raised
# after the break still says why). Read where Dynamo is already imported (a model compiled before
# the offloader starts), never while Dynamo traces: inspecting there would itself be traced.
_break_message = {"takes_one": False}


def note_graph_break_signature() -> None:
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        _break_message["takes_one"] = "msg" in inspect.signature(dynamo.graph_break).parameters
