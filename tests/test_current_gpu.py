"""The shared refusal of tensors on a GPU other than the current one (systems/current_gpu.py).

Tensors on two GPUs need two GPUs; the decision itself only reads ``is_cuda`` and ``device``, so it
is checked here with stand-ins and a patched current device, and on two GPUs with real tensors
(tests/test_gather_unseen_inputs.py).
"""

from types import SimpleNamespace

import pytest
import torch

from systems.current_gpu import refuse_other_gpus


def on(index: int | None) -> SimpleNamespace:
    """A stand-in for a tensor on cuda:``index`` (None: on the host)."""
    device = torch.device("cpu") if index is None else torch.device("cuda", index)
    return SimpleNamespace(is_cuda=index is not None, device=device)


@pytest.fixture
def current_is_0(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_tensors_on_the_current_gpu_or_the_host_pass(current_is_0):
    refuse_other_gpus(seeds=on(0), indptr=on(None), indices=on(0))
    refuse_other_gpus()


def test_host_tensors_alone_never_ask_for_a_gpu(monkeypatch):
    def no_gpu():
        raise AssertionError("asked for the current GPU without a CUDA tensor")

    monkeypatch.setattr(torch.cuda, "current_device", no_gpu)
    refuse_other_gpus(table=torch.randn(3, 2), rows=torch.tensor([2, 0]))


def test_one_tensor_elsewhere_is_named_with_the_device_to_call_under(current_is_0):
    with pytest.raises(
        ValueError, match=r"^idx is on cuda:1, the current GPU is cuda:0: call it under torch\.cuda\.device\(1\)$"
    ):
        refuse_other_gpus(idx=on(1))


def test_tensors_on_several_gpus_are_named_each(current_is_0):
    with pytest.raises(ValueError) as raised:
        refuse_other_gpus(seeds=on(1), indptr=on(0), indices=on(None))
    assert str(raised.value) == (
        "seeds is on cuda:1, the current GPU is cuda:0: put them on one GPU: seeds on cuda:1, indptr on cuda:0"
    )
