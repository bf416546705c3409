"""Where a layer's time goes, by kind of work: one call under ``torch.profiler``, each operator's
own time (its device kernels' on a GPU, its CPU time on a CPU) put in one class by the operator's
name, the first rule that matches:

* ``gemm``: matrix products (``mm``, ``bmm``, ``addmm``, ``grouped_mm``, ``linear``);
* ``aggregation``: sums and maxima into targets and softmax (``index_add``, ``scatter_add``,
  ``scatter_reduce``, ``softmax``, ``sum``);
* ``gather_scatter``: moving rows by index and copies (``index``, ``index_select``, ``gather``,
  ``scatter``, ``cat``, ``copy``, ``sort``, ``fill``, ...);
* ``elementwise``: per-edge or per-node arithmetic (``mul``, ``add``, ``exp``, ``leaky_relu``, ...),
  and in training the loss and Adam's update;
* ``other``: everything else (autograd's own bookkeeping, views).

Operators, not kernels, are classified: a kernel's name says little (an ``index_add`` kernel is
called ``indexFuncLargeIndex``), its operator says what it is for. Hector's generated kernels are
launched through CuPy, and the profiler links them to whatever torch operator is innermost around
the launch (the layer's custom op, or its autograd wrapper): they are classed by their entry point
(``segment_gemm`` is a GEMM, ``scatter_map`` an aggregation, ...). A kernel the profiler links to
no operator is still counted, from the device's own events: Hector's by entry point, any other as
``other``. A device event whose span holds the next one of its stream is not work of its own (a
stream runs one piece of work at a time): it is the record of a launch that ran others (a CUDA
graph's replay, which Hector's plans are) or a second record of the same work, and is not counted;
nor is the device side of a ``record_function`` range (the profiler records Hector's step ranges on
the device too, each spanning its kernels). So the classes sum to the time the device was busy.
"""

from __future__ import annotations

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
            r"where|clamp\w*|reciprocal|lerp_?|addcmul_?|addcdiv_?|_foreach_\w+|_fused_adamw?_|mse_loss\w*)$"
        ),
    ),
)


# Hector's template steps: their profiler ranges (systems/hector/codegen.py), and the entry points
# of the kernels they launch.
_HECTOR = {
    "hector::gemm": "gemm",
    "hector::outer": "gemm",
    "hector::scatter": "aggregation",
    "hector::softmax": "aggregation",
    "hector::max": "aggregation",
    "hector::scattermap": "aggregation",
    "hector::fusedscatter": "aggregation",
    "hector::map": "elementwise",
    "hector::fused": "elementwise",
    "hector::dot": "elementwise",
}
_HECTOR_KERNELS = {
    "segment_gemm": "gemm",
    "segment_outer": "gemm",
    "scatter_rows": "aggregation",
    "edge_softmax": "aggregation",
    "max_rows": "aggregation",
    "scatter_map": "aggregation",
    "fused_scatter_map": "aggregation",
    "rows_map": "elementwise",
    "fused_map": "elementwise",
    "rows_dot": "elementwise",
}


def classify(operator: str) -> str:
    """The class of an operator (``aten::mm``, a Hector step's range) or of a Hector kernel's entry
    point (``segment_gemm``)."""
    if operator in _HECTOR:
        return _HECTOR[operator]
    if operator in _HECTOR_KERNELS:
        return _HECTOR_KERNELS[operator]
    for name, rule in _RULES:
        if rule.match(operator):
            return name
    return "other"


def breakdown(fn, device: str) -> dict[str, float]:
    """Seconds per class of one call of ``fn`` (see the module)."""
    return profile_call(fn, device)[0]


def profile_call(fn, device: str) -> tuple[dict[str, float], dict[str, int]]:
    """Seconds and bytes per class of one call of ``fn``, under one profiler.

    Bytes: what each operator allocated and did not free itself (its outputs, mostly; on a GPU
    device memory, on a CPU host memory), summed by class. A plain allocation (``empty``,
    ``zeros``, ...) counts for the operator that asked for it: on the GPU, Hector's steps allocate
    their outputs with torch inside the step's range (``hector::gemm``, ...). So this is where a
    call's memory goes by kind of work; it is allocation volume, not the peak (a tensor freed
    before the next is made counts too)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, profile_memory=True) as prof:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    return _seconds(prof, device), _bytes(prof, device)


# The profiler's own device activity (CUPTI's buffer requests), not the profiled call's work.
_PROFILER_OWN = {"Activity Buffer Request"}
# Where the kernels no operator is linked to are counted (class ``other``).
UNLINKED = "kernels without an operator"


def operators(fn, device: str) -> dict[str, float]:
    """Seconds per operator of one call of ``fn`` (Hector's kernels per entry point), for a reader
    who asks what a class holds: :func:`classify` of a key is its class."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    return _seconds_by_operator(prof, device)


def _seconds(prof, device: str) -> dict[str, float]:
    seconds = dict.fromkeys(CLASSES, 0.0)
    for name, spent in _seconds_by_operator(prof, device).items():
        seconds[classify(name)] += spent
    return seconds


def _seconds_by_operator(prof, device: str) -> dict[str, float]:
    seconds: dict[str, float] = {}
    if device != "cuda":
        for event in prof.key_averages():
            seconds[event.key] = seconds.get(event.key, 0.0) + event.self_cpu_time_total / 1e6
        return seconds
    reached: dict[str, float] = {}  # microseconds per kernel name reached through an operator
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CPU or not event.self_device_time_total:
            continue  # kernels are counted through the operator that launched them
        if event.name in _PROFILER_OWN:
            continue
        # Hector's kernels, launched through CuPy, are linked to the innermost torch operator
        # around the launch: the layer's custom op, or in training its autograd wrapper. They are
        # counted by their entry point, the operator's own kernels under the operator's name.
        own = event.self_device_time_total
        for kernel in event.kernels:
            reached[kernel.name] = reached.get(kernel.name, 0.0) + kernel.duration
            if kernel_class(kernel.name) is not None:
                entry = _entry_point(kernel.name)
                seconds[entry] = seconds.get(entry, 0.0) + kernel.duration / 1e6
                own -= kernel.duration
        seconds[event.name] = seconds.get(event.name, 0.0) + max(own, 0.0) / 1e6
    # The profiler does not link every kernel to an operator (seen on the H200 under torch 2.11):
    # those the operators did not reach are counted from the device's own events, Hector's by
    # entry point, any other under UNLINKED, so the split sums to every kernel the call ran.
    for name, spent in _device_time_by_kernel(prof).items():
        missing = spent - reached.get(name, 0.0)
        if missing > 0.01:  # microseconds: more than the two sums' rounding
            key = _entry_point(name) if kernel_class(name) is not None else UNLINKED
            seconds[key] = seconds.get(key, 0.0) + missing / 1e6
    return seconds


def _device_time_by_kernel(prof) -> dict[str, float]:
    """Microseconds per name of every kernel, copy and fill the profiler saw on the device."""
    spent: dict[str, float] = {}
    for event in device_events(prof):
        spent[event.name] = spent.get(event.name, 0.0) + event.time_range.elapsed_us()
    return spent


def device_events(prof) -> list:
    """The profiler's device events that are work: not its own buffer requests, not the device
    side of a ``record_function`` range (Hector's steps are such ranges: on the device each spans
    the step's kernels), and not an event whose time span holds others of its stream. Work on one
    stream runs one piece at a time, so such a span is a record of the launch that ran them (a
    CUDA graph's replay), or a second record of the same work; counting it as well would count
    that work twice."""
    by_stream: dict[tuple, list] = {}
    for event in prof.events():
        if (
            event.device_type != torch.autograd.DeviceType.CPU
            and event.name not in _PROFILER_OWN
            and not getattr(event, "is_user_annotation", False)
        ):
            by_stream.setdefault((event.device_index, event.device_resource_id), []).append(event)
    work = []
    for events in by_stream.values():
        events.sort(key=lambda e: (e.time_range.start, -e.time_range.end))
        for event, after in zip(events, [*events[1:], None]):
            holds_next = after is not None and after.time_range.end <= event.time_range.end
            if not holds_next:
                work.append(event)
    return work


def _bytes(prof, device: str) -> dict[str, int]:
    allocated = dict.fromkeys(CLASSES, 0)
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CPU:
            continue
        own = event.self_device_memory_usage if device == "cuda" else event.self_cpu_memory_usage
        if own > 0:
            allocated[memory_class(event)] += own
    return allocated


_ALLOCATORS = re.compile(r"^aten::(empty\w*|zeros\w*|ones\w*|full\w*|new_\w+|resize_)$")


def memory_class(event) -> str:
    """The class an allocation counts for: its operator's, or for a plain allocation that of the
    nearest enclosing event that is not one (its caller)."""
    walker = event
    while _ALLOCATORS.match(walker.name) and walker.cpu_parent is not None:
        walker = walker.cpu_parent
    return classify(walker.name)


def kernel_class(name: str) -> str | None:
    """The class of one of Hector's generated kernels by its entry point (``segment_gemm_<hash>``);
    None for any other kernel."""
    return _HECTOR_KERNELS.get(_entry_point(name))


def _entry_point(kernel: str) -> str:
    return re.sub(r"_[0-9a-f]{10}$", "", kernel)
