"""Analytic per-block costs: forward FLOPs, bytes saved for backward, and the write bandwidth
that hides a block's offload inside its own forward. Used by the planner and the figures;
workloads.llm.profile measures the same quantities on a real model.

Notation: b micro-batch, s sequence, h hidden, a heads, kv the width of the key (and of the
value) projection (kv_heads · h/a: h without grouped-query attention), f the FFN width, V the
vocabulary, e bytes per element (2 for bf16, 4 for fp32). T5's decoder reads s tokens, as its
encoder does.

Forward FLOPs, 2 per multiply-add, matrix products and attention only (elementwise work,
norms, softmax and embeddings lookups are left out; they are a few percent at these shapes):

- attention: projections 2bs·h·(2h + 2kv) (q and o are h x h, k and v h x kv); scores and
  weighted values 4bs²h (every head over the full s x s square: causal masks are not exploited
  by the kernels' FLOP count either);
- FFN: 4bshf (GELU or ReLU: two matrices), 6bshf (Llama's SwiGLU: gate, up, down);
- GPT-2 and BERT blocks and T5 encoder blocks: 8bsh² + 4bs²h + 4bshf, which with f = 4h is
  REFERENCE §3's 24bsh²(1 + s/6h); a Llama block: 4bsh² + 4bsh·kv + 4bs²h + 6bshf (with kv = h and
  f = 8/3 h also 24bsh²(1 + s/6h)); a T5 decoder block adds cross-attention to self-attention:
  16bsh² + 8bs²h + 4bshf;
- outside the blocks: the output projection 2bshV (BERT's masked-LM head adds its h x h
  transform, 2bsh²); a training step is 3x the forward (backward computes two products per
  forward one) plus any recomputation, which :func:`model_tflops` does not count (the usual
  "model FLOPs" convention).

Saved activation bytes per block, as fused kernels save them (Korthikanti et al., the source of
REFERENCE §3's 34·s·b·h): each norm its input and output (2h elements per token; statistics
negligible), attention its q, k, v and output (2h + 2kv; a fused kernel keeps a logsumexp of a
floats per token, negligible), a GELU FFN its activation's input and output (2f), a ReLU FFN the
ReLU output (f), SwiGLU gate, activation, up and product (4f). Per token, times e: GPT-2/BERT
8h + 2f (16h at f = 4h: 32 bytes in 16 bits); Llama 6h + 2kv + 4f; T5 encoder 8h + f, decoder
(three norms, self- and cross-attention) 14h + f. With dropout each dropout saves a 1-byte mask
per element: 2h for GPT-2 and BERT (after attention and after the FFN: 16h·2 + 2h = REFERENCE's
34h), 2h + f for a T5 encoder block and 3h + f for a decoder block, plus the dropped FFN
activation itself (f·e, T5 drops inside its FFN). Unfused attention adds the probabilities,
e·a·s² per sequence per attention (and with dropout a mask and the dropped copy, a·s²·(1 + e));
REFERENCE's formula assumes fused attention. Tensors made once and read by every block (T5's
encoder output and position bias, Llama's rotary tables) are not in the per-block figures.

Known gaps to transformers' eager models, measured by tests/test_llm_models.py on tiny models:
their RMSNorm (Llama, T5) is unfused and saves 4 more bytes per element of h than a fused norm
(an fp32 copy of its input in 16-bit training, an extra normalized copy in fp32); on a CPU,
T5's self-attention runs SDPA's unfused math path (its learned position bias needs a gradient),
saving the probabilities. Further gaps, measured and not modelled: on the H200 T5's blocks saved
2.6-3.1x the formula's bytes (1.4-1.6x with both gaps above added; the profiles of
results/h200/llm_offload); on a CPU, dropout saves a float32 noise tensor, not a 1-byte mask (CPU
dropout multiplies by it), and SDPA with dropout takes the math path (the probabilities, the mask
and the dropped copy): the formula is 20-46% short there. The figures that need a model's saved
bytes read the profile's measured ones where a run has one.
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads.llm.models import FAMILY, ModelSpec


@dataclass(frozen=True)
class BlockCost:
    """One transformer block's forward FLOPs and saved bytes. ``kind``: ``layer`` (GPT-2, BERT,
    Llama), ``encoder`` or ``decoder`` (T5)."""

    kind: str
    forward_flops: int
    saved_bytes: int


def _attention_flops(b: int, s: int, h: int, kv: int) -> int:
    return 2 * b * s * h * (2 * h + 2 * kv) + 4 * b * s * s * h


def _unfused_attention_bytes(spec: ModelSpec, e: int) -> int:
    """The probabilities an unfused attention saves (and with dropout, their mask and dropped copy)."""
    probabilities = spec.micro_batch * spec.heads * spec.sequence**2
    return probabilities * (e + (1 + e if spec.dropout else 0))


def block_costs(spec: ModelSpec, element_bytes: int = 2, fused_attention: bool = True) -> list[BlockCost]:
    """Every block's costs in execution order (T5: encoder blocks, then decoder blocks)."""
    b, s, h, f, kv, e = spec.micro_batch, spec.sequence, spec.hidden, spec.ffn_hidden, spec.kv_dim, element_bytes
    dropping = 1 if spec.dropout else 0
    unfused = 0 if fused_attention else _unfused_attention_bytes(spec, e)
    tokens = b * s
    if spec.family in ("gpt2", "bert"):
        flops = _attention_flops(b, s, h, h) + 4 * tokens * h * f
        saved = tokens * ((8 * h + 2 * f) * e + dropping * 2 * h) + unfused
        return [BlockCost("layer", flops, saved)] * spec.layers
    if FAMILY[spec.family].llama_style:
        flops = _attention_flops(b, s, h, kv) + 6 * tokens * h * f
        saved = tokens * (6 * h + 2 * kv + 4 * f) * e + unfused  # no dropout outside the attention kernel
        return [BlockCost("layer", flops, saved)] * spec.layers
    ffn_flops = 4 * tokens * h * f
    ffn_dropout = dropping * f * (1 + e)  # T5 drops its FFN activation: a mask, and the dropped copy wo saves
    encoder = BlockCost(
        "encoder",
        _attention_flops(b, s, h, h) + ffn_flops,
        tokens * ((8 * h + f) * e + dropping * 2 * h + ffn_dropout) + unfused,
    )
    decoder = BlockCost(
        "decoder",
        2 * _attention_flops(b, s, h, h) + ffn_flops,
        tokens * ((14 * h + f) * e + dropping * 3 * h + ffn_dropout) + 2 * unfused,
    )
    return [encoder] * spec.layers + [decoder] * spec.layers


def head_flops(spec: ModelSpec) -> int:
    """Forward FLOPs outside the blocks: the output projection (BERT: and its h x h transform)."""
    tokens = spec.micro_batch * spec.sequence
    transform = 2 * tokens * spec.hidden**2 if spec.family == "bert" else 0
    return 2 * tokens * spec.hidden * spec.vocab + transform


def forward_flops(spec: ModelSpec) -> int:
    """FLOPs of one forward of the whole model on one micro-batch."""
    return sum(block.forward_flops for block in block_costs(spec)) + head_flops(spec)


def training_flops(spec: ModelSpec) -> int:
    """Model FLOPs of one training step (forward and backward) on one micro-batch, no recomputation."""
    return 3 * forward_flops(spec)


def model_tflops(spec: ModelSpec, step_seconds: float) -> float:
    """Model TFLOP/s of a training step on one micro-batch that took ``step_seconds``."""
    return training_flops(spec) / step_seconds / 1e12


def write_bandwidth(saved_bytes: float, forward_seconds: float) -> float:
    """Bytes per second that write a block's saved bytes within its own forward (SSDTrain's test for
    offloading a block: the measured write bandwidth must reach this)."""
    return saved_bytes / forward_seconds


def hiding_bandwidths(spec: ModelSpec, flops_per_second: float, element_bytes: int = 2) -> list[float]:
    """Per block, the write bandwidth (bytes/s) that hides its offload in its forward at a
    throughput of ``flops_per_second``: 34sbh / (24bsh²(1 + s/6h) / F) ≈ 1.4·F/h for GPT-2 with
    dropout (REFERENCE §3), independent of the micro-batch."""
    return [
        write_bandwidth(block.saved_bytes, block.forward_flops / flops_per_second)
        for block in block_costs(spec, element_bytes)
    ]
