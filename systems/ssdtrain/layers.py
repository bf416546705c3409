"""Finding a model's repeated blocks, the unit the offloader numbers, keeps and prefetches.

Transformer models keep their blocks in one ``nn.ModuleList`` of modules of one class (GPT-2's
``transformer.h``, Llama's ``model.layers``); other lists of one class (heads, experts) hold fewer
parameters, so the list holding the most parameters is taken.
"""

from __future__ import annotations

from torch import nn

from harness.errors import UserError


def find_layers(model: nn.Module) -> list[nn.Module]:
    """The blocks of ``model``'s largest ``ModuleList`` / ``Sequential`` of modules of one class, in
    order. Raises a UserError if it has none (pass the layers explicitly then)."""
    best, best_size = None, (-1, 0)
    for module in model.modules():
        if isinstance(module, nn.ModuleList | nn.Sequential) and len(module) and len({type(m) for m in module}) == 1:
            size = (sum(p.numel() for p in module.parameters()), len(module))
            if size > best_size:
                best, best_size = module, size
    if best is None:
        raise UserError(
            f"{type(model).__name__} has no list of repeated blocks (an nn.ModuleList of modules of one class); "
            "pass layers=[...] to the Offloader"
        )
    return list(best)
