"""``recompute``: every block recomputed in backward (``torch.utils.checkpoint``, non-reentrant),
so a step keeps only each block's input: the usual way to trade compute for activation memory."""

from systems.ssdtrain.policies import OffloaderPolicy, PolicyEntry, register


class Recompute(OffloaderPolicy):
    def recomputed(self):
        return self.setting.layers


register(
    PolicyEntry(
        "recompute",
        "baseline",
        make=Recompute,
        notes="torch.utils.checkpoint on every block",
    )
)
