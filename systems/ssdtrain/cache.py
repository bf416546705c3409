"""The tensor cache: each storage autograd saves for backward is stored once, however many tensors
(views, transposes, splits) are saved from it, and comes back as views of one restored copy.

Identity of a storage. Two saved tensors share an entry when they have the same ``StorageKey``: the
address of the storage's C++ object (the StorageImpl behind ``untyped_storage()``), its data address
and the tensor's version counter. Addresses alone are no identity: once a storage is freed, the
allocator may give its data address, and its StorageImpl's address, to a new tensor (peers that
keyed on an address restored one activation's bytes for another). So every entry holds a weak
reference to its StorageImpl (``StorageWeakRef``). A weak reference keeps the StorageImpl object
allocated, not its data, so its address cannot be reused while the entry exists; the key leaves the
index with the entry. The data address in the key catches a storage whose memory was replaced
(``resize_``, ``set_``), and the version one modified in place between two saves (other bytes).
The version counter is shared by a tensor and its views, but not by the pieces of ``unsafe_chunk``
and ``unsafe_split`` (a GRU cell's gates on the CPU): one piece changed in place after another was
saved leaves the other's counter as it was, so a tensor that is no view yet covers only part of its
storage gets a key of its own (``offload_key``), never an entry made for another tensor.

Life of an entry. ``offload`` starts the store's put and keeps the whole storage in memory until
the put completes. An entry backward asks for (by ``prefetch`` or an unpack) while still in memory
is served from there (forwarding) and stays; otherwise it is read back, once, into a new storage on
the tensor's device, and every handle becomes a view of it. With ``always_read_back`` there is no
forwarding: backward first waits for the put, so every entry it uses is read back from the store
in every step, whatever the timing (a check that the stored bytes are right relies on that).
Autograd drops a handle once backward has used it; with the last handle the entry frees its
memory and the store's copy. Autograd does not check in-place changes of saved tensors when
saved-tensor hooks are active, so the cache checks them while it holds the tensor: a change made
before its put has ended makes its unpack raise, as autograd would without hooks. After that the
tensor is let go (holding it would keep the memory offloading frees), a later change goes unseen,
and backward uses the bytes as they were saved: the values the forward computed with. So whether
such a change raises depends on how fast the store writes (a host store on a CPU writes within
``put``); the gradient is right either way.

Deferred puts. An op may save a tensor before it fills it in place without a version change
(``rrelu_with_noise`` saves its ``noise`` buffer, then draws into it): a put started at once would
store bytes never written. Tensors without autograd history (the only kind such a buffer can be)
are offloaded with ``defer=True``: their puts start at ``start_deferred``, which the engine calls
when their block's forward has ended, after every op of the block has run.
"""

from __future__ import annotations

import functools
import itertools
import threading
from concurrent.futures import Future, wait
from typing import NamedTuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from systems.ssdtrain.stores import Store

# Store keys are never reused in a process: a free deferred until its transfer ends cannot meet a
# later tensor under the same key, even when several caches share a store.
_store_keys = itertools.count()
PRUNE_AT = 4096  # transfers remembered before the finished ones are let go


class StorageKey(NamedTuple):
    impl: int  # the StorageImpl's address, reserved by the StorageWeakRef held with the key
    data_ptr: int
    version: int


def storage_key(tensor: torch.Tensor) -> tuple[StorageKey, StorageWeakRef]:
    """The identity of ``tensor``'s storage, and the weak reference that keeps it unique: hold the
    reference as long as the key is used."""
    storage = tensor.untyped_storage()
    ref = StorageWeakRef(storage)
    return StorageKey(ref.cdata, storage.data_ptr(), tensor._version), ref


_own_keys = itertools.count(1)  # versions of keys that match nothing else (negative: no real version)


def offload_key(tensor: torch.Tensor) -> tuple[StorageKey, StorageWeakRef]:
    """``storage_key``, except for a tensor that may not share its storage's version counter (no
    view, yet not all of its storage: see the module), whose key is unique."""
    key, ref = storage_key(tensor)
    covered = tensor.numel() * tensor.element_size()
    partial = tensor.storage_offset() != 0 or covered != tensor.untyped_storage().nbytes()
    if partial and not tensor._is_view():
        key = key._replace(version=-next(_own_keys))
    return key, ref


def span_bytes(tensor: torch.Tensor) -> int:
    """The bytes of its storage that ``tensor`` reaches, from its first element to its last."""
    if tensor.numel() == 0:
        return 0
    reach = 1 + sum((size - 1) * abs(stride) for size, stride in zip(tensor.shape, tensor.stride()))
    return reach * tensor.element_size()


def whole_storage(tensor: torch.Tensor) -> torch.Tensor:
    """A uint8 tensor over all of ``tensor``'s storage (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage())


def modified_error(version: int, now: int) -> RuntimeError:
    return RuntimeError(
        f"a tensor saved for backward was modified in place after it was saved (version {version}, now {now}); "
        "autograd raises the same without the offloader: clone it before the in-place operation"
    )


class Entry:
    """One stored storage, its bytes in the store and, while needed, in memory."""

    def __init__(self, tensor: torch.Tensor, key: StorageKey, ref: StorageWeakRef, layer: int):
        self.store_key = next(_store_keys)
        self.key, self.ref, self.layer = key, ref, layer
        self.version = tensor._version  # as saved (the key's may be a unique one: offload_key)
        self.device = tensor.device
        self.nbytes = tensor.untyped_storage().nbytes()
        self.source = tensor  # the saved tensor, until its bytes are in the store (version check)
        self.memory: torch.Tensor | None = whole_storage(tensor)  # the bytes on the device, when there
        self.put: Future | None = None
        self.load: tuple[Future, torch.Tensor] | None = None  # the read back: its future and its bytes
        self.written = False  # the put has ended well
        self.wanted = False  # backward wants it: memory still holding it stays
        self.problem: Exception | None = None  # why the stored bytes cannot be used
        self.refs = 0  # live handles
        self.released = False


class Handle:
    """What autograd holds for an offloaded tensor: its entry and where in the storage it lies."""

    __slots__ = ("cache", "entry", "dtype", "offset", "shape", "stride")

    def __init__(self, cache: TensorCache, entry: Entry, tensor: torch.Tensor):
        self.cache, self.entry = cache, entry
        self.dtype, self.offset, self.shape, self.stride = (
            tensor.dtype,
            tensor.storage_offset(),
            tensor.shape,
            tensor.stride(),
        )

    def view_of(self, memory: torch.Tensor) -> torch.Tensor:
        return torch.empty(0, dtype=self.dtype, device=memory.device).set_(
            memory.untyped_storage(), self.offset, self.shape, self.stride
        )

    def __del__(self):
        self.cache.release(self.entry)


class TensorCache:
    """Entries by storage identity, their transfers to and from ``store``, and their lifetimes."""

    def __init__(self, store: Store, *, always_read_back: bool = False):
        self.store = store
        self.always_read_back = always_read_back
        # Reentrant: a store may complete a transfer, and run its callback, inside the call.
        self._lock = threading.RLock()
        self._index: dict[StorageKey, Entry] = {}
        self._by_layer: dict[int, dict[int, Entry]] = {}
        self._transfers: list[Future] = []  # every put and get started since the last reset, unfinished
        self._deferred: list[Entry] = []  # entries whose puts wait for start_deferred (see the module)
        self._prune_at = PRUNE_AT
        self.error: BaseException | None = None  # the first failed transfer, for the engine to raise
        # Reads back started by prefetch, and by an unpack that found nothing on its way (a stall).
        self.prefetched_loads = self.demand_loads = 0

    def _track(self, transfer: Future) -> None:
        """Remember a transfer for :meth:`reset`; finished ones are let go now and then, so a block
        around a whole training loop does not grow with it (their errors are in ``error``)."""
        self._transfers.append(transfer)
        if len(self._transfers) >= self._prune_at:
            self._transfers = [t for t in self._transfers if not t.done()]
            self._prune_at = max(PRUNE_AT, 2 * len(self._transfers))

    def start_step(self) -> None:
        """Forget the last step's error and counts."""
        with self._lock:
            self.error = None
            self.prefetched_loads = self.demand_loads = 0

    def holds(self, key: StorageKey) -> bool:
        with self._lock:
            return key in self._index

    def offload(
        self, tensor: torch.Tensor, layer: int, key: StorageKey, ref: StorageWeakRef, *, defer: bool = False
    ) -> tuple[Handle, bool]:
        """A handle for ``tensor``, whose ``storage_key`` is ``key, ref``; True when its storage is
        new to the cache (its put has started, or with ``defer`` waits for ``start_deferred``)."""
        with self._lock:
            entry = self._index.get(key)
            new = entry is None
            if new:
                entry = Entry(tensor, key, ref, layer)
                self._index[key] = entry
                self._by_layer.setdefault(layer, {})[entry.store_key] = entry
            elif layer > entry.layer:
                # Saved again by a later layer (Llama's rotary cos and sin are saved by every
                # layer): that layer's backward comes first, so prefetch it with that layer.
                del self._by_layer[entry.layer][entry.store_key]
                self._by_layer.setdefault(layer, {})[entry.store_key] = entry
                entry.layer = layer
            entry.refs += 1
            handle = Handle(self, entry, tensor)
            if new and defer:
                self._deferred.append(entry)
            elif new:
                self._start_put(entry)
        if new and not defer:
            entry.put.add_done_callback(lambda future: self._written(entry, future))
        return handle, new

    def _start_put(self, entry: Entry) -> None:
        """Under the lock; the caller adds the completion callback once the lock is released."""
        entry.put = self.store.put(entry.store_key, entry.memory)
        self._track(entry.put)

    def start_deferred(self) -> None:
        """Start the puts offloaded with ``defer`` (see the module)."""
        if not self._deferred:
            return
        with self._lock:
            entries, self._deferred = [e for e in self._deferred if not e.released], []
            for entry in entries:
                self._start_put(entry)
        for entry in entries:
            entry.put.add_done_callback(functools.partial(self._written, entry))

    def _written(self, entry: Entry, future: Future) -> None:
        """The put of ``entry`` has ended: let go of its memory unless backward wants it."""
        with self._lock:
            if future.exception() is not None:
                self.error = self.error or future.exception()
                return  # the bytes stay in memory; the engine raises the error
            if entry.released or entry.written:
                return
            entry.written = True
            if entry.source._version != entry.version:
                # Changed while being written: the stored bytes may be either version. Only an
                # unpack raises, as autograd would: a tensor never used again is no error.
                entry.problem = modified_error(entry.version, entry.source._version)
            entry.source = None
            if not entry.wanted:
                entry.memory = None  # the store has the bytes; the device memory may go

    def _written_before_use(self, entries: list[Entry]) -> None:
        """Without forwarding: wait until the puts of ``entries`` have ended and their memory is
        gone, so that backward reads them back from the store (a failed put raises here)."""
        if not self.always_read_back:
            return
        for entry in entries:
            if entry.put is not None and not entry.released:
                entry.put.result()
                self._written(entry, entry.put)  # its callback may still be on its way

    def unpack(self, handle: Handle, *, for_backward: bool = True) -> torch.Tensor:
        """The tensor ``handle`` stands for, from memory while its put has not ended, else read
        back. ``for_backward=False``: a read before the step's backward (a backward run inside a
        block's forward), which neither keeps the tensor in memory for later nor keeps what it read."""
        entry = handle.entry
        self._written_before_use([entry])
        with self._lock:
            if entry.problem is not None:
                raise entry.problem
            if entry.released:
                raise RuntimeError(
                    "a saved activation was used after the Offloader freed it (its step ended: the end of the "
                    "with block, reset() or an error); run backward inside the with block"
                )
            if entry.source is not None and entry.source._version != entry.version:
                raise modified_error(entry.version, entry.source._version)
            memory, reading = entry.memory, None
            if for_backward:
                entry.wanted = True  # if still in memory (forwarding: its put has not ended), it stays
                if memory is None:
                    self.demand_loads += entry.load is None
                    reading, memory = self._start_load(entry)
            elif memory is None:
                memory = torch.empty(entry.nbytes, dtype=torch.uint8, device=entry.device)
                reading = self.store.get(entry.store_key, memory)
        if reading is not None:
            reading.result()  # raises the store's error, if any
        return handle.view_of(memory)

    def _start_load(self, entry: Entry) -> tuple[Future, torch.Tensor]:
        """The read of ``entry`` back into device memory, started if it is not yet (under the lock)."""
        if entry.load is None:
            out = torch.empty(entry.nbytes, dtype=torch.uint8, device=entry.device)
            entry.load = (self.store.get(entry.store_key, out), out)
            self._track(entry.load[0])
            # The callback must not hold ``out``: the future (and its callbacks) may live in
            # _transfers until the step ends, and the read-back bytes must go with their entry.
            entry.load[0].add_done_callback(functools.partial(self._loaded, entry))
        return entry.load

    def _loaded(self, entry: Entry, future: Future) -> None:
        with self._lock:
            if future.exception() is not None:
                self.error = self.error or future.exception()
            elif not entry.released and entry.load is not None:
                entry.memory = entry.load[1]

    def prefetch(self, layer: int) -> None:
        """Start reading back every entry of ``layer`` that is only in the store, and keep in
        memory those still there (their puts have not ended)."""
        with self._lock:
            entries = list(self._by_layer.get(layer, {}).values())
        self._written_before_use(entries)
        with self._lock:
            for entry in entries:
                if entry.released:
                    continue
                entry.wanted = True
                if entry.memory is None and entry.load is None:
                    self.prefetched_loads += 1
                    self._start_load(entry)

    def layers(self) -> list[int]:
        """The layers that have entries, in descending order (the order backward needs them)."""
        with self._lock:
            return sorted((layer for layer, entries in self._by_layer.items() if entries), reverse=True)

    def release(self, entry: Entry) -> None:
        """One handle of ``entry`` is gone; the last one frees the entry."""
        with self._lock:
            entry.refs -= 1
            if entry.refs == 0 and not entry.released:
                self._drop(entry)

    def _drop(self, entry: Entry) -> None:
        entry.released = True
        entry.source = entry.memory = entry.load = None
        del self._index[entry.key]
        del self._by_layer[entry.layer][entry.store_key]
        if entry.put is not None:
            self.store.free(entry.store_key)  # the store waits for the entry's transfers in flight

    def wait_puts(self) -> None:
        """Wait until every put started so far, deferred ones included, has ended and its entry has
        let go of the memory."""
        self.start_deferred()
        with self._lock:
            entries = [e for e in self._index.values() if e.put is not None]
        wait([e.put for e in entries])
        # A future's callbacks may still be running when wait() returns; _written is idempotent.
        for entry in entries:
            self._written(entry, entry.put)

    def reset(self) -> None:
        """Wait for every transfer in flight, also those of entries already gone (their frees wait
        for them), then free every entry: the store holds nothing after."""
        with self._lock:
            transfers, self._transfers, self._deferred = self._transfers, [], []
        wait(transfers)
        with self._lock:
            for entry in list(self._index.values()):
                if not entry.released:  # a handle collected meanwhile may have dropped it
                    self._drop(entry)

    def __len__(self) -> int:
        return len(self._index)
