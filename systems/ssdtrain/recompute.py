"""Recomputation: blocks whose forward runs again in backward instead of saving activations.

``checkpointed(layers)`` wraps each block's forward in ``torch.utils.checkpoint`` (non-reentrant)
for the duration of a step, so autograd keeps only each block's inputs and runs the block again
when backward reaches it. Another library's checkpointing (DeepSpeed's, which keeps the inputs on
the host) is given as ``checkpoint``, a function with ``torch.utils.checkpoint``'s signature.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

TORCH_CHECKPOINT = functools.partial(torch_checkpoint, use_reentrant=False)


def tensors_in(values) -> Iterator[torch.Tensor]:
    """The tensors in ``values``, looking into tuples and lists."""
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, tuple | list):
            yield from tensors_in(value)


@contextlib.contextmanager
def checkpointed(
    layers: list[nn.Module], checkpoint: Callable = TORCH_CHECKPOINT, inputs: dict[int, int] | None = None
):
    """Within the block, each of ``layers`` runs its forward through ``checkpoint(forward, *args,
    **kwargs)``. ``inputs`` (if given) collects the storages of the blocks' tensor inputs, which
    checkpointing holds for backward: storage address -> bytes. The blocks' own forwards are back
    when the block ends, however it ends."""
    if not layers:
        yield
        return

    def hold(module, args, kwargs):
        for tensor in tensors_in([*args, *kwargs.values()]):
            storage = tensor.untyped_storage()
            inputs[storage.data_ptr()] = storage.nbytes()

    hooks = [layer.register_forward_pre_hook(hold, with_kwargs=True) for layer in layers] if inputs is not None else []
    for layer in layers:
        # An instance attribute shadows the class's forward; nn.Module.__call__ finds it.
        layer.forward = functools.partial(checkpoint, layer.forward)
    try:
        yield
    finally:
        for layer in layers:
            del layer.forward  # the class's forward again
        for hook in hooks:
            hook.remove()
