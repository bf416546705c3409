"""Finding a model's repeated blocks, the unit the offloader numbers, keeps, offloads, recomputes
and prefetches.

A block is a module that a ``nn.ModuleList``, ``nn.Sequential`` or ``nn.ModuleDict`` holds among
modules of its own class: a transformer's layers (GPT-2's ``transformer.h``, Llama's ``model.layers``, T5's encoder
and decoder blocks), a ResNet's ``BasicBlock``s (two in each of ``layer1`` to ``layer4``). The
class whose blocks hold the most parameters is taken, and every block of it, in the order the
model lists its modules (the order forward runs them in these models); other repeated classes
(heads, experts inside a layer, the convolutions of a downsampling path) hold fewer. Where that
class's blocks form one list, every other class whose composite blocks form one list and hold at
least a quarter of its parameters is a stack of its own and is taken too: BART's or Whisper's
encoder and decoder layers, a vision-language model's vision and language layers. A block is
made of modules: among the classes that hold parameters, a list of single operators (embedding
tables, output heads) is taken only where the model has no list of composite blocks, however
many parameters the operators hold. Frozen blocks are blocks like any other (gradients may flow
through them: a frozen language model under a trained adapter saves activations); where the blocks
found have no trainable parameter and another list's do, a one-line warning says so (a
distillation's teacher, run under ``no_grad``, saves nothing to recompute or offload). A
TorchScript module is never a block (it takes no hooks).

A block is called: a module without a forward of its own (``nn.ModuleList``, ``nn.ModuleDict``, any
module whose forward is ``nn.Module``'s unimplemented one) never runs, its hooks never fire, so it
is never a block. A list of such containers stands for the modules with a forward that they hold
(looking into containers in them), in the order they list them, as one candidate: vit-pytorch's
``nn.ModuleList([nn.ModuleList([attention, feedforward]) for ...])``, whose forward runs ``for
attn, ff in self.layers``, has the attention and feed-forward modules as its blocks, two per layer.

A block the user compiled as a module, ``layers[i] = torch.compile(layers[i])``, is the wrapper
torch puts in the list (an ``OptimizedModule``), counted as a block of the class it wraps (so a list
of which only some blocks are compiled is still one list): the wrapper's hooks run outside the
compiled code, the wrapped module's would run inside it (user_compiled.py).
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from harness.errors import UserError
from systems.ssdtrain._warn import warn


def find_layers(model: nn.Module) -> list[nn.Module]:
    """Every block of the repeated class of ``model`` (see the module), in module order. Raises a
    UserError if it has none (pass the blocks explicitly then)."""
    refuse_lazy(model)
    blocks: dict[object, list[nn.Module]] = {}  # by class; those of containers by the set of their classes
    stacks: dict[object, int] = {}  # by the same key: how many lists the blocks come from
    mixed: list[tuple[str, nn.Module]] = []  # lists of called modules of several classes, by name
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList | nn.Sequential | nn.ModuleDict) or not len(module):
            continue
        members = list(module.values() if isinstance(module, nn.ModuleDict) else module)
        if any(_scripted(m) for m in members):
            continue  # a TorchScript module takes no hooks: never a block, nor a list's member that runs
        if len({block_class(m) for m in members}) != 1:
            # (A dict of parts of several classes names them: a model's embedding, body and head.)
            # A list of torch's single operators (a head's LayerNorm and Linear, a classifier's
            # Linear, ReLU and Dropout, a conv block's Conv2d and BatchNorm) is a part of a model,
            # never its layers, whatever it holds; a class of the user's is a layer.
            layers = sum(1 for m in members if not _torch_operator(m))
            if name and not isinstance(module, nn.ModuleDict) and all(_called(m) for m in members) and layers >= 2:
                mixed.append((name, module))
            continue
        if not _called(members[0]):  # containers: the modules they hold are the blocks
            inside = [block for member in members for block in _called_modules(member)]
            if inside:
                key = frozenset(block_class(m) for m in inside)
                blocks.setdefault(key, []).extend(inside)
                stacks[key] = stacks.get(key, 0) + 1
            continue
        key = block_class(members[0])
        blocks.setdefault(key, []).extend(members)
        stacks[key] = stacks.get(key, 0) + 1
    if not blocks:
        _refuse_mixed_stack(model, mixed, 0)
        raise UserError(
            f"{type(model).__name__} has no list of repeated blocks (an nn.ModuleList, nn.Sequential or "
            "nn.ModuleDict of modules of one class); pass the blocks explicitly (layers=[...])"
        )

    inner = {
        key: {id(m) for block in found for m in block.modules() if m is not block} for key, found in blocks.items()
    }

    def size(key) -> tuple[bool, bool, int, bool, int]:
        parameters = sum(p.numel() for block in blocks[key] for p in block.parameters())
        composite = any(True for block in blocks[key] for _ in unwrapped(block).children())
        # Of two classes with the same parameters, the blocks that hold the others' (a list of
        # PyG's HeteroConv, each holding a dict of one conv per relation) are the model's blocks.
        nested = any(other != key and all(id(b) in inner[other] for b in blocks[key]) for other in blocks)
        return parameters > 0, composite, parameters, not nested, len(blocks[key])

    largest = max(blocks, key=size)
    chosen = list(blocks[largest])
    # An encoder-decoder's two stacks are of two classes (BART, Whisper; T5's share one), a
    # vision-language model's too: where the largest class is one list of composite blocks, every
    # other class that is one list of composite blocks is a stack of its own and taken as well, in
    # module order (its forward order in these models). Classes spread over several lists (a
    # U-Net's resnets and attentions, interleaved in forward) are not: their order is unknown.
    if stacks[largest] == 1 and size(largest)[:2] == (True, True):
        # A stack holds a share of the model's parameters (an encoder's: about two thirds of its
        # decoder's); a list of small composite modules (heads, adapters) is not a stack.
        stack = lambda key: stacks[key] == 1 and size(key)[:2] == (True, True)  # noqa: E731
        others = [key for key in blocks if key != largest and stack(key) and 4 * size(key)[2] >= size(largest)[2]]
        if others:
            order = {id(m): i for i, m in enumerate(model.modules())}
            chosen = sorted([*chosen, *(b for key in others for b in blocks[key])], key=lambda b: order[id(b)])
    _refuse_mixed_stack(model, mixed, sum(p.numel() for p in _parameters_of(chosen)))
    unique = list({id(block): block for block in chosen}.values())  # a block listed twice is one block
    inside = {id(m) for block in unique for m in block.modules() if m is not block}
    found = [block for block in unique if id(block) not in inside]  # a block nested in another is the other's
    _warn_of_larger_enclosing_blocks(model, found)
    _warn_of_frozen_blocks(found, [b for key in blocks for b in blocks[key]])
    return found


def _warn_of_frozen_blocks(found: list[nn.Module], listed: list[nn.Module]) -> None:
    """Warn, in one line, where no block found has a trainable parameter while blocks of another
    list do: the found ones may run without gradients (a distillation's teacher), saving nothing to
    recompute or offload, or be a frozen model the trained ones feed (then they are right)."""
    trains = lambda block: any(p.requires_grad for p in block.parameters())  # noqa: E731
    chosen = {id(block) for block in found}
    training = [block for block in listed if id(block) not in chosen and trains(block)]
    if training and not any(trains(block) for block in found) and any(True for b in found for _ in b.parameters()):
        warn(
            f"find_layers: the {len(found)} blocks found ({block_name(found[0])}) have no trainable parameter, "
            f"while {len(training)} others ({block_name(training[0])}) train: if the found ones run without "
            "gradients (a frozen teacher), pass the trained ones (layers=[...])"
        )


def _warn_of_larger_enclosing_blocks(model: nn.Module, found: list[nn.Module]) -> None:
    """Warn, in one line, where the blocks found sit inside several called modules of one class
    that hold more than twice their parameters: the model's real blocks, held where no list shows
    them (attributes ``block0``, ``block1``...), of which the blocks found are small parts
    (attention heads), so that offloading them would move a fraction of the activations. Stacks
    that hold little besides their blocks (T5's encoder and decoder, a ResNet's stages) are not."""
    ids = {id(block) for block in found}
    names = [name for name, module in model.named_modules() if id(module) in ids]
    # Every module above a block, found by its name's prefixes: one pass, however deep the model.
    above = {name.rsplit(".", depth)[0] for name in names for depth in range(1, name.count(".") + 1)}
    enclosing: dict[type, list[nn.Module]] = {}
    for name, module in model.named_modules():
        if name in above and id(module) not in ids and _called(module):
            enclosing.setdefault(block_class(module), []).append(module)
    for cls, modules in enclosing.items():
        within = {id(m) for module in modules for m in module.modules()}
        # Embedding tables left out: stacks that share one (T5's encoder and decoder) hold it too.
        held = sum(p.numel() for p in _parameters_of(modules, embeddings=False))
        theirs = sum(p.numel() for p in _parameters_of([b for b in found if id(b) in within], embeddings=False))
        if len(modules) >= 2 and held > 2 * theirs:
            warn(
                f"find_layers: the {len(found)} blocks found ({block_class(found[0]).__name__}) hold "
                f"{theirs / held:.0%} of the parameters of the {len(modules)} {cls.__name__} modules around them: "
                f"if those are the model's blocks, pass them (layers=[...])"
            )
            return


def _torch_operator(module: nn.Module) -> bool:
    """Whether ``module`` is one of torch's own single operators (``nn.Linear``, ``nn.ReLU``...)."""
    module = unwrapped(module)
    return type(module).__module__.startswith("torch.nn.") and not any(True for _ in module.children())


def _parameters_of(modules, embeddings: bool = True) -> list:
    """The distinct parameters of ``modules``; without those of embedding tables if not ``embeddings``."""
    tables = (
        set()
        if embeddings
        else {id(p) for m in modules for e in m.modules() if isinstance(e, nn.Embedding) for p in e.parameters()}
    )
    return [p for p in {id(p): p for m in modules for p in m.parameters()}.values() if id(p) not in tables]


def _refuse_mixed_stack(model: nn.Module, mixed: list[tuple[str, nn.Module]], chosen: int) -> None:
    """Refuse, naming it, a list of modules of several classes that holds more than twice the
    parameters of the blocks found (``chosen``, a count): a hybrid model's layers (Jamba's or
    Zamba2's, Mamba and attention layers in one list), whose repeated classes are then only small
    parts of them (Zamba2's LoRA adapters), so that offloading them would move almost nothing. A
    list that holds the blocks found and little else (a stem, stages of blocks and a head in one
    ``nn.Sequential``) is no such list. Of several, the largest of those that hold no other is
    named (a list nested in another: the inner one is the layers)."""
    held_by = {name: sum(p.numel() for p in _parameters_of([stack])) for name, stack in mixed}
    over = [(name, stack) for name, stack in mixed if held_by[name] > 2 * chosen]
    inner = [(name, stack) for name, stack in over if not any(o.startswith(f"{name}.") for o, _ in over)]
    if inner:
        name, stack = max(inner, key=lambda named: held_by[named[0]])
        classes = sorted({block_class(m).__name__ for m in stack})
        raise UserError(
            f"{type(model).__name__}.{name} holds the model's blocks in one list of several classes "
            f"({', '.join(classes)}), which find_layers does not take as blocks; pass the blocks explicitly, "
            f"e.g. layers=list(model.{name})"
        )


def refuse_lazy(model: nn.Module) -> None:
    """A one-line UserError where ``model`` holds parameters or buffers of lazy modules
    (``nn.LazyLinear``...) that no forward has made yet: their sizes are unknown (torch raises on
    any use of them), and the storages they get in the first forward would not be known as the
    model's, so its weights would be offloaded as activations."""
    for module in model.modules():
        if any(is_lazy(t) for t in (*module._parameters.values(), *module._buffers.values())):
            raise UserError(
                f"{type(model).__name__} holds a {type(module).__name__} not yet initialized (a lazy module): run "
                "one forward (a dummy batch) before offloading, so that its parameters exist"
            )


def _called(module: nn.Module) -> bool:
    """Whether ``module`` has a forward of its own (a container's is nn.Module's, which raises)."""
    if _scripted(module):  # its class's forward is a descriptor that raises when the class reads it
        return True
    return type(unwrapped(module)).forward is not nn.Module.forward


def _scripted(module: nn.Module) -> bool:
    """Whether ``module`` is a TorchScript module (``torch.jit.script`` or ``trace`` made it)."""
    return isinstance(module, torch.jit.ScriptModule)


def compiled_wrapper_class() -> type | None:
    """torch's ``OptimizedModule``, what ``torch.compile(module)`` returns; None while Dynamo is not
    imported (no module can have been compiled then, and importing it takes a second)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return None if eval_frame is None else eval_frame.OptimizedModule


def is_compiled_wrapper(module: nn.Module) -> bool:
    """Whether ``module`` is ``torch.compile(some_module)``'s wrapper."""
    wrapper = compiled_wrapper_class()
    return wrapper is not None and isinstance(module, wrapper)


def unwrapped(module: nn.Module) -> nn.Module:
    """The module ``torch.compile`` wrapped, or ``module`` itself where it is no such wrapper."""
    while is_compiled_wrapper(module):
        module = module._orig_mod
    return module


def block_class(module: nn.Module) -> type:
    """The class a block counts as: a compiled block's is the class of the module it wraps."""
    return type(unwrapped(module))


def block_name(module: nn.Module) -> str:
    """A block's class name for messages (a compiled block's: the wrapped module's)."""
    return block_class(module).__name__


def _called_modules(container: nn.Module) -> list[nn.Module]:
    """The modules a container holds that have a forward, looking into containers inside it (but
    TorchScript modules, which take no hooks)."""
    out = []
    for child in container.children():
        if not _scripted(child):
            out.extend([child] if _called(child) else _called_modules(child))
    return out


class InstalledForward:
    """A forward that a ``with`` block puts on a block as its instance attribute ``forward`` while it
    runs (a recomputed block's, a compiled block's). A copy of the block made meanwhile
    (``copy.deepcopy(model)`` to keep the best model or start an EMA, ``torch.save(model)``) gets the
    forward the block had before (``before``; None: its class's), bound to the copy: a plain function
    would be copied as it is, and the copy would run this block, with its weights, instead of its own."""

    def __init__(self, run: Callable, layer: nn.Module, before: Callable | None):
        functools.update_wrapper(self, run)  # the block's name and signature, as the forward's
        self.run, self.layer, self.before = run, layer, before

    def __call__(self, *args, **kwargs):
        return self.run(*args, **kwargs)

    def __reduce__(self):  # deepcopy and pickle alike
        return _forward_of_copy, (self.layer, self.before)


def _forward_of_copy(layer: nn.Module, before: Callable | None) -> Callable:
    return before if before is not None else types.MethodType(type(layer).forward, layer)
