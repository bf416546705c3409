"""Where a layer's time goes, by kind of work: one call under ``torch.profiler``, each operator's
own time (its device kernels' on a GPU, its CPU time on a CPU) put in one class by the operator's
name, the first rule that matches:

* ``gemm``: matrix products (``mm``, ``bmm``, ``addmm``, ``grouped_mm``, ``linear``);
* ``aggregation``: sums and maxima into targets and softmax (``index_add``, ``scatter_add``,
  ``scatter_reduce``, ``softmax``, ``sum``);
* ``gather_scatter``: moving rows by index and copies (``index``, ``index_select``, ``gather``,
  ``scatter``, ``cat``, ``copy``, ``sort``, ``fill``, ...);
* ``elementwise``: per-edge or per-node arithmetic (``mul``, ``add``, ``exp``, ``leaky_relu``, ...);
* ``other``: everything else (autograd's own bookkeeping, views).

Operators, not kernels, are classified: a kernel's name says little (an ``index_add`` kernel is
called ``indexFuncLargeIndex``), its operator says what it is for. Hector's generated kernels are
classed by the template step that launched them (``hector::gemm``, ``hector::map``, ...): they are
launched through CuPy, not by a torch operator, so the profiler hangs them on the driver's launch
call; an event that no rule classes and that is not torch's own takes the class of the nearest
enclosing event that has one.
"""

from __future__ import annotations

import bisect
import math
import re

import torch
from torch.profiler import ProfilerActivity, profile

CLASSES = ("gemm", "aggregation", "gather_scatter", "elementwise", "other")
_RULES = (
    ("gemm", re.compile(r"^aten::(mm|bmm|addmm|addbmm|baddbmm|matmul|linear|_grouped_mm|grouped_mm)$")),
    (
        "aggregation",
        re.compile(r"^aten::(index_add_?|scatter_add_?|scatter_reduce_?|_?softmax|_softmax_backward_data|sum|amax)$"),
    ),
    (
        "gather_scatter",
        re.compile(
            r"^aten::(index|index_select|_index_put_impl_|index_put_?|gather|scatter_?|take|cat|copy_|_to_copy|"
            r"clone|contiguous|sort|unique\w*|masked_\w+|nonzero|repeat|stack|constant_pad_nd|fill_|zero_|"
            r"embedding\w*|index_select_backward|gather_backward)$"
        ),
    ),
    (
        "elementwise",
        re.compile(
            r"^aten::(mul_?|add_?|sub_?|div_?|rsub|exp_?|neg|pow|sqrt|rsqrt|leaky_relu\w*|gelu\w*|sigmoid\w*|"
            r"where|clamp\w*|reciprocal|lerp_?|addcmul_?|addcdiv_?|_foreach_\w+)$"
        ),
    ),
)


# Hector's generated kernels run inside one profiler range per template step (systems/hector/codegen.py).
_HECTOR = {
    "hector::gemm": "gemm",
    "hector::outer": "gemm",
    "hector::scatter": "aggregation",
    "hector::softmax": "aggregation",
    "hector::scattermap": "aggregation",
    "hector::fusedscatter": "aggregation",
    "hector::map": "elementwise",
    "hector::fused": "elementwise",
    "hector::dot": "elementwise",
}
_TORCH_OWN = ("aten::", "autograd::", "Optimizer.", "torch::")  # classed by their own name only


def classify(operator: str) -> str:
    if operator in _HECTOR:
        return _HECTOR[operator]
    for name, rule in _RULES:
        if rule.match(operator):
            return name
    return "other"


def breakdown(fn, device: str) -> dict[str, float]:
    """Seconds per class of one call of ``fn`` (see the module)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    seconds = dict.fromkeys(CLASSES, 0.0)
    if device != "cuda":
        for event in prof.key_averages():
            seconds[classify(event.key)] += event.self_cpu_time_total / 1e6
        return seconds
    events = prof.events()
    ranges = _hector_ranges(events)
    for event in events:
        if event.device_type == torch.autograd.DeviceType.CPU and event.self_device_time_total:
            # kernels are counted through the operator (or the launch call) that launched them
            seconds[class_of(event, ranges)] += event.self_device_time_total / 1e6
    return seconds


def _hector_ranges(events) -> list[tuple[float, float, str]]:
    """(start, end, class) of every Hector step range, by start."""
    found = [(e.time_range.start, e.time_range.end, _HECTOR[e.name]) for e in events if e.name in _HECTOR]
    return sorted(found)


def class_of(event, ranges=()) -> str:
    """``event``'s class, or for a launch call no rule classes (CuPy's ``cuLaunchKernel``) that of
    the nearest enclosing event that has one (a ``hector::`` step). The profiler does not always
    give driver calls a parent (they can sit in another thread's tree), so a launch no parent
    classes takes the class of the Hector step range it began in."""
    kind = classify(event.name)
    walker = event
    while kind == "other" and not walker.name.startswith(_TORCH_OWN) and walker.cpu_parent is not None:
        walker = walker.cpu_parent
        kind = classify(walker.name)
    if kind == "other" and not event.name.startswith(_TORCH_OWN):
        start = event.time_range.start
        at = bisect.bisect_right(ranges, (start, math.inf, "")) - 1
        if at >= 0 and ranges[at][1] >= event.time_range.end:
            kind = ranges[at][2]
    return kind
