"""host_memcpy: a large copy in host memory; bandwidth counts bytes read plus bytes written."""

from __future__ import annotations

import torch

from harness.errors import UserError
from harness.machine import usable_cores
from harness.progress import progress
from harness.timing import measure
from workloads.buffers import MIB, random_bytes


def run(params: dict, writer, *, repeat: int, warmup: int, **_) -> dict:
    # More threads than this process may run on would time the scheduler, not the copy: left out,
    # and said so (in the record, or in one line where nothing is left).
    usable = usable_cores()
    beyond = [t for t in params["threads"] if t > usable]
    if beyond and len(beyond) == len(params["threads"]):
        raise UserError(f"host_memcpy: threads {beyond} are all more than the {usable} usable CPUs here")
    nbytes = params["size_mib"] * MIB
    src = random_bytes(nbytes, seed=2)
    dst = torch.empty_like(src)
    threads_before = torch.get_num_threads()
    try:
        for threads in progress([t for t in params["threads"] if t <= usable], desc="host_memcpy"):
            torch.set_num_threads(threads)
            dst.copy_(src)
            if not torch.equal(dst, src):
                raise RuntimeError("host_memcpy: copied bytes differ from the source")
            dst.fill_(0)
            m = measure(lambda: dst.copy_(src), device="cpu", repeat=repeat, warmup=warmup)
            writer.add_measurement(
                m,
                role="probe",
                variant="read+write",
                bytes_moved=2 * nbytes,
                config={"device": "cpu", "size_bytes": nbytes, "threads": threads},
            )
    finally:
        torch.set_num_threads(threads_before)
    left_out = {str(t): f"more than the {usable} usable CPUs" for t in beyond}
    return {"usable_cpus": usable, **({"threads_left_out": left_out} if beyond else {})}
