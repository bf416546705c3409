"""In-place pinning of an existing host tensor, and a tensor-like view that GPU kernels read.

``UnifiedTensor(t)`` registers ``t``'s memory with the CUDA driver (cudaHostRegister, no copy),
so GPU threads can read it over PCIe; ``unified[idx]`` gathers rows onto the GPU of ``idx``
along the path measured fastest on this GPU for the table's row and table size (``dispatch.py``:
the suite's ``ops.gather`` kernel or stock torch's ``index_select`` on the alias, each sorted or
not; ``unified.path`` says which and why). The memory is unregistered exactly once: on
``close()``, at the end of a ``with`` block, or when the object is garbage-collected, whichever
comes first. ``unified.launch_into(idx, out)`` queues the same gather into a buffer of the
caller's and returns without waiting for the GPU (its range check is handed back, to call when
the caller may wait): what a loader that prepares the next batch while one trains needs.

``unified.cuda_alias()`` is the same memory as a CUDA tensor of ``t``'s shape and dtype (no
copy), so stock torch code reads it unchanged: ``alias[idx]``, ``alias.index_select(0, idx)``,
``F.embedding(idx, alias)``, slicing. It lives on the GPU that was current when ``t`` was
registered (the driver records that device for the memory).

Lifetime: every tensor sharing the alias's memory (the alias, its views, its storage) holds the
registration. The UnifiedTensor is not garbage-collected before them, and ``close()`` (or the end
of a ``with`` block) raises ``RuntimeError`` while one of them lives; delete them first. Results
computed from the alias (``alias[idx]`` is a copy in GPU memory) are not aliases and may stay. So
no tensor can reach the memory once it is unregistered; ``close()`` also waits for the current
device's queued work, which may still be reading it.

What is safe with the alias: reads, from any stream, while nothing writes the same bytes. What is
not: in-place writes through the alias (``alias[i] = x``, ``alias.add_(...)``) from several streams
without synchronisation (they race like any unsynchronised writes, and each one crosses PCIe);
GPU writes racing CPU reads or writes of ``t`` (the CPU sees a kernel's writes only once it has
finished: synchronise first); and writing ``t`` on the CPU while GPU work reads it.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import weakref

import numpy as np
import torch

from harness import resources
from harness.arguments import whole_number
from harness.errors import NeedsGpuError
from systems import nvrtc
from systems.pytorch_direct import dispatch
from systems.pytorch_direct.ops import KERNELS, refuse_misaligned

CUDA_HOST_REGISTER_PORTABLE_MAPPED = 1 | 2  # cudaHostRegisterPortable | cudaHostRegisterMapped
CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712  # cudaErrorHostMemoryAlreadyRegistered


class NoGpuError(NeedsGpuError, RuntimeError):
    """No CUDA GPU to register memory with: the suite's one-line error, and a RuntimeError as this
    refusal always was, for code that catches that."""


def _cudart():
    if not torch.cuda.is_available():
        raise NoGpuError("UnifiedTensor needs a CUDA GPU; none is available (on the CPU, gather with t.index_select)")
    return torch.cuda.cudart()


def _check_options(kernel, dedup, max_threads) -> None:
    """The kernel options, refused when given (not at the first gather, nor hidden behind a missing GPU)."""
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if dedup is not None and not isinstance(dedup, bool | np.bool_):
        raise ValueError(f"dedup must be a bool, got {dedup!r}")
    if max_threads is not None and whole_number(max_threads) is None:
        raise ValueError(f"max_threads must be a whole number >= 0 (0: all), got {max_threads!r}")


@functools.cache
def _process_cudarts() -> tuple[ctypes.CDLL, ...]:
    """The CUDA runtime libraries this process loaded (torch's among them; none without CUDA)."""
    try:
        with open("/proc/self/maps") as maps:
            fields = [line.split(maxsplit=5) for line in maps]
    except OSError:
        return ()
    paths = sorted({f[5].strip() for f in fields if len(f) == 6 and "/libcudart.so" in f[5]})
    found = []
    for path in paths:
        if path.endswith("(deleted)"):  # replaced on disk since it was loaded: not to be opened again
            continue
        try:
            found.append(ctypes.CDLL(path))
        except OSError:
            continue
    return tuple(found)


def _forget_failed_call() -> None:
    """A failed runtime call stays the thread's last error, which torch's check after its next
    kernel launch would raise as that kernel's: read it, which resets it (a refusal the caller
    handles must not fail an unrelated operation later). Each runtime loaded keeps its own; the
    failed call was torch's, whichever of them that is."""
    for cudart in _process_cudarts():
        cudart.cudaGetLastError()


def _unregister(tensor: torch.Tensor, nbytes: int) -> None:
    # `tensor` is held here so its memory outlives the registration. Kernels already queued (an
    # asynchronous sorted gather, a read through an alias just dropped) may still read it.
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    error = _cudart().cudaHostUnregister(tensor.data_ptr())
    resources.note_registered_pinned(-nbytes)
    if int(error) != 0:
        _forget_failed_call()
        raise RuntimeError(f"cudaHostUnregister failed with CUDA error {int(error)}")


class _DeviceBytes:
    """The registered bytes as torch reads them (the CUDA array interface), and their owner.

    torch keeps a reference to this object in the storage of the tensor it makes from it, so it
    lives as long as any tensor sharing that storage (the alias and all its views), and it holds
    the UnifiedTensor, so the registration lives as long too.
    """

    def __init__(self, owner: UnifiedTensor | None, address: int, nbytes: int):
        self.owner = owner
        self.address = address
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (address, False),
            "strides": None,
            "version": 3,
            "stream": None,
        }


def _wrap_device_bytes(memory: _DeviceBytes) -> torch.Tensor:
    """A uint8 CUDA tensor over ``memory``, no copy: torch has no public call to wrap a device
    pointer, but ``as_tensor`` wraps a CUDA array interface in place (placing it on the device
    the driver reports for the pointer)."""
    return torch.as_tensor(memory)


class UnifiedTensor:
    """A host tensor pinned in place; ``self[idx_on_gpu]`` returns those rows as a CUDA tensor,
    and ``cuda_alias()`` the whole table as a CUDA tensor over the same memory.

    ``path``: ``"auto"`` (the measured dispatch table; the suite's kernel where this GPU has none)
    or one of ``dispatch.PATHS``. Options of the suite's kernel (``kernel``, passed to ``ops.gather``
    as ``loads``; ``dedup``, ``max_threads``) make ``"auto"`` choose the path ``"kernel"``."""

    def __init__(
        self,
        tensor: torch.Tensor,
        *,
        path: str = "auto",
        kernel: str | None = None,
        dedup: bool | None = None,
        max_threads: int | None = None,
    ):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type != "cpu":
            raise ValueError(f"the tensor is already on {tensor.device}; UnifiedTensor pins host tensors")
        if tensor.numel() == 0 or tensor.dim() == 0:
            raise ValueError("cannot pin an empty table (or a scalar)")
        if not tensor.is_contiguous():
            raise ValueError("the tensor is not contiguous; pass tensor.contiguous() (a copy)")
        if tensor.is_conj() or tensor.is_neg():  # the paths read the raw bytes, without the bit
            bit, call = ("conjugate", "resolve_conj()") if tensor.is_conj() else ("negative", "resolve_neg()")
            raise ValueError(f"the tensor has torch's lazy {bit} bit set (a .conj() view?): pass tensor.{call}")
        storage = tensor.untyped_storage()
        nbytes = tensor.numel() * tensor.element_size()
        if tensor.storage_offset() != 0 or storage.nbytes() != nbytes:
            raise ValueError(
                "the tensor is a view into a larger allocation; the driver pins whole allocations, "
                "so pin the tensor that owns the memory (or pass view.clone())"
            )
        refuse_misaligned(tensor, "tensor")
        _check_options(kernel, dedup, max_threads)
        self.options = {
            k: v for k, v in (("loads", kernel), ("dedup", dedup), ("max_threads", max_threads)) if v is not None
        }
        self._choice = self._check_path(path)  # "auto" is resolved on first use (it asks the GPU's name)
        cudart = _cudart()
        if tensor.is_pinned():
            raise ValueError("the tensor's memory is already page-locked (pin_memory() or another UnifiedTensor)")
        error = cudart.cudaHostRegister(tensor.data_ptr(), nbytes, CUDA_HOST_REGISTER_PORTABLE_MAPPED)
        if int(error) != 0:
            _forget_failed_call()
        if int(error) == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
            # A view the check above cannot see as one: torch.from_numpy of a numpy view owns a
            # storage of exactly its bytes, inside an array another UnifiedTensor pinned a part of.
            raise ValueError(
                "part of the tensor's memory is already page-locked (a view of an array that another UnifiedTensor "
                "pins, such as torch.from_numpy of a numpy slice?): pin the array that owns the memory once"
            )
        if int(error) != 0:
            raise RuntimeError(
                f"cudaHostRegister of {nbytes} bytes ({nbytes / 2**30:.2f} GiB) failed with CUDA error "
                f"{int(error)}; error 2 (out of memory) means the host cannot page-lock that much: "
                "pin a smaller table"
            )
        resources.note_registered_pinned(nbytes)
        self.tensor = tensor
        self.nbytes = nbytes
        self._release = weakref.finalize(self, _unregister, tensor, nbytes)
        self._aliases = weakref.WeakSet()  # the _DeviceBytes of every alias still in use
        self._rows_alias = None  # the torch paths' own alias, made on first use, dropped by close()

    @property
    def _rows(self) -> torch.Tensor:
        """The table as 2-D rows, viewed anew each time: a view taken once would miss a
        ``requires_grad_()`` made on the table after construction."""
        return self.tensor.view(self.tensor.shape[0], -1)

    @property
    def shape(self) -> torch.Size:
        return self.tensor.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.tensor.dtype

    @property
    def registered(self) -> bool:
        return self._release.alive

    def __len__(self) -> int:
        return self.tensor.shape[0]

    def _check_path(self, path: str) -> dispatch.Choice | None:
        if path != "auto" and path not in dispatch.PATHS:
            raise ValueError(f"path must be 'auto' or one of {dispatch.PATHS}, got {path!r}")
        if self.options:
            if path == "auto":
                return dispatch.Choice("kernel", f"kernel options {sorted(self.options)} given")
            if path not in ("kernel", "kernel_sorted"):
                raise ValueError(f"kernel options {sorted(self.options)} apply to the kernel paths, not {path!r}")
        return None if path == "auto" else dispatch.Choice(path, "chosen by the caller")

    def _resolved(self) -> dispatch.Choice:
        if self._choice is None:
            self._choice = dispatch.choose_for(self._rows)
        return self._choice

    @property
    def path(self) -> str:
        """The path ``self[idx]`` takes (one of ``dispatch.PATHS``)."""
        return self._resolved().path

    @property
    def path_reason(self) -> str:
        """Why :attr:`path` was taken: the dispatch table's cell, or the caller's choice."""
        return self._resolved().reason

    def __getitem__(self, idx: torch.Tensor) -> torch.Tensor:
        """``table[idx]`` for a CUDA ``idx`` of any shape and strides: the rows, shaped
        ``idx.shape + table.shape[1:]``."""
        self._check_open()
        if not isinstance(idx, torch.Tensor) or not idx.is_cuda:
            raise TypeError("index a UnifiedTensor with an int32/int64 CUDA tensor of row ids")
        path = self.path
        if path.startswith("torch") and self._needs_grad():
            # The torch paths read an alias with no autograd link to the table: the kernel reads
            # the same rows and has a backward.
            path = path.replace("torch", "kernel")
        alias = self._rows_alias_for_torch() if path.startswith("torch") else None
        rows = dispatch.gather_rows(path, self._rows, alias, idx.reshape(-1), **self.options)
        return rows.view(idx.shape + self.tensor.shape[1:])

    def _needs_grad(self) -> bool:
        return self.tensor.requires_grad and torch.is_grad_enabled()

    def launch_into(self, idx: torch.Tensor, out: torch.Tensor, *, max_threads: int | None = None):
        """Queue ``self[idx]`` into ``out`` along :attr:`path` and return at once, without waiting
        for the GPU: for a loader that gathers the next batch while one trains. ``idx`` is a 1-D
        int32/int64 tensor on the current GPU, ``out`` a dense ``(len(idx), row)`` tensor of the
        table's dtype there. Returns an ``ops.BoundsCheck``: calling it waits for the gather and
        raises ``IndexError`` for an out-of-range index (until then ``out`` is not to be trusted),
        so a caller that checked its ids itself can drop it. ``max_threads`` (default: the one
        given at construction, else 0: all) caps the gather's threads, which only the suite's
        kernel can: with a cap, a torch path gives way to the kernel reading rows in the same
        order (``dispatch.launch_rows``). The ``dedup`` option is not taken here: it must wait to
        count rows."""
        self._check_open()
        if not isinstance(idx, torch.Tensor) or not idx.is_cuda:
            raise TypeError("index a UnifiedTensor with an int32/int64 CUDA tensor of row ids")
        if self.options.get("dedup"):
            raise ValueError("launch_into cannot de-duplicate without waiting for the GPU: use self[idx]")
        if self._needs_grad():  # as torch refuses out= for an input that requires grad
            raise RuntimeError(
                "launch_into writes into out=, which autograd cannot follow, and the table requires grad: "
                "use self[idx], or launch under torch.no_grad()"
            )
        threads = self.options.get("max_threads", 0) if max_threads is None else max_threads
        if (threads := whole_number(given := threads)) is None:
            raise ValueError(f"max_threads must be a whole number >= 0 (0: all), got {given!r}")
        alias = self._rows_alias_for_torch() if self.path.startswith("torch") and not threads else None
        loads = self.options.get("loads", "vectorized")
        return dispatch.launch_rows(self.path, self._rows, alias, idx, out, max_threads=threads, loads=loads)

    def _rows_alias_for_torch(self) -> torch.Tensor:
        """The torch paths' alias of the rows, made on first use and kept until close()."""
        if self._rows_alias is None:
            self._rows_alias = self._alias_of_rows()
        return self._rows_alias

    def _alias_of_rows(self) -> torch.Tensor:
        """The table as a 2-D CUDA tensor for the torch paths. Its memory object does not hold
        this UnifiedTensor (no reference cycle) and is not counted as a user's alias: nothing
        outside this object can reach it, and close() drops it before unregistering."""
        memory = _DeviceBytes(None, nvrtc.device_pointer_of_pinned(self.tensor), self.nbytes)
        return _wrap_device_bytes(memory).view(self.dtype).view(self._rows.shape)

    def cuda_alias(self) -> torch.Tensor:
        """The table as a CUDA tensor of its shape and dtype over the registered memory (no
        copy), for stock torch ops. ``close()`` is refused while it or a view of it lives; see
        the module docstring for what is safe to do with it."""
        self._check_open()
        memory = _DeviceBytes(self, nvrtc.device_pointer_of_pinned(self.tensor), self.nbytes)
        raw = _wrap_device_bytes(memory)
        if raw.data_ptr() != memory.address:
            raise RuntimeError(
                "torch copied the table instead of aliasing it (a default device set by "
                "torch.set_default_device that differs from the table's GPU?)"
            )
        self._aliases.add(memory)
        # Bytes, then the table's dtype and shape: views share the storage that holds `memory`.
        return raw.view(self.dtype).view(self.shape)

    def close(self) -> None:
        """Unregister the memory now (idempotent); the tensor itself stays valid, unpinned.
        Raises ``RuntimeError`` while an alias from :meth:`cuda_alias` (or a view of one) lives."""
        in_use = self._aliases_in_use()
        if in_use:
            raise RuntimeError(
                f"cannot close: {in_use} alias(es) from cuda_alias() (or views of them) still use the "
                "registered memory; delete them first (tensors computed from them are copies and may stay)"
            )
        self._rows_alias = None
        self._release()

    def _aliases_in_use(self) -> int:
        if len(self._aliases):
            gc.collect()  # an alias kept only by a reference cycle is garbage, not in use
        return len(self._aliases)

    def _check_open(self) -> None:
        if not self.registered:
            raise RuntimeError("this UnifiedTensor was closed; its memory is no longer pinned")

    def __enter__(self) -> UnifiedTensor:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is not None and self._aliases_in_use():
            # Refusing here would bury the error in flight (whose frames may hold the alias);
            # the registration ends instead when the last alias and this object are collected.
            return
        self.close()

    def __repr__(self) -> str:
        state = "registered" if self.registered else "closed"
        return f"UnifiedTensor(shape={tuple(self.shape)}, dtype={self.dtype}, {state})"
