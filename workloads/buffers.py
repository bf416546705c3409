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
        buffer[start:start + n].copy_(torch.randint(0, 256, (n,), dtype=torch.uint8, device=gen_device, generator=generator))
    return buffer
