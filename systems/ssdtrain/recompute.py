"""Recomputation: blocks whose forward runs again in backward instead of saving activations.

``checkpointed(layers)`` wraps each block's forward in ``torch.utils.checkpoint`` (non-reentrant)
for the duration of a step, so autograd keeps only each block's inputs and runs the block again
when backward reaches it. The recomputation updates copies of the block's buffers, dropped after
it: the forward already updated them (BatchNorm's running statistics and batch count), and a second
update would leave the model in another state than training without recomputation. Another
library's checkpointing (DeepSpeed's, which keeps the inputs on the host) is given as
``checkpoint``, a function with ``torch.utils.checkpoint``'s signature.
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
    # What was there before: a wrapper's instance forward (accelerate's hooks, another block) or None.
    before = [vars(layer).get("forward") for layer in layers]
    for layer in layers:
        # An instance attribute shadows the class's forward; nn.Module.__call__ finds it.
        layer.forward = functools.partial(checkpoint, _buffers_kept(layer, layer.forward))
    try:
        yield
    finally:
        for layer, forward in reversed(list(zip(layers, before))):  # a block listed twice: its first forward last
            if forward is None:
                vars(layer).pop("forward", None)  # the class's forward again
            else:
                layer.forward = forward
        for hook in hooks:
            hook.remove()


def _buffers_kept(layer: nn.Module, forward: Callable) -> Callable:
    """``forward``, which when run again in backward (the recomputation) updates copies of the
    block's buffers instead of the buffers: the first forward has updated them already. Swapped, not
    copied back: an in-place copy would change tensors autograd may hold (a reentrant checkpoint
    saves the recomputation's buffers through the saved-tensor hooks, which check versions). A block
    without buffers (a transformer layer) keeps its bound forward: nothing to protect."""
    if not any(True for _ in layer.buffers()):
        return forward

    @functools.wraps(forward)
    def run(*args, **kwargs):
        if torch._C._current_graph_task_id() == -1:
            return forward(*args, **kwargs)
        # The buffers as they are now: the first forward may have assigned new tensors.
        owned = [(m, name, b) for m in layer.modules() for name, b in m._buffers.items() if b is not None]
        for module, name, buffer in owned:
            module._buffers[name] = buffer.clone()
        try:
            return forward(*args, **kwargs)
        finally:
            for module, name, buffer in owned:
                module._buffers[name] = buffer

    return run
