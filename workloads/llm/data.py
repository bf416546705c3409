"""Seeded token batches for the four families, with the labels each one's head trains on.

Two sources of tokens. :func:`uniform_tokens`: independent uniform tokens, for throughput and
memory measurements (what the model computes does not depend on the values). :class:`MarkovLanguage`:
sequences from a small random Markov chain, a language with a known entropy rate that a tiny
model learns in a few hundred steps on a CPU: the sanity check that a built model trains.

Tokens are drawn on the CPU from a seeded ``torch.Generator`` and then moved, so a seed gives the
same batches on every machine. Token ids below :data:`FIRST_TOKEN` are reserved: :data:`PAD`
(also T5's decoder start token) and :data:`MASK`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from harness.errors import UserError
from workloads.llm.models import ModelSpec

PAD = 0  # padding, and T5's decoder start token (its config says so)
MASK = 1  # replaces the masked tokens of masked-LM and seq2seq inputs
FIRST_TOKEN = 2  # ordinary tokens are drawn from [FIRST_TOKEN, vocab)
IGNORE = -100  # the label transformers' losses skip
MASK_FRACTION = 0.15  # BERT's


def _check_vocab(vocab: int) -> None:
    if vocab <= FIRST_TOKEN:
        raise UserError(f"vocab {vocab} leaves no ordinary tokens: ids below {FIRST_TOKEN} are reserved")


def uniform_tokens(vocab: int, micro_batch: int, sequence: int, generator: torch.Generator) -> torch.Tensor:
    """A [micro_batch, sequence] batch of independent tokens, uniform over the ordinary ids."""
    _check_vocab(vocab)
    return torch.randint(FIRST_TOKEN, vocab, (micro_batch, sequence), generator=generator)


class MarkovLanguage:
    """A first-order Markov chain over the ordinary tokens, split into ``topics`` closed groups.

    Each token's ``branching`` successors are drawn uniformly from its own group and their
    probabilities from a flat Dirichlet, so the next-token entropy is at most log(branching)
    nats, far below log(vocab): a causal model that learns the table gets its loss down to
    :meth:`entropy_rate`, one that learns nothing stays near log(vocab). A sequence stays in one
    group (its topic), so a masked model can also narrow a masked token down to its topic's
    tokens from the bag of the others (uniform attention, which it has at initialization);
    with one topic it would first have to learn to attend to the neighbours by position, which
    takes a tiny BERT thousands of steps. Tokens left over by the split never occur.
    """

    def __init__(self, vocab: int, branching: int = 4, topics: int = 6, seed: int = 0):
        _check_vocab(vocab)
        per_topic = (vocab - FIRST_TOKEN) // max(topics, 1)
        if topics < 1 or not 1 <= branching <= per_topic:
            raise UserError(
                f"a Markov language over {vocab - FIRST_TOKEN} tokens in {topics} topics needs 1 to "
                f"{per_topic} successors per token, got {branching}"
            )
        g = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        states = per_topic * topics
        first_of_group = torch.arange(states) // per_topic * per_topic
        picks = torch.stack([torch.randperm(per_topic, generator=g)[:branching] for _ in range(states)])
        self.successors = first_of_group[:, None] + picks
        weights = -torch.rand(states, branching, generator=g, dtype=torch.float64).log()  # Exp(1): flat Dirichlet
        self.probabilities = weights / weights.sum(1, keepdim=True)
        self.stationary = self._stationary()

    def _stationary(self) -> torch.Tensor:
        """The stationary distribution, by power iteration on the lazy chain (same fixed point, never periodic)."""
        states = len(self.successors)
        transition = torch.zeros(states, states, dtype=torch.float64)
        transition.scatter_add_(1, self.successors, self.probabilities)
        pi = torch.full((states,), 1 / states, dtype=torch.float64)
        for _ in range(2000):
            pi = 0.5 * pi + 0.5 * pi @ transition
        return pi / pi.sum()

    def entropy_rate(self) -> float:
        """Nats per token of the chain in its stationary regime: the loss floor of a causal LM."""
        per_state = -(self.probabilities * self.probabilities.log()).sum(1)
        return float(self.stationary @ per_state)

    def sample(self, micro_batch: int, sequence: int, generator: torch.Generator) -> torch.Tensor:
        """A [micro_batch, sequence] batch of sequences that start in the stationary distribution."""
        state = torch.multinomial(self.stationary, micro_batch, replacement=True, generator=generator)
        out = [state]
        for _ in range(sequence - 1):
            pick = torch.multinomial(self.probabilities[state], 1, generator=generator).squeeze(1)
            state = self.successors[state, pick]
            out.append(state)
        return torch.stack(out, 1) + FIRST_TOKEN


def to_batch(task: str, tokens: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The keyword arguments of a training forward (``model(**batch).loss``) on ``tokens``.

    ``causal``: predict every next token (transformers shifts the labels itself). ``masked``: a
    :data:`MASK_FRACTION` of the positions (at least one per sequence) become :data:`MASK` and
    only they are predicted. ``seq2seq``: the encoder reads the masked sequence and the decoder
    writes the whole original one (denoising, T5-style but with single-token masks); T5 makes
    the decoder's input by shifting the labels right behind its start token.
    """
    if task == "causal":
        return {"input_ids": tokens, "labels": tokens}
    chosen = torch.rand(tokens.shape, generator=generator) < MASK_FRACTION
    chosen[:, 0] |= ~chosen.any(1)  # a sequence without a masked token would have no loss
    masked = tokens.masked_fill(chosen, MASK)
    if task == "masked":
        return {"input_ids": masked, "labels": tokens.masked_fill(~chosen, IGNORE)}
    if task == "seq2seq":
        return {"input_ids": masked, "labels": tokens}
    raise UserError(f"unknown training task {task!r}; one of causal, masked, seq2seq")


def batches(
    spec: ModelSpec,
    source: str = "uniform",
    seed: int = 0,
    device: torch.device | str = "cpu",
    language: MarkovLanguage | None = None,
) -> Iterator[dict[str, torch.Tensor]]:
    """Endless [micro_batch, sequence] training batches for ``spec``'s family, on ``device``.

    ``source``: ``uniform`` tokens or ``markov`` (sequences of ``language``, by default the
    :class:`MarkovLanguage` over the spec's vocabulary seeded with ``seed``).
    """
    if source not in ("uniform", "markov"):
        raise UserError(f"unknown token source {source!r}; one of uniform, markov")
    g = torch.Generator().manual_seed(seed)
    if source == "markov":
        language = language or MarkovLanguage(spec.vocab, seed=seed)
        if language.vocab > spec.vocab:
            raise UserError(f"a language over {language.vocab} tokens does not fit {spec.family} vocab {spec.vocab}")
    while True:
        if source == "markov":
            tokens = language.sample(spec.micro_batch, spec.sequence, g)
        else:
            tokens = uniform_tokens(spec.vocab, spec.micro_batch, spec.sequence, g)
        yield {k: v.to(device, non_blocking=True) for k, v in to_batch(spec.task, tokens, g).items()}


def uniform_loss(vocab: int) -> float:
    """The cross-entropy of a model that predicts every ordinary token equally: log(vocab - reserved)."""
    return math.log(vocab - FIRST_TOKEN)
