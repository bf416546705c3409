"""Files through kvikio (cuFile): GPU memory to the disk without a host bounce where the machine has
GPUDirect Storage."""

from __future__ import annotations

import errno
from pathlib import Path

import torch

from harness.errors import NeedsGpuError, UserError
from systems.ssdtrain import fileio
from systems.ssdtrain.stores import StoreEntry, register
from systems.ssdtrain.stores._base import READ, WRITE
from systems.ssdtrain.stores._files import FileStore


class KvikioStore(FileStore):
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
                # A short write (the disk filled up) is followed by a write of the rest, which
                # fails with the reason instead of a generic short-write error.
                while 0 < done < data.numel():
                    more = file.pwrite(data[done:], file_offset=done).get()
                    if more == 0:
                        break
                    done += more
            if done != data.numel():
                raise OSError(errno.EIO, f"the disk took {done} of {data.numel()} bytes and gave no reason")
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


register(
    StoreEntry(
        "kvikio",
        "optimized",
        label="kvikio files",
        needs_gpu=True,
        packages=("kvikio",),
        make=lambda params, folder: KvikioStore(folder, threads=params.get("file_threads", 4)),
        scratch=True,
        notes="one file per tensor through kvikio (cuFile; POSIX compatibility mode without nvidia-fs)",
    )
)
