"""Where offloaded tensors go: one interface, ``Store``, and its implementations.

- ``HostStore``: host memory (page-locked for GPU tensors); the bound any SSD is compared with.
- ``DirectFileStore``: one file per tensor on a real disk, O_DIRECT, a pool of I/O threads.
- ``EmulatedStore``: another store throttled to a given bandwidth, standing in for a disk array this
  machine lacks; ``emulated`` is True so results say so.
- ``KvikioStore``: one file per tensor through kvikio (cuFile; GPUDirect Storage where the machine
  has it), for GPU tensors.

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
import errno
import threading
import time  # busy-time counters and the emulated device's pacing; step timing is harness.timing's
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import astuple, dataclass
from pathlib import Path

import torch

from harness.errors import NeedsGpuError, UserError
from harness.resources import block_device_counters, device_bytes
from systems.ssdtrain import fileio
from systems.ssdtrain.streams import copy_after, copy_and_wait, ready_event

WRITE, READ = "write", "read"


@dataclass(frozen=True)
class StoreCounters:
    """What a store has moved since it opened; subtract two snapshots for an interval."""

    bytes_written: int = 0  # the tensors' own bytes (no padding), completed puts only
    bytes_read: int = 0
    write_seconds: float = 0.0  # wall time with at least one put in flight (overlaps counted once)
    read_seconds: float = 0.0
    tensors_stored: int = 0  # completed puts

    def __sub__(self, other: StoreCounters) -> StoreCounters:
        return StoreCounters(*(a - b for a, b in zip(astuple(self), astuple(other))))


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


def _done_future(result=None) -> Future:
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
        self._closed = False

    # -- the interface -----------------------------------------------------------------------
    def put(self, key: int, tensor: torch.Tensor) -> Future:
        self._check_open()
        if not isinstance(key, int):
            raise TypeError(f"{self.name}: keys are ints, got {type(key).__name__}")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{self.name}: put() takes a torch.Tensor, got {type(tensor).__name__}")
        src = tensor.detach()
        if not src.is_contiguous():
            src = src.contiguous()  # a copy on the caller's stream, kept alive by the transfer below
        nbytes = src.numel() * src.element_size()
        with self._lock:
            if key in self._records:
                raise KeyError(f"{self.name}: key {key} is already stored; free it first")
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
            )

    def __len__(self) -> int:
        return len(self._records)

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
            raise RuntimeError(f"{self.name}: the store is closed")

    def _transfer(self, record: _Record, direction: str, start) -> Future:
        """Run ``start()`` (which returns the subclass's future) under the counters; returns a
        future that completes after the counters are updated, so whoever waits sees them."""
        outer = Future()
        with self._lock:
            self._clocks[direction].start(time.monotonic())
            record.in_flight += 1
        try:
            inner = start()
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


def _wait_holding(done: torch.cuda.Event, *tensors: torch.Tensor) -> None:
    """Wait for ``done``. ``tensors`` are held until it has happened: the caching allocator must not
    give their memory to new tensors while a side stream still copies from or into it (a source may
    be put()'s own contiguous copy, which nobody else holds)."""
    done.synchronize()


class HostStore(Store):
    """Host memory: page-locked for GPU tensors (so copies are DMA on the store's own stream),
    plain for CPU tensors (a copy done before ``put`` returns)."""

    name = "host"

    def __init__(self):
        super().__init__()
        self._buffers: dict[int, torch.Tensor] = {}
        self._waiter: ThreadPoolExecutor | None = None  # waits for GPU copies to end

    def _put(self, key, src, ready):
        buffer = torch.empty(src.shape, dtype=src.dtype, pin_memory=src.is_cuda)
        future = self._copy(buffer, src, ready)
        self._buffers[key] = buffer
        return future

    def _get(self, key, out, ready):
        return self._copy(out, self._buffers[key], ready)

    def _copy(self, dst, src, ready) -> Future:
        done = copy_after(dst, src, ready)
        if done is None:
            return _done_future()
        with self._lock:
            if self._waiter is None:
                self._waiter = ThreadPoolExecutor(1, thread_name_prefix="ssdtrain-host")
        return self._waiter.submit(_wait_holding, done, dst, src)

    def _free(self, key):
        self._buffers.pop(key, None)

    def _close(self):
        if self._waiter is not None:
            self._waiter.shutdown(wait=True)
        self._buffers.clear()


def _sleep_until(deadline: float) -> None:
    # sleep() may return early on some systems; the monotonic clock decides.
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(left)


class EmulatedStore(Store):
    """``inner`` (a new HostStore by default) throttled to ``bandwidth_gbps`` GB/s (10^9 B/s).

    The emulated device serves one transfer at a time, reads and writes alike, in the order they
    were asked for: each one ends no earlier than ``bytes / bandwidth`` after the previous one ended
    (or after it was asked for, if the device was idle), read on the monotonic clock, and never
    before the inner store has really finished it. The store owns ``inner`` and closes it.
    """

    emulated = True

    def __init__(self, bandwidth_gbps: float, inner: Store | None = None):
        if not isinstance(bandwidth_gbps, int | float) or not bandwidth_gbps > 0:
            raise UserError(f"EmulatedStore: bandwidth_gbps must be a positive number of GB/s, got {bandwidth_gbps!r}")
        super().__init__()
        self.inner = inner if inner is not None else HostStore()
        self.bandwidth_gbps = bandwidth_gbps
        self.name = f"emulated_{bandwidth_gbps:g}gbps_{self.inner.name}"
        self._free_at = 0.0  # when the emulated device finishes the transfers queued so far
        self._timer = ThreadPoolExecutor(1, thread_name_prefix="ssdtrain-throttle")

    def _throttle(self, asked: float, inner: Future, nbytes: int) -> Future:
        """The inner transfer, asked for at ``asked``, made to end no earlier than the device allows."""
        with self._lock:  # deadlines and the timer's queue in the same order
            start = max(asked, self._free_at)
            self._free_at = deadline = start + nbytes / (self.bandwidth_gbps * 1e9)
            return self._timer.submit(lambda: (inner.result(), _sleep_until(deadline)))

    # The clock is read before the inner transfer starts: a host copy done inside put() or get()
    # overlaps the emulated transfer instead of adding to it.
    def _put(self, key, src, ready):
        asked = time.monotonic()
        return self._throttle(asked, self.inner.put(key, src), src.numel() * src.element_size())

    def _get(self, key, out, ready):
        asked = time.monotonic()
        return self._throttle(asked, self.inner.get(key, out), out.numel() * out.element_size())

    def _free(self, key):
        self.inner.free(key)

    def _close(self):
        self._timer.shutdown(wait=True)
        self.inner.close()


def _close_files(pool: ThreadPoolExecutor, directory: Path) -> None:
    # A function, not a method: weakref.finalize must not hold the store.
    pool.shutdown(wait=True, cancel_futures=True)
    fileio.remove_scratch(directory)


class _FileStore(Store):
    """One file per tensor in a private folder made inside ``folder``; the folder and every file in
    it are removed on ``close()``, when the store is garbage-collected, and at process exit."""

    def __init__(self, folder, *, threads: int, direct: bool):
        if not isinstance(threads, int) or threads < 1:
            raise UserError(f"{type(self).__name__}: threads must be a positive integer, got {threads!r}")
        super().__init__()
        self.folder = Path(folder)
        self.directory = fileio.make_scratch(self.folder, direct=direct)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=f"ssdtrain-{self.name}")
        self._cleanup = weakref.finalize(self, _close_files, self._pool, self.directory)
        self._file_bytes = {WRITE: 0, READ: 0}  # what the files were asked for, padding included
        self._device_stat = block_device_counters(self.directory)
        self._device_start = device_bytes(self._device_stat) if self._device_stat else None

    def path_of(self, key: int) -> Path:
        return self.directory / f"{key}.bin"

    def _count_file_bytes(self, direction: str, nbytes: int) -> None:
        with self._lock:
            self._file_bytes[direction] += nbytes

    def _free(self, key):
        self.path_of(key).unlink(missing_ok=True)

    def _close(self):
        self._cleanup()

    def device_bytes_ratio(self) -> tuple[float, float]:
        """(read, write): bytes the block device holding the folder read and wrote since this store
        opened, per byte this store read from and wrote to its files. Reads well below 1 mean the
        page cache served them, not the disk; writes come out a little above 1 (file-system
        metadata). The device's counters include other programs' I/O at the same time. NaN for a
        direction this store has not used."""
        if self._device_stat is None:
            raise UserError(
                f"{self.folder} is not on a block device (overlay or network file system?), so there are no "
                "device byte counters to check the page cache against"
            )
        now = device_bytes(self._device_stat)
        with self._lock:
            asked = (self._file_bytes[READ], self._file_bytes[WRITE])
        return tuple(
            (done - start) / n if n else float("nan") for done, start, n in zip(now, self._device_start, asked)
        )


class DirectFileStore(_FileStore):
    """Files on a real disk written and read with O_DIRECT (fileio.py) by ``threads`` threads, each
    through its own aligned bounce buffer of ``block_bytes`` (page-locked where there is a GPU, so
    device copies are DMA). One tensor is one task: tensors move in parallel, a tensor's blocks in
    order. A folder on tmpfs, or on a file system that refuses O_DIRECT, is refused at once. The
    default block is the size that reached the disk's full speed on the H200 machine (64 MiB
    requests: 2.1-2.3 GB/s written, against 1.5 with 16 MiB; REFERENCE.md §4)."""

    name = "direct_file"

    def __init__(self, folder, *, threads: int = 4, block_bytes: int = 64 << 20):
        if not isinstance(block_bytes, int) or block_bytes <= 0 or block_bytes % fileio.ALIGN:
            raise UserError(
                f"DirectFileStore: block_bytes must be a positive multiple of {fileio.ALIGN}, got {block_bytes!r}"
            )
        self.block_bytes = block_bytes
        self._local = threading.local()  # each I/O thread's bounce buffer
        super().__init__(folder, threads=threads, direct=True)

    def _buffer(self) -> fileio.BounceBuffer:
        if not hasattr(self._local, "buffer"):
            self._local.buffer = fileio.BounceBuffer(self.block_bytes, pin=torch.cuda.is_available())
        return self._local.buffer

    def _put(self, key, src, ready):
        return self._pool.submit(self._write, self.path_of(key), src.reshape(-1).view(torch.uint8), ready)

    def _get(self, key, out, ready):
        return self._pool.submit(self._read, self.path_of(key), out.reshape(-1).view(torch.uint8), ready)

    def _write(self, path: Path, data: torch.Tensor, ready) -> None:
        def stage(offset, n, block):
            copy_and_wait(block, data[offset : offset + n], ready)

        self._count_file_bytes(WRITE, fileio.write_file(path, data.numel(), self._buffer(), stage))

    def _read(self, path: Path, data: torch.Tensor, ready) -> None:
        def stage(offset, n, block):
            copy_and_wait(data[offset : offset + n], block, ready)

        self._count_file_bytes(READ, fileio.read_file(path, data.numel(), self._buffer(), stage))


class KvikioStore(_FileStore):
    """Files written and read by kvikio straight from and into GPU memory (cuFile: GPUDirect
    Storage where the machine has nvidia-fs, kvikio's POSIX compatibility mode otherwise). GPU
    tensors only. kvikio is imported here, not installed by the suite: constructing the store
    without kvikio or without a GPU raises, saying which."""

    name = "kvikio"

    def __init__(self, folder, *, threads: int = 4):
        try:
            import kvikio
        except ImportError as err:
            raise UserError(
                f"KvikioStore needs the kvikio package, which does not import here ({err}); install kvikio-cu13 "
                "on the GPU machine, or use DirectFileStore"
            ) from None
        if not torch.cuda.is_available():
            raise NeedsGpuError("KvikioStore moves files to and from GPU memory and this machine has no usable GPU")
        self._kvikio = kvikio
        super().__init__(folder, threads=threads, direct=False)

    def _put(self, key, src, ready):
        if not src.is_cuda:
            raise ValueError(f"KvikioStore stores GPU tensors; this one is on {src.device}")
        return self._pool.submit(self._write, self.path_of(key), src.reshape(-1).view(torch.uint8), ready)

    def _get(self, key, out, ready):
        if not out.is_cuda:
            raise ValueError(f"KvikioStore reads into GPU tensors; out is on {out.device}")
        return self._pool.submit(self._read, self.path_of(key), out.reshape(-1).view(torch.uint8), ready)

    # kvikio reads and writes device memory outside stream order, so each transfer first waits on
    # the host for the caller's stream to reach its ready event.
    def _write(self, path: Path, data: torch.Tensor, ready) -> None:
        ready.synchronize()
        try:
            with self._kvikio.CuFile(path, "w") as file:
                done = file.pwrite(data).get()
            if done != data.numel():
                raise OSError(errno.EIO, f"short write: {done} of {data.numel()} bytes")
        except BaseException as err:
            path.unlink(missing_ok=True)
            if isinstance(err, OSError):
                raise fileio.explain(err, path, "writing") from err
            raise
        self._count_file_bytes(WRITE, data.numel())

    def _read(self, path: Path, data: torch.Tensor, ready) -> None:
        ready.synchronize()
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise UserError(
                f"{path} is missing: the stored tensor's file was removed behind the store's back"
            ) from None
        if size != data.numel():
            raise UserError(f"{path} holds {size} bytes, not the {data.numel()} written: truncated or replaced")
        with self._kvikio.CuFile(path, "r") as file:
            done = file.pread(data).get()
        if done != data.numel():
            raise UserError(f"{path}: short read, {done} of {data.numel()} bytes (file truncated?)")
        self._count_file_bytes(READ, data.numel())
