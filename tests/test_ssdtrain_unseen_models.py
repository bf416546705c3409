"""``systems.ssdtrain.offload`` on models and training loops the suite does not ship, where the model
the ``with`` block covers is never called itself: a container without a forward (``nn.ModuleDict``)
whose parts the loop calls, a model whose ``forward`` is called directly, a Hugging Face model
(GPT-NeoX) called that way with its key-value cache on. The planned policies must still plan after
the profiled step and apply the plan, with the losses and gradients of a plain run, bit for bit."""

import contextlib
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from systems.ssdtrain import HostStore, offload
from systems.ssdtrain.planning import RECOMPUTE

STEPS = 3


class Block(nn.Module):
    forwards = 0  # every run of a block's forward, recomputations included

    def __init__(self, dim: int):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.drop = nn.Dropout(0.3)  # a recomputation must draw the same masks

    def forward(self, x):
        Block.forwards += 1
        return x + self.down(self.drop(F.gelu(self.up(self.norm(x)))))


class Encoder(nn.Module):
    def __init__(self, dim: int = 24, blocks: int = 3):
        super().__init__()
        self.inp = nn.Linear(5, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(blocks))

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return h


def container() -> nn.Module:
    return nn.ModuleDict({"encoder": Encoder(), "head": nn.Linear(24, 3)})


def container_loss(model, x, y):
    return F.cross_entropy(model["head"](model["encoder"](x)), y)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder, self.head = Encoder(), nn.Linear(24, 3)

    def forward(self, x, y):
        return F.cross_entropy(self.head(self.encoder(x)), y)


MODELS = {
    "a container whose parts the loop calls": (container, container_loss),
    "a model whose forward is called directly": (Classifier, lambda model, x, y: model.forward(x, y)),
}


def train(name: str, session=None):
    """Losses, gradients per step and forwards run per step (recomputations included) of STEPS SGD
    steps, all inside one ``session(model)`` block (or none)."""
    make, loss_of = MODELS[name]
    torch.manual_seed(0)
    model = make()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    losses, grads, forwards = [], [], []
    block = session(model) if session else contextlib.nullcontext()
    with block:
        for _ in range(STEPS):
            optimizer.zero_grad()
            Block.forwards = 0
            loss = loss_of(model, torch.randn(7, 5, generator=g), torch.randint(0, 3, (7,), generator=g))
            loss.backward()
            losses.append(loss.detach())
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
            forwards.append(Block.forwards)
            optimizer.step()
        decisions = block.decisions if session else None  # inside the block: not the plan made at its end
    return losses, grads, forwards, block, decisions


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("policy", ["offload_adaptive", "planner"])
def test_a_planned_policy_plans_where_the_model_itself_is_never_called(name, policy):
    want_losses, want_grads, *_ = train(name)
    args = {"budget": 0.5, "bandwidth": 1e3} if policy == "planner" else {"bandwidth": 1e15}
    with HostStore() as store, warnings.catch_warnings():
        warnings.filterwarnings("ignore", "SSDTrain planner: no plan fits", UserWarning)
        session = lambda model: offload(model, store=store, policy=policy, min_bytes=0, **args)  # noqa: E731
        losses, grads, forwards, done, decisions = train(name, session)
    for step in range(STEPS):
        assert torch.equal(losses[step], want_losses[step]), f"loss differs at step {step}"
        for n, grad in want_grads[step].items():
            assert torch.equal(grads[step][n], grad), f"gradient of {n} differs at step {step}"
    # Planned after the profiled step, and applied: offloaded, or (the slow store) recomputed.
    assert decisions is not None
    if policy == "planner":
        recomputed = decisions.count(RECOMPUTE)
        assert recomputed > 0
        assert forwards[-1] == 3 + recomputed  # each recomputed block ran again in backward
    else:
        assert done.stats.total.offloaded_tensors > 0


def test_a_hugging_face_model_whose_forward_is_called_directly_is_planned_with_its_cache_on():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPTNeoXConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32, hidden_dropout=0.1, attention_dropout=0.1, use_cache=True,
    )  # fmt: skip
    g = torch.Generator().manual_seed(2)
    batches = [torch.randint(0, 64, (2, 11), generator=g) for _ in range(STEPS)]

    def run(session=None):
        decisions = []  # the block's decisions after each step (None: not planned yet)
        torch.manual_seed(0)
        model = transformers.GPTNeoXForCausalLM(config)
        model.train()
        out = []
        with session(model) if session else contextlib.nullcontext() as block:
            for ids in batches:
                model.zero_grad()
                loss = model.forward(input_ids=ids, labels=ids).loss
                loss.backward()
                out.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
                decisions.append(block.decisions if block else None)
        return out, decisions

    want, _ = run()
    with HostStore() as store, warnings.catch_warnings():
        warnings.filterwarnings("ignore", "SSDTrain planner: no plan fits", UserWarning)
        warnings.filterwarnings("ignore", ".*use_cache is off", UserWarning)
        planner = {"policy": "planner", "budget": 0.5, "bandwidth": 1e3, "min_bytes": 0}
        got, decisions = run(lambda m: offload(m, store=store, **planner))
    assert decisions[0] is None and RECOMPUTE in decisions[1]  # planned at the second forward, recomputed at the third
    for step, ((loss, grads), (want_loss, want_grads)) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(loss, want_loss), f"loss differs at step {step}"
        for n, grad in want_grads.items():
            assert torch.equal(grads[n], grad), f"gradient of {n} differs at step {step}"
