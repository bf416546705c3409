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
data-dependent shapes). One that does cannot be captured: :class:`NotCapturable` says why.
"""

from __future__ import annotations

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
    graph = torch.cuda.CUDAGraph()
    failure = None
    try:
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            step()
    except Exception as err:  # torch's, CuPy's and the driver's errors alike
        failure = f"{type(err).__name__}: {(str(err).strip().splitlines() or [type(err).__name__])[0]}"
    if failure is not None:
        # Raised outside the handler, unchained: a traceback that kept this frame alive would keep
        # the failed capture's memory pool with it.
        del graph
        torch.cuda.synchronize()
        _end_random_number_capture()
        torch.cuda.empty_cache()
        raise NotCapturable(failure)
    return graph.replay


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
