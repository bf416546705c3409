"""Host memory: the store any SSD is compared with (page-locked for GPU tensors)."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch

from systems.ssdtrain.stores import StoreEntry, register
from systems.ssdtrain.stores._base import Store, done_future, wait_holding
from systems.ssdtrain.streams import copy_after


class HostStore(Store):
    """Host memory: page-locked for GPU tensors (so copies are DMA on the store's own stream),
    plain for CPU tensors (a copy done before ``put`` returns)."""

    name = "host"

    def __init__(self):
        super().__init__()
        self._buffers: dict[int, torch.Tensor] = {}
        self._waiter: ThreadPoolExecutor | None = None  # waits for GPU copies to end

    def _put(self, key, src, ready):
        buffer = torch.empty(src.shape, dtype=src.dtype, pin_memory=src.is_cuda)
        future = self._copy(buffer, src, ready)
        self._buffers[key] = buffer
        return future

    def _get(self, key, out, ready):
        return self._copy(out, self._buffers[key], ready)

    def _copy(self, dst, src, ready) -> Future:
        done = copy_after(dst, src, ready)
        if done is None:
            return done_future()
        with self._lock:
            if self._waiter is None:
                self._waiter = ThreadPoolExecutor(1, thread_name_prefix="ssdtrain-host")
        return self._waiter.submit(wait_holding, done, dst, src)

    def _free(self, key):
        self._buffers.pop(key, None)

    def _close(self):
        if self._waiter is not None:
            self._waiter.shutdown(wait=True)
        self._buffers.clear()


register(
    StoreEntry(
        "host",
        "optimized",
        label="pinned host memory",
        make=lambda params, folder: HostStore(),
        notes="host memory, page-locked for GPU tensors: what no SSD can beat",
    )
)
