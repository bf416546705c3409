"""Results format of the gnn_training topic (see harness.results for the common columns).

``dataset`` names the graph ("ogbn-products-like"); ``role`` is ``baseline`` (cpu_gather),
``optimized`` (zero_copy, zero_copy_overlap, uva_sampling) or ``upper_bound`` (all_in_gpu);
``variant`` is the pipeline. Metrics: ``epoch_time`` per timed epoch, ``phase_time`` per phase
of one instrumented epoch, ``cpu_time`` per epoch, ``pcie_bytes`` per epoch, ``loss`` per step
of the first epoch, ``accuracy`` on the validation nodes (after the timed epochs and the
instrumented one).

``pcie_bytes`` is the payload of the feature rows gathered (rows x row bytes), the same for
every pipeline that crosses PCIe: not the link's traffic, which also carries ids, edges and
labels, and for zero-copy reads whole 128-byte lines.
"""

from harness.results import Schema

SCHEMA = Schema(
    topic="gnn_training",
    config={
        "device": str,  # where the model trains: "cuda" or "cpu"
        "model": str,  # "sage" or "gat"
        "layers": int,
        "fanouts": str,  # e.g. "10-25", hop 1 first
        "batch_size": int,
        "hidden": int,
        "nodes": int,
        "edges": int,
        "feature_dim": int,
        "sampler_workers": int,  # CPU sampling processes (0: in the training process)
        "train_threads": int,  # torch threads of the training process (the cores workers leave)
        "phase": str,  # for phase_time: "sample", "gather" (with transfer), "train"
    },
)
