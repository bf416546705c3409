"""Which modules of a model are its blocks, as ``offload()`` and the ``Offloader`` take them: found
(layers.py) or given, and checked, so that both refuse the same ``layers=`` in the same words."""

from __future__ import annotations

import torch
from torch import nn

from harness.errors import UserError
from systems.ssdtrain.layers import find_layers
from systems.ssdtrain.user_compiled import as_called


def checked_blocks(model: nn.Module, layers) -> list[nn.Module]:
    """The blocks of ``model`` that a policy applies to: ``layers`` as given (a list, a
    ModuleList, Sequential or ModuleDict of the model's own submodules, in forward order), each
    module ``torch.compile`` wrapped replaced by its wrapper; ``find_layers(model)`` where None.
    Refused in one line: anything but a non-empty list of the model's submodules, a container that
    is never called, a TorchScript module, a block inside another, a block listed twice."""
    if layers is None:
        return find_layers(model)
    if isinstance(layers, nn.ModuleDict):  # its members are the blocks, as find_layers reads it (list() gives keys)
        layers = list(layers.values())
    if isinstance(layers, nn.Module) and not isinstance(layers, nn.ModuleList | nn.Sequential):
        raise UserError(f"layers must be a list of blocks; got one {type(layers).__name__} (pass [block])")
    try:
        layers = list(layers)
    except TypeError:  # layers=3, layers=None-like objects: one line, not list()'s traceback
        layers = []
    inside = {id(m) for m in model.modules()}
    if not layers or not all(isinstance(layer, nn.Module) and id(layer) in inside for layer in layers):
        raise UserError("layers must be a non-empty list of the model's own submodules (its blocks, in forward order)")
    # A container without a forward of its own is never called, so its hooks would never run.
    container = next(
        (
            layer
            for layer in layers
            if isinstance(layer, nn.ModuleList | nn.ModuleDict) and type(layer).forward is nn.Module.forward
        ),
        None,
    )
    if container is not None:
        raise UserError(
            f"layers lists a {type(container).__name__}, which has no forward of its own and is never called: "
            "list its blocks (e.g. layers=list(model.layers))"
        )
    scripted = next((layer for layer in layers if isinstance(layer, torch.jit.ScriptModule)), None)
    if scripted is not None:  # else torch's own error, deep in the first hook's registration
        raise UserError(
            f"layers lists a TorchScript module ({type(scripted).__name__}), which takes no hooks: "
            "pass the eager modules (torch.compile them instead, if they must be compiled)"
        )
    layers = as_called(model, layers)  # a module torch.compile wrapped: the wrapper, whose hooks run outside
    # A block inside another would be numbered, and recomputed, twice over: blocks are disjoint.
    for layer in layers:
        outer = next((o for o in layers if o is not layer and any(m is layer for m in o.modules())), None)
        if outer is not None:
            raise UserError(
                f"layers lists a {type(layer).__name__} that lies inside another listed {type(outer).__name__}: "
                "list blocks that do not contain each other"
            )
    # A block listed twice would be numbered twice (and checkpointed twice): one block, one index.
    seen: set[int] = set()
    twice = next((layer for layer in layers if id(layer) in seen or seen.add(id(layer))), None)
    if twice is not None:
        raise UserError(f"layers lists the same {type(twice).__name__} twice: list each block once")
    return layers
