"""SSDTrain: activation offloading for LLM training. The activations that autograd saves during
forward go to a store (host memory, files on an SSD, an emulated SSD) while forward goes on, and come
back, prefetched layer by layer, when backward needs them; losses and gradients are bit-identical to
keeping them on the device.

One ``with`` block around training, any model, any policy (offloading.py)::

    with DirectFileStore("/nvme/scratch") as store, offload(model, store=store, policy="offload_all"):
        for batch in loader:
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()

The engine alone, one step: ``with Offloader(model, store): model(**batch).loss.backward()``; a
policy of the registry the comparison runs (the same step, counted)::

    policy = POLICIES["offload_all"].build(model, store=DirectFileStore("/nvme/scratch"))
    with policy.step(): model(**batch).loss.backward()

``offloading.py`` is ``offload()``, ``engine.py`` the offloader (saved-tensor hooks, layer
hooks, prefetch), ``cache.py`` the deduplicating tensor cache, ``stores/`` the stores and their
registry ``STORES``, ``policies/`` the policies a comparison runs and their registry
``POLICIES``, ``planning.py`` the cost model and plans, ``recompute.py`` recomputed blocks,
``layers.py`` finding a model's blocks, ``blocks.py`` checking those given, ``user_compiled.py``
blocks the user compiled with ``torch.compile``, ``fileio.py`` O_DIRECT files, ``streams.py`` the
GPU copy ordering, ``stats.py`` the per-step bookkeeping.
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
