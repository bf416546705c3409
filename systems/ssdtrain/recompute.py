"""Recomputation: blocks whose forward runs again in backward instead of saving activations.

``checkpointed(layers)`` wraps each block's forward in ``torch.utils.checkpoint`` (non-reentrant)
for the duration of a step, so autograd keeps only each block's inputs and runs the block again
when backward reaches it. The block's keyword arguments are bound to its forward, never handed to
the checkpoint function, which takes some names (``debug``, ``context_fn``...) as its own; but every
tensor among its arguments, keyword ones and those in tuples (named ones too), lists, dicts and
dataclasses included, is handed to torch's checkpoint positionally, so that it holds and
version-checks each (and a tensor changed in place after the forward began, whose values the
recomputation would not find, raises in backward rather than giving other gradients) and takes the
devices of all for their RNG states. A tensor kept inside any other object (a cache object's
attribute) is out of its sight: changed in place after the forward, the recomputation reads the
changed values, as ``torch.utils.checkpoint`` itself does. Another library's checkpoint
(DeepSpeed's) gets the positional arguments only.

The recomputation starts from the buffers as the forward found them and updates copies of them,
dropped after it. A forward that changes a buffer and then reads it (spectral normalization's power
iteration) must be replayed from the values it read, or the recomputed activations, and the
gradients, differ from training without recomputation; and the first forward has already made its
updates (BatchNorm's running statistics), which a second one must not repeat. So each forward of a
block with buffers copies them first and keeps the copies of those it changed until backward.
Another library's checkpointing (DeepSpeed's, which keeps the inputs on the host) is given as
``checkpoint``, a function with ``torch.utils.checkpoint``'s signature.

What a recomputation replays is the global CPU and CUDA random generators (the checkpoint's), the
block's registered buffers (above), its parameters as the forward found them (tensors put in their
place for the call, as ``torch.func.functional_call`` does with a meta-learner's fast weights; one
changed in place since, by an optimizer step before backward, raises as autograd does without
recomputation) and each of its modules' training or eval mode (a model switched to eval between a
forward and its backward recomputes in the mode the forward ran in), and each ``torch.Generator``
among its arguments or in its modules' attributes that held one when the block was wrapped (in
tuples, lists, dicts and dataclasses too): the recomputation draws from the state the forward drew
from, and leaves it as it found it. State kept elsewhere, a generator the block reaches another way
(a global of the user's module, its parent's attribute, an attribute first given one later) or a
plain tensor attribute the block changes, is found as the forward left it.

Which call is the recomputation: every call of the block's function after the first within one
checkpointed call (backward alone does not tell: another library's recomputation runs the whole
forward again in backward). A block that already runs inside torch's checkpoint (a model that
checkpoints its own blocks) is left to it (``inside_a_checkpoint``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from systems.ssdtrain.cache import StorageKey, storage_key
from systems.ssdtrain.engine import StepHook, has_storage_identity, inside_a_checkpoint, saving_inputs_of
from systems.ssdtrain.layers import InstalledForward

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
    layers: list[nn.Module],
    checkpoint: Callable = TORCH_CHECKPOINT,
    inputs: dict[StorageKey, int] | None = None,
    when: Callable[[nn.Module], bool] | None = None,
):
    """Within the block, each of ``layers`` runs its forward through ``checkpoint``, given the
    forward's tensors (see the module). ``inputs`` (if given) collects the storages of the blocks'
    tensor inputs, which checkpointing holds for backward: their identity (cache.StorageKey) ->
    bytes, each storage once. torch's checkpoint saves the tensor inputs through the saved-tensor
    hooks around it (an Offloader counts them there too). ``when`` (if given) is asked at each call
    of a block whether to recompute it (no: its own forward runs), for a decision made while the
    blocks run (a plan): a block's forward is looked up before its pre-hooks run, so it must be
    wrapped beforehand.
    The blocks' own forwards are back when the block ends, however it ends."""
    if not layers:
        yield
        return
    references = []  # keep each key unique while the block runs (cache.storage_key)

    def hold(module, args, kwargs):
        if not torch.is_grad_enabled():
            return  # nothing is recomputed, nothing held (and inference tensors have no version)
        for tensor in tensors_in([*args, *kwargs.values()]):
            if not has_storage_identity(tensor):
                continue  # sparse, nested, an inference tensor...: no storage identity to count it by
            key, reference = storage_key(tensor)
            references.append(reference)
            inputs[key] = tensor.untyped_storage().nbytes()

    hooks = (
        [layer.register_forward_pre_hook(StepHook(hold), with_kwargs=True) for layer in layers]
        if inputs is not None
        else []
    )
    # What was there before: a wrapper's instance forward (accelerate's hooks, another block) or None.
    before = [vars(layer).get("forward") for layer in layers]
    for layer, forward in zip(layers, before):
        # An instance attribute shadows the class's forward; nn.Module.__call__ finds it.
        layer.forward = InstalledForward(_recomputed(layer, layer.forward, checkpoint, when), layer, forward)
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


def _recomputed(
    layer: nn.Module, forward: Callable, checkpoint: Callable, when: Callable[[nn.Module], bool] | None = None
) -> Callable:
    """``forward`` run through ``checkpoint``, its keyword arguments bound, its recomputation run
    from the buffers as this forward found them, on copies (see the module's docstring). A block
    without buffers (a transformer layer) has nothing to copy."""
    with_buffers = any(True for _ in layer.buffers())
    holders = _generator_holders(layer)

    @functools.wraps(forward)
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)  # nothing saved, nothing recomputed (checkpoint does the same)
        if when is not None and not when(layer):
            return forward(*args, **kwargs)
        if inside_a_checkpoint():
            return forward(*args, **kwargs)  # the model's own checkpoint recomputes the block already
        if checkpoint is TORCH_CHECKPOINT:
            tensors: list[torch.Tensor] = []
            shapes = _lift(args, tensors), _lift(kwargs, tensors)  # the arguments, each tensor an index
        else:
            # Another library's checkpoint (DeepSpeed's) takes every tensor it is given for the
            # block's own activation, moves it to the host and empties the caller's: a mask or
            # rotary table shared by the blocks after would be gone. It gets the positional
            # arguments only, the keyword ones bound, as it expects.
            tensors, shapes = list(args), None
        modes = _modes_of(layer)  # train/eval of each submodule, as this forward ran them
        generators = _generators_in(args, kwargs, *(getattr(module, name, None) for module, name in holders))
        generator_states = [generator.get_state() for generator in generators]  # as this forward draws from them
        parameters = _parameters_of(layer)  # the tensors in their places, as this forward found them
        parameter_versions = [p._version for _, _, p in parameters]
        forward_versions: list[int] = []  # the same once the forward has run (read at the recomputation)
        calls = []  # one entry per call of body: the first is the forward
        found = _buffers_of(layer) if with_buffers else []
        # One copy per tensor: a buffer two submodules share must stay one tensor in the replay.
        copies = {id(buffer): buffer.clone() for _, _, buffer in found}
        versions = {id(buffer): buffer._version for _, _, buffer in found}

        @functools.wraps(forward)  # the block's forward, its keyword arguments bound: ``__wrapped__`` names it
        def body(*inputs):
            recomputing = bool(calls)
            calls.append(None)
            if shapes is None:  # another library's checkpoint: its positional inputs, the keywords bound
                again, kw_again = inputs, kwargs
            elif not recomputing:  # the forward: the very arguments it was given (a list it appends to...)
                return forward(*args, **kwargs)
            else:  # recomputing: the tensors as the checkpoint gives them back, in copies of their containers
                again, kw_again = _place(shapes[0], inputs), _place(shapes[1], inputs)
            if not recomputing:
                return forward(*again, **kw_again)
            with (
                _modes_as(layer, modes),
                _parameters_as(layer, parameters, parameter_versions, forward_versions),
                _generators_as(generators, generator_states),
            ):
                if not with_buffers:
                    return forward(*again, **kw_again)
                return replay_from_buffers(again, kw_again)

        def replay_from_buffers(again, kw_again):
            """The recomputation: from what the forward found, on copies (it may run more than once)."""
            now = _buffers_of(layer)
            replay = {}
            for module, name, buffer in found:
                kept = copies[id(buffer)]
                if kept is buffer and (
                    module._buffers.get(name) is not buffer or buffer._version != versions[id(buffer)]
                ):
                    raise RuntimeError(
                        f"buffer {name} of a recomputed {type(layer).__name__} changed between its forward and "
                        "its recomputation (another forward of the block changed it): the recomputation "
                        "cannot replay it; keep or offload this block"
                    )
                module._buffers[name] = replay.setdefault(id(buffer), kept.clone())
            try:
                return forward(*again, **kw_again)
            finally:
                for module, name, buffer in now:
                    module._buffers[name] = buffer

        with saving_inputs_of(layer):  # what the hooks around see saved now are the block's inputs
            out = checkpoint(body, *tensors)
        forward_versions.extend(p._version for _, _, p in parameters)
        # Only the copies of buffers this forward changed are needed (an unchanged one is its own
        # copy, made again at the recomputation): the others are let go now.
        for module, name, buffer in found:
            if module._buffers.get(name) is buffer and buffer._version == versions[id(buffer)]:
                copies[id(buffer)] = buffer
        return out

    return run


def _modes_of(layer: nn.Module) -> list[bool]:
    return [module.training for module in layer.modules()]


@contextlib.contextmanager
def _modes_as(layer: nn.Module, modes: list[bool]):
    """Each submodule of ``layer`` in training or eval mode as in ``modes`` (the forward's), and
    back as it was after: a model switched to eval between a forward and its backward (an
    evaluation that did not switch back) recomputes what the forward computed."""
    modules, now = list(layer.modules()), _modes_of(layer)
    if now == modes:
        yield
        return
    for module, training in zip(modules, modes, strict=True):
        module.training = training
    try:
        yield
    finally:
        for module, training in zip(modules, now, strict=True):
            module.training = training


_ABSENT = object()  # a parameter name its module did not have


def _parameters_of(layer: nn.Module) -> list[tuple[nn.Module, str, torch.Tensor]]:
    return [(m, name, p) for m in layer.modules() for name, p in m._parameters.items() if p is not None]


@contextlib.contextmanager
def _parameters_as(
    layer: nn.Module, found: list[tuple[nn.Module, str, torch.Tensor]], versions: list[int], forward_ended: list[int]
):
    """The parameters of ``layer`` as the forward found them (``found``), in their places for the
    recomputation and back after; refused if one was changed in place since (``versions``;
    ``forward_ended``: theirs when the forward ended, which tells a change the forward made itself)."""
    for (_, name, tensor), version, ended in zip(found, versions, forward_ended or versions, strict=True):
        if tensor._version != version and tensor._version == ended:
            raise RuntimeError(
                f"parameter {name} of a recomputed {type(layer).__name__} is changed in place by the block's own "
                "forward (nn.Embedding's max_norm renormalises the rows it reads, for one): its recomputation would "
                "run on other values than its forward did; keep or offload this block"
            )
        if tensor._version != version:
            raise RuntimeError(
                f"parameter {name} of a recomputed {type(layer).__name__} was modified in place between its forward "
                f"and its recomputation (version {version}, now {tensor._version}: an optimizer step before "
                "backward?); autograd raises the same without recomputation"
            )
    swapped = [(module, name, tensor) for module, name, tensor in found if module._parameters.get(name) is not tensor]
    before = [(module, name, module._parameters.get(name, _ABSENT)) for module, name, _ in swapped]
    for module, name, tensor in swapped:
        module._parameters[name] = tensor
    try:
        yield
    finally:
        for module, name, tensor in before:
            if tensor is _ABSENT:
                module._parameters.pop(name, None)
            else:
                module._parameters[name] = tensor


def _buffers_of(layer: nn.Module) -> list[tuple[nn.Module, str, torch.Tensor]]:
    return [(m, name, b) for m in layer.modules() for name, b in m._buffers.items() if b is not None]


class _Slot(int):
    """Where a lifted tensor was: its index among the tensors (``_lift``)."""


def _lift(value, tensors: list[torch.Tensor]):
    """``value`` with each tensor in it, also inside tuples (named ones too), lists, dicts (of any
    dict class) and dataclasses, appended to ``tensors`` and replaced by its ``_Slot``; other
    objects (a cache object) stay as they are, and so do inference tensors, which autograd cannot
    save (and nothing can change outside ``torch.inference_mode``)."""
    if isinstance(value, torch.Tensor) and not value.is_inference():
        tensors.append(value)
        return _Slot(len(tensors) - 1)
    return _rebuilt(value, lambda item: _lift(item, tensors))


def _place(value, tensors):
    """``_lift``'s ``value`` with each slot filled from ``tensors``."""
    if isinstance(value, _Slot):
        return tensors[value]
    return _rebuilt(value, lambda item: _place(item, tensors))


def _rebuilt(value, each: Callable):
    """A copy of the container ``value`` (a tuple, named or not, a list, a dict of any dict class, a
    dataclass instance) with ``each`` applied to its items; anything else as it is."""
    if type(value) in (tuple, list):
        return type(value)(each(item) for item in value)
    if isinstance(value, tuple) and hasattr(type(value), "_make"):  # a named tuple
        return type(value)._make(each(item) for item in value)
    if isinstance(value, dict):
        copied = copy.copy(value)  # keeps a subclass's class and state (an OrderedDict, a defaultdict)
        for key, item in value.items():
            copied[key] = each(item)
        return copied
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        copied = copy.copy(value)
        for field in dataclasses.fields(value):
            object.__setattr__(copied, field.name, each(getattr(value, field.name)))  # frozen ones too
        return copied
    return value


def _generators_in(*values) -> list[torch.Generator]:
    """The ``torch.Generator``s in ``values``, looking into tuples, lists, dicts and dataclasses; each once."""
    found: dict[int, torch.Generator] = {}
    seen: set[int] = set()  # containers walked (one may hold itself)

    def walk(value) -> None:
        # By the value's type, never the value: a Hugging Face config answers every attribute
        # look-up through Python code.
        kind = type(value)
        if kind in _ATOMS:
            return
        if issubclass(kind, torch.Generator):
            found.setdefault(id(value), value)
            return
        if issubclass(kind, dict):
            items = value.values()
        elif issubclass(kind, tuple | list):
            items = value
        elif dataclasses.is_dataclass(kind):
            items = [getattr(value, field.name, None) for field in dataclasses.fields(kind)]
        else:
            return
        if id(value) not in seen:
            seen.add(id(value))
            for item in items:
                walk(item)

    walk(values)
    return list(found.values())


def _generator_holders(layer: nn.Module) -> list[tuple[nn.Module, str]]:
    """The attributes of the block's modules that hold a ``torch.Generator`` (in a container too),
    found when the block is wrapped and read again at each call (a generator put in their place)."""
    return [
        (module, name)
        for module in layer.modules()
        for name, value in vars(module).items()
        if name not in _MODULE_INTERNALS and _generators_in(value)  # parameters, buffers, submodules, hooks: none
    ]


_MODULE_INTERNALS = frozenset(vars(nn.Module()))
_ATOMS = frozenset({int, float, bool, str, type(None), torch.Tensor, nn.Parameter})


@contextlib.contextmanager
def _generators_as(generators: list[torch.Generator], states: list[torch.Tensor]):
    """Each of ``generators`` at its state in ``states`` (the forward's), and back at its own after:
    the recomputation draws what the forward drew, and draws after backward are a plain run's."""
    if not generators:
        yield
        return
    now = [generator.get_state() for generator in generators]
    for generator, state in zip(generators, states, strict=True):
        generator.set_state(state)
    try:
        yield
    finally:
        for generator, state in zip(generators, now, strict=True):
            generator.set_state(state)
