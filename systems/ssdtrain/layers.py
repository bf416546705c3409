"""Finding a model's repeated blocks, the unit the offloader numbers, keeps, offloads, recomputes
and prefetches.

A block is a module that a ``nn.ModuleList`` or ``nn.Sequential`` holds among modules of its own
class: a transformer's layers (GPT-2's ``transformer.h``, Llama's ``model.layers``, T5's encoder
and decoder blocks), a ResNet's ``BasicBlock``s (two in each of ``layer1`` to ``layer4``). The
class whose blocks hold the most parameters is taken, and every block of it, in the order the
model lists its modules (the order forward runs them in these models); other repeated classes
(heads, experts inside a layer, the convolutions of a downsampling path) hold fewer. A block is
made of modules: among the classes that hold parameters, a list of single operators (embedding
tables, output heads) is taken only where the model has no list of composite blocks, however
many parameters the operators hold.
"""

from __future__ import annotations

from torch import nn

from harness.errors import UserError


def find_layers(model: nn.Module) -> list[nn.Module]:
    """Every block of the repeated class of ``model`` (see the module), in module order. Raises a
    UserError if it has none (pass the blocks explicitly then)."""
    blocks: dict[type, list[nn.Module]] = {}
    for module in model.modules():
        if isinstance(module, nn.ModuleList | nn.Sequential) and len(module) and len({type(m) for m in module}) == 1:
            blocks.setdefault(type(module[0]), []).extend(module)
    if not blocks:
        raise UserError(
            f"{type(model).__name__} has no list of repeated blocks (an nn.ModuleList or nn.Sequential of modules "
            "of one class); pass the blocks explicitly (layers=[...])"
        )

    def size(cls: type) -> tuple[bool, bool, int, int]:
        parameters = sum(p.numel() for block in blocks[cls] for p in block.parameters())
        composite = any(True for block in blocks[cls] for _ in block.children())
        return parameters > 0, composite, parameters, len(blocks[cls])

    chosen = blocks[max(blocks, key=size)]
    unique = list({id(block): block for block in chosen}.values())  # a block listed twice is one block
    inside = {id(m) for block in unique for m in block.modules() if m is not block}
    return [block for block in unique if id(block) not in inside]  # a block nested in another is the other's
