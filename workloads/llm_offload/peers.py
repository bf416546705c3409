"""Other libraries' ways to save activation memory, run beside the suite's policies where they run.

Each peer is a :class:`Peer`: either saved-tensor hooks made afresh for every step (torchtune's
``OffloadActivations``: every saved tensor to pinned host memory on a side stream) or a function
that runs a block's forward for recomputation (DeepSpeed's activation checkpointing with
``checkpoint_in_cpu``: each block recomputed in backward, its input held on the host
meanwhile). A peer that does not import, or cannot run on this device, is left out with the
reason in the notes (``notes["skipped"][variant]``), never faked.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Peer:
    """One peer's mechanism: ``hooks`` (a factory of saved-tensor hooks, entered around a step) or
    ``checkpoint`` (``checkpoint(forward, *args, **kwargs)`` runs a block's forward so that backward
    recomputes it); ``reset`` clears what the library holds after a step that raised."""

    hooks: Callable[[], torch.autograd.graph.saved_tensors_hooks] | None = None
    checkpoint: Callable | None = None
    reset: Callable[[], None] = lambda: None  # forget a step that failed half-way (the library's own state)

    def __post_init__(self):
        if (self.hooks is None) == (self.checkpoint is None):
            raise ValueError("a peer has saved-tensor hooks or a checkpoint function, exactly one")


NAMES = ("torchtune_offload", "deepspeed_offload")


def first_line(err: Exception) -> str:
    text = str(err).splitlines()[0][:200] if str(err) else ""
    return f"{type(err).__name__}: {text}"


def peers(params, device: str, notes: dict, wanted=NAMES) -> list[tuple[str, Peer]]:
    """(variant, :class:`Peer`) for each peer in ``wanted`` that runs here; the others are
    skipped with the reason in ``notes["skipped"]``, their versions in ``notes["peers"]``."""
    found = []
    for name, make in (("torchtune_offload", _torchtune), ("deepspeed_offload", _deepspeed)):
        if name not in wanted:
            continue
        peer = make(params, device, notes)
        if peer is not None:
            found.append((name, peer))
    return found


def _torchtune(params, device: str, notes: dict) -> Peer | None:
    try:
        import torchtune
        from torchtune.training import OffloadActivations
    except Exception as err:  # torchtune's package import pulls datasets, torchao and more
        notes["skipped"]["torchtune_offload"] = f"torchtune not importable ({first_line(err)})"
        return None
    if device != "cuda":
        notes["skipped"]["torchtune_offload"] = (
            "torchtune's OffloadActivations moves CUDA tensors to the host; this run trains on the CPU"
        )
        return None
    notes.setdefault("peers", {})["torchtune"] = torchtune.__version__
    min_bytes = params["min_bytes"]
    return Peer(hooks=lambda: OffloadActivations(use_pin_memory=True, use_streams=True, min_offload_size=min_bytes))


def _deepspeed(params, device: str, notes: dict) -> Peer | None:
    """DeepSpeed's activation checkpointing with ``checkpoint_in_cpu`` (partition_activations off:
    with one model-parallel rank there is nothing to partition, and that path copies on the
    compute stream). Its ``configure`` logs through DeepSpeed's communication backend, so a
    single-process gloo group is made first where none exists."""
    try:
        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        import deepspeed
    except Exception as err:  # a pure-Python wheel built without ops (DS_BUILD_OPS=0) is enough
        notes["skipped"]["deepspeed_offload"] = f"deepspeed not importable ({first_line(err)})"
        return None
    if device != "cuda":
        # Seen with DeepSpeed 0.19.8: on CPU tensors its copy to the host is the tensor itself,
        # which the engine then empties before backward reads it back.
        notes["skipped"]["deepspeed_offload"] = (
            "DeepSpeed's checkpoint_in_cpu moves CUDA tensors to the host; this run trains on the CPU"
        )
        return None
    if not torch.distributed.is_initialized():
        # One process group for the process (a part runs in a process of its own): left in place
        # for the next model's DeepSpeed, and said in the notes, since torch.distributed is then on.
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
            os.environ.setdefault(key, value)
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
        notes["process_group"] = "a one-process gloo group made for DeepSpeed's configure, kept for the process"
    deepspeed.checkpointing.configure(None, checkpoint_in_cpu=True, partition_activations=False)
    notes.setdefault("peers", {})["deepspeed"] = deepspeed.__version__

    def checkpoint(forward, *args, **kwargs):
        # Keyword arguments are bound here, not handed to DeepSpeed: it would treat a tensor among
        # them (a float attention mask shared by every block) as this block's input to move to the
        # host, and empty it for the blocks after (seen with 0.19.8: a wrong loss, no error).
        return deepspeed.checkpointing.checkpoint(functools.partial(forward, **kwargs), *args)

    return Peer(checkpoint=checkpoint, reset=deepspeed.checkpointing.reset)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
