"""Results format of the gnn_multi_gpu topic (see harness.results for the common columns).

``dataset`` names the graph; ``role``/``variant`` as in gnn_training (variant = pipeline).
Metrics: ``epoch_time`` per timed epoch (barrier to barrier, so the slowest rank's),
``cpu_time`` per epoch summed over the ranks and their sampling workers, ``bandwidth`` of
feature-row payload one rank moved per second of epoch (``rank`` names the rank; payload as in
gnn_training's ``pcie_bytes``), ``loss`` per step of the first epoch (mean over the ranks: the
global batch's loss), ``accuracy`` on the validation nodes (rank 0, after the timed epochs: one
epoch fewer than gnn_training, which also trains an instrumented epoch first).
"""

from harness.results import Schema

SCHEMA = Schema(
    topic="gnn_multi_gpu",
    config={
        "device": str,  # "cuda" (one GPU per rank) or "cpu"
        "backend": str,  # "nccl" or "gloo"
        "world_size": int,  # ranks
        "model": str,
        "layers": int,
        "fanouts": str,
        "batch_size": int,  # seeds per rank per step (the global batch is world_size times this)
        "hidden": int,
        "nodes": int,
        "edges": int,
        "feature_dim": int,
        "sampler_workers": int,  # CPU sampling processes per rank
        "train_threads": int,  # torch threads per rank
        "rank": str,  # the rank of a per-rank value, or "all"
    },
)
