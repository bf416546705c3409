"""What the file stores share: one file per tensor in a private scratch folder on a real disk,
a pool of I/O threads, and the device's byte counters to tell disk reads from the page cache."""

from __future__ import annotations

import os
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.arguments import whole_number
from harness.errors import UserError
from harness.resources import block_device_counters, device_bytes
from systems.ssdtrain import fileio
from systems.ssdtrain._warn import warn
from systems.ssdtrain.stores._base import READ, WRITE, Store


def _close_files(pool: ThreadPoolExecutor, directory: Path, owner: int) -> None:
    # A function, not a method: weakref.finalize must not hold the store.
    pool.shutdown(wait=True, cancel_futures=True)
    fileio.remove_scratch(directory, owner)


class FileStore(Store):
    """One file per tensor in a private folder made inside ``folder``; the folder and every file in
    it are removed on ``close()``, when the store is garbage-collected, and at process exit, or, where
    the process was killed, by the next file store made in the same ``folder`` (fileio.make_scratch)."""

    def __init__(self, folder, *, threads: int, direct: bool):
        if (threads := whole_number(given := threads, at_least=1)) is None:
            raise UserError(f"{type(self).__name__}: threads must be a positive integer, got {given!r}")
        # "" would be the working directory (an unset variable, most likely); None or a number
        # would be Path()'s TypeError.
        if not isinstance(folder, str | os.PathLike) or str(folder) == "":
            raise UserError(f"{type(self).__name__}: folder must be the path of an existing folder, got {folder!r}")
        super().__init__()
        self.folder = Path(folder).expanduser()
        self.directory, owner = fileio.make_scratch(self.folder, direct=direct)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=f"ssdtrain-{self.name}")
        self._cleanup = weakref.finalize(self, _close_files, self._pool, self.directory, owner)
        self._file_bytes = {WRITE: 0, READ: 0}  # what the files were asked for, padding included
        self._said_left_behind = False  # a file could not be removed (said once)
        self._device_stat = block_device_counters(self.directory)
        self._device_start = device_bytes(self._device_stat) if self._device_stat else None

    def path_of(self, key: int) -> Path:
        return self.directory / f"{key}.bin"

    def _count_file_bytes(self, direction: str, nbytes: int) -> None:
        with self._lock:
            self._file_bytes[direction] += nbytes

    def _free(self, key):
        # Called while a step ends, an error of the step's own perhaps on its way (a disk turned
        # read-only): a file that cannot be removed is said once, and never hides that error.
        try:
            self.path_of(key).unlink(missing_ok=True)
        except OSError as err:
            with self._lock:
                said, self._said_left_behind = self._said_left_behind, True
            if not said:
                warn(
                    f"{type(self).__name__}: removing {self.path_of(key)} failed ({err.strerror}); "
                    f"files may be left in {self.directory}"
                )

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
