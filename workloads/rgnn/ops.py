"""Operations the relational layers' plain-PyTorch forms share: per-relation products of rows
already in relation order (a loop of matrix products, or one grouped GEMM), and the softmax of
edge scores over each target's incoming edges."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def segment_products(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``rows[offsets[r]:offsets[r+1]] @ weight[r]`` for every relation r, concatenated: one
    matrix product per relation's contiguous segment (DGL's segment_mm style)."""
    bounds = offsets.tolist()  # one host read per call, not one per relation
    return torch.cat([rows[bounds[r] : bounds[r + 1]] @ weight[r] for r in range(weight.shape[0])])


def grouped_products(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The same as :func:`segment_products` in one ``torch.nn.functional.grouped_mm`` call. Its
    operands' rows must be multiples of 16 bytes, so odd sizes are zero-padded (adding nothing)."""
    align = 16 // rows.element_size()
    pad_in, pad_out = -weight.shape[1] % align, -weight.shape[2] % align
    if pad_in or pad_out:
        rows = F.pad(rows, (0, pad_in))
        weight = F.pad(weight, (0, pad_out, 0, pad_in))
    out = F.grouped_mm(rows, weight, offs=offsets[1:].to(torch.int32))
    return out[:, : out.shape[1] - pad_out]


def edge_softmax(scores: torch.Tensor, dst: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Softmax of each edge's score over the edges into the same target. The per-target maximum
    is subtracted for range only (the result does not depend on it), so it is not differentiated."""
    top = torch.full((num_nodes,), -torch.inf, dtype=scores.dtype, device=scores.device)
    top = top.scatter_reduce(0, dst, scores.detach(), "amax")
    exp = (scores - top[dst]).exp()
    total = torch.zeros(num_nodes, dtype=scores.dtype, device=scores.device).index_add(0, dst, exp)
    return exp / total[dst]
