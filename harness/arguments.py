"""The one reading of "a whole number" for every count, size and index a user passes to the suite's
libraries and parts: an integer of any kind (Python's, numpy's, a one-value integer tensor's),
never a bool (``True`` would count as 1) and never a float (``1.0`` is refused rather than
truncated, and ``2.5`` cannot slip through as 2). Likewise "a real number" for sizes, speeds and
fractions: finite, never a bool. Each caller says what it refuses in its own
words and error type; this module only decides.
"""

from __future__ import annotations

import math
import numbers
import operator

import numpy as np
import torch


def integer(value) -> int | None:
    """``value`` as a Python int where it is an integer of any kind, else None."""
    if isinstance(value, bool | np.bool_) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        return None
    try:
        return operator.index(value)
    except TypeError:  # a float, a string, a tensor of floats or of several values
        return None


def whole_number(value, *, at_least: int = 0, at_most: int | None = None) -> int | None:
    """``value`` as a Python int where it is an integer in ``[at_least, at_most]``, else None."""
    number = integer(value)
    if number is None or number < at_least or (at_most is not None and number > at_most):
        return None
    return number


def real_number(value) -> float | None:
    """``value`` as a Python float where it is a finite real number of any kind (an integer or a
    float, Python's or numpy's), else None: NaN and the infinities are no size, speed or fraction."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def cpu_or_cuda(value) -> torch.device | None:
    """``value`` as a torch device where it names the CPU or a CUDA GPU the way torch takes one
    (``"cpu"``, ``"cuda"``, ``"cuda:N"``, a ``torch.device``, an integer as a CUDA ordinal), else
    None. Whether this machine has that GPU is the caller's to say (torch's own reading of an
    ordinal fails with "Cannot access accelerator" on a machine without one, naming no argument)."""
    ordinal = integer(value)
    try:
        device = torch.device("cuda", ordinal) if ordinal is not None else torch.device(value)
    except (RuntimeError, TypeError):  # a name torch does not know, a negative ordinal, a float
        return None
    # torch keeps an ordinal in 8 bits: 256 and "cuda:300" would come back as cuda:0 and cuda:44.
    if ordinal is not None and device.index != ordinal:
        return None
    if isinstance(value, str) and str(device) != value:
        return None
    return device if device.type in ("cpu", "cuda") else None
