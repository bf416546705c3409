"""One feature table in host memory, shared by every process of a data-parallel run.

The launcher copies the cached graph's feature table once into a file in ``/dev/shm`` (memory,
not disk) and removes it when the run ends, however it ends; every rank maps that file
(``MAP_SHARED``), so all ranks read the same physical pages, and each registers the mapping with
CUDA once for zero-copy reads. No rank holds a copy of its own.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from harness import machine
from harness.errors import UserError

SHARED_MEMORY = Path("/dev/shm")
SHARED_MEMORY_HEADROOM = 2 << 30  # DataLoader workers hand their batches over through /dev/shm too
MEMORY_HEADROOM = 2 << 30  # for the training processes, the sampling workers and their batches
LARGE_TABLE_SHARE = 0.5  # an unpinned table above this share of the free memory needs the headroom too


def check_table_fits_in_memory(nbytes: int, pinned: bool = True) -> None:
    """Refuse, with the numbers, a feature table the host cannot hold in RAM.

    A table pinned for zero-copy reads cannot be swapped out: one larger than the free memory
    less :data:`MEMORY_HEADROOM` would end in an out-of-memory kill or a failed registration
    halfway through a run, not in an error that says why. A table that is not pinned (``pinned``
    false: one trained on the CPU) needs the headroom only where it takes much of the free memory:
    a small one fits beside whatever else runs, however little memory is free."""
    available = machine.available_memory_bytes()
    if available is None:
        return
    headroom = MEMORY_HEADROOM if pinned or nbytes > available * LARGE_TABLE_SHARE else 0
    if nbytes + headroom > available:
        kept = f", {MEMORY_HEADROOM >> 30} GiB of it kept for the training and sampling processes" if headroom else ""
        raise UserError(
            f"the feature table ({_size(nbytes)}) is too large to hold{' and pin' if pinned else ''} in this "
            f"host's memory ({_size(available)} available{kept}): free memory, or use a smaller graph "
            "(for a generated one, a smaller scale_factor)"
        )


def _size(nbytes: int) -> str:
    """A size as people read it: a tiny table in bytes, not "0.0 GiB"."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes:,} bytes"


@contextmanager
def shared_table(array: np.ndarray, name: str, directory: Path = SHARED_MEMORY) -> Iterator[dict]:
    """Copy ``array`` into shared memory for the duration of the block; yields the description
    that :func:`map_table` takes (path, dtype, shape), as a JSON-able dict."""
    check_table_fits_in_memory(array.nbytes)
    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(
            f"{directory} does not exist: sharing a feature table between processes needs Linux shared memory"
        )
    free = shutil.disk_usage(directory).free
    if array.nbytes + SHARED_MEMORY_HEADROOM > free:
        raise UserError(
            f"the feature table ({array.nbytes / 2**30:.1f} GiB) and {SHARED_MEMORY_HEADROOM >> 30} GiB "
            f"for the sampling workers' batches do not fit in {directory} ({free / 2**30:.1f} GiB free); "
            "free space there or use a smaller scale"
        )
    path = directory / f"suite-{name}-{os.getpid()}.table"
    try:
        table = np.memmap(path, dtype=array.dtype, mode="w+", shape=array.shape)
        _copy_in_steps(array, table)
        table.flush()
        del table
        yield {"path": str(path), "dtype": str(array.dtype), "shape": list(array.shape)}
    finally:
        path.unlink(missing_ok=True)


def shared_anonymous_copy(array: np.ndarray, pinned: bool = True) -> torch.Tensor:
    """A copy of ``array`` in shared anonymous memory (``MAP_SHARED``), for one process's table.

    Why not private memory (``clone()``): once CUDA pins private pages, every fork (each sampling
    worker) gets its own physical copy of them, 8 workers x a 14 GiB table; shared pages are
    never copied at fork.
    """
    table = shared_anonymous_table(array.shape, array.dtype, pinned)
    _copy_in_steps(array, table)
    return torch.from_numpy(table)  # the array keeps the mapping alive


def shared_anonymous_table(shape: tuple[int, ...], dtype, pinned: bool = True) -> np.ndarray:
    """An uninitialised array in shared anonymous memory (``MAP_SHARED``; see
    :func:`shared_anonymous_copy` for why), refused in one line where the host cannot hold it.
    Its pages are taken as they are first written, so a table filled a chunk at a time never
    needs more than itself. ``pinned``: whether the table will be pinned for a GPU's zero-copy
    reads (see :func:`check_table_fits_in_memory`)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    check_table_fits_in_memory(nbytes, pinned)
    buffer = mmap.mmap(-1, max(nbytes, 1))  # anonymous, MAP_SHARED
    return np.frombuffer(buffer, dtype=dtype, count=nbytes // dtype.itemsize).reshape(shape)


def _copy_in_steps(source: np.ndarray, target: np.ndarray) -> None:
    """target[:] = source, 256 MiB of rows at a time: the source may be a memory-mapped file, and
    one copy would first fault all of it in next to the target."""
    rows_per_step = max(1, (256 << 20) // max(1, source.strides[0] if source.ndim else 1))
    for start in range(0, source.shape[0], rows_per_step):
        target[start : start + rows_per_step] = source[start : start + rows_per_step]


def map_table(description: dict | str) -> torch.Tensor:
    """The shared table as a tensor over the shared pages (writable mapping: CUDA registers it)."""
    if isinstance(description, str):
        description = json.loads(description)
    path = Path(description["path"])
    if not path.exists():
        raise UserError(f"shared feature table {path} is gone (did the launcher end?)")
    expected = int(np.prod(description["shape"])) * np.dtype(description["dtype"]).itemsize
    if path.stat().st_size != expected:
        raise UserError(f"shared feature table {path} holds {path.stat().st_size} bytes, expected {expected}")
    table = np.memmap(path, dtype=description["dtype"], mode="r+", shape=tuple(description["shape"]))
    return torch.from_numpy(table)
