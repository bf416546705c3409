"""PyTorch-Direct: GPU-centric zero-copy gathering of rows from a table in pinned host memory.

Two lines in a training loop::

    feats = UnifiedTensor(features)      # pin the existing host tensor in place (no copy)
    batch = feats[node_ids_on_gpu]       # GPU threads gather the rows over PCIe

``feats.cuda_alias()`` is the same host memory as a CUDA tensor, for stock torch ops
(``alias[idx]``, ``index_select``, ``F.embedding``, slicing); ``unified.py`` says when it may be
used and written. ``ops.gather`` calls the ``torch.library`` op underneath ``feats[idx]``
(``ops.gather_op``, with a CPU reference), its arguments' types checked first. The ways of
gathering that the benchmark compares (the CPU-gather baselines, stock torch, WholeGraph, this
op's steps, an all-in-GPU bound) are entries of ``gather_variants.GATHER_VARIANTS``, one module
each or per family.
"""

from systems.pytorch_direct.unified import UnifiedTensor

__all__ = ["UnifiedTensor"]
