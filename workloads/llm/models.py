"""GPT-2, BERT, T5 and Llama, and Llama's block under Mistral's and Qwen2's names, built from
Hugging Face configs, with seeded random weights.

A :class:`ModelSpec` is one workload: a family, the model's shape and the micro-batch it trains
on. :func:`spec` makes one from a named preset; :func:`build` instantiates it on a device (through
transformers' ``AutoModel*.from_config``: nothing is downloaded) with SDPA attention where the
model has it. Shapes a model cannot have are refused in one line (:class:`UserError`).

Presets (family-agnostic shapes; the family picks vocabulary and FFN): SSDTrain's three
(hidden, layers) = (8192, 4), (12288, 3), (16384, 2), with 128-wide heads, sequence 1024 and
micro-batch 16 (REFERENCE §3); a deeper ``deep-4096x16``; ``h200-2048x24``, the GPT-2-style row
measured on the H200 (REFERENCE §4: 1.32B parameters, sequence 2048, micro-batch 8); and ``tiny``
for tests. The Llama-style families use 8 key/value heads (grouped-query attention) at every
full-size preset, as in the H200 Llama row, and an FFN of 8/3 hidden rounded up to a multiple of
256 (Llama's rule): that gives the row's 3.29B parameters at 8192x4 exactly.

Memory when building (P parameters; :func:`parameter_count` gives P without allocating, from a
``meta`` build). The weights are created directly on the target device in the target dtype
(``torch.device`` context plus transformers' dtype context), so they exist once: 2P bytes in
bf16 on a GPU, 4P in fp32 on a CPU, with no host copy and no fp32 copy first. The largest
presets: Llama 16384x2 has P = 6.49B (13.0 GB in bf16), GPT-2 16384x2 7.28B (14.6 GB), T5
16384x2 (2 encoder and 2 decoder blocks, the decoder's with cross-attention) 15.6B (31.1 GB).
Mixed-precision training with Adam holds 16P bytes before any activation (bf16 weights and
gradients, an fp32 master copy and two fp32 moments): 104 GB for Llama 16384x2, 117 GB for
GPT-2 16384x2, 249 GB for T5 16384x2, which therefore needs sharding (the paper used tensor
parallelism 2) or a smaller preset on one 143 GB H200. Activations add 34·s·b·h bytes per layer
in bf16 (REFERENCE §3; workloads.llm.cost): 9.1 GB per layer at hidden 16384, b=16, s=1024.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
from torch import nn

from harness.arguments import real_number, whole_number
from harness.errors import UserError


@dataclass(frozen=True)
class Family:
    """What a family fixes when the spec leaves it open, and how its transformers config is made."""

    vocab: int  # the published tokenizer's size
    ffn_mult: float  # FFN width / hidden
    ffn_multiple_of: int  # the FFN width is rounded up to a multiple of this
    task: str  # the head trained: "causal", "masked" or "seq2seq" (workloads.llm.data makes its labels)
    config: Callable[[ModelSpec], object]  # makes its transformers config
    # A Llama-style decoder: grouped-query attention (kv_heads may be fewer than heads), a gated
    # (SwiGLU) FFN, rotary positions, RMSNorm (workloads.llm.cost counts its blocks as Llama's).
    llama_style: bool = False
    config_extra: tuple[tuple[str, object], ...] = ()  # more settings of its config, by name


def _gpt2_config(s: ModelSpec):
    from transformers import GPT2Config

    # gelu_pytorch_tanh is GPT-2's tanh GELU as one fused op; "gelu_new" computes the same in
    # eight elementwise ops and saves several of their results for backward.
    return GPT2Config(
        vocab_size=s.vocab,
        n_positions=s.max_positions,
        n_embd=s.hidden,
        n_layer=s.layers,
        n_head=s.heads,
        n_inner=s.ffn_hidden,
        activation_function="gelu_pytorch_tanh",
        resid_pdrop=s.dropout,
        embd_pdrop=s.dropout,
        attn_pdrop=s.dropout,
        bos_token_id=None,
        eos_token_id=None,
        use_cache=False,
    )


def _bert_config(s: ModelSpec):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=s.vocab,
        hidden_size=s.hidden,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        intermediate_size=s.ffn_hidden,
        hidden_act="gelu",
        hidden_dropout_prob=s.dropout,
        attention_probs_dropout_prob=s.dropout,
        max_position_embeddings=s.max_positions,
        pad_token_id=0,
    )


def _t5_config(s: ModelSpec):
    from transformers import T5Config

    return T5Config(
        vocab_size=s.vocab,
        d_model=s.hidden,
        d_kv=s.head_dim,
        d_ff=s.ffn_hidden,
        num_layers=s.layers,
        num_decoder_layers=s.layers,
        num_heads=s.heads,
        dropout_rate=s.dropout,
        feed_forward_proj="relu",
        pad_token_id=0,
        decoder_start_token_id=0,
        eos_token_id=None,
        use_cache=False,
    )


def _llama_style_config(s: ModelSpec):
    """Llama's, Mistral's and Qwen2's configs take the same names (each its own class, found by
    the family's model type), and each family's ``config_extra``."""
    import transformers

    return transformers.CONFIG_MAPPING[s.family](
        vocab_size=s.vocab,
        hidden_size=s.hidden,
        intermediate_size=s.ffn_hidden,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        max_position_embeddings=s.max_positions,
        attention_dropout=s.dropout,
        bos_token_id=None,
        eos_token_id=None,
        use_cache=False,
        **dict(FAMILY[s.family].config_extra),
    )


FAMILY = {
    "gpt2": Family(vocab=50257, ffn_mult=4, ffn_multiple_of=1, task="causal", config=_gpt2_config),
    "bert": Family(vocab=30522, ffn_mult=4, ffn_multiple_of=1, task="masked", config=_bert_config),
    "t5": Family(vocab=32128, ffn_mult=4, ffn_multiple_of=1, task="seq2seq", config=_t5_config),
    "llama": Family(32000, 8 / 3, 256, "causal", _llama_style_config, llama_style=True),
    # Llama's block under other names: Mistral (the v0.3 tokenizer's 32768 tokens; its sliding
    # window off, so that it attends as Llama does) and Qwen2 (151936 tokens; q, k and v biased).
    "mistral": Family(
        32768, 8 / 3, 256, "causal", _llama_style_config, llama_style=True, config_extra=(("sliding_window", None),)
    ),
    "qwen2": Family(151936, 8 / 3, 256, "causal", _llama_style_config, llama_style=True),
}
FAMILIES = tuple(FAMILY)


@dataclass(frozen=True)
class ModelSpec:
    """One workload: a model's shape and the micro-batch it trains on.

    ``layers`` counts transformer blocks; T5 has that many in its encoder and again in its
    decoder, and its decoder reads as many tokens as its encoder (``sequence``). ``kv_heads``
    (key/value heads, grouped-query attention) may differ from ``heads`` for Llama only.
    ``max_positions``: the longest sequence the position embeddings cover (T5's relative
    positions have no limit; the check still applies). ``dropout`` is 0 by default so that runs
    that keep, offload or recompute activations are bit-identical without replaying the RNG.
    Fields left ``None`` take the family's value (:data:`FAMILY`) or the one named beside them.
    """

    family: str
    hidden: int
    layers: int
    heads: int
    sequence: int
    micro_batch: int = 1
    vocab: int | None = None
    kv_heads: int | None = None  # None: heads
    ffn_mult: float | None = None
    ffn_multiple_of: int | None = None
    max_positions: int | None = None  # None: sequence
    dropout: float = 0.0

    def __post_init__(self):
        if self.family not in FAMILY:
            raise UserError(f"unknown model family {self.family!r}; one of {', '.join(FAMILIES)}")
        family = FAMILY[self.family]
        defaults = {
            "vocab": family.vocab,
            "kv_heads": self.heads,
            "ffn_mult": family.ffn_mult,
            "ffn_multiple_of": family.ffn_multiple_of,
            "max_positions": self.sequence,
        }
        for name, value in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)  # frozen: resolve once, here
        self._check()

    def _check(self):
        names = ("hidden", "layers", "heads", "sequence", "micro_batch", "vocab", "kv_heads", "ffn_multiple_of")
        for name in (*names, "max_positions"):
            value = getattr(self, name)
            if whole_number(value, at_least=1) is None:
                raise UserError(f"{self.family} {name} must be a positive integer, got {value!r}")
        if self.hidden % self.heads:
            raise UserError(f"{self.family} hidden {self.hidden} is not divisible by its {self.heads} heads")
        if FAMILY[self.family].llama_style and self.head_dim % 2:
            # Rotary positions turn pairs of a head's channels; transformers refuses an odd width with a traceback.
            raise UserError(
                f"{self.family} heads of width {self.head_dim} (hidden {self.hidden} / {self.heads} heads): rotary "
                "positions need an even head width"
            )
        if self.task == "causal" and self.sequence < 2:
            # Each position predicts the next token: a sequence of one has nothing to predict, and a NaN loss.
            raise UserError(f"{self.family} sequence {self.sequence}: a causal model needs 2 tokens to predict one")
        if self.kv_heads != self.heads and not FAMILY[self.family].llama_style:
            raise UserError(f"{self.family} has no grouped-query attention: kv_heads must equal heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise UserError(f"{self.family} kv_heads {self.kv_heads} does not divide its {self.heads} heads")
        if self.sequence > self.max_positions:
            raise UserError(f"{self.family} sequence {self.sequence} exceeds its max positions {self.max_positions}")
        ffn_mult, dropout = real_number(self.ffn_mult), real_number(self.dropout)  # None: no finite number
        if ffn_mult is None or ffn_mult <= 0:
            raise UserError(f"{self.family} ffn_mult must be a positive finite number, got {self.ffn_mult!r}")
        if dropout is None or not 0 <= dropout < 1:
            raise UserError(f"{self.family} dropout must be a number in [0, 1), got {self.dropout!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: hidden for multi-head attention."""
        return self.kv_heads * self.head_dim

    @property
    def ffn_hidden(self) -> int:
        # round() first: 8/3 * 768 is 2048.0000000000002 in floating point, not 2049 after ceil
        width = round(self.ffn_mult * self.hidden, 6)
        return math.ceil(width / self.ffn_multiple_of) * self.ffn_multiple_of

    @property
    def task(self) -> str:
        return FAMILY[self.family].task

    @property
    def blocks(self) -> int:
        """Transformer blocks in the model: T5 has an encoder and a decoder of ``layers`` each."""
        return 2 * self.layers if self.family == "t5" else self.layers


@dataclass(frozen=True)
class Shape:
    """A preset: a shape any family can take (``vocab`` None: the family's tokenizer)."""

    hidden: int
    layers: int
    heads: int
    sequence: int
    micro_batch: int
    kv_heads: int | None = None  # Llama only; the other families use heads
    vocab: int | None = None


PRESETS = {
    "tiny": Shape(hidden=64, layers=2, heads=4, sequence=32, micro_batch=4, kv_heads=2, vocab=128),
    "paper-8192x4": Shape(hidden=8192, layers=4, heads=64, sequence=1024, micro_batch=16, kv_heads=8),
    "paper-12288x3": Shape(hidden=12288, layers=3, heads=96, sequence=1024, micro_batch=16, kv_heads=8),
    "paper-16384x2": Shape(hidden=16384, layers=2, heads=128, sequence=1024, micro_batch=16, kv_heads=8),
    "deep-4096x16": Shape(hidden=4096, layers=16, heads=32, sequence=1024, micro_batch=16, kv_heads=8),
    "h200-2048x24": Shape(hidden=2048, layers=24, heads=16, sequence=2048, micro_batch=8, kv_heads=8),
}


def spec(family: str, preset: str = "tiny", **overrides) -> ModelSpec:
    """The preset's shape as a ``family`` model; ``overrides`` replace any :class:`ModelSpec` field."""
    if preset not in PRESETS:
        raise UserError(f"unknown model preset {preset!r}; one of {', '.join(PRESETS)}")
    unknown = set(overrides) - set(_spec_fields())
    if unknown:
        raise UserError(f"unknown model setting {sorted(unknown)[0]!r}; one of {', '.join(_spec_fields())}")
    shape = PRESETS[preset]
    values = {f.name: getattr(shape, f.name) for f in fields(Shape)}
    if family not in FAMILY or not FAMILY[family].llama_style:
        values["kv_heads"] = None  # grouped-query attention is the Llama-style decoders' alone
    return ModelSpec(family=family, **{**values, **overrides})


def _spec_fields() -> list[str]:
    return [f.name for f in fields(ModelSpec) if f.name != "family"]


def hf_config(spec: ModelSpec):
    """The transformers config of ``spec``: no cache (training), dropout as the spec says.

    Padding (and T5's decoder start) is token 0, as workloads.llm.data reserves it; there are no
    begin/end tokens: nothing here generates text.
    """
    return FAMILY[spec.family].config(spec)


def _auto_class(family: str):
    import transformers

    name = {"causal": "AutoModelForCausalLM", "masked": "AutoModelForMaskedLM", "seq2seq": "AutoModelForSeq2SeqLM"}
    return getattr(transformers, name[FAMILY[family].task])


def default_dtype(device: torch.device | str) -> torch.dtype:
    """bf16 on a GPU (what the measurements train in); fp32 on a CPU, whose bf16 matmuls are slow."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


@dataclass(frozen=True)
class BuiltModel:
    """A built model and how it was built; ``attention_note`` says why it is not SDPA, if not."""

    model: nn.Module
    spec: ModelSpec
    device: torch.device
    dtype: torch.dtype
    attention: str  # the attention implementation the model runs: "sdpa" or "eager"
    attention_note: str | None = None


def build(
    spec: ModelSpec, device: torch.device | str = "cpu", dtype: torch.dtype | None = None, seed: int = 0
) -> BuiltModel:
    """``spec`` with random weights drawn from ``seed``, in training mode, created on ``device``.

    The same spec, seed, device and dtype give bit-identical weights. The caller's RNG state is
    left as it was. Attention is SDPA; a model class without SDPA is built with eager attention
    instead and the reason recorded in ``attention_note``.
    """
    device = torch.device(device)
    dtype = dtype or default_dtype(device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
        _check_fits(spec, device, dtype)
    model, note = None, None
    for attention in ("sdpa", "eager"):
        try:
            model = _instantiate(spec, device, dtype, seed, attention)
            break
        except ValueError as err:  # transformers refuses SDPA for a class without it
            if attention != "sdpa" or "scaled_dot_product_attention" not in str(err):
                raise
            note = f"{spec.family}: no SDPA in this transformers version, eager attention instead"
    if spec.task == "causal" and getattr(model, "loss_type", None) is None:
        # GPT2LMHeadModel's name matches none of transformers' loss names, so every first loss
        # warns that it falls back to the causal-LM loss: the right one; say so instead.
        model.loss_type = "ForCausalLM"
    model.train()
    return BuiltModel(model, spec, device, dtype, model.config._attn_implementation, note)


def _instantiate(spec: ModelSpec, device: torch.device, dtype: torch.dtype, seed: int, attention: str) -> nn.Module:
    # fork_rng: seeding here must not change the caller's random stream (nor the GPU's).
    gpus = [device.index] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=gpus), torch.device(device):
        torch.manual_seed(seed)
        return _auto_class(spec.family).from_config(hf_config(spec), attn_implementation=attention, dtype=dtype)


def parameter_count(spec: ModelSpec) -> int:
    """The number of parameters of ``spec`` (tied embeddings once), from a build on ``meta``: no memory."""
    model = _instantiate(spec, torch.device("meta"), torch.bfloat16, seed=0, attention="eager")
    return sum(p.numel() for p in model.parameters())


def _check_fits(spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse in one line a model whose weights alone exceed the GPU's free memory, before allocating."""
    need = parameter_count(spec) * dtype.itemsize
    free, _ = torch.cuda.mem_get_info(device)
    if need > free:
        raise UserError(
            f"{spec.family} hidden {spec.hidden} x {spec.layers} layers needs {need / 2**30:.1f} GiB for its "
            f"weights in {dtype}; {device} has {free / 2**30:.1f} GiB free"
        )
