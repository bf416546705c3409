"""What a policy is: an object that runs a training step's forward and backward its way
(:meth:`Policy.step`, a context manager) and counts what the step saved and moved; and the
mechanisms the suite's policies are built from (an Offloader with a per-block rule and
recomputed blocks; saved-tensor hooks of one's own, counted; blocks compiled by torch.compile,
_compiled.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from harness.errors import UserError
from systems.ssdtrain.cache import StorageKey
from systems.ssdtrain.engine import KEEP, Offloader
from systems.ssdtrain.planning import Plan
from systems.ssdtrain.policies._compiled import CompiledBlocks, check_budget
from systems.ssdtrain.recompute import TORCH_CHECKPOINT, checkpointed
from systems.ssdtrain.stores import Store
from systems.ssdtrain.stores.host import HostStore


class Unavailable(UserError):
    """The policy cannot be set up here (its library does not import, say): one line saying why."""


def first_line(err: Exception) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(err).splitlines()[0][:200] if str(err) else ""
    return f"{type(err).__name__}: {text}"


@dataclass
class Setting:
    """What a policy is applied to: a model and its blocks (the unit that is kept, offloaded or
    recomputed), the store the offloading policies send activations to, the plan of a planned
    policy, the offloader's knobs (``systems.ssdtrain.Offloader``), and whether the blocks run
    compiled by ``torch.compile`` (``compiled``), with the partitioner's ``activation_budget`` (a
    fraction in (0, 1]; None: torch's default partitioner)."""

    model: nn.Module
    layers: list[nn.Module]
    store: Store | None = None
    plan: Plan | None = None
    keep_last: int = 1
    min_bytes: int = 1 << 20
    prefetch: int = 1
    always_read_back: bool = False
    compiled: bool = False
    activation_budget: float | None = None

    def __post_init__(self):
        self.activation_budget = check_budget(self.activation_budget)
        if self.activation_budget is not None and not self.compiled:
            raise UserError("an activation_budget applies to compiled blocks: this policy runs its blocks eagerly")

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def parameter_storages(self) -> set[int]:
        """The data addresses of the model's parameters and buffers (never activations)."""
        return {t.untyped_storage().data_ptr() for t in [*self.model.parameters(), *self.model.buffers()]}


class Policy:
    """One policy applied to one model. Every step goes::

        with policy.step():
            loss = model(**batch).loss
            loss.backward()

    and leaves its counts in ``policy.history[-1]`` (metric -> value: ``activation_bytes``,
    ``bytes_packed``, ``bytes_unique``; the offloading ones also ``bytes_written``, ``bytes_read``,
    ``write_seconds``, ``read_seconds``, ``bytes_made_contiguous``; a peer only what it can see).
    Subclasses implement :meth:`around`. ``about``: lines for the provenance (a library's
    version). ``close()`` frees what the policy made itself; the store it was given stays its
    owner's to close. Where the setting is ``compiled``, every step runs the blocks' compiled
    forwards (compiled at the first step) and :meth:`around` sees them as it sees eager blocks."""

    def __init__(self, setting: Setting):
        self.setting = setting
        self.history: list[dict[str, float]] = []
        self.about: dict[str, str] = {}
        self.compiled = CompiledBlocks(setting.layers, setting.activation_budget) if setting.compiled else None

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        counts: dict[str, float] = {}
        if self.compiled:
            budgets = self.layer_budgets()
            uniform = [self.setting.activation_budget] * len(self.setting.layers)
            self.compiled.use(uniform if budgets is None else budgets)
        with self.compiled.installed() if self.compiled else contextlib.nullcontext(), self.around(counts):
            yield
        self.history.append(counts)

    def layer_budgets(self) -> list[float | None] | None:
        """Compiled blocks: each block's activation memory budget for the next step (None: the
        setting's ``activation_budget`` for every block)."""
        return None

    def around(self, counts: dict[str, float]) -> contextlib.AbstractContextManager:
        """A context manager around one step's forward and backward that fills ``counts`` as it ends."""
        raise NotImplementedError

    @contextlib.contextmanager
    def reading_back(self) -> Iterator[None]:
        """Steps inside this read every offloaded tensor back from its store (none is served from
        memory while its write runs), so that checking such a step checks the store's bytes too,
        whatever the timing. Policies that keep their tensors themselves have nothing to change."""
        yield

    def reset(self) -> None:
        """Forget a step that raised half-way (state a library keeps of its own)."""

    def close(self) -> None:
        """Free what this policy made (not the store it was given)."""


class OffloaderPolicy(Policy):
    """A step under SSDTrain's Offloader: each block's saved tensors kept or sent to the store as
    :meth:`decide` says, the blocks of :meth:`recomputed` run again in backward instead. With no
    store, nothing is offloaded and an Offloader that keeps everything only counts what autograd
    saves (keep, recompute). ``activation_bytes`` is what stays on the device for backward: the kept
    saved tensors and the recomputed blocks' inputs."""

    checkpoint = staticmethod(TORCH_CHECKPOINT)  # how a recomputed block runs its forward

    def __init__(self, setting: Setting):
        super().__init__(setting)
        s = setting
        self.offloading = s.store is not None
        if not self.offloading and type(self).decide is not OffloaderPolicy.decide:
            # Without a store the Offloader only counts: its decide() would never be asked, and the
            # policy would be measured as keep under its own name.
            raise UserError(
                f"{type(self).__name__} decides which blocks to offload (it overrides decide()) but has no store: "
                "register its PolicyEntry with uses_store=True"
            )
        self._counter_store = None if self.offloading else HostStore()
        self.offloader = Offloader(
            s.model,
            s.store if self.offloading else self._counter_store,
            policy=self.decide if self.offloading else "keep",
            layers=s.layers,
            keep_last=s.keep_last,
            min_bytes=s.min_bytes,
            prefetch=s.prefetch,
            always_read_back=s.always_read_back,
        )

    @contextlib.contextmanager
    def reading_back(self) -> Iterator[None]:
        cache = self.offloader.cache
        before, cache.always_read_back = cache.always_read_back, True
        try:
            yield
        finally:
            cache.always_read_back = before

    def decide(self, layer: int) -> str:
        """``"keep"`` or ``"offload"`` for block ``layer`` (the last ``keep_last`` are kept anyway)."""
        return KEEP

    def recomputed(self) -> list[nn.Module]:
        """The blocks recomputed in backward."""
        return []

    @contextlib.contextmanager
    def around(self, counts):
        inputs: dict[StorageKey, int] = {}
        with self.offloader, checkpointed(self.recomputed(), self.checkpoint, inputs):
            yield
        stats = self.offloader.stats
        total = stats.total
        # A recomputed block's inputs that the Offloader saw saved (torch's checkpoint saves the
        # positional ones through its hooks; another block may save a shared one) are counted
        # there already: each storage once.
        held_inputs = sum(nbytes for key, nbytes in inputs.items() if not stats.has(key))
        counts["activation_bytes"] = total.kept_bytes + held_inputs
        counts["bytes_packed"] = total.packed_bytes
        counts["bytes_unique"] = total.unique_bytes
        if self.offloading:
            moved = stats.store
            counts["bytes_written"] = moved.bytes_written
            counts["bytes_read"] = moved.bytes_read
            counts["write_seconds"] = moved.write_seconds
            counts["read_seconds"] = moved.read_seconds
            counts["bytes_made_contiguous"] = moved.bytes_made_contiguous

    def close(self) -> None:
        if self._counter_store is not None:
            self._counter_store.close()


def counting(hooks: torch.autograd.graph.saved_tensors_hooks, parameters: set[int]):
    """Wrap the pack and unpack hooks of ``hooks`` (before it is entered) so that it counts the bytes
    it packs (``packed``), unpacks (``unpacked``) and the unique storages it saw, parameters left
    out (``unique``: storage address -> bytes)."""
    hooks.packed = hooks.unpacked = 0
    hooks.unique = {}
    pack, unpack = hooks.pack_hook, hooks.unpack_hook

    def counting_pack(tensor):
        hooks.packed += tensor.numel() * tensor.element_size()
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            hooks.unique[storage.data_ptr()] = storage.nbytes()
        return pack(tensor)

    def counting_unpack(packed):
        tensor = unpack(packed)
        hooks.unpacked += tensor.numel() * tensor.element_size()
        return tensor

    hooks.pack_hook, hooks.unpack_hook = counting_pack, counting_unpack
    return hooks


class HooksPolicy(Policy):
    """A step under saved-tensor hooks of one's own (:meth:`hooks`, made afresh each step), counted:
    ``bytes_packed`` and ``bytes_unique``. What they keep on the device is theirs to decide, so on a
    GPU the measured activation peak is the memory figure."""

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        raise NotImplementedError

    @contextlib.contextmanager
    def around(self, counts):
        hooks = counting(self.hooks(), self.setting.parameter_storages())
        with hooks:
            yield
        counts["bytes_packed"] = hooks.packed
        counts["bytes_unique"] = sum(hooks.unique.values())
