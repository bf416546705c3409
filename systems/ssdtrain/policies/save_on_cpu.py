"""``save_on_cpu``: torch's own ``torch.autograd.graph.save_on_cpu``, every saved tensor copied to
host memory in forward and back in backward, on the compute stream."""

import contextlib

import torch

from systems.ssdtrain.policies import Policy, PolicyEntry, counting, register


class SaveOnCpu(Policy):
    """Counts what torch's hooks copy. On a GPU every saved tensor goes to the host (none held on
    the device); on a CPU ``tensor.cpu()`` is the tensor itself: nothing moves and the activations
    stay where keep holds them."""

    @contextlib.contextmanager
    def around(self, counts):
        on_gpu = self.setting.device.type == "cuda"
        hooks = counting(torch.autograd.graph.save_on_cpu(pin_memory=on_gpu), self.setting.parameter_storages())
        with hooks:
            yield
        unique = sum(hooks.unique.values())
        counts["activation_bytes"] = 0 if on_gpu else unique
        counts["bytes_packed"] = hooks.packed
        counts["bytes_unique"] = unique
        counts["bytes_written"] = hooks.packed if on_gpu else 0
        counts["bytes_read"] = hooks.unpacked if on_gpu else 0


register(
    PolicyEntry(
        "save_on_cpu",
        "baseline",
        make=SaveOnCpu,
        notes="torch.autograd.graph.save_on_cpu: every saved tensor to host memory and back",
    )
)
