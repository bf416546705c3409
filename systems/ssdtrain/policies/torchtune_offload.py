"""``torchtune_offload``, a peer: torchtune's ``OffloadActivations``, saved-tensor hooks that copy
every saved tensor of at least ``min_bytes`` to pinned host memory on a side stream and back in
backward. Runs on a GPU where torchtune imports."""

from systems.ssdtrain.policies import HooksPolicy, PolicyEntry, Unavailable, first_line, register


class TorchtuneOffload(HooksPolicy):
    def __init__(self, setting):
        try:
            import torchtune
            from torchtune.training import OffloadActivations
        except Exception as err:  # torchtune's package import pulls datasets, torchao and more
            raise Unavailable(f"torchtune not importable ({first_line(err)})") from None
        super().__init__(setting)
        self._hooks = OffloadActivations
        self.about = {"torchtune": torchtune.__version__}

    def hooks(self):
        return self._hooks(use_pin_memory=True, use_streams=True, min_offload_size=self.setting.min_bytes)


register(
    PolicyEntry(
        "torchtune_offload",
        "peer",
        label="torchtune OffloadActivations",
        needs_gpu=True,  # it moves CUDA tensors to the host
        packages=("torchtune",),
        make=TorchtuneOffload,
        notes="torchtune.training.OffloadActivations: saved tensors to pinned host memory on a side stream",
    )
)
