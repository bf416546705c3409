"""``offload_all``: SSDTrain's offloading of every block but the last ``keep_last`` to the store,
while forward goes on; backward reads them back ahead of need (systems/ssdtrain/engine.py)."""

from systems.ssdtrain.engine import OFFLOAD
from systems.ssdtrain.policies import OffloaderPolicy, PolicyEntry, register


class OffloadAll(OffloaderPolicy):
    def decide(self, layer):
        return OFFLOAD


register(
    PolicyEntry(
        "offload_all",
        "optimized",
        make=OffloadAll,
        uses_store=True,
        notes="SSDTrain: every block's activations but the last block's offloaded to the store",
    )
)
