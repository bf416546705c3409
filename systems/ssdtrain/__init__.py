"""SSDTrain: activation offloading for LLM training. The activations that autograd saves during
forward go to a store (host memory, files on an SSD, an emulated SSD) while forward goes on, and come
back, prefetched layer by layer, when backward needs them; losses and gradients are bit-identical to
keeping them on the device.

Two lines around a training step::

    offloader = Offloader(model, DirectFileStore("/nvme/scratch"))   # once
    with offloader: model(**batch).loss.backward()                    # every step

or, through a policy of the registry (the same step, counted; keep, recompute and the rest)::

    policy = POLICIES["offload_all"].build(model, store=DirectFileStore("/nvme/scratch"))
    with policy.step(): model(**batch).loss.backward()

``engine.py`` is the offloader (saved-tensor hooks, layer hooks, prefetch), ``cache.py`` the
deduplicating tensor cache, ``stores/`` the stores and their registry ``STORES``, ``policies/``
the policies a comparison runs and their registry ``POLICIES``, ``planning.py`` the cost model and
plans, ``recompute.py`` recomputed blocks, ``fileio.py`` O_DIRECT files, ``streams.py`` the GPU
copy ordering, ``stats.py`` the per-step bookkeeping.
"""

from systems.ssdtrain.engine import Offloader
from systems.ssdtrain.layers import find_layers
from systems.ssdtrain.offloading import Offloading, offload
from systems.ssdtrain.policies import POLICIES, Policy, PolicyEntry, Unavailable
from systems.ssdtrain.stats import LayerStats, StepStats
from systems.ssdtrain.stores import STORES, Store, StoreCounters, StoreEntry

# The suite's stores, imported in the order the figures list them (the registry keeps it).
from systems.ssdtrain.stores.host import HostStore  # isort: skip
from systems.ssdtrain.stores.direct_file import DirectFileStore  # isort: skip
from systems.ssdtrain.stores.kvikio_file import KvikioStore  # isort: skip
from systems.ssdtrain.stores.emulated import EmulatedStore  # isort: skip

__all__ = [
    "POLICIES",
    "STORES",
    "DirectFileStore",
    "EmulatedStore",
    "HostStore",
    "KvikioStore",
    "LayerStats",
    "Offloader",
    "Offloading",
    "Policy",
    "PolicyEntry",
    "StepStats",
    "Store",
    "StoreCounters",
    "StoreEntry",
    "Unavailable",
    "find_layers",
    "offload",
]
