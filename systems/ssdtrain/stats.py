"""Per-step bookkeeping of what autograd saved and where it went, in total and per layer.

Bytes are counted two ways: ``packed`` counts every save with the saved tensor's own bytes (a tensor
saved by three operations counts three times); ``unique`` counts each storage once, whole, in the
layer that saved it first. The unique bytes split into ``offloaded`` (sent to the store),
``parameter`` (the model's parameters and buffers and their casts under autocast, never
offloaded) and ``kept`` (the rest, held on the device for backward: the policy's keep, the last
layers, tensors below ``min_bytes`` and those saved outside the layers). ``unoffloadable`` counts
the kept storages no policy could offload: below ``min_bytes``, or without a storage of their own.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from systems.ssdtrain.cache import StorageKey
from systems.ssdtrain.stores import StoreCounters

# Why saved tensors gave a store nothing, decided from the largest storage saved: every one empty
# (a batch of 0 rows), every one below min_bytes, or large enough but none a store can take (no
# storage of its own: meta or subclass tensors; or the model's weights).
EMPTY, BELOW_MIN_BYTES, NOT_STORABLE = "empty", "below_min_bytes", "not_storable"


def why_nothing_moved(largest: int, min_bytes: int) -> str:
    """One of :data:`EMPTY`, :data:`BELOW_MIN_BYTES` or :data:`NOT_STORABLE` for saved tensors none
    of which was offloaded, ``largest`` being the largest storage among them in bytes."""
    if largest == 0:
        return EMPTY
    if largest < max(min_bytes, 1):
        return BELOW_MIN_BYTES
    return NOT_STORABLE


@dataclass
class LayerStats:
    packed_tensors: int = 0
    packed_bytes: int = 0
    unique_tensors: int = 0
    unique_bytes: int = 0
    offloaded_tensors: int = 0
    offloaded_bytes: int = 0
    parameter_bytes: int = 0
    unoffloadable_bytes: int = 0

    @property
    def kept_bytes(self) -> int:
        return self.unique_bytes - self.offloaded_bytes - self.parameter_bytes

    def __add__(self, other: LayerStats) -> LayerStats:
        return LayerStats(*(a + b for a, b in zip(astuple(self), astuple(other))))

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"kept_bytes": self.kept_bytes}


PRUNE_AT = 4096  # storages counted before the references of freed ones are let go


class StepStats:
    """One step's ``LayerStats`` by layer index (None: saved outside the model's layers); set when
    the step ends: what the store moved (``store``) and how reads back started."""

    def __init__(self):
        self.layers: dict[int | None, LayerStats] = {}
        self.store: StoreCounters | None = None
        # Reads back started ahead by prefetch, and by an unpack that found nothing on its way (a
        # stall of backward); a tensor still in memory needs neither.
        self.prefetched_loads = self.demand_loads = 0
        # Per layer, the largest storage saved that is no parameter's (what ``min_bytes`` is set against).
        self.largest: dict[int | None, int] = {}
        # Weak references to every storage counted: they keep the keys unique (cache.py). Those of
        # freed storages, and older versions of live ones, are let go now and then, so a block
        # around a whole training loop does not grow with it (a freed storage's key cannot come back
        # while its reference is held, and a new storage at its address is a new key once it is let go).
        self._seen: dict[StorageKey, StorageWeakRef] = {}
        self._prune_at = PRUNE_AT

    def record(
        self,
        tensor: torch.Tensor,
        layer: int | None,
        key: tuple[StorageKey, StorageWeakRef] | None,
        *,
        parameter: bool = False,
        offloaded: bool = False,
        unoffloadable: bool = False,
    ) -> None:
        """One save of ``tensor``; ``key`` is its storage's identity (None: a tensor without one,
        counted as unique and unoffloadable), ``offloaded`` says that this save sent a new storage
        to the store, ``unoffloadable`` that no policy would (below ``min_bytes``)."""
        stats = self.layers.setdefault(layer, LayerStats())
        nbytes = tensor.numel() * tensor.element_size()
        stats.packed_tensors += 1
        stats.packed_bytes += nbytes
        storage_bytes = nbytes if key is None else tensor.untyped_storage().nbytes()
        if not parameter:
            self.largest[layer] = max(self.largest.get(layer, 0), storage_bytes)
        if key is None:
            stats.unique_tensors += 1
            stats.unique_bytes += nbytes
            stats.unoffloadable_bytes += nbytes
            return
        if key[0] not in self._seen:
            self._seen[key[0]] = key[1]
            if len(self._seen) >= self._prune_at:
                self._prune()
            stats.unique_tensors += 1
            stats.unique_bytes += storage_bytes
            stats.parameter_bytes += storage_bytes if parameter else 0
            stats.unoffloadable_bytes += storage_bytes if unoffloadable and not parameter else 0
        if offloaded:
            stats.offloaded_tensors += 1
            stats.offloaded_bytes += storage_bytes

    def _prune(self) -> None:
        """Let go of the keys of freed storages, and of the older versions of a live one: a weight
        the optimizer updates in place is a new key (version) every step, and no tensor of an older
        version can be saved again (versions only grow)."""
        live = {k: ref for k, ref in self._seen.items() if not ref.expired()}
        newest: dict[tuple[int, int], int] = {}
        for k in live:
            if k.version >= 0:  # (negative: a key of its own, no version of a shared counter)
                where = (k.impl, k.data_ptr)
                newest[where] = max(newest.get(where, k.version), k.version)
        self._seen = {k: ref for k, ref in live.items() if k.version < 0 or k.version == newest[(k.impl, k.data_ptr)]}
        self._prune_at = max(PRUNE_AT, 2 * len(self._seen))

    def has(self, key: StorageKey) -> bool:
        """Whether this step has counted the storage ``key`` already."""
        return key in self._seen

    @property
    def total(self) -> LayerStats:
        return sum(self.layers.values(), LayerStats())
