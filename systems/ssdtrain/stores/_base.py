"""The interface every offload store keeps, ``Store``, and its bookkeeping (see the package).

The contract, the same for every store: ``put(key, tensor)`` copies the tensor's bytes (a
non-contiguous tensor is first made contiguous, a copy) and returns a ``concurrent.futures.Future``;
the caller keeps the tensor alive and unchanged until it completes. ``get(key, out)`` fills a
contiguous ``out`` of the stored shape and dtype, on any device, once the put has completed.
``free(key)`` forgets a tensor (after its transfers in flight end). ``close()`` frees everything
and is idempotent; file stores also run it when garbage-collected and at process exit. GPU work is
ordered by events (streams.py): a future that has completed means the bytes are where they were
asked to be, for any stream. Counters (``counters``) say how much each direction moved and for how
long it was busy; a key is any int that is not already stored.
"""

from __future__ import annotations

import abc
import threading
import time  # busy-time counters; step timing is harness.timing's
from concurrent.futures import Future
from dataclasses import astuple, dataclass

import torch

from harness.errors import UserError, WrongResult
from systems.ssdtrain.streams import ready_event

WRITE, READ = "write", "read"


class StoreCorrupted(WrongResult, AssertionError):
    """A store gave back other bytes than it was given: the store is wrong, nothing it holds can be trusted."""


@dataclass(frozen=True)
class StoreCounters:
    """What a store has moved since it opened; subtract two snapshots for an interval."""

    bytes_written: int = 0  # the tensors' own bytes (no padding), completed puts only
    bytes_read: int = 0
    write_seconds: float = 0.0  # wall time with at least one put in flight (overlaps counted once)
    read_seconds: float = 0.0
    tensors_stored: int = 0  # completed puts
    # Bytes copied on the tensor's own device before a put because the tensor was not contiguous:
    # memory the device holds twice until the write lands.
    bytes_made_contiguous: int = 0

    def __sub__(self, other: StoreCounters) -> StoreCounters:
        return StoreCounters(*(a - b for a, b in zip(astuple(self), astuple(other))))

    def __add__(self, other: StoreCounters) -> StoreCounters:
        return StoreCounters(*(a + b for a, b in zip(astuple(self), astuple(other))))


class _BusyClock:
    """Wall time during which at least one transfer of one direction is in flight."""

    def __init__(self):
        self.in_flight, self.since, self.total = 0, 0.0, 0.0

    def start(self, now: float) -> None:
        if self.in_flight == 0:
            self.since = now
        self.in_flight += 1

    def stop(self, now: float) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.total += now - self.since

    def seconds(self, now: float) -> float:
        return self.total + (now - self.since if self.in_flight else 0.0)


@dataclass
class _Record:
    """A stored tensor: what ``get`` must be given, and its transfers in flight."""

    key: int
    shape: torch.Size
    dtype: torch.dtype
    nbytes: int
    put: Future
    in_flight: int = 0
    freed: bool = False  # free() was called while transfers were in flight: the last one frees


def done_future(result=None) -> Future:
    future = Future()
    future.set_result(result)
    return future


class Store(abc.ABC):
    """The interface (see the module's docstring). Subclasses move bytes in ``_put``, ``_get``,
    ``_free`` and ``_close``; this class checks arguments, keeps the index and counts."""

    name = "store"
    emulated = False

    def __init__(self):
        self._lock = threading.Lock()
        self._records: dict[int, _Record] = {}
        self._clocks = {WRITE: _BusyClock(), READ: _BusyClock()}
        self._moved = {WRITE: 0, READ: 0}
        self._stored = 0
        self._made_contiguous = 0
        self._closed = False

    # -- the interface -----------------------------------------------------------------------
    def put(self, key: int, tensor: torch.Tensor) -> Future:
        self._check_open()
        if not isinstance(key, int):
            raise TypeError(f"{self.name}: keys are ints, got {type(key).__name__}")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{self.name}: put() takes a torch.Tensor, got {type(tensor).__name__}")
        src = tensor.detach()
        made_contiguous = not src.is_contiguous()
        if made_contiguous:
            src = src.contiguous()  # a copy on the caller's stream, kept alive by the transfer below
        nbytes = src.numel() * src.element_size()
        with self._lock:
            if key in self._records:
                raise KeyError(f"{self.name}: key {key} is already stored; free it first")
            self._made_contiguous += nbytes if made_contiguous else 0
            record = _Record(key, src.shape, src.dtype, nbytes, Future())
            self._records[key] = record
        try:
            record.put = self._transfer(record, WRITE, lambda: self._put(key, src, ready_event(src)))
        except BaseException:
            with self._lock:
                del self._records[key]
            raise
        return record.put

    def get(self, key: int, out: torch.Tensor) -> Future:
        self._check_open()
        record = self._records.get(key)
        if record is None:
            raise KeyError(f"{self.name}: key {key} is not stored")
        if not record.put.done():
            raise RuntimeError(f"{self.name}: key {key} is still being written; wait for its put's future")
        if record.put.exception() is not None:
            raise RuntimeError(f"{self.name}: key {key} was never stored: its put failed") from record.put.exception()
        if out.shape != record.shape or out.dtype != record.dtype:
            raise ValueError(
                f"{self.name}: out is {tuple(out.shape)} {out.dtype}, but key {key} holds "
                f"{tuple(record.shape)} {record.dtype}"
            )
        if not out.is_contiguous():
            raise ValueError(f"{self.name}: out must be contiguous (read into a contiguous tensor, then copy)")
        return self._transfer(record, READ, lambda: self._get(key, out, ready_event(out)))

    def free(self, key: int) -> None:
        """Forget ``key``. Its memory or file goes now, or, with transfers of it in flight, as the
        last one ends (before its future completes)."""
        with self._lock:
            if self._closed:
                return  # close() has freed everything
            record = self._records.pop(key, None)
            if record is None:
                raise KeyError(f"{self.name}: key {key} is not stored")
            record.freed = True
            now = record.in_flight == 0
        if now:
            self._free(key)

    def close(self) -> None:
        """Wait for the transfers in flight, then free everything. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._records.clear()
        self._close()

    @property
    def counters(self) -> StoreCounters:
        now = time.monotonic()
        with self._lock:
            return StoreCounters(
                bytes_written=self._moved[WRITE],
                bytes_read=self._moved[READ],
                write_seconds=self._clocks[WRITE].seconds(now),
                read_seconds=self._clocks[READ].seconds(now),
                tensors_stored=self._stored,
                bytes_made_contiguous=self._made_contiguous,
            )

    @property
    def closed(self) -> bool:
        return self._closed

    def refuse_if_closed(self) -> None:
        """A one-line UserError where the store was closed: handed to offload() or an Offloader, it
        would fail only at the first forward, deep in a hook."""
        if self._closed:
            raise UserError(f"the store given ({self.name}) is closed (close() was called): make a new store")

    def __len__(self) -> int:
        """How many tensors it holds."""
        return len(self._records)

    def __bool__(self) -> bool:
        # A store is there even when it holds nothing: without this, ``__len__`` makes an empty
        # store false, and ``if store: store.close()`` or ``store or HostStore()`` pass it over.
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- for subclasses ------------------------------------------------------------------------
    @abc.abstractmethod
    def _put(self, key: int, src: torch.Tensor, ready: torch.cuda.Event | None) -> Future:
        """Start copying contiguous ``src`` (after ``ready``, on a GPU); the future ends when done."""

    @abc.abstractmethod
    def _get(self, key: int, out: torch.Tensor, ready: torch.cuda.Event | None) -> Future:
        """Start filling contiguous ``out`` (after ``ready``, on a GPU); the future ends when done."""

    @abc.abstractmethod
    def _free(self, key: int) -> None:
        """Release ``key``'s memory or file; called with no transfer of it in flight, from any thread."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Wait for everything in flight and release everything."""

    def _check_open(self) -> None:
        if self._closed:
            raise UserError(f"{self.name}: the store is closed (a with block or close() ended it): make a new one")

    def _transfer(self, record: _Record, direction: str, start) -> Future:
        """Run ``start()`` (which returns the subclass's future) under the counters; returns a
        future that completes after the counters are updated, so whoever waits sees them."""
        outer = Future()
        with self._lock:
            self._clocks[direction].start(time.monotonic())
            record.in_flight += 1
        try:
            inner = start()
            if not isinstance(inner, Future):  # a subclass's _put/_get that forgot to return its future
                method = "_put" if direction == WRITE else "_get"
                raise TypeError(
                    f"{self.name}: {type(self).__name__}.{method} returned {type(inner).__name__}, not the "
                    "concurrent.futures.Future of its transfer"
                )
        except BaseException:
            with self._lock:
                self._clocks[direction].stop(time.monotonic())
                record.in_flight -= 1
            raise

        def finish(inner: Future) -> None:
            error = RuntimeError(f"{self.name} was closed before this transfer ran") if inner.cancelled() else None
            error = error or inner.exception()
            with self._lock:
                self._clocks[direction].stop(time.monotonic())
                if error is None:
                    self._moved[direction] += record.nbytes
                    self._stored += direction == WRITE
                record.in_flight -= 1
                free_now = record.freed and record.in_flight == 0
            # Outside the lock: _free may take time, and the caller's callbacks may call back in.
            try:
                if free_now:
                    self._free(record.key)
            finally:
                if error is None:
                    outer.set_result(None)
                else:
                    outer.set_exception(error)

        inner.add_done_callback(finish)
        return outer


def wait_holding(done: torch.cuda.Event, *tensors: torch.Tensor) -> None:
    """Wait for ``done``. ``tensors`` are held until it has happened: the caching allocator must not
    give their memory to new tensors while a side stream still copies from or into it (a source may
    be put()'s own contiguous copy, which nobody else holds)."""
    done.synchronize()
