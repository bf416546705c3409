"""An emulated SSD: another store throttled to a given bandwidth, standing in for a disk array
this machine lacks; its results say ``emulated`` everywhere."""

from __future__ import annotations

import time  # the emulated device's pacing
from concurrent.futures import Future, ThreadPoolExecutor

from harness.arguments import real_number
from harness.errors import UserError
from systems.ssdtrain.stores import StoreEntry, register
from systems.ssdtrain.stores._base import Store
from systems.ssdtrain.stores.host import HostStore


def _sleep_until(deadline: float) -> None:
    # sleep() may return early on some systems; the monotonic clock decides.
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(left)


class EmulatedStore(Store):
    """``inner`` (a new HostStore by default) throttled to ``bandwidth_gbps`` GB/s (10^9 B/s).

    The emulated device serves one transfer at a time, reads and writes alike, in the order they
    were asked for: each one ends no earlier than ``bytes / bandwidth`` after the previous one ended
    (or after it was asked for, if the device was idle), read on the monotonic clock, and never
    before the inner store has really finished it. The store owns ``inner`` and closes it.
    """

    emulated = True

    def __init__(self, bandwidth_gbps: float, inner: Store | None = None):
        if (speed := real_number(bandwidth_gbps)) is None or speed <= 0:
            raise UserError(
                f"EmulatedStore: bandwidth_gbps must be a positive, finite number of GB/s, got {bandwidth_gbps!r}"
            )
        if inner is not None and not isinstance(inner, Store):  # a name ("host") would fail later, deep inside
            raise UserError(f"EmulatedStore: inner must be a Store (HostStore(), DirectFileStore(...)), got {inner!r}")
        super().__init__()
        self.inner = inner if inner is not None else HostStore()
        self.bandwidth_gbps = speed
        self.name = f"emulated_{bandwidth_gbps:g}gbps_{self.inner.name}"
        self._free_at = 0.0  # when the emulated device finishes the transfers queued so far
        self._timer = ThreadPoolExecutor(1, thread_name_prefix="ssdtrain-throttle")

    def _throttle(self, asked: float, inner: Future, nbytes: int) -> Future:
        """The inner transfer, asked for at ``asked``, made to end no earlier than the device allows."""
        with self._lock:  # deadlines and the timer's queue in the same order
            start = max(asked, self._free_at)
            self._free_at = deadline = start + nbytes / (self.bandwidth_gbps * 1e9)
            return self._timer.submit(lambda: (inner.result(), _sleep_until(deadline)))

    # The clock is read before the inner transfer starts: a host copy done inside put() or get()
    # overlaps the emulated transfer instead of adding to it.
    def _put(self, key, src, ready):
        asked = time.monotonic()
        return self._throttle(asked, self.inner.put(key, src), src.numel() * src.element_size())

    def _get(self, key, out, ready):
        asked = time.monotonic()
        return self._throttle(asked, self.inner.get(key, out), out.numel() * out.element_size())

    def _free(self, key):
        self.inner.free(key)

    def _close(self):
        self._timer.shutdown(wait=True)
        self.inner.close()


register(
    StoreEntry(
        "emulated",
        "optimized",
        label="emulated SSD",
        make=lambda params, folder, gbps: EmulatedStore(gbps),
        # One store per bandwidth of the part's ``emulated_gbps``.
        settings=lambda params: [{"gbps": float(g)} for g in params.get("emulated_gbps", [])],
        emulated=True,
        columns=lambda gbps: {"emulated_gbps": gbps},
        notes="host memory throttled to a bandwidth: a stand-in for an SSD array, never a measured device",
    )
)
