"""The one refusal every hand-launched kernel needs: its tensors must be on the current GPU.

A kernel launched from Python (NVRTC, CuPy) runs on the current GPU, and a custom op has no device
guard that would switch to its inputs' GPU first, so a CUDA tensor on another GPU would be read and
written by its address on the wrong one: silently wrong data, or an illegal access later.
"""

from __future__ import annotations

import torch


def refuse_other_gpus(**tensors: torch.Tensor) -> None:
    """Refuse, in one line naming the argument, any CUDA tensor of ``tensors`` (argument name ->
    tensor) that is not on the current GPU; tensors on the host pass (pinned memory is read through
    unified addressing)."""
    on_gpu = {name: t.device.index for name, t in tensors.items() if t.is_cuda}
    if not on_gpu:
        return
    current = torch.cuda.current_device()
    for name, index in on_gpu.items():
        if index != current:
            # Several GPUs among the arguments: no current device suits them all.
            hint = (
                f"call it under torch.cuda.device({index})"
                if set(on_gpu.values()) == {index}
                else "put them on one GPU: " + ", ".join(f"{n} on cuda:{i}" for n, i in on_gpu.items())
            )
            raise ValueError(f"{name} is on cuda:{index}, the current GPU is cuda:{current}: {hint}")
