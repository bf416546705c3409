"""Data-parallel GNN training: one process per GPU (torchrun, NCCL; gloo on CPUs), every rank
sampling its own slice of each global batch and gathering from ONE feature table in shared host
memory (workloads.graphs.shared).

Parts are world sizes (``world1`` .. ``world8``): the number of ranks, one GPU each on a GPU
machine; on a machine without a GPU, 1 and 2 CPU processes (the distributed code path, with the
CPU-sampling pipelines, ``cpu_gather`` and ``cpu_gather_workers``). A machine runs the world sizes
its GPUs allow and that have a core per rank.
"""

from harness.topic import Part, Topic
from workloads.gnn_multi_gpu.schema import SCHEMA

WORLDS = {"world1": 1, "world2": 2, "world4": 4, "world8": 8}
CPU_WORLDS = ("world1", "world2")
# NVLink multicast stays off, in every rank's environment (the launcher sets these; a rank
# refuses to start without them).
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

TOPIC = Topic(
    name="gnn_multi_gpu",
    title="Multi-GPU GNN training",
    technique="pytorch_direct",
    schema=SCHEMA,
    parts=tuple(Part(name, gpus=world, cpu=name in CPU_WORLDS, cores=world) for name, world in WORLDS.items()),
)
