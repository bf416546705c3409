"""Buffers filled with random bytes (never zeros: zeros hide unwritten outputs and bad indexing)."""

from __future__ import annotations

import torch

MIB = 1 << 20
_CHUNK = 256 * MIB


def random_bytes(nbytes: int, *, device: str = "cpu", pin_memory: bool = False, seed: int = 0) -> torch.Tensor:
    """A 1-D uint8 tensor of ``nbytes`` random bytes."""
    if device != "cpu":
        generator = torch.Generator(device=device).manual_seed(seed)
        return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device, generator=generator)
    return fill_random_(torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin_memory), seed=seed)


def fill_random_(buffer: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Fill a 1-D uint8 host tensor with random bytes, in place.

    The bytes are generated on the GPU when there is one (a 32 GiB table fills in seconds instead
    of minutes of single-threaded CPU random numbers) and copied over in chunks.
    """
    gen_device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=gen_device).manual_seed(seed)
    for start in range(0, buffer.numel(), _CHUNK):
        n = min(_CHUNK, buffer.numel() - start)
        buffer[start : start + n].copy_(
            torch.randint(0, 256, (n,), dtype=torch.uint8, device=gen_device, generator=generator)
        )
    return buffer


HOST_ALLOCATIONS = ("pinned", "registered", "registered_thp")


class PinnedHostBuffer:
    """``nbytes`` of random bytes in page-locked host memory, allocated one of three ways:

    ``pinned``: by the CUDA driver (cudaHostAlloc, through torch's pinned allocator);
    ``registered``: ordinary memory from the C allocator, pinned in place (cudaHostRegister, as
    PyTorch-Direct's UnifiedTensor does); ``registered_thp``: the same from an anonymous mapping
    advised to use transparent huge pages (2 MiB) before it is touched.
    """

    def __init__(self, nbytes: int, allocation: str, seed: int = 0):
        from systems.pytorch_direct import UnifiedTensor

        self.allocation, self.unified, self.mapping = allocation, None, None
        if allocation == "pinned":
            self.tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        elif allocation == "registered":
            self.tensor = torch.empty(nbytes, dtype=torch.uint8)
        elif allocation == "registered_thp":
            import mmap

            self.mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            self.mapping.madvise(mmap.MADV_HUGEPAGE)
            self.tensor = torch.frombuffer(self.mapping, dtype=torch.uint8)
        else:
            raise ValueError(f"allocation must be one of {HOST_ALLOCATIONS}, got {allocation!r}")
        if allocation != "pinned":
            self.unified = UnifiedTensor(self.tensor)
        fill_random_(self.tensor, seed=seed)

    def close(self) -> None:
        if self.unified is not None:
            self.unified.close()
        self.tensor = None


def huge_pages_note() -> dict:
    """The kernel's transparent-huge-page policy and how much of this process uses huge pages."""
    note = {}
    try:
        note["thp_enabled"] = open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip()
        for line in open("/proc/self/smaps_rollup"):
            if line.startswith("AnonHugePages:"):
                note["anon_huge_pages_kib"] = int(line.split()[1])
    except OSError as err:
        note["thp_unreadable"] = str(err)
    return note
