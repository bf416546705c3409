"""PyTorch-Direct: GPU-centric zero-copy gathering of rows from a table in pinned host memory.

Two lines in a training loop::

    feats = UnifiedTensor(features)      # pin the existing host tensor in place (no copy)
    batch = feats[node_ids_on_gpu]       # GPU threads gather the rows over PCIe

``feats.cuda_alias()`` is the same host memory as a CUDA tensor, for stock torch ops
(``alias[idx]``, ``index_select``, ``F.embedding``, slicing); ``unified.py`` says when it may be
used and written. ``ops.gather`` is the ``torch.library`` op underneath ``feats[idx]`` (with a
CPU reference); what it is compared against (the CPU-gather baselines, stock torch, an
all-in-GPU bound) is in workloads/feature_gather/variants.py.
"""

from systems.pytorch_direct.unified import UnifiedTensor

__all__ = ["UnifiedTensor"]
