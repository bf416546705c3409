"""SSDTrain: activation offloading for LLM training. The activations that autograd saves during
forward go to a store (host memory, files on an SSD, an emulated SSD) while forward goes on, and come
back, prefetched layer by layer, when backward needs them; losses and gradients are bit-identical to
keeping them on the device.

Two lines around a training step::

    offloader = Offloader(model, DirectFileStore("/nvme/scratch"))   # once
    with offloader: model(**batch).loss.backward()                    # every step

``engine.py`` is the offloader (saved-tensor hooks, layer hooks, policies, prefetch),
``cache.py`` the deduplicating tensor cache, ``stores.py`` the stores, ``fileio.py`` O_DIRECT
files, ``streams.py`` the GPU copy ordering, ``stats.py`` the per-step bookkeeping.
"""

from systems.ssdtrain.engine import POLICIES, Offloader
from systems.ssdtrain.layers import find_layers
from systems.ssdtrain.stats import LayerStats, StepStats
from systems.ssdtrain.stores import (
    DirectFileStore,
    EmulatedStore,
    HostStore,
    KvikioStore,
    Store,
    StoreCounters,
)

__all__ = [
    "POLICIES",
    "DirectFileStore",
    "EmulatedStore",
    "HostStore",
    "KvikioStore",
    "LayerStats",
    "Offloader",
    "StepStats",
    "Store",
    "StoreCounters",
    "find_layers",
]
