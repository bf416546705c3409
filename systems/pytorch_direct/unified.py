"""In-place pinning of an existing host tensor, and a tensor-like view that GPU kernels read.

``UnifiedTensor(t)`` registers ``t``'s memory with the CUDA driver (cudaHostRegister, no copy),
so GPU threads can read it over PCIe; ``unified[idx]`` gathers rows onto the GPU of ``idx``. The
memory is unregistered exactly once: on ``close()``, at the end of a ``with`` block, or when the
object is garbage-collected, whichever comes first.
"""

from __future__ import annotations

import weakref

import torch

from harness import resources
from systems.pytorch_direct.ops import gather

CUDA_HOST_REGISTER_PORTABLE_MAPPED = 1 | 2  # cudaHostRegisterPortable | cudaHostRegisterMapped


def _cudart():
    if not torch.cuda.is_available():
        raise RuntimeError("UnifiedTensor needs a CUDA GPU; none is available")
    return torch.cuda.cudart()


def _unregister(tensor: torch.Tensor, nbytes: int) -> None:
    # `tensor` is held here so its memory outlives the registration.
    error = _cudart().cudaHostUnregister(tensor.data_ptr())
    resources.note_registered_pinned(-nbytes)
    if int(error) != 0:
        raise RuntimeError(f"cudaHostUnregister failed with CUDA error {int(error)}")


class UnifiedTensor:
    """A host tensor pinned in place; ``self[idx_on_gpu]`` returns those rows as a CUDA tensor."""

    def __init__(self, tensor: torch.Tensor, *, kernel: str = "vectorized", dedup: bool = False,
                 max_threads: int = 0):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type != "cpu":
            raise ValueError(f"the tensor is already on {tensor.device}; UnifiedTensor pins host tensors")
        if tensor.numel() == 0 or tensor.dim() == 0:
            raise ValueError("cannot pin an empty table (or a scalar)")
        if not tensor.is_contiguous():
            raise ValueError("the tensor is not contiguous; pass tensor.contiguous() (a copy)")
        storage = tensor.untyped_storage()
        nbytes = tensor.numel() * tensor.element_size()
        if tensor.storage_offset() != 0 or storage.nbytes() != nbytes:
            raise ValueError(
                "the tensor is a view into a larger allocation; the driver pins whole allocations, "
                "so pin the tensor that owns the memory (or pass view.clone())")
        cudart = _cudart()
        if tensor.is_pinned():
            raise ValueError("the tensor's memory is already page-locked (pin_memory() or another UnifiedTensor)")
        error = cudart.cudaHostRegister(tensor.data_ptr(), nbytes, CUDA_HOST_REGISTER_PORTABLE_MAPPED)
        if int(error) != 0:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes ({nbytes / 2**30:.2f} GiB) failed with CUDA error "
                               f"{int(error)}; error 2 (out of memory) means the host cannot page-lock that much: "
                               "pin a smaller table")
        resources.note_registered_pinned(nbytes)
        self.tensor = tensor
        self.nbytes = nbytes
        self.options = {"kernel": kernel, "dedup": dedup, "max_threads": max_threads}
        self._rows = tensor.view(tensor.shape[0], -1)
        self._release = weakref.finalize(self, _unregister, tensor, nbytes)

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

    def __getitem__(self, idx: torch.Tensor) -> torch.Tensor:
        """``table[idx]`` for a CUDA ``idx`` of any shape and strides: the rows, shaped
        ``idx.shape + table.shape[1:]``."""
        if not self.registered:
            raise RuntimeError("this UnifiedTensor was closed; its memory is no longer pinned")
        if not isinstance(idx, torch.Tensor) or not idx.is_cuda:
            raise TypeError("index a UnifiedTensor with an int32/int64 CUDA tensor of row ids")
        rows = gather(self._rows, idx.reshape(-1), **self.options)
        return rows.view(idx.shape + self.tensor.shape[1:])

    def close(self) -> None:
        """Unregister the memory now (idempotent); the tensor itself stays valid, unpinned."""
        self._release()

    def __enter__(self) -> "UnifiedTensor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "registered" if self.registered else "closed"
        return f"UnifiedTensor(shape={tuple(self.shape)}, dtype={self.dtype}, {state})"
