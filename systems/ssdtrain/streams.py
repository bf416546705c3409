"""Copies between host and GPU memory on side streams, ordered after the caller's work.

A store's copy must not start before the kernels that produce its source have run, nor write a
destination whose memory the caller's stream may still be using for earlier work (the caching
allocator hands out memory in the order of the stream that allocated it). ``ready_event`` marks
that point on the caller's current stream; ``copy_after`` queues the copy on a side stream that
waits for it, so the caller's stream never blocks and the copy overlaps its later work. Every
copy's end is an event that the store waits on (sleeping, not spinning) before it reports the
transfer done, so whoever waits on a store's future may use the bytes on any stream.
"""

from __future__ import annotations

import threading

import torch

_local = threading.local()


def ready_event(tensor: torch.Tensor) -> torch.cuda.Event | None:
    """An event after the work queued so far on ``tensor``'s device's current stream; None on the CPU."""
    if not tensor.is_cuda:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(tensor.device))
    return event


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """This thread's own copy stream on ``device`` (each I/O thread gets one, so copies of
    different transfers do not queue behind each other)."""
    streams = _local.__dict__.setdefault("streams", {})
    if device not in streams:
        streams[device] = torch.cuda.Stream(device)
    return streams[device]


def copy_after(dst: torch.Tensor, src: torch.Tensor, ready: torch.cuda.Event | None) -> torch.cuda.Event | None:
    """``dst.copy_(src)``. When a GPU is involved (``ready`` given), queued on this thread's side
    stream after ``ready``, without blocking: the returned event marks its end. On the CPU the copy
    is done when this returns (None)."""
    if ready is None:
        dst.copy_(src)
        return None
    stream = side_stream(dst.device if dst.is_cuda else src.device)
    with torch.cuda.stream(stream):
        stream.wait_event(ready)
        dst.copy_(src, non_blocking=True)
        done = torch.cuda.Event(blocking=True)  # synchronize() sleeps instead of spinning a core
        done.record(stream)
    return done


def copy_and_wait(dst: torch.Tensor, src: torch.Tensor, ready: torch.cuda.Event | None) -> None:
    """``copy_after``, then wait for the copy to end (so ``src`` or ``dst`` may be reused)."""
    done = copy_after(dst, src, ready)
    if done is not None:
        done.synchronize()
