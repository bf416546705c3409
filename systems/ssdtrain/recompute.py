"""Recomputation: blocks whose forward runs again in backward instead of saving activations.

``checkpointed(layers)`` wraps each block's forward in ``torch.utils.checkpoint`` (non-reentrant)
for the duration of a step, so autograd keeps only each block's inputs and runs the block again
when backward reaches it. The block's keyword arguments are bound to its forward, never handed to
the checkpoint function, which takes some names (``debug``, ``context_fn``...) as its own.

The recomputation starts from the buffers as the forward found them and updates copies of them,
dropped after it. A forward that changes a buffer and then reads it (spectral normalization's power
iteration) must be replayed from the values it read, or the recomputed activations, and the
gradients, differ from training without recomputation; and the first forward has already made its
updates (BatchNorm's running statistics), which a second one must not repeat. So each forward of a
block with buffers copies them first and keeps the copies of those it changed until backward.
Another library's checkpointing (DeepSpeed's, which keeps the inputs on the host) is given as
``checkpoint``, a function with ``torch.utils.checkpoint``'s signature.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from systems.ssdtrain.cache import StorageKey, storage_key
from systems.ssdtrain.engine import in_backward

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
    layers: list[nn.Module], checkpoint: Callable = TORCH_CHECKPOINT, inputs: dict[StorageKey, int] | None = None
):
    """Within the block, each of ``layers`` runs its forward through ``checkpoint(forward, *args,
    **kwargs)``. ``inputs`` (if given) collects the storages of the blocks' tensor inputs, which
    checkpointing holds for backward: their identity (cache.StorageKey) -> bytes, each storage
    once. torch's checkpoint saves the positional inputs through the saved-tensor hooks around
    it (an Offloader counts them there too); the keyword ones it holds in the bound forward. The
    blocks' own forwards are back when the block ends, however it ends."""
    if not layers:
        yield
        return
    references = []  # keep each key unique while the block runs (cache.storage_key)

    def hold(module, args, kwargs):
        for tensor in tensors_in([*args, *kwargs.values()]):
            key, reference = storage_key(tensor)
            references.append(reference)
            inputs[key] = tensor.untyped_storage().nbytes()

    hooks = [layer.register_forward_pre_hook(hold, with_kwargs=True) for layer in layers] if inputs is not None else []
    # What was there before: a wrapper's instance forward (accelerate's hooks, another block) or None.
    before = [vars(layer).get("forward") for layer in layers]
    for layer in layers:
        # An instance attribute shadows the class's forward; nn.Module.__call__ finds it.
        layer.forward = _recomputed(layer, layer.forward, checkpoint)
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


def _recomputed(layer: nn.Module, forward: Callable, checkpoint: Callable) -> Callable:
    """``forward`` run through ``checkpoint``, its keyword arguments bound, its recomputation run
    from the buffers as this forward found them, on copies (see the module's docstring). A block
    without buffers (a transformer layer) has nothing to copy."""
    with_buffers = any(True for _ in layer.buffers())

    @functools.wraps(forward)
    def run(*args, **kwargs):
        found = _buffers_of(layer) if with_buffers else []
        # One copy per tensor: a buffer two submodules share must stay one tensor in the replay.
        copies = {id(buffer): buffer.clone() for _, _, buffer in found}
        versions = {id(buffer): buffer._version for _, _, buffer in found}

        @functools.wraps(forward)  # the block's forward, its keyword arguments bound: ``__wrapped__`` names it
        def body(*inputs):
            if not (with_buffers and in_backward()):
                return forward(*inputs, **kwargs)
            # The recomputation: from what the forward found, on copies (it may run more than once).
            now = _buffers_of(layer)
            replay = {}
            for module, name, buffer in found:
                copy = copies[id(buffer)]
                if copy is buffer and (
                    module._buffers.get(name) is not buffer or buffer._version != versions[id(buffer)]
                ):
                    raise RuntimeError(
                        f"buffer {name} of a recomputed {type(layer).__name__} changed between its forward and "
                        "its recomputation (another forward of the block changed it): the recomputation "
                        "cannot replay it; keep or offload this block"
                    )
                module._buffers[name] = replay.setdefault(id(buffer), copy.clone())
            try:
                return forward(*inputs, **kwargs)
            finally:
                for module, name, buffer in now:
                    module._buffers[name] = buffer

        out = checkpoint(body, *args)
        # Only the copies of buffers this forward changed are needed (an unchanged one is its own
        # copy, made again at the recomputation): the others are let go now.
        for module, name, buffer in found:
            if module._buffers.get(name) is buffer and buffer._version == versions[id(buffer)]:
                copies[id(buffer)] = buffer
        return out

    return run


def _buffers_of(layer: nn.Module) -> list[tuple[nn.Module, str, torch.Tensor]]:
    return [(m, name, b) for m in layer.modules() for name, b in m._buffers.items() if b is not None]
