"""Operations the relational layers' plain-PyTorch forms share: gathering rows, per-relation
products of rows already in relation order (a loop of matrix products, or one grouped GEMM), and
the softmax of edge scores over each target's incoming edges.

These are written as a careful user would write them, so that no baseline pays for avoidable
autograd overhead (each was measured on the H200 at commit ab3500e, docs/relational_gnn.md)."""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from harness.errors import UserError

GROUPED_MM_TYPES = (torch.float32, torch.bfloat16, torch.float16)  # what torch's grouped_mm multiplies


def take_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` along the first dimension through ``index_select``, whose gradient is one
    ``index_add`` (atomic adds). Advanced indexing's gradient is an accumulating ``index_put_``,
    which sorts the indices first: slower where a few nodes are the ends of many edges."""
    return table.index_select(0, index)


def segment_products(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """``rows[offsets[r]:offsets[r+1]] @ weight[r]`` for every relation r, concatenated: one
    matrix product per relation's contiguous segment (DGL's segment_mm style).

    The segments come from ``split`` and ``unbind``, whose gradients are one ``cat`` and one
    ``stack``. Slicing in the loop instead gives each segment's gradient as a zero-filled tensor
    of the full size, summed over the relations: relations x edges x width of memory traffic
    (on fb15k-like, 474 relations, over 100 ms a training step on the H200)."""
    if weight.shape[0] == 0:  # no relations, so no rows: an empty product, still tied to both operands
        return rows @ weight.sum(0)
    sizes = _segment_sizes(offsets)
    return torch.cat([segment @ w for segment, w in zip(rows.split(sizes), weight.unbind(0), strict=True)])


# id(offsets) -> (a weak reference to it, what identifies its contents, its segments' lengths on
# the host). Keyed by id, not by the tensor: a tensor's == is elementwise, so it cannot be a key.
_sizes_read: dict[int, tuple[weakref.ref, tuple, list[int]]] = {}


def _segment_sizes(offsets: torch.Tensor) -> list[int]:
    """The segments' lengths, read to the host once per offsets tensor (again if torch changes it
    in place, or its storage is swapped: ``.data =``, ``set_``), as a careful user keeps them: a
    graph's segments do not change between steps, and a step that reads nothing back from the GPU
    can be captured as a CUDA graph. Writes torch cannot see (through ``.numpy()``, or to
    ``.data``, which has a version counter of its own) are not seen here either."""
    if offsets.is_inference():  # no version counter to tell an in-place change by: read each time
        return offsets.diff().tolist()
    key = id(offsets)
    state = (offsets._version, offsets.data_ptr(), offsets.storage_offset(), tuple(offsets.shape), offsets.stride())
    known = _sizes_read.get(key)
    if known is None or known[0]() is not offsets or known[1] != state:
        gone = weakref.ref(offsets, lambda _: _sizes_read.pop(key, None))
        known = (gone, state, offsets.diff().tolist())
        _sizes_read[key] = known
    return known[2]


def grouped_products(
    rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor, ends: torch.Tensor | None = None
) -> torch.Tensor:
    """The same as :func:`segment_products` in one ``torch.nn.functional.grouped_mm`` call. Its
    operands' rows must be multiples of 16 bytes, so odd sizes are zero-padded (adding nothing).
    ``ends``: grouped_mm's ``offs`` (``offsets[1:]`` as int32), when the caller made them once.
    grouped_mm multiplies float32, bfloat16 and float16 only: other types are refused in one line
    (this form is that one call; :func:`segment_products` takes any type). Under autocast its
    operands are cast as autocast casts a matrix product's (torch's autocast lists leave grouped_mm
    out on the CPU): the form then computes what segment_products computes there."""
    rows, weight = autocast_operands(rows, weight)
    if rows.dtype not in GROUPED_MM_TYPES:
        raise UserError(
            f"grouped_mm multiplies float32, bfloat16 or float16 tensors, got {str(rows.dtype).removeprefix('torch.')}"
            " (the segment_mm form computes the same in any type)"
        )
    align = 16 // rows.element_size()
    pad_in, pad_out = -weight.shape[1] % align, -weight.shape[2] % align
    if pad_in or pad_out:
        rows = F.pad(rows, (0, pad_in))
        weight = F.pad(weight, (0, pad_out, 0, pad_in))
    out = F.grouped_mm(rows, weight, offs=offsets[1:].to(torch.int32) if ends is None else ends)
    return out[:, : out.shape[1] - pad_out]


def autocast_operands(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensors`` as autocast gives them to a matrix product where it is on for their device:
    float32 ones in its lower type, others as they are. For an operator autocast leaves out, which
    would otherwise compute in float32 beside the rest of a form's products in bfloat16."""
    device = tensors[0].device.type
    if not torch.is_autocast_enabled(device):
        return tensors
    low = torch.get_autocast_dtype(device)
    return tuple(t.to(low) if t.dtype == torch.float32 else t for t in tensors)


def edge_softmax(scores: torch.Tensor, dst: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Softmax of each edge's score over the edges into the same target. The per-target maximum
    is subtracted for range only (the result does not depend on it), so it is not differentiated.
    Scores in a narrower type than float32 are exponentiated and summed in float32 (as autocast
    runs softmax): a bfloat16 sum of a node's exponentials drifts by a few percent. ``scores`` is
    one score per edge, or one row per edge (a score per head): each column on its own."""
    if scores.dim() == 0 or dst.dim() != 1 or scores.shape[0] != dst.shape[0]:
        raise UserError(
            f"edge_softmax takes one score (or one row of scores) per edge of dst: got scores of shape "
            f"{tuple(scores.shape)} for dst of shape {tuple(dst.shape)}"
        )
    if scores.dtype in (torch.bfloat16, torch.float16):
        return edge_softmax(scores.float(), dst, num_nodes).to(scores.dtype)
    rest = scores.shape[1:]
    top = torch.full((num_nodes, *rest), -torch.inf, dtype=scores.dtype, device=scores.device)
    top = top.scatter_reduce(0, dst.view(-1, *(1 for _ in rest)).expand_as(scores), scores.detach(), "amax")
    exp = (scores - take_rows(top, dst)).exp()
    total = torch.zeros((num_nodes, *rest), dtype=scores.dtype, device=scores.device).index_add(0, dst, exp)
    return exp / take_rows(total, dst)
