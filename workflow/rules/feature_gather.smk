# PyTorch-Direct feature gathering against the CPU-gather baseline (workloads/feature_gather).
# Rules files share one namespace: each topic imports its parts function under its own name.
from workloads.feature_gather import parts_for as gather_parts_for

register_topic("feature_gather", "PyTorch-Direct feature gathering", lambda: gather_parts_for(HAS_GPU))


rule feature_gather:
    """This machine's feature-gathering figure at the configured scale (measures what is missing)."""
    input:
        topic_targets("feature_gather"),
