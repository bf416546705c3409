"""hbm_copy: a device-to-device copy; bandwidth counts bytes read plus bytes written."""

from __future__ import annotations

import torch

from harness.timing import measure
from workloads.buffers import MIB, random_bytes


def run(params: dict, writer, *, repeat: int, warmup: int, **_) -> None:
    nbytes = params["size_mib"] * MIB
    src = random_bytes(nbytes, device="cuda", seed=1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    if not torch.equal(dst, src):
        raise RuntimeError("hbm_copy: copied bytes differ from the source")
    m = measure(lambda: dst.copy_(src), device="cuda", repeat=repeat, warmup=warmup, desc="hbm_copy")
    writer.add_measurement(
        m, role="probe", variant="read+write", bytes_moved=2 * nbytes, config={"device": "cuda", "size_bytes": nbytes}
    )
