"""Buffers filled with random bytes (never zeros: zeros hide unwritten outputs and bad indexing)."""

from __future__ import annotations

import torch

MIB = 1 << 20
_CHUNK = 256 * MIB


def random_bytes(nbytes: int, *, device: str = "cpu", pin_memory: bool = False, seed: int = 0) -> torch.Tensor:
    """A 1-D uint8 tensor of ``nbytes`` random bytes.

    Host buffers are filled in chunks generated on the GPU when there is one (a 32 GiB table
    fills in seconds instead of minutes of single-threaded CPU random numbers).
    """
    gen_device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=gen_device).manual_seed(seed)
    if device != "cpu":
        return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device, generator=generator)
    out = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin_memory)
    for start in range(0, nbytes, _CHUNK):
        n = min(_CHUNK, nbytes - start)
        out[start:start + n].copy_(torch.randint(0, 256, (n,), dtype=torch.uint8, device=gen_device, generator=generator))
    return out
