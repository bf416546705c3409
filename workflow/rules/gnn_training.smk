# Minibatch GNN training: CPU-gather baseline vs zero-copy vs all-in-GPU (workloads/gnn_training).
from workloads.gnn_training import parts_for as gnn_parts_for

register_topic("gnn_training", "GNN minibatch training", lambda: gnn_parts_for(HAS_GPU))


rule gnn_training:
    """This machine's GNN training figure at the configured scale (measures what is missing)."""
    input:
        topic_targets("gnn_training"),
