"""``deepspeed_offload``, a peer: DeepSpeed's activation checkpointing with ``checkpoint_in_cpu``:
each block recomputed in backward, its input held on the host meanwhile. Runs on a GPU where
DeepSpeed imports (a pure-Python wheel built without ops, DS_BUILD_OPS=0, is enough).

``partition_activations`` is off: with one model-parallel rank there is nothing to partition, and
that path copies on the compute stream. DeepSpeed's ``configure`` logs through its communication
backend, so a one-process gloo group is made first where none exists, and kept for the process
(a part runs in a process of its own); ``about`` says so, since torch.distributed is then on."""

import functools
import logging
import os
import socket

import torch

from systems.ssdtrain.policies import Policy, PolicyEntry, Unavailable, first_line, register
from systems.ssdtrain.recompute import checkpointed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DeepspeedOffload(Policy):
    """Every block through DeepSpeed's checkpoint. Where it keeps each block's input is its own (on
    the host), so on a GPU the measured activation peak is the memory figure; it counts nothing."""

    def __init__(self, setting):
        try:
            logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
            import deepspeed
        except Exception as err:
            raise Unavailable(f"deepspeed not importable ({first_line(err)})") from None
        super().__init__(setting)
        self.about = {"deepspeed": deepspeed.__version__}
        if not torch.distributed.is_initialized():
            for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
                os.environ.setdefault(key, value)
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
            self.about["process_group"] = "a one-process gloo group made for DeepSpeed's configure, kept"
        deepspeed.checkpointing.configure(None, checkpoint_in_cpu=True, partition_activations=False)
        self._deepspeed = deepspeed

    def checkpoint(self, forward, *args, **kwargs):
        # Keyword arguments are bound here, not handed to DeepSpeed: it would treat a tensor among
        # them (a float attention mask shared by every block) as this block's input to move to the
        # host, and empty it for the blocks after (seen with 0.19.8: a wrong loss, no error).
        return self._deepspeed.checkpointing.checkpoint(functools.partial(forward, **kwargs), *args)

    def around(self, counts):
        return checkpointed(self.setting.layers, self.checkpoint)

    def reset(self):
        self._deepspeed.checkpointing.reset()


register(
    PolicyEntry(
        "deepspeed_offload",
        "peer",
        label="DeepSpeed CPU checkpointing",
        # Seen with DeepSpeed 0.19.8: on CPU tensors its copy to the host is the tensor itself,
        # which the engine then empties before backward reads it back.
        needs_gpu=True,
        packages=("deepspeed",),
        make=DeepspeedOffload,
        notes="deepspeed.checkpointing with checkpoint_in_cpu: blocks recomputed, inputs on the host",
    )
)
