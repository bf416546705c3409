"""The bit-identity check every policy passes before it is timed: one forward and backward on the
same weights and batch, its loss and every gradient equal to keep's bit for bit.

On a GPU the checked steps run in deterministic mode (:func:`deterministic`): fused attention's
backward and some reductions accumulate with atomics, so two identical keep steps would otherwise
differ in their last bits; the timed steps run the fast kernels.

Compiled blocks (torch.compile) fuse and reorder their arithmetic, so they round differently from
eager blocks: compiled keep is checked against keep within :data:`TOLERANCE` (:func:`check_close`),
or within :data:`SPREAD_FACTOR` times the distance between two valid eager steps of the same model
where that is larger (:func:`rounding_spread`; in bfloat16 on a large Llama a query projection's
gradient differed between compiled and eager blocks by more than the fixed tolerance), and the
policies on compiled blocks against compiled keep: bit for bit where they run the same compiled
code (offloading changes where a saved tensor waits, not what is computed), within the tolerance
where they compute differently (torch's rematerialization under a memory budget recomputes in the
compiled backward).
"""

from __future__ import annotations

import contextlib
import math
import os

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from harness.errors import WrongResult

# cuBLAS reads this when its first handle is made (this module is imported before any model runs);
# deterministic mode needs it for reproducible matrix products.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


class NotBitIdentical(WrongResult, AssertionError):
    """A policy's loss or gradients differ from keeping every activation: that path is wrong."""


# The largest relative difference, in norm (||x - x_ref|| / ||x_ref||), that a loss or a gradient
# may show against its reference when the two round differently, by the model's dtype: float32
# steps of the tiny models differ by about 1e-7; bfloat16 keeps 8 bits of mantissa (a relative
# step of 0.4% per rounding), and a compiled block rounds at other places than an eager one.
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-10, torch.bfloat16: 5e-2, torch.float16: 1e-2}

# A step that rounds differently may lie this many times as far from keep's as keep's own step on
# the fast kernels does (rounding_spread); a wrong gradient lies orders of magnitude further.
SPREAD_FACTOR = 2.0


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
    # The gradients are taken from the model, not copied: a check holds two or three steps' gradients
    # at once, and under a memory cap (part memory_bound) a fourth set does not fit.
    grads = {}
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            grads[name], parameter.grad = parameter.grad.detach(), None
    return loss.detach().clone(), grads


def check_identical(name: str, reference, result, reference_name: str = "keep") -> None:
    """Raise :class:`NotBitIdentical` where ``result`` (a :func:`one_step`) differs from ``reference``
    (``reference_name``'s step)."""
    (loss0, grads0), (loss1, grads1) = reference, result
    if not torch.equal(loss0, loss1):
        raise NotBitIdentical(f"{name}: loss {loss1.item()!r} differs from {reference_name}'s {loss0.item()!r}")
    if grads0.keys() != grads1.keys():
        raise NotBitIdentical(f"{name}: gradients of {sorted(grads0.keys() ^ grads1.keys())} missing or extra")
    wrong = [n for n in grads0 if not equal(grads0[n], grads1[n])]
    if wrong:
        raise NotBitIdentical(
            f"{name}: gradients of {len(wrong)} parameters differ from {reference_name}'s, e.g. {wrong[0]}"
        )


# Elements per piece of equal and relative_difference: temporaries of a piece, not of a whole
# gradient (an embedding's can be gigabytes, under a memory cap that the step itself nearly fills).
PIECE = 1 << 22


def _pieces(value: torch.Tensor, reference: torch.Tensor):
    """Matching flat pieces of two tensors of one shape, at most :data:`PIECE` elements each. The
    pieces are cut along the leading dimension before flattening, so a strided tensor is copied a
    piece at a time, never whole (``reshape(-1)`` of a non-contiguous gradient would copy it all)."""
    if value.numel() <= PIECE or value.dim() <= 1:  # flattening copies at most one piece, or nothing
        value, reference = value.reshape(-1), reference.reshape(-1)
        for start in range(0, value.numel(), PIECE):
            yield value[start : start + PIECE], reference[start : start + PIECE]
        return
    row = value[0].numel()
    if row > PIECE:  # one row is more than a piece: cut each row on its own
        for index in range(value.shape[0]):
            yield from _pieces(value[index], reference[index])
        return
    rows = PIECE // row
    for start in range(0, value.shape[0], rows):
        yield value[start : start + rows].reshape(-1), reference[start : start + rows].reshape(-1)


def equal(value: torch.Tensor, reference: torch.Tensor) -> bool:
    """``torch.equal`` (same shape, dtype and every element), compared piece by piece."""
    if value.shape != reference.shape or value.dtype != reference.dtype or value.device != reference.device:
        return False
    return all(torch.equal(piece, reference_piece) for piece, reference_piece in _pieces(value, reference))


def relative_difference(value: torch.Tensor, reference: torch.Tensor) -> float:
    """||value - reference|| / ||reference|| in float64 (the absolute difference where the
    reference is all zeros); infinite where either is not finite."""
    if value.shape != reference.shape:
        raise NotBitIdentical(f"a tensor of shape {tuple(value.shape)} against one of {tuple(reference.shape)}")
    squares, difference_squares = 0.0, 0.0
    for piece, reference_piece in _pieces(value, reference):
        piece, reference_piece = piece.double(), reference_piece.double()
        if not (torch.isfinite(piece).all() and torch.isfinite(reference_piece).all()):
            return float("inf")
        squares += torch.dot(reference_piece, reference_piece).item()
        difference = piece - reference_piece
        difference_squares += torch.dot(difference, difference).item()
    scale, difference = math.sqrt(squares), math.sqrt(difference_squares)
    return difference / scale if scale > 0 else difference


def differences(reference, result, name: str = "the step") -> dict[str, float]:
    """The relative difference, in norm, of the loss (key ``"loss"``) and of every gradient (by
    parameter name) of ``result`` from ``reference``, two :func:`one_step` results."""
    (loss0, grads0), (loss1, grads1) = reference, result
    if grads0.keys() != grads1.keys():
        raise NotBitIdentical(f"{name}: gradients of {sorted(grads0.keys() ^ grads1.keys())} missing or extra")
    return {"loss": relative_difference(loss1, loss0)} | {n: relative_difference(grads1[n], grads0[n]) for n in grads0}


def rounding_spread(model, batch, reference, device: str) -> dict[str, float]:
    """How far apart two valid eager steps of ``model`` on ``batch`` lie: ``reference`` (keep's
    checked step, deterministic, SDPA's math attention) against the same step on the default kernels
    (fused attention, atomic reductions), per loss and gradient (:func:`differences`). Empty on a
    CPU, where both are the same kernels."""
    if device != "cuda":
        return {}
    fast = one_step(model, batch)
    return differences(reference, fast, "keep on the default kernels")


def check_close(
    name: str,
    reference,
    result,
    dtype: torch.dtype,
    reference_name: str = "keep",
    spread: dict[str, float] | None = None,
) -> float:
    """Raise :class:`NotBitIdentical` where the loss or a gradient of ``result`` differs from
    ``reference`` (relative, in norm) by more than :data:`TOLERANCE` of ``dtype`` or, where larger,
    :data:`SPREAD_FACTOR` times its ``spread`` (:func:`rounding_spread`); returns the largest
    difference found (the loss's and every gradient's)."""
    found = differences(reference, result, name)
    spread = spread or {}
    allowed = {key: max(TOLERANCE[dtype], SPREAD_FACTOR * spread.get(key, 0.0)) for key in found}
    worst = max(found, key=lambda key: found[key] / allowed[key])
    if not found[worst] <= allowed[worst]:
        raise NotBitIdentical(
            f"{name}: {worst} differs from {reference_name}'s by {found[worst]:.3g} (relative, in norm), "
            f"above the {allowed[worst]:.3g} allowed ({_why(dtype, spread.get(worst))})"
        )
    return max(found.values())


def _why(dtype: torch.dtype, spread: float | None) -> str:
    tolerance = f"the tolerance {TOLERANCE[dtype]:g} for {str(dtype).removeprefix('torch.')}"
    if spread is None or SPREAD_FACTOR * spread <= TOLERANCE[dtype]:
        return tolerance
    return f"{SPREAD_FACTOR:g} x keep's own spread {spread:.3g} between eager kernels; {tolerance}"
