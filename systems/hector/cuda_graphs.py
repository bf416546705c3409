"""Hector's plans replayed as CUDA graphs: one launch for all of a plan's kernels.

On a small graph a plan is bound by the host: each of its 10-40 kernels costs tens of
microseconds of Python and CuPy to launch and a few to compute. So once a plan has run on a graph
(codegen recorded its launches), the next call with the same shapes captures those launches in a
CUDA graph over input buffers of its own, and every later call copies its inputs into those
buffers, replays the graph, and returns copies of the graph's results: a caller may still hold a
result when it calls again (a layer applied twice before one backward), so the graph's own
buffers are never handed out.

The copies are memory traffic that grows with the graph, while the launches' host time does not,
and a capture keeps its intermediate values in a memory pool of its own while the graph lives: a
plan whose inputs and results together, or whose per-edge values, exceed :data:`COPY_LIMIT_BYTES`
launches directly (on such graphs the GPU work outlasts the launches anyway), as do
calls under the profiler (the breakdown reads each step's range, systems/rgnn/breakdown.py) and
calls made while the caller's own stream is capturing (the launches go into the caller's graph),
and every call where the environment sets ``HECTOR_CUDA_GRAPHS=0``.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable

import torch

from harness.graphed_step import release_failed_capture
from systems.hector import codegen, lower

# HECTOR_CUDA_GRAPHS=0 launches every plan directly (to compare, or where graphs misbehave).
ENABLED = os.environ.get("HECTOR_CUDA_GRAPHS", "1") != "0"
# At 4.8 TB/s, copying 256 MiB in and out costs ~0.1 ms of GPU time, less than the host time a
# replay saves (0.8-1.1 ms a training step on aifb-like, docs/hector.md).
COPY_LIMIT_BYTES = 256 << 20

_NEVER = "never"  # a plan and shapes that launch directly: too large, or its capture failed
_SEEN = "seen"  # run once (recorded): captured on the next call

# Per graph (its GraphIndex, gone with the graph): (plan, precision, shapes) -> a capture or a state.
_captures: weakref.WeakKeyDictionary[lower.GraphIndex, dict[tuple, object]] = weakref.WeakKeyDictionary()


class _Capture:
    """One plan's launches on one graph, captured over static inputs."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: list[torch.Tensor], outputs: list[torch.Tensor]):
        self.graph, self.inputs, self.outputs = graph, inputs, outputs

    def replay(self, given: list[torch.Tensor]) -> list[torch.Tensor]:
        torch._foreach_copy_(self.inputs, given)
        self.graph.replay()
        return [out.clone() for out in self.outputs]


def run(
    plan: lower.Plan,
    graph,
    tensors: dict[str, torch.Tensor],
    widths: Callable[[], dict],
    tensor_cores: bool = False,
) -> list[torch.Tensor]:
    """What ``codegen.run(plan, graph, tensors, widths(), tensor_cores)`` returns, from a CUDA
    graph where one is captured. ``widths`` is called (and checks the tensors) only when the
    launches are worked out or captured, not on a replay."""
    if not ENABLED or codegen._profiling() or torch.cuda.is_current_stream_capturing():
        return codegen.run(plan, graph, tensors, widths(), tensor_cores)
    known = _captures.setdefault(lower.GraphIndex.of(graph), {})
    key = (id(plan), tensor_cores, *((name, t.dtype, t.shape) for name, t in tensors.items()))
    state = known.get(key)
    if isinstance(state, _Capture):
        return state.replay(list(tensors.values()))
    if state is None or state == _NEVER:
        results = codegen.run(plan, graph, tensors, widths(), tensor_cores)
        if state is None:
            known[key] = _SEEN if _bytes_at_stake(graph, tensors, results) <= COPY_LIMIT_BYTES else _NEVER
        return results
    capture = _capture(plan, graph, tensors, widths(), tensor_cores)
    known[key] = capture if capture is not None else _NEVER
    return (
        capture.replay(list(tensors.values())) if capture else codegen.run(plan, graph, tensors, widths(), tensor_cores)
    )


def _bytes_at_stake(graph, tensors: dict[str, torch.Tensor], results: list[torch.Tensor]) -> int:
    """The larger of what a replay copies (inputs in, results out) and of one value per edge at
    the widest width: a capture keeps the plan's intermediate values in a memory pool of its own
    while the graph lives, and on large graphs those are per-edge."""
    given = [*tensors.values(), *results]
    widest = max((t.shape[-1] for t in given if t.dim()), default=1)
    return max(sum(t.nbytes for t in given), graph.edges * widest * 4)


def _capture(plan, graph, tensors: dict[str, torch.Tensor], widths: dict, tensor_cores: bool) -> _Capture | None:
    """The plan's launches on static copies of ``tensors`` as a CUDA graph, or None where they
    cannot be captured (a step that could not be recorded synchronizes with the host)."""
    static = {name: t.clone(memory_format=torch.contiguous_format) for name, t in tensors.items()}
    # Outside the capture: records the launches for these (16-byte aligned) buffers, so the
    # captured call only replays them.
    codegen.run(plan, graph, static, widths, tensor_cores)
    cuda_graph, pool = torch.cuda.CUDAGraph(), torch.cuda.graph_pool_handle()
    try:
        with torch.cuda.graph(cuda_graph, pool=pool, capture_error_mode="thread_local"):
            outputs = codegen.run(plan, graph, static, widths, tensor_cores)
    except Exception:  # torch's and CuPy's errors both: the direct launches then say what is wrong
        release_failed_capture(cuda_graph, pool)
        return None
    return _Capture(cuda_graph, list(static.values()), outputs)


def held_bytes(graph) -> int:
    """GPU memory the captures on ``graph`` keep reserved between replays: their intermediate
    values live in each capture's private pool, freed back to it but not to the allocator, so
    ``torch.cuda.memory_allocated`` does not count them (the results, allocated, it does)."""
    pools = {
        state.graph.pool()
        for state in _captures.get(lower.GraphIndex.of(graph), {}).values()
        if isinstance(state, _Capture)
    }
    if not pools:
        return 0
    return sum(
        segment["total_size"] - segment["allocated_size"]
        for segment in torch.cuda.memory_snapshot()
        if tuple(segment.get("segment_pool_id", ())) in pools
    )


def captured(graph) -> int:
    """How many plans are captured on ``graph`` (for tests and reports)."""
    return sum(isinstance(state, _Capture) for state in _captures.get(lower.GraphIndex.of(graph), {}).values())
