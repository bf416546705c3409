"""Machine ceilings: the physical limits every later figure is compared against.

Parts (one results file each; the functions are in parts.py): ``pcie_copy`` (host<->device
copies, pinned and pageable), ``uva_read`` (GPU threads reading pinned host memory, by access
order, granularity and table size), ``hbm_copy`` (device-to-device copy), ``matmul``
(fp32/TF32/bf16 rate), ``disk`` (O_DIRECT sequential write and read, checked against the block
device's byte counters) and ``host_memcpy``. The first three need a GPU; matmul runs on the GPU
when there is one; disk and host_memcpy hold no GPU.
"""

from harness.topic import Part, Topic
from workloads.ceilings.schema import SCHEMA

TOPIC = Topic(
    name="ceilings",
    title="Machine ceilings",
    technique=None,
    schema=SCHEMA,
    parts=(
        Part("pcie_copy", cpu=False),
        Part("uva_read", cpu=False),
        Part("hbm_copy", cpu=False),
        Part("matmul"),
        Part("disk", gpus=0),
        Part("host_memcpy", gpus=0),
    ),
)
