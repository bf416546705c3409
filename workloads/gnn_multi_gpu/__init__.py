"""Data-parallel GNN training: one process per GPU (torchrun, NCCL; gloo on CPUs), every rank
sampling its own slice of each global batch and gathering from ONE feature table in shared host
memory (workloads.graphs.shared).

Parts are world sizes (``world1`` .. ``world8``): the number of ranks, one GPU each on a GPU
machine; on a machine without a GPU, 1 and 2 CPU processes (the distributed code path, with the
CPU pipeline only). A part needing more GPUs than the machine has is not listed here.
"""

from harness import machine

WORLDS = {"world1": 1, "world2": 2, "world4": 4, "world8": 8}
CPU_WORLDS = ("world1", "world2")
# NVLink multicast stays off, in every rank's environment (the launcher sets these; a rank
# refuses to start without them).
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def parts_for(has_gpu: bool) -> tuple[str, ...]:
    if not has_gpu:
        return CPU_WORLDS
    gpus = len(machine.nvidia_gpus())
    return tuple(part for part, world in WORLDS.items() if world <= gpus)


def gpus_of(part: str, has_gpu: bool) -> int:
    """GPUs a part holds while it runs (for the workflow's resources)."""
    return WORLDS[part] if has_gpu else 0
