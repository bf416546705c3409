"""pcie_copy: host-to-device and device-to-host copies from pinned and from pageable memory."""

from __future__ import annotations

import torch

from harness.progress import progress
from harness.timing import measure
from workloads.buffers import MIB, random_bytes


def run(params: dict, writer, *, repeat: int, warmup: int, **_) -> None:
    cases = [
        (size_mib, direction, host_memory)
        for size_mib in params["sizes_mib"]
        for direction in ("h2d", "d2h")
        for host_memory in ("pinned", "pageable")
    ]
    for size_mib, direction, host_memory in progress(cases, desc="pcie_copy"):
        nbytes = size_mib * MIB
        host = random_bytes(nbytes, pin_memory=host_memory == "pinned", seed=size_mib)
        gpu = random_bytes(nbytes, device="cuda", seed=size_mib + 1)
        if direction == "h2d":
            src, dst = host, gpu
        else:
            src, dst = gpu, host
        copy = lambda: dst.copy_(src, non_blocking=host_memory == "pinned")  # noqa: E731
        copy()
        torch.cuda.synchronize()
        if not torch.equal(dst.cpu() if dst.is_cuda else dst, src.cpu() if src.is_cuda else src):
            raise RuntimeError(f"pcie_copy {direction}/{host_memory}: copied bytes differ from the source")
        m = measure(copy, device="cuda", repeat=repeat, warmup=warmup)
        writer.add_measurement(
            m,
            role="probe",
            variant=direction,
            bytes_moved=nbytes,
            config={"device": "cuda", "host_memory": host_memory, "size_bytes": nbytes},
        )
        host = gpu = src = dst = None  # frees both buffers before the next size is allocated
