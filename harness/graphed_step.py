"""A whole step as one CUDA graph: what a user does when a small model's step is bound by the host.

On a small graph, a GNN layer's training step (forward, loss, backward, optimizer) is a few
hundred microseconds of kernels behind a millisecond or more of Python, dispatch and launches,
whichever way the layer is written. Capturing the step once and replaying it removes the host from
the step for every form alike, so what is left to compare is the GPU work.

    replay = capture_step(step)   # step() runs the whole step on static tensors
    replay()                      # the same work, one launch

The step must read and write only tensors that live across calls (parameters, their gradients
kept allocated with ``zero_grad(set_to_none=False)``, an optimizer built with
``capturable=True``, fixed inputs) and must never wait for the GPU (no ``.item()``, no
data-dependent shapes). One that does cannot be captured: :class:`NotCapturable` says why. A
step that runs out of memory while it is captured raises ``torch.cuda.OutOfMemoryError``, as it
would eagerly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable


class NotCapturable(RuntimeError):
    """The step waits for the GPU, or does something else a CUDA graph cannot hold."""


def capture_step(step: Callable[[], object], warmup: int = 3) -> Callable[[], None]:
    """``step`` captured as a CUDA graph, after ``warmup`` calls on a side stream (which let lazy
    state be made outside the capture: gradients, optimizer state, caches, compiled code); the
    returned callable replays it on the current stream."""
    import torch

    if not torch.cuda.is_available():
        raise NotCapturable("capturing a step needs a CUDA GPU")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph, pool = torch.cuda.CUDAGraph(), torch.cuda.graph_pool_handle()
    failure, message, out_of_memory = None, "", False
    try:
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            step()
    except Exception as err:  # torch's, CuPy's and the driver's errors alike
        message = (str(err).strip().splitlines() or [type(err).__name__])[0]
        failure, out_of_memory = f"{type(err).__name__}: {message}", isinstance(err, torch.cuda.OutOfMemoryError)
    if failure is not None:
        # Raised outside the handler, unchained: a traceback that kept this frame alive would keep
        # the failed capture's memory pool with it.
        release_failed_capture(graph, pool)
        del graph
        torch.cuda.synchronize()
        _end_random_number_capture()
        torch.cuda.empty_cache()
        if out_of_memory:  # the step does not fit, captured or not: a size, not a refusal
            raise torch.cuda.OutOfMemoryError(message)
        raise NotCapturable(failure)
    return graph.replay


def release_failed_capture(graph, pool) -> None:
    """Undo what a capture that never ended left in torch's allocator.

    A capture invalidated by a call that waits for the GPU fails in ``cudaStreamEndCapture``,
    before torch stops routing allocations to the capture's pool, and the graph then never gives
    that pool back. While the allocator believes a capture is under way it no longer returns its
    cache to the GPU when an allocation fails, so the process runs out of memory with most of it
    cached and unused. ``pool`` is the handle the capture was given (``torch.cuda.graph(pool=)``).
    A capture that ended (an error raised inside it, a step that ran to the end) needs none of this:
    its graph gives its pool back when it is deleted."""
    import torch

    try:
        graph.pool()  # raises unless the capture ended
        return
    except RuntimeError:
        pass
    device = torch.cuda.current_device()
    with contextlib.suppress(RuntimeError):  # it ended the routing itself before it failed
        torch._C._cuda_endAllocateToPool(device, pool)
    torch._C._cuda_releasePool(device, pool)


def _end_random_number_capture() -> None:
    """After a capture that failed, the CUDA random-number generator can be left in capture mode
    (its end-of-capture step never ran), and every later ``torch.randn`` on the GPU in the process
    fails with "Offset increment outside graph capture". A capture that succeeds ends it: one with
    nothing in it."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            pass
