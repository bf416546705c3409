"""disk: sequential write and read of one file with O_DIRECT, by request size and thread count.

O_DIRECT keeps the page cache out of the way (a host with more RAM than the file would otherwise
serve reads from DRAM). The block device's own byte counters (/sys/dev/block/MAJ:MIN/stat, read
by harness.resources) are read around every repetition: the probe records how many bytes reached the device per byte
requested, and refuses a read whose bytes did not come from the device. A scratch directory that
is not on a block device (tmpfs, overlay) is refused: nothing could prove the numbers are disk's.
Each thread writes or reads its own contiguous slice of the file. Writes end with fsync, so their
time includes getting the data onto the device. Variants: ``write`` creates the file anew each
repetition (the filesystem allocates blocks, as when every tensor gets a new file), ``overwrite``
rewrites the existing file in place, ``read`` reads it back.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import os
import secrets
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.errors import UserError
from harness.progress import progress
from harness.resources import block_device_counters, device_bytes, open_direct
from harness.timing import measure

MIB = 1 << 20
PAGE = 4096
SHIFTS = 16
# A read repetition must see at least this share of its bytes at the device.
MIN_DEVICE_SHARE = 0.95


def _open_direct(path: Path, flags: int) -> int:
    return open_direct(path, flags, hint="set scratch_dir (--config scratch_dir=DIR) to a directory on a local disk")


class _Transfer:
    """One file moved in ``threads`` slices of ``block`` bytes each request."""

    def __init__(self, path: Path, file_bytes: int, block: int, threads: int):
        self.path, self.block, self.threads = path, block, threads
        self.blocks_per_thread = file_bytes // block // threads
        # Page-aligned buffers (mmap), as O_DIRECT requires, of random bytes (never zeros). Each
        # request writes from a different 4 KiB offset into its thread's buffer, so consecutive
        # requests carry different data (a compressing or de-duplicating device gains little).
        self.buffers = [mmap.mmap(-1, block + SHIFTS * PAGE) for _ in range(threads)]
        for buf in self.buffers:
            buf.write(secrets.token_bytes(len(buf)))
        self.pool = ThreadPoolExecutor(threads)

    @property
    def nbytes(self) -> int:
        return self.blocks_per_thread * self.block * self.threads

    def _slice(self, fd: int, t: int, write: bool) -> None:
        view = memoryview(self.buffers[t])
        first = t * self.blocks_per_thread
        for i in range(first, first + self.blocks_per_thread):
            offset = i * self.block
            shift = (i % SHIFTS) * PAGE
            buf = view[shift : shift + self.block]
            done = os.pwrite(fd, buf, offset) if write else os.preadv(fd, [buf], offset)
            if done != self.block:
                raise OSError(f"short {'write' if write else 'read'} at offset {offset}: {done} of {self.block} bytes")

    def _run(self, fd: int, write: bool) -> None:
        for f in [self.pool.submit(self._slice, fd, t, write) for t in range(self.threads)]:
            f.result()

    def write(self) -> None:
        self._write(os.O_CREAT | os.O_TRUNC)

    def overwrite(self) -> None:
        self._write(0)

    def _write(self, flags: int) -> None:
        fd = _open_direct(self.path, os.O_WRONLY | flags)
        try:
            self._run(fd, write=True)
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> None:
        fd = _open_direct(self.path, os.O_RDONLY)
        try:
            self._run(fd, write=False)
        finally:
            os.close(fd)

    def close(self) -> None:
        self.pool.shutdown()
        for buf in self.buffers:
            # A failed request's traceback still holds views of its buffer: that buffer is freed
            # with them, and its BufferError would hide the failure that is being raised (ENOSPC).
            with contextlib.suppress(BufferError):
                buf.close()


class _CountedCall:
    """Wraps a transfer so each call also records the device bytes it caused."""

    def __init__(self, fn, stat: Path, column: int):
        self.fn, self.stat, self.column = fn, stat, column
        self.device_bytes: list[int] = []

    def __call__(self) -> None:
        before = device_bytes(self.stat)[self.column]
        self.fn()
        self.device_bytes.append(device_bytes(self.stat)[self.column] - before)


def run(params: dict, writer, *, repeat: int, warmup: int, scratch_dir: Path, **_) -> dict:
    repeat = params.get("repeat", repeat)
    warmup = params.get("warmup", warmup)
    scratch_dir = Path(scratch_dir)
    # Checked on the nearest folder that exists (a folder made in it lies on its device), so that
    # a refused scratch_dir is not left behind, made and empty.
    existing = scratch_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    stat = block_device_counters(existing)
    if stat is None:
        raise UserError(
            f"scratch_dir {scratch_dir} is not on a block device (tmpfs or overlay?), so the disk "
            "probe cannot prove its bytes reached a disk; set scratch_dir to a directory on a local disk"
        )
    free = shutil.disk_usage(existing).free
    if params["file_size_mib"] * MIB > free:
        raise UserError(
            f"disk: file_size_mib={params['file_size_mib']} needs that much space on scratch_dir {scratch_dir}'s "
            f"disk, which has {free // MIB} MiB free"
        )
    scratch_dir.mkdir(parents=True, exist_ok=True)
    path = scratch_dir / f"disk-probe-{os.getpid()}.bin"
    cases = list(itertools.product(params["block_sizes_kib"], params["threads"]))
    try:
        for block_kib, threads in progress(cases, desc="disk"):
            transfer = _Transfer(path, params["file_size_mib"] * MIB, block_kib * 1024, threads)
            if transfer.blocks_per_thread == 0:
                raise UserError(
                    f"disk: file_size_mib={params['file_size_mib']} is too small for "
                    f"{threads} threads of {block_kib} KiB requests"
                )
            try:
                for variant, column in (("write", 1), ("overwrite", 1), ("read", 0)):
                    call = _CountedCall(getattr(transfer, variant), stat, column)
                    # The first write creates the file that the other variants use.
                    m = measure(call, device="cpu", repeat=repeat, warmup=warmup if variant == "write" else 0)
                    config = {
                        "device": "cpu",
                        "size_bytes": transfer.nbytes,
                        "block_bytes": transfer.block,
                        "threads": threads,
                    }
                    writer.add_measurement(m, role="probe", variant=variant, bytes_moved=transfer.nbytes, config=config)
                    timed = call.device_bytes[-repeat:]
                    for rep, counted in enumerate(timed):
                        writer.add(
                            role="probe",
                            variant=variant,
                            config=config,
                            metric="device_bytes_ratio",
                            value=counted / transfer.nbytes,
                            unit="ratio",
                            repetition=rep,
                        )
                    if variant == "read" and min(timed) < MIN_DEVICE_SHARE * transfer.nbytes:
                        raise RuntimeError(
                            f"disk read: the device saw only {min(timed) / transfer.nbytes:.0%} of the bytes read; "
                            "the page cache was not bypassed, so this is not a disk measurement"
                        )
            finally:
                transfer.close()
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    counters = f"verified with {stat} ({os.path.realpath(stat.parent)})"
    return {"disk_byte_counters": counters, "scratch_dir": str(scratch_dir.resolve())}
