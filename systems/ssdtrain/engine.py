"""The offloader: a context manager around one training step's forward and backward that sends the
activations autograd saves to a store during forward and brings them back for backward.

How. ``torch.autograd.graph.saved_tensors_hooks`` sees every tensor autograd saves: the pack hook
returns a small handle instead of the tensor, the unpack hook turns it back into the tensor. Forward
hooks on the model's layers (layers.py) say which layer is running, so each saved tensor belongs to
a layer and the policy decides per layer: ``keep`` (on the device) or ``offload`` (to the store).
The last ``keep_last`` layers are always kept: their backward comes first, right after forward.
Parameters and buffers (recognised by their storage), their casts under ``torch.autocast`` and
tensors whose storage is under ``min_bytes`` are never offloaded (a small view of a large storage
is offloaded: the whole storage is what it holds on the device); a storage saved several times is stored once
(cache.py). A cast of a weight is recognised by its autograd node: a copy (``ToCopyBackward0``)
whose input is the parameter itself. Its bytes are the weight's, the same every step: writing
them out each step would spend the store's bandwidth (and an SSD's endurance) on bytes the model
holds anyway, for a saving of one low-precision copy of the weights. A frozen parameter's cast
has no autograd node and is treated as an activation.

Overlap. A put starts as soon as the tensor is saved and runs on the store's threads and streams
while forward goes on. Backward runs the layers in reverse: when it reaches layer L (the first
unpack of a tensor L saved, kept or offloaded, in each ``backward()`` call, told apart by autograd's
graph task) it starts reading back the offloaded layers from L - ``prefetch`` up (L itself where
its backward begins the call); at the start of a call that begins above the layers (a loss or head
saved outside them), the last ``prefetch`` layers. So a layer's tensors are on their way when
backward reaches the layer above it, and not before: bytes read back early would be on the device
again at the start of backward, where the activation peak is (offloading the first block would
then free nothing at the peak). Several
forwards and backwards may run in one step (micro-batches of gradient accumulation): each
backward prefetches, and the policy is asked again at each forward. A tensor whose put has not
finished yet is served from memory, unless ``always_read_back``: then backward waits for the put
and reads the tensor back, so what the store moves in a step does not depend on how fast it ran
(for checks of the stored bytes; slower).

A step. Entering the context starts a step and its ``stats``; leaving it (normally or by an
exception) waits for the transfers in flight and frees everything the step stored, so files never
accumulate. Backward must run inside the context. A step whose first forward to offload some layer
offloaded nothing (every saved tensor below ``min_bytes``, or the layers' tensors saved by another
mechanism; a planned policy's first forward keeps every layer while it profiles), or whose first
forward ran none of its layers, warns once, in one line.

Two offloaders at once, each on its own model (a GAN's generator and discriminator, a teacher and
its student, each in its own ``with``): torch runs only the innermost saved-tensor hooks, so the
innermost offloader hands a tensor saved while a layer of another active offloader runs to that
one, which packs it and, in backward, unpacks it.

Hugging Face gradient checkpointing. A layer with ``gradient_checkpointing`` on saves only its
inputs, through ``torch.utils.checkpoint``; the engine attributes them to the layer (also where the
library checkpoints outside the layer's forward hooks), so an offloading policy offloads them.

Compiled blocks (user_compiled.py). The layer hooks must run outside compiled code: a block
compiled by ``torch.compile(block)`` is hooked on torch's wrapper, one compiled by
``block.compile()`` has its forward compiled instead of its whole call while the step runs, and a
model compiled as a whole is refused in one line (when the offloader is made, or when a block's
hook finds itself traced by Dynamo).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Callable

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from harness.arguments import whole_number
from harness.errors import UserError
from systems.ssdtrain._warn import warn
from systems.ssdtrain.blocks import checked_blocks
from systems.ssdtrain.cache import TensorCache, modified_error, offload_key, span_bytes
from systems.ssdtrain.layers import block_name, refuse_lazy
from systems.ssdtrain.stats import BELOW_MIN_BYTES, EMPTY, NOT_STORABLE, StepStats, why_nothing_moved
from systems.ssdtrain.stores import Store
from systems.ssdtrain.user_compiled import (
    hooks_outside_compiled,
    refuse_compiled_around,
    refuse_if_traced,
)

KEEP, OFFLOAD = "keep", "offload"
# Named per-layer policies: layer index -> decision. A callable with the same signature is one too.
# (The policies a comparison runs, built on these, are systems/ssdtrain/policies.)
LAYER_POLICIES: dict[str, Callable[[int], str]] = {
    "keep": lambda layer: KEEP,  # the control: hooks and bookkeeping, nothing offloaded
    "offload_all": lambda layer: OFFLOAD,
}


# Per thread, as torch's saved-tensor hooks are: ``active``, the offloaders whose ``with`` is active,
# innermost last (only the innermost's hooks run, so it hands a tensor saved while a layer of
# another one runs to that one: ``_pack``); ``block``, the recomputed block whose inputs a
# checkpoint is saving now (recompute.py).
_local = threading.local()


def _active_offloaders() -> list[Offloader]:
    if not hasattr(_local, "active"):
        _local.active = []
    return _local.active


def active_offloaders() -> tuple[Offloader, ...]:
    """The offloaders whose ``with`` is active on this thread, innermost last."""
    return tuple(_active_offloaders())


@contextlib.contextmanager
def saving_inputs_of(block: nn.Module):
    """Within it, what the hooks see saved are ``block``'s inputs, kept by a checkpoint for its
    recomputation (torch's checkpoint saves nothing else through them: its own hooks take the rest)."""
    outer = getattr(_local, "block", None)
    _local.block = block_name(block)
    try:
        yield
    finally:
        _local.block = outer


def _inert(*args, **kwargs) -> None:
    """The hook a copy of the model gets for a :class:`StepHook`: it does nothing."""


def _inert_hook():
    return _inert


class StepHook:
    """A hook that a ``with`` block (an Offloader, offload()) puts on the model's modules while it
    runs. ``copy.deepcopy(model)`` or ``torch.save(model)`` inside the block (keeping the best model,
    starting an EMA) copies the modules' hooks with them: the copy gets one that does nothing, as it is
    not the model the block covers (and the offloader, with its locks and threads, cannot be copied).

    It acts on the thread that made it (the one that entered the block) and in backward, wherever
    autograd runs that: a forward another thread runs meanwhile (a monitoring thread's evaluation
    under no_grad) passes untouched, as torch's saved-tensor hooks, kept per thread, pass it too."""

    __slots__ = ("func", "thread", "passed")

    def __init__(self, func: Callable):
        self.func = func
        self.thread = threading.get_ident()
        self.passed = False  # whether another thread's forward called it (and it did nothing)

    def __call__(self, *args, **kwargs):
        # (Traced by dynamo, as inside a compiled region, it runs as it is: a thread id is no graph value.)
        if not torch.compiler.is_compiling() and threading.get_ident() != self.thread and not in_backward():
            self.passed = True
            return None  # another thread's forward: no hook of the block's applies to it
        return self.func(*args, **kwargs)

    def __reduce__(self):  # deepcopy and pickle alike
        return _inert_hook, ()


class _Kept:
    """What autograd holds for a tensor kept on the device: the tensor, detached (returning the
    saved output itself would make a reference cycle through its grad_fn that the garbage collector
    cannot see, and leak it), and its version when saved, which autograd no longer checks.
    ``block``: the recomputed block whose input it is (None: another saved tensor); ``layer``: the
    layer that saved it (None: saved outside the layers), which tells backward's progress."""

    __slots__ = ("tensor", "version", "block", "layer")

    def __init__(self, tensor: torch.Tensor, block: str | None = None, layer: int | None = None):
        self.tensor, self.version, self.block, self.layer = tensor.detach(), tensor._version, block, layer

    def unpack(self) -> torch.Tensor:
        if self.tensor._version != self.version:
            if self.block is not None:
                raise input_modified_error(self.block, self.version, self.tensor._version)
            raise modified_error(self.version, self.tensor._version)
        return self.tensor


def input_modified_error(block: str, version: int, now: int) -> RuntimeError:
    # Not autograd's error: without recomputation the block saves what it computed and may never
    # need this input again; its recomputation does, and the values it ran with are gone.
    return RuntimeError(
        f"an input of a recomputed {block} was modified in place during or after the block's forward (version "
        f"{version}, now {now}): its recomputation cannot replay the values the forward used; change it out of "
        "place (x = x + block(x), not x += block(x)), or keep or offload this block"
    )


class _Foreign:
    """A tensor another active offloader packed (its block was running): that one unpacks it."""

    __slots__ = ("owner", "packed")

    def __init__(self, owner: Offloader, packed):
        self.owner, self.packed = owner, packed


def has_storage_identity(tensor: torch.Tensor) -> bool:
    """A plain dense tensor with a storage of its own; subclasses, sparse, nested, quantized, meta
    and inference tensors (no version counter) are kept as they are, and so are lazy conjugate and
    negative views (``x.conj()``, ``x.conj().imag``), whose bit a view rebuilt from the stored bytes
    would not carry."""
    return (
        type(tensor) in (torch.Tensor, nn.Parameter)
        and tensor.layout == torch.strided
        and not tensor.is_nested
        and not tensor.is_inference()
        and not tensor.is_quantized
        and not tensor.is_conj()
        and not tensor.is_neg()
        and tensor.device.type != "meta"
    )


class Offloader:
    """``with Offloader(model, store): loss = ...; loss.backward()`` offloads the activations of
    that step (see the module's docstring).

    ``policy``: ``"offload_all"``, ``"keep"`` or a callable ``decide(layer_index) -> "keep" |
    "offload"``, asked once per layer per forward. ``keep_last``: how many of the last layers are kept
    whatever the policy says. ``min_bytes``: saved tensors of smaller storages are kept. ``layers``: the blocks
    to number (default: found by ``find_layers``). ``prefetch``: how many layers ahead backward
    reads back. ``always_read_back``: no tensor is served from memory while its write runs (see
    the module).
    """

    def __init__(
        self,
        model: nn.Module,
        store: Store,
        *,
        policy: str | Callable[[int], str] = "offload_all",
        min_bytes: int = 1 << 20,
        keep_last: int = 1,
        layers: list[nn.Module] | None = None,
        prefetch: int = 1,
        always_read_back: bool = False,
    ):
        if not isinstance(store, Store):
            raise TypeError(f"store must be a systems.ssdtrain Store, got {type(store).__name__}")
        store.refuse_if_closed()
        if isinstance(policy, str):
            if policy not in LAYER_POLICIES:
                raise UserError(
                    f"unknown offloading policy {policy!r}; choose one of {sorted(LAYER_POLICIES)} or pass a callable"
                )
            policy = LAYER_POLICIES[policy]
        elif not callable(policy):
            raise UserError(f"policy must be a name or a callable decide(layer_index), got {policy!r}")
        for name, value in (("min_bytes", min_bytes), ("keep_last", keep_last), ("prefetch", prefetch)):
            if whole_number(value) is None:
                raise UserError(f"{name} must be a non-negative integer, got {value!r}")
        if not isinstance(always_read_back, bool):  # "no" would read as True
            raise UserError(f"always_read_back must be True or False, got {always_read_back!r}")
        refuse_lazy(model)  # its parameters' storages must be known when a step starts
        self.model, self.store, self.decide = model, store, policy
        self.min_bytes, self.keep_last, self.prefetch = map(whole_number, (min_bytes, keep_last, prefetch))
        self.layers = checked_blocks(model, layers)
        refuse_compiled_around(model, self.layers)
        self.cache = TensorCache(store, always_read_back=always_read_back)
        self.stats = StepStats()
        self.backwards = 0
        # Called with the layer (None: outside the layers) each time a backward first unpacks one of
        # its tensors: where backward is (planning.PeakTrace measures memory by it).
        self.backward_listeners: list[Callable[[int | None], None]] = []
        self._active = False
        self._order_warned = False  # whether the layers were found out of forward order (once)
        # The blocks ever entered inside a torch.utils.checkpoint their caller runs (not one this
        # offloader wraps): the checkpoint's hooks then take what they save, not this offloader's.
        self.checkpointed_by_caller: set[int] = set()

    # -- a step --------------------------------------------------------------------------------
    def __enter__(self) -> Offloader:
        if self._active:
            raise RuntimeError("this Offloader is already active: its steps do not nest")
        self._compiled_blocks = hooks_outside_compiled(self.layers)  # first: it may refuse a block
        self._compiled_blocks.__enter__()
        try:
            self._begin_step()
        except BaseException:  # the blocks compiled by .compile() are put back as they were
            self._compiled_blocks.__exit__(*sys.exc_info())
            raise
        return self

    def _begin_step(self) -> None:
        self._active = True
        self.stats = StepStats()
        self.cache.start_step()
        self._counters_at_start = self.store.counters
        self._layer: int | None = None  # the layer running forward now
        self._layer_in_forward = False  # whether it was entered by a forward (not recomputed in backward)
        self._decisions: dict[int, str] = {}  # this forward's decision per layer
        self._last_entered = -1  # the block forward entered last (its order is checked against the list's)
        self._offloads_a_layer = False  # whether one of this forward's decisions is to offload
        self._backward_task: int | None = None  # autograd's graph task of the backward running now
        self._backward_layers: set[int | None] = set()  # layers whose unpack this backward has seen
        self._backward_since_forward = False  # a backward ran since the last forward began
        self.backwards = 0  # the backward passes this step has run so far
        self._offloading_checked = False  # whether the first offloading forward's offloading was checked
        self._ran_with_grad = False  # whether a block ran where autograd saves tensors
        self._parameter_storages = self._storages_of_the_model()
        self._parameters_listed = True  # whether they were listed since this forward began (_is_parameter)
        self._module_hooks = []
        self._entry_hooks: list[StepHook] = []  # the blocks' forward pre-hooks (whether another thread ran them)
        for index, layer in enumerate(self.layers):
            enter = StepHook(functools.partial(self._enter_layer, index))
            self._entry_hooks.append(enter)
            self._module_hooks.append(layer.register_forward_pre_hook(enter))
            # always_call: a block whose forward raises (a batch the user skips) is left all the same,
            # or the next forward's tensors saved before the blocks would count as that block's.
            self._module_hooks.append(layer.register_forward_hook(StepHook(self._leave_layer), always_call=True))
        self._checkpoint_funcs = self._attribute_library_checkpoints()
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._saved_hooks.__enter__()
        _active_offloaders().append(self)

    def __exit__(self, exc_type, exc, tb) -> None:
        active = _active_offloaders()
        if self in active:  # (left on another thread than it was entered on: not there)
            active.remove(self)
        self._saved_hooks.__exit__(exc_type, exc, tb)
        for hook in self._module_hooks:
            hook.remove()
        for layer, func in self._checkpoint_funcs:
            layer._gradient_checkpointing_func = func
        self._compiled_blocks.__exit__(exc_type, exc, tb)
        self._active = False
        self.reset()
        self.stats.store = self.store.counters - self._counters_at_start
        self.stats.prefetched_loads, self.stats.demand_loads = self.cache.prefetched_loads, self.cache.demand_loads
        if exc_type is None and self.cache.error is not None:
            raise self.cache.error
        if exc_type is None and not self._ran_with_grad and any(hook.passed for hook in self._entry_hooks):
            # Saved-tensor hooks are per thread: a forward on another thread saved nothing through them.
            warn(
                "SSDTrain: the blocks ran on another thread than the one that entered this offload() block, "
                "and nothing was offloaded or planned there: enter offload() on the thread that runs forward"
            )
        if (
            exc_type is None
            and self._ran_with_grad
            and not self._offloading_checked
            and OFFLOAD in self._decisions.values()
        ):
            if not any(stats.packed_tensors for stats in self.stats.layers.values()):
                # The blocks ran, decided to offload, and no saved tensor reached this offloader's hooks.
                warn(
                    "SSDTrain: the blocks ran and offloaded nothing: none of their saved tensors reached this "
                    "offloader (a saved-tensor hook entered after it took them: another offload() or "
                    "save_on_cpu around the same blocks)"
                )

    def leave_out_of_stats(self, counters) -> None:
        """Leave the store traffic ``counters`` (an interval of ``store.counters``) out of this step's
        ``stats.store``: traffic of the caller's own during the step (a bandwidth probe), not training's."""
        self._counters_at_start = self._counters_at_start + counters

    def flush(self) -> None:
        """Wait for the puts in flight: after forward, device memory is then what offloading leaves."""
        self.cache.wait_puts()

    def reset(self) -> None:
        """Wait for the transfers in flight and free everything stored (the end of a step does it).
        A saved tensor used after that raises, never returns stale bytes."""
        self.cache.reset()

    # -- layers --------------------------------------------------------------------------------
    def _enter_layer(self, index: int, module, args) -> None:
        refuse_if_traced(module)  # a model compiled as a whole: this hook would be traced, not run
        if self._backward_since_forward and not in_backward():
            # A new forward (the next micro-batch): the policy decides again, so a plan made
            # meanwhile applies from this forward on.
            self._decisions.clear()
            self._last_entered = -1
            self._offloads_a_layer = False
            self._backward_since_forward = False
            self._parameters_listed = False
        if self._layer != index and torch.is_grad_enabled() and not in_backward() and inside_a_checkpoint():
            self.checkpointed_by_caller.add(index)
        self._layer, self._layer_in_forward = index, not in_backward()
        self._ran_with_grad = self._ran_with_grad or torch.is_grad_enabled()
        if not in_backward():
            # Against the block entered just before, not every block so far: a forward that skips
            # a block (LayerDrop), then another before backward, runs it in order.
            if index not in self._decisions and index < self._last_entered:
                self._warn_out_of_order(index, self._last_entered)
            self._last_entered = index
        if index not in self._decisions:
            decision = KEEP if index >= len(self.layers) - self.keep_last else self.decide(index)
            if decision not in (KEEP, OFFLOAD):
                raise UserError(
                    f"the offloading policy returned {decision!r} for layer {index}; expected 'keep' or 'offload'"
                )
            self._decisions[index] = decision
            self._offloads_a_layer = self._offloads_a_layer or decision == OFFLOAD

    def _warn_out_of_order(self, index: int, later: int) -> None:
        """Block ``index`` first ran after block ``later`` in this forward: keep_last and prefetch
        follow the list's order, which is then not the order backward meets the blocks in."""
        if self._order_warned:
            return
        self._order_warned = True
        names = {id(module): name or "the model" for name, module in self.model.named_modules()}

        def name(i: int) -> str:
            return f"{i} ({names.get(id(self.layers[i]), type(self.layers[i]).__name__)})"

        warn(
            f"SSDTrain: the blocks are not in forward order: block {name(index)} first ran after block "
            f"{name(later)}; keep_last and prefetch follow the list's order, so the blocks kept and read back "
            "first are not the last to run: pass layers= in the order forward calls them"
        )

    def _leave_layer(self, module, args, output) -> None:
        self._layer, self._layer_in_forward = None, False
        self.cache.start_deferred()

    def _attribute_library_checkpoints(self) -> list[tuple[nn.Module, Callable]]:
        """Wrap the checkpoint function of each layer that Hugging Face checkpoints, so that what it
        saves (the layer's inputs) belongs to the layer even where the library calls it before the
        layer's forward hooks run, and so does what the function it checkpoints saves when backward
        runs it again: Hugging Face checkpoints the layer's ``forward``, its hooks outside, so a
        reentrant checkpoint's recomputation in backward runs no hook of the layer's (its tensors
        were counted as saved outside the layers). Returns the functions to put back."""
        replaced = []
        for index, layer in enumerate(self.layers):
            func = vars(layer).get("_gradient_checkpointing_func")
            if func is None or not getattr(layer, "gradient_checkpointing", False):
                continue

            def attributed(*args, _index=index, _layer=layer, _func=func, **kwargs):
                if args and callable(args[0]):  # checkpoint(function, *inputs): the function, in the layer
                    args = (self._in_layer(args[0], _index, _layer), *args[1:])
                return self._in_layer(_func, _index, _layer)(*args, **kwargs)

            layer._gradient_checkpointing_func = attributed
            replaced.append((layer, func))
        return replaced

    def _in_layer(self, function: Callable, index: int, layer: nn.Module) -> Callable:
        """``function``, run as part of layer ``index``: what it saves is the layer's, and the layer
        the caller was in is put back when it returns."""

        @functools.wraps(function)
        def run(*args, **kwargs):
            outer = self._layer, self._layer_in_forward
            self._enter_layer(index, layer, args)
            try:
                return function(*args, **kwargs)
            finally:
                self._layer, self._layer_in_forward = outer
                self.cache.start_deferred()

        return run

    # -- saved tensors -------------------------------------------------------------------------
    def _pack(self, tensor: torch.Tensor):
        # Dynamo traces this hook in a model compiled as a whole: refused before any storage is
        # looked at (a traced one would be a fake's, and torch prints an error as each is freed).
        refuse_if_traced(None)
        if self._layer is None:
            owner = next((o for o in reversed(_active_offloaders()) if o._layer is not None and o is not self), None)
            if owner is not None:  # a block of another model's offloader is running: its tensor
                return _Foreign(owner, owner._pack(tensor))
        if self.cache.error is not None:
            raise self.cache.error  # a failed put: stop the step now rather than at its end
        layer = self._layer
        key = offload_key(tensor) if has_storage_identity(tensor) else None
        parameter = key is not None and self._is_parameter(tensor, key[0].impl)
        # Without autograd history it may be a buffer its op fills after saving it: written
        # once the block's forward has ended (cache: deferred puts).
        no_history = tensor.grad_fn is None and not tensor.requires_grad
        offload = (
            key is not None
            and not parameter
            and layer is not None
            # Data from outside the model (no history) that is a small view of a larger storage, as
            # a batch sliced from a dataset the caller holds: storing the storage would write all
            # of it and free none of it. Kept, as the caller's data is held anyway.
            and not (no_history and 2 * span_bytes(tensor) <= tensor.untyped_storage().nbytes())
            and self._decisions[layer] == OFFLOAD
            # Saved while backward runs (a reentrant checkpoint recomputing its block): needed at once.
            and not in_backward()
            and tensor.untyped_storage().nbytes() >= max(self.min_bytes, 1)
            # A storage this step already keeps is held anyway: a copy in the store frees nothing.
            and (not self.stats.has(key[0]) or self.cache.holds(key[0]))
        )
        if not offload:
            small = key is not None and tensor.untyped_storage().nbytes() < max(self.min_bytes, 1)
            self.stats.record(tensor, layer, key, parameter=parameter, unoffloadable=small)
            return _Kept(tensor, getattr(_local, "block", None), layer)
        with torch.no_grad():
            handle, new = self.cache.offload(tensor, layer, *key, defer=no_history)
        self.stats.record(tensor, layer, key, offloaded=new)
        return handle

    def _storages_of_the_model(self) -> dict[int, StorageWeakRef]:
        # The parameters' and buffers' storages by address. The weak references are kept: while one
        # is held, no new storage can take the address of one freed (a parameter replaced), which
        # would then pass for a parameter.
        tensors = [*self.model.parameters(), *self.model.buffers()]
        return {ref.cdata: ref for ref in (StorageWeakRef(t.untyped_storage()) for t in tensors)}

    def _is_parameter(self, tensor: torch.Tensor, storage: int) -> bool:
        """Whether ``tensor`` (of ``storage``) is one of the model's parameters or buffers, or
        autocast's cast of a parameter (see the module). A leaf that requires grad, or a cast of one,
        whose storage is not among those known makes the engine list the model's again, once a
        forward: a parameter replaced inside a long ``with`` block (``model.to(torch.float64)``,
        ``load_state_dict(assign=True)``)."""
        leaf = tensor if tensor.is_leaf and tensor.requires_grad else self._cast_source(tensor)
        if leaf is None:
            return storage in self._parameter_storages
        leaf_storage = StorageWeakRef(leaf.untyped_storage()).cdata
        if leaf_storage not in self._parameter_storages and not self._parameters_listed:
            # Once a forward: an input that requires grad, saved by many ops, is such a leaf too.
            self._parameter_storages, self._parameters_listed = self._storages_of_the_model(), True
        return leaf_storage in self._parameter_storages

    @staticmethod
    def _cast_source(tensor: torch.Tensor) -> torch.Tensor | None:
        """The leaf of which ``tensor`` (or the tensor it views) is a copy in another dtype or
        device, as autocast casts a weight; None where it is no such copy."""
        base = tensor._base if tensor._is_view() else tensor
        node = base.grad_fn
        if node is None or type(node).__name__ != "ToCopyBackward0" or not node.next_functions:
            return None
        return getattr(node.next_functions[0][0], "variable", None)  # an AccumulateGrad holds its leaf

    def _unpack(self, packed) -> torch.Tensor:
        if isinstance(packed, _Foreign):
            return packed.owner._unpack(packed.packed)
        if not in_backward() or (self._layer is not None and self._layer_in_forward):
            # Not the step's backward: a saved tensor read outside any backward (grad_fn._saved_*),
            # or a backward run inside a block's forward (torch.autograd.grad there: forces as the
            # gradient of an energy, a PINN's derivatives). It neither prefetches nor counts as a
            # backward: a planned policy would plan from half a forward, and the next block would
            # start a new micro-batch.
            return packed.unpack() if isinstance(packed, _Kept) else self.cache.unpack(packed, for_backward=False)
        self.cache.start_deferred()  # a block that never returned (its forward hook did not run)
        # Checked at the first backward after a forward that offloads a layer (or ran none): a
        # planned policy's first forward, which profiles, keeps every layer.
        if not self._offloading_checked and (self._offloads_a_layer or not self._decisions):
            self._offloading_checked = True
            self._warn_if_nothing_offloaded()
        self._backward_since_forward = True
        if isinstance(packed, _Kept):
            self._backward_reached(packed.layer)
            return packed.unpack()
        self._backward_reached(packed.entry.layer)
        return self.cache.unpack(packed)

    def _backward_reached(self, layer: int | None) -> None:
        """Backward is at ``layer`` (None: outside the layers): start reading back the offloaded
        layers from ``layer - prefetch`` up, once per layer and backward call (see the module)."""
        task = torch._C._current_graph_task_id()
        if task != self._backward_task:
            self._backward_task = task
            self._backward_layers = set()
            self.backwards += 1
        if layer in self._backward_layers:
            return
        first = not self._backward_layers
        self._backward_layers.add(layer)
        for listener in self.backward_listeners:
            listener(layer)
        if not self.prefetch or (layer is None and not first):
            return  # a tensor saved outside the layers after the first: backward is below them all
        lowest = (len(self.layers) if layer is None else layer) - self.prefetch
        for target in self.cache.layers():  # descending; a layer read back already is skipped
            if target >= lowest:
                self.cache.prefetch(target)

    def _warn_if_nothing_offloaded(self) -> None:
        """One line when the first forward to offload a layer offloaded nothing, or when the first
        forward ran none of the layers (no policy then applies to anything)."""
        if not self._decisions and self.layers:
            warn(
                f"SSDTrain: none of the {len(self.layers)} blocks ran in this forward, so no policy applied to "
                f"anything: the blocks (layers=) must be modules the model's forward calls"
            )
            return
        offloading = sorted(layer for layer, d in self._decisions.items() if d == OFFLOAD)
        if not offloading or self.stats.total.offloaded_tensors:
            return
        saved = [self.stats.layers[i] for i in offloading if i in self.stats.layers]
        weights = [p for i in offloading for p in self.layers[i].parameters()]
        largest = max(self.stats.largest.get(i, 0) for i in offloading)
        if all(i in self.checkpointed_by_caller for i in offloading):
            why = CALLERS_CHECKPOINT
        elif any(s.packed_tensors for s in saved):
            why = {
                # Every saved storage empty (a batch of 0 rows): no min_bytes would offload anything.
                EMPTY: "every storage the offloaded layers saved is empty (0 B: an empty batch?)",
                BELOW_MIN_BYTES: (
                    f"every storage the offloaded layers saved is below min_bytes={self.min_bytes} (the largest "
                    f"is {largest} B): lower min_bytes"
                ),
                NOT_STORABLE: (
                    "the offloaded layers saved no tensor a store can take: those large enough have no storage "
                    "of their own (meta or subclass tensors) or are the model's weights"
                ),
            }[why_nothing_moved(largest, self.min_bytes)]
        elif weights and not any(p.requires_grad for p in weights):
            # Frozen blocks whose inputs need no gradient: autograd saves nothing in them, and
            # no other hook is to blame (fine-tuning a head on a frozen backbone).
            why = (
                "the offloaded layers saved no tensor for backward: their parameters are frozen (requires_grad=False) "
                "and their inputs need no gradient, so there is nothing to offload"
            )
        elif not self._ran_with_grad:
            why = (
                "the blocks ran with gradients off (torch.no_grad or inference_mode), so autograd saved nothing in them"
            )
        else:
            why = "the offloaded layers saved no tensor through the offloader (another saved-tensor hook holds them?)"
        warn(f"SSDTrain offloaded nothing in this forward: {why}")


def inside_a_checkpoint() -> bool:
    """Whether torch's (non-reentrant) checkpoint runs the caller: a model that checkpoints its own
    blocks, in forward or recomputing in backward. Its saved-tensor hooks are then the innermost
    (torch names no public call for this: their functions' names tell). A second checkpoint inside
    would recompute nothing more, and the outer one, which stops its recomputation once it has the
    tensors it saved, would not rerun the block, so a BatchNorm's statistics would be updated once
    where without the policy they are updated twice."""
    try:
        hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    except (AttributeError, RuntimeError, TypeError):
        return False
    name = getattr(hooks[0], "__qualname__", "") if hooks else ""
    return name.startswith(("_checkpoint_hook.", "_recomputation_hook."))


# Why a block run inside its caller's torch.utils.checkpoint offloads nothing, and what to do.
CALLERS_CHECKPOINT = (
    "the blocks ran inside a torch.utils.checkpoint their caller runs, whose hooks take what they save "
    "(and their inputs, saved before a block starts, count as saved outside the blocks): SSDTrain "
    "recomputes blocks itself, so call the blocks directly and choose policy='recompute' or a planned policy"
)


def in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1
