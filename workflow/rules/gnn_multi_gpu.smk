# Data-parallel GNN training at 1-8 GPUs from one shared feature table (workloads/gnn_multi_gpu).
from workloads.gnn_multi_gpu import gpus_of as multi_gpu_gpus_of
from workloads.gnn_multi_gpu import parts_for as multi_gpu_parts_for

register_topic("gnn_multi_gpu", "Multi-GPU GNN training", lambda: multi_gpu_parts_for(HAS_GPU),
               gpus=lambda part: multi_gpu_gpus_of(part, HAS_GPU))


rule gnn_multi_gpu:
    """This machine's multi-GPU GNN training figure (every world size its GPUs allow)."""
    input:
        topic_targets("gnn_multi_gpu"),
