"""PyTorch-Direct: GPU-centric zero-copy gathering of rows from a table in pinned host memory.

Two lines in a training loop::

    feats = UnifiedTensor(features)      # pin the existing host tensor in place (no copy)
    batch = feats[node_ids_on_gpu]       # GPU threads gather the rows over PCIe

``ops.gather`` is the ``torch.library`` op underneath (with a CPU reference); what it is compared
against (the CPU-gather baselines, stock torch, an all-in-GPU bound) is in
workloads/feature_gather/variants.py.
"""

from systems.pytorch_direct.unified import UnifiedTensor

__all__ = ["UnifiedTensor"]
