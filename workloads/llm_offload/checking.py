"""The bit-identity check every policy passes before it is timed: one forward and backward on the
same weights and batch, its loss and every gradient equal to keep's bit for bit.

On a GPU the checked steps run in deterministic mode (:func:`deterministic`): fused attention's
backward and some reductions accumulate with atomics, so two identical keep steps would otherwise
differ in their last bits; the timed steps run the fast kernels.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

# cuBLAS reads this when its first handle is made (this module is imported before any model runs);
# deterministic mode needs it for reproducible matrix products.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


class NotBitIdentical(AssertionError):
    """A policy's loss or gradients differ from keeping every activation: that path is wrong."""


@contextlib.contextmanager
def deterministic(device: str):
    """Reproducible kernels on a GPU for the bit-identity check: attention through SDPA's math
    backend, torch's deterministic algorithms (a warning, not an error, for an op that has none:
    the check itself then tells whether the step reproduces)."""
    if device != "cuda":
        yield
        return
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def one_step(model, batch, policy=None):
    """Loss and gradients of one forward and backward (no optimizer step), under ``policy``."""
    model.zero_grad(set_to_none=True)
    with policy.step() if policy else contextlib.nullcontext():
        loss = model(**batch).loss
        loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach().clone(), grads


def check_identical(name: str, reference, result) -> None:
    """Raise :class:`NotBitIdentical` where ``result`` (a :func:`one_step`) differs from ``reference``."""
    (loss0, grads0), (loss1, grads1) = reference, result
    if not torch.equal(loss0, loss1):
        raise NotBitIdentical(f"{name}: loss {loss1.item()!r} differs from keep's {loss0.item()!r}")
    if grads0.keys() != grads1.keys():
        raise NotBitIdentical(f"{name}: gradients of {sorted(grads0.keys() ^ grads1.keys())} missing or extra")
    wrong = [n for n in grads0 if not torch.equal(grads0[n], grads1[n])]
    if wrong:
        raise NotBitIdentical(f"{name}: gradients of {len(wrong)} parameters differ from keep's, e.g. {wrong[0]}")
