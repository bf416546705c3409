"""The repeated transformer blocks of each model: what an offloader or recomputation wraps.

Each family keeps its blocks in one ``nn.ModuleList`` (T5 in two: encoder, then decoder). They
are named here rather than searched for, so a transformers release that moves them fails loudly
(one line naming the path) instead of silently wrapping the wrong modules.

Things a wrapper must know: T5's first block of each stack computes the relative-position bias
and every later block of that stack reuses the same tensor; Llama's rotary cos/sin tables are
computed once per forward, outside the blocks, and passed to every block; every T5 decoder block
reads the encoder's output (cross-attention). Those tensors cross block boundaries, so a
per-block cache must not free them when one block's backward ends, and should store them once.
"""

from __future__ import annotations

from torch import nn

from harness.errors import UserError

# model_type (transformers' config name) -> the ModuleLists holding its blocks, in execution order
BLOCK_LISTS = {
    "gpt2": ("transformer.h",),
    "bert": ("bert.encoder.layer",),
    "t5": ("encoder.block", "decoder.block"),
    "llama": ("model.layers",),
    "mistral": ("model.layers",),
    "qwen2": ("model.layers",),
}


def block_lists(model: nn.Module) -> list[tuple[str, nn.ModuleList]]:
    """The model's block ModuleLists with their qualified names, in execution order."""
    kind = getattr(getattr(model, "config", None), "model_type", None)
    if kind not in BLOCK_LISTS:
        raise UserError(f"no known transformer blocks for model type {kind!r}; one of {', '.join(BLOCK_LISTS)}")
    found = []
    for path in BLOCK_LISTS[kind]:
        try:
            stack = model.get_submodule(path)
        except AttributeError:
            stack = None
        if not isinstance(stack, nn.ModuleList):
            raise UserError(f"{type(model).__name__} has no block list at {path!r} (a transformers change?)")
        found.append((path, stack))
    return found


def blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every transformer block with its qualified name (``transformer.h.0``), in execution order."""
    return [(f"{path}.{i}", block) for path, stack in block_lists(model) for i, block in enumerate(stack)]
