"""The one place that reads a clock.

``measure(fn)`` warms up, then runs ``fn`` ``repeat`` times and records, for each repetition, its
time (CUDA events on the current stream when ``device='cuda'``, the monotonic clock otherwise) and
the CPU core-seconds the process spent, and on request peak GPU memory (reset before each
repetition), peak host RSS and pinned host memory. Medians and spread come from the samples.
``mark``/``elapsed`` time pieces of work that hooks delimit (layers of a step), on the same clocks.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from harness import resources
from harness.progress import progress


@dataclass(frozen=True)
class Measurement:
    """Per-repetition samples of one measured region."""

    clock: str  # "cuda_events" or "monotonic"
    seconds: tuple[float, ...]
    cpu_core_seconds: tuple[float, ...]
    peak_gpu_bytes: tuple[int, ...] = field(default_factory=tuple)
    peak_rss_bytes: tuple[int, ...] = field(default_factory=tuple)
    pinned_host_bytes: tuple[int, ...] = field(default_factory=tuple)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def spread(self) -> tuple[float, float]:
        """Interquartile range (25th, 75th percentile) of the repetition times."""
        if len(self.seconds) < 2:
            return (self.seconds[0], self.seconds[0])
        q = statistics.quantiles(self.seconds, n=4, method="inclusive")
        return (q[0], q[2])


def _cuda():
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("measure(device='cuda') called on a machine without a usable CUDA GPU")
    return torch


def device_kind(device) -> str:
    """``"cuda"`` or ``"cpu"`` for a device given any way torch takes one: ``"cuda"``,
    ``"cuda:1"``, ``torch.device("cuda", 0)``, a GPU index, ``"cpu"``."""
    if isinstance(device, int) and not isinstance(device, bool):
        return "cuda"
    kind = str(device).split(":", 1)[0]
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"device must be a CUDA device or the CPU, got {device!r}")
    return kind


def measure(
    fn: Callable[[], object],
    *,
    device: str,
    repeat: int,
    warmup: int,
    track_memory: bool = False,
    desc: str | None = None,
) -> Measurement:
    """Time ``fn`` ``repeat`` times after ``warmup`` untimed calls.

    With ``device='cuda'`` each repetition is bracketed by CUDA events on the current stream and
    the events are read after one synchronize at the end, so back-to-back launches are not
    serialized by the measurement. With ``device='cpu'`` the monotonic clock brackets each call,
    so ``fn`` must finish its work before returning (synchronize inside ``fn`` if it launches
    device work and the host time is what matters).
    """
    if repeat < 1 or warmup < 0:
        raise ValueError(f"repeat must be >= 1 and warmup >= 0, got repeat={repeat}, warmup={warmup}")
    torch = _cuda() if device_kind(device) == "cuda" else None

    for _ in range(warmup):
        fn()
    if torch is not None:
        torch.cuda.synchronize()

    seconds, cpu_s, peak_gpu, peak_rss, pinned = [], [], [], [], []
    events = []
    reps = range(repeat) if desc is None else progress(range(repeat), desc=desc, total=repeat)
    for _ in reps:
        if track_memory:
            resources.reset_peak_rss()
            if torch is not None:
                torch.cuda.synchronize()  # the peak must not include the previous repetition
                torch.cuda.reset_peak_memory_stats()
        cpu0 = resources.cpu_core_seconds()
        if torch is not None:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events.append((start, end))
        else:
            t0 = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - t0)
        cpu_s.append(resources.cpu_core_seconds() - cpu0)
        if track_memory:
            if torch is not None:
                torch.cuda.synchronize()
                peak_gpu.append(torch.cuda.max_memory_allocated())
            peak_rss.append(resources.peak_rss_bytes())
            pinned.append(resources.pinned_host_bytes())
    if torch is not None:
        torch.cuda.synchronize()
        seconds = [start.elapsed_time(end) / 1e3 for start, end in events]

    return Measurement(
        clock="cuda_events" if torch is not None else "monotonic",
        seconds=tuple(seconds),
        cpu_core_seconds=tuple(cpu_s),
        peak_gpu_bytes=tuple(peak_gpu),
        peak_rss_bytes=tuple(peak_rss),
        pinned_host_bytes=tuple(pinned),
    )


def mark(device: str):
    """A point in time for :func:`elapsed`: a CUDA event recorded on the current stream (``cuda``)
    or the monotonic clock (``cpu``), for timing pieces of work from inside hooks, where
    :func:`measure` cannot bracket them."""
    if device_kind(device) == "cuda":
        torch = _cuda()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(device))
        return event
    return time.perf_counter()


def elapsed(start, end) -> float:
    """Seconds between two :func:`mark` of the same device; for CUDA events, once both have
    completed (synchronize first)."""
    if isinstance(start, float):
        return end - start
    return start.elapsed_time(end) / 1e3


class PhaseClock:
    """Time the phases of a loop (sample, gather, train, ...) by wall clock, waiting for the GPU
    at every phase boundary so each phase's GPU work is charged to it. That serializes the
    pipeline: use it for a breakdown, and ``measure`` (or one wait per epoch) for throughput.

        clock = PhaseClock(device)
        with clock.phase("sample"):
            ...
        clock.totals  # {"sample": seconds, ...}
    """

    def __init__(self, device: str):
        self.device = device
        self.totals: dict[str, float] = {}

    def _wait(self) -> None:
        if device_kind(self.device) == "cuda":
            _cuda().cuda.synchronize(self.device)

    @contextlib.contextmanager
    def phase(self, name: str):
        self._wait()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._wait()
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - start


def wall_clock(
    fn: Callable[[], object],
    device: str,
    *,
    before: Callable[[], object] | None = None,
    after: Callable[[], object] | None = None,
) -> float:
    """Seconds for one call of ``fn``, waiting for the GPU before and after (epoch timing).

    ``before`` and ``after``, when given, are those waits instead: in data-parallel training they
    wait for every rank (a barrier), so the time is the slowest rank's.
    """
    torch = _cuda() if device_kind(device) == "cuda" else None

    def wait_for_gpu() -> None:
        if torch is not None:
            torch.cuda.synchronize()

    (before or wait_for_gpu)()
    start = time.perf_counter()
    fn()
    (after or wait_for_gpu)()
    return time.perf_counter() - start
