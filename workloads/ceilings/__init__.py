"""Machine ceilings: the physical limits every later figure is compared against.

Probes (one results file each): ``pcie_copy`` (host<->device copies, pinned and pageable),
``uva_read`` (GPU threads reading pinned host memory, by access order, granularity and table
size), ``hbm_copy`` (device-to-device copy), ``matmul`` (fp32/TF32/bf16 rate), ``disk``
(O_DIRECT sequential write and read, checked against the block device's byte counters) and
``host_memcpy``. The first three need a GPU; matmul runs on the GPU when there is one.
"""

GPU_PROBES = ("pcie_copy", "uva_read", "hbm_copy")
HOST_PROBES = ("matmul", "disk", "host_memcpy")
PROBES = GPU_PROBES + HOST_PROBES


def probes_for(has_gpu: bool) -> tuple[str, ...]:
    """The probes that apply on a machine with or without a GPU."""
    return PROBES if has_gpu else HOST_PROBES
