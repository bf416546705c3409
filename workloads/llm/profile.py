"""Per-block measurements of a real model: bytes saved for backward, and forward FLOPs.

What SSDTrain's adaptive keep profiles before it plans (REFERENCE §3), and what checks the
formulas of workloads.llm.cost. Both run one training forward of the model on a batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from workloads.llm.layers import blocks


@dataclass(frozen=True)
class SavedBytes:
    """Bytes of the distinct storages autograd saved during one forward.

    ``per_block``: saved while each block ran, in execution order; ``outside``: saved outside every
    block (embeddings, final norm, head, loss).
    """

    per_block: list[int]
    outside: int


def saved_bytes(model: nn.Module, batch: dict[str, torch.Tensor]) -> SavedBytes:
    """What one training forward of ``model`` on ``batch`` saves for backward, block by block.

    Counted as an offloader with deduplication would store it: each storage once (views of one
    tensor, and a tensor saved by several ops, count once), the whole storage of a saved view,
    attributed to the block that saved it first (T5's position bias, Llama's rotary tables and
    T5's encoder output, made once and read by every block, count in the first block that
    saves them). Parameters and buffers are not activations and are left out.
    """
    weights = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    named = blocks(model)
    per_block = [0] * len(named)
    seen: dict[int, torch.UntypedStorage] = {}  # holding the storages keeps their addresses unique
    outside = 0
    current = [None]  # index of the block running now, or None between blocks

    def pack(tensor: torch.Tensor):
        nonlocal outside
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key not in weights and key not in seen:
            seen[key] = storage
            if current[0] is None:
                outside += storage.nbytes()
            else:
                per_block[current[0]] += storage.nbytes()
        return tensor

    handles = []
    for i, (_, block) in enumerate(named):
        handles.append(block.register_forward_pre_hook(lambda *_, i=i: current.__setitem__(0, i)))
        handles.append(block.register_forward_hook(lambda *_: current.__setitem__(0, None)))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model(**batch)
    finally:
        for handle in handles:
            handle.remove()
    return SavedBytes(per_block, outside)


def _attention_flops(query_shape, key_shape, value_shape, *_, **__) -> int:
    """Scores and weighted values, 2 FLOPs per multiply-add, every query head (grouped-query
    attention shares key/value heads, not work)."""
    b, heads, s_q, d = query_shape
    s_k, d_v = key_shape[2], value_shape[3]
    return 2 * b * heads * s_q * s_k * (d + d_v)


# FlopCounterMode knows the GPU's fused attention kernels but not the CPU's (torch 2.13): without
# this, attention on a CPU would count zero.
CPU_ATTENTION = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _attention_flops}


def forward_flops(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[list[int], int]:
    """FLOPs of one forward, per block in execution order, and of the whole model.

    torch's FlopCounterMode counts matrix products and attention (2 per multiply-add; attention
    over the full square, whatever the mask) and no elementwise work: the same terms as the
    analytic formulas. Rotary position tables are not model FLOPs and are left out of the total:
    transformers 5.17 builds them with a matrix product (counted), 5.24 without.
    """
    counter = FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION)
    with torch.no_grad(), counter:
        model(**batch)
    counts = {name.split(".", 1)[-1]: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    rotary = sum(n for name, n in counts.items() if name.split(".")[-1] == "rotary_emb")
    return [counts.get(name, 0) for name, _ in blocks(model)], counter.get_total_flops() - rotary
