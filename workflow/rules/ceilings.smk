# Machine ceilings: PCIe, zero-copy reads, HBM, matmul, disk, host memcpy (workloads/ceilings).
from workloads.ceilings import probes_for

register_topic("ceilings", "Machine ceilings", lambda: probes_for(HAS_GPU))


rule ceilings:
    """This machine's ceilings figure at the configured scale (measures what is missing)."""
    input:
        topic_targets("ceilings"),
