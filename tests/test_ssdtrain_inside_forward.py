"""What a model does inside its own forward that the engine must not take for the step's backward,
and the model's parameters changing under a long ``with`` block.

- A block whose forward computes a gradient (``torch.autograd.grad(energy, x, create_graph=True)``:
  forces from an energy, a PINN's derivatives) runs a backward of its own mid-forward. It used to
  count as the step's backward: the planned policies planned after block 0 from half a profile (the
  blocks not yet run kept for good, the budget ignored), and the next block started a new
  micro-batch. The step's one backward is counted; the plans are those of a full profile; the
  gradients are a plain run's, bit for bit, also where the inner backward reads an offloaded tensor
  back from the store (``always_read_back``).
- Code that reads a saved tensor during forward (``grad_fn._saved_result``) is no backward either.
- A parameter replaced inside the block (``model.double()``, ``load_state_dict(assign=True)``) is
  still a parameter: never written to the store.
- The engine's ``Offloader(layers=...)`` refuses what ``offload(layers=...)`` refuses, in one line.
"""

import re

import pytest
import torch
from torch import nn

from harness.errors import UserError
from systems.ssdtrain import HostStore, Offloader, offload

WIDTH, BLOCKS, STEPS = 16, 4, 3


class EnergyBlock(nn.Module):
    """x - 0.1 * dE/dx for a small learned energy E: the gradient is taken inside forward."""

    def __init__(self):
        super().__init__()
        self.inner, self.energy = nn.Linear(WIDTH, 48), nn.Linear(48, 1)

    def forward(self, x):
        energy = self.energy(torch.tanh(self.inner(x))).sum()
        (force,) = torch.autograd.grad(energy, x, create_graph=True)
        return x - 0.1 * force


class PeekingBlock(nn.Module):
    """A block that looks at what autograd saved for its tanh (a debugging hook would)."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, 48), nn.Linear(48, WIDTH)
        self.peeked = []

    def forward(self, x):
        hidden = torch.tanh(self.up(x))
        self.peeked.append(float(hidden.grad_fn._saved_result.detach().sum()))
        return x + self.down(hidden)


class Stack(nn.Module):
    def __init__(self, block: type[nn.Module]):
        super().__init__()
        self.layers = nn.ModuleList([block() for _ in range(BLOCKS)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.square().mean()


def inputs(step: int, device: str = "cpu") -> torch.Tensor:
    generator = torch.Generator().manual_seed(100 + step)
    return torch.randn(24, WIDTH, generator=generator).to(device).requires_grad_()


def train(block: type[nn.Module], device: str = "cpu", **offload_args):
    """Losses and gradients of STEPS steps, one ``with`` block each (none: a plain run), and the
    session."""
    torch.manual_seed(0)
    model = Stack(block).to(device)
    session = offload(model, **offload_args) if offload_args else None
    losses, grads, backwards = [], [], []
    for step in range(STEPS):
        x = inputs(step, device)
        if session is None:
            loss = model(x)
            loss.backward()
        else:
            with session:
                loss = model(x)
                loss.backward()
            backwards.append(session.offloader.backwards)
        losses.append(loss.detach())
        # (The energy's bias has no gradient: it does not move dE/dx.)
        grads.append([p.grad for p in model.parameters()] + [x.grad])
        model.zero_grad(set_to_none=True)
    return losses, grads, backwards, session


def assert_plain(block, got, device: str = "cpu"):
    losses, grads, _, _ = train(block, device)
    for a, b in zip(got[0], losses, strict=True):
        assert torch.equal(a, b)
    for step_got, step_want in zip(got[1], grads, strict=True):
        for a, b in zip(step_got, step_want, strict=True):
            assert (a is None and b is None) or torch.equal(a, b)
        assert sum(a is not None for a in step_got) > len(step_got) // 2


PLANNED = {
    "offload_adaptive": {"bandwidth": 1e15},
    "planner": {"budget": 0.3, "bandwidth": 1e15},
}


@pytest.mark.parametrize("policy", ["offload_all", *PLANNED])
@pytest.mark.parametrize("always_read_back", [False, True])
def test_a_gradient_taken_inside_forward_is_not_the_steps_backward(policy, always_read_back):
    store = HostStore()
    got = train(
        EnergyBlock,
        store=store,
        policy=policy,
        min_bytes=0,
        always_read_back=always_read_back,
        **PLANNED.get(policy, {}),
    )
    _, _, backwards, session = got
    assert backwards == [1] * STEPS  # the step's backward, not one more per block
    # A store as fast as memory and a budget under what keep holds: every block but the last kept
    # one is offloaded, by a plan made from the whole first step (all four blocks profiled).
    assert session.decisions == ["offload"] * (BLOCKS - 1) + ["keep"]
    last = session.stats.layers
    assert all(last[i].offloaded_bytes > 0 for i in range(BLOCKS - 1))
    assert_plain(EnergyBlock, got)
    store.close()


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["offload_all", "planner"])
@pytest.mark.parametrize("always_read_back", [False, True])
def test_gpu_a_gradient_taken_inside_forward_is_not_the_steps_backward(policy, always_read_back):
    """On the GPU: the inner backward reads what is still in flight from memory, or (always read
    back) from pinned host memory over the copy streams, and keeps neither for later."""
    torch.use_deterministic_algorithms(True)
    try:
        store = HostStore()
        got = train(
            EnergyBlock,
            "cuda",
            store=store,
            policy=policy,
            min_bytes=0,
            always_read_back=always_read_back,
            **PLANNED.get(policy, {}),
        )
        assert got[2] == [1] * STEPS
        assert got[3].decisions == ["offload"] * (BLOCKS - 1) + ["keep"]
        assert_plain(EnergyBlock, got, "cuda")
        store.close()
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("policy", ["offload_all", "planner"])
def test_reading_a_saved_tensor_during_forward_is_no_backward(policy):
    store = HostStore()
    got = train(PeekingBlock, store=store, policy=policy, min_bytes=0, **PLANNED.get(policy, {}))
    _, _, backwards, session = got
    assert backwards == [1] * STEPS
    assert session.decisions == ["offload"] * (BLOCKS - 1) + ["keep"]
    assert_plain(PeekingBlock, got)
    store.close()


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, 64), nn.Linear(64, WIDTH)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


def test_parameters_replaced_inside_the_block_are_never_offloaded():
    """``model.double()`` inside one long ``with``: the new float64 weights are the model's, so
    the second forward offloads its activations, twice the first's bytes, and no weight."""
    torch.manual_seed(0)
    model = Stack(Block)
    with HostStore() as store, offload(model, store=store, policy="offload_all", min_bytes=0) as session:
        model(inputs(0)).backward()
        first = session.stats.total
        model.double()
        model(inputs(1).double()).backward()
        second = session.stats.total
    added_weights = second.parameter_bytes - first.parameter_bytes
    added_offloaded = second.offloaded_bytes - first.offloaded_bytes
    assert first.parameter_bytes > 0 and first.offloaded_bytes > 0
    assert added_weights == 2 * first.parameter_bytes
    assert added_offloaded == 2 * first.offloaded_bytes


def test_a_replaced_parameter_under_autocast_is_known_by_its_cast():
    """The cast of a replaced weight (autocast's bf16 copy) is the weight's too."""
    torch.manual_seed(0)
    model = Stack(Block)
    with HostStore() as store, offload(model, store=store, policy="offload_all", min_bytes=0) as session:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(inputs(0)).backward()
        first = session.stats.total
        model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(inputs(1)).backward()
        second = session.stats.total
    assert first.parameter_bytes > 0
    assert second.parameter_bytes - first.parameter_bytes == first.parameter_bytes
    assert second.offloaded_bytes - first.offloaded_bytes == first.offloaded_bytes


def test_the_engine_refuses_the_blocks_offload_refuses():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3)])
    cases = [
        (["block0"], "a non-empty list of the model's own submodules"),
        (3, "a non-empty list of the model's own submodules"),
        ([nn.Linear(8, 8)], "a non-empty list of the model's own submodules"),
        ([model[0], model[0]], "the same Sequential twice"),
        ([model, model[0]], "lies inside another listed Sequential"),
        (model[0][0], r"a list of blocks; got one Linear \(pass \[block\]\)"),
    ]
    for layers, message in cases:
        for make in (lambda: Offloader(model, HostStore(), layers=layers), lambda: offload(model, layers=layers)):
            with pytest.raises(UserError) as error:
                make()
            assert re.search(message, str(error.value)) and "\n" not in str(error.value), str(error.value)


class FailingBlock(nn.Module):
    """A block whose forward raises while ``fail`` is set (a batch the user catches and skips)."""

    fail = False

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, 48), nn.Linear(48, WIDTH)

    def forward(self, x):
        hidden = torch.tanh(self.up(x))
        if FailingBlock.fail:
            raise RuntimeError("a batch the user skips")
        return x + self.down(hidden)


class Embedded(nn.Module):
    """A stem before the blocks (what it saves belongs to no block), then the blocks."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(WIDTH, WIDTH)
        self.layers = nn.ModuleList([FailingBlock() for _ in range(BLOCKS)])

    def forward(self, x):
        x = torch.tanh(self.stem(x))
        for layer in self.layers:
            x = layer(x)
        return x.square().mean()


def test_a_block_that_raised_is_left_so_the_next_tensors_and_backward_are_nobody_s():
    """A forward that raised inside a block left the engine in that block: the next micro-batch's
    stem tensors were offloaded as the block's (the doc keeps what is saved outside the blocks), and
    a backward before the next forward was taken for one inside a block's forward (no prefetch, no
    backward counted)."""
    torch.manual_seed(0)
    model = Embedded()
    plain = Embedded()
    plain.load_state_dict(model.state_dict())
    with HostStore() as store, offload(model, store=store, policy="offload_all", min_bytes=0, keep_last=0) as session:
        first = model(inputs(0))
        FailingBlock.fail = True
        try:
            with pytest.raises(RuntimeError, match="a batch the user skips"):
                model(inputs(1))
        finally:
            FailingBlock.fail = False
        first.backward()
        assert session.offloader.backwards == 1 and session.offloader.cache.prefetched_loads > 0
        assert session.offloader._layer is None
        stem_bytes = session.stats.layers.get(None)
        model.zero_grad(set_to_none=True)
        second = model(inputs(2))
        assert session.stats.layers[None].offloaded_bytes == 0  # the stem's tensors, kept
        second.backward()
    plain(inputs(0)).backward()
    plain.zero_grad(set_to_none=True)
    plain(inputs(2)).backward()
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    assert stem_bytes is not None and stem_bytes.packed_bytes > 0
