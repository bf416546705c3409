"""``systems.ssdtrain.offload`` applied as a new user would, to models the suite does not ship: an
MLP of repeated blocks with dropout, a tiny transformer of ``nn.TransformerEncoderLayer``, blocks
called with keyword arguments, tied weights and one block applied three times, blocks that return
tuples, a small ResNet with BatchNorm. Every policy must give the losses, gradients and model state
(BatchNorm's running statistics included) of a plain run, bit for bit, over gradient accumulation
inside one ``with`` block and under CPU bf16 autocast; file stores leave no file behind; bad
arguments are refused in one line. Also what users' models do beyond that: change a recomputed
block's input in place after it ran (an error that says so, never other gradients), hold blocks in
lists of module lists, skip blocks (LayerDrop), give sparse or inference-mode inputs, train two
models each in its own ``offload()``, switch to train mode inside the block."""

import collections
import contextlib
import copy
import dataclasses
import io
import os
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from test_ssdtrain_stores import real_disk_folder
from torch import nn

from harness.errors import UserError
from systems.ssdtrain import DirectFileStore, EmulatedStore, HostStore, Offloader, find_layers, offload
from systems.ssdtrain.planning import KEEP, OFFLOAD, RECOMPUTE, Plan

STEPS, MICRO_BATCHES = 2, 2


# -- models ---------------------------------------------------------------------------------------
class MLPBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(3 * dim, dim)
        self.drop = nn.Dropout(0.2)  # draws from the global generator: a stray draw changes the masks

    def forward(self, x):
        return x + self.drop(self.down(F.gelu(self.up(self.norm(x)))))


class MLP(nn.Module):
    def __init__(self, dim: int = 24, blocks: int = 4):
        super().__init__()
        self.inp, self.out = nn.Linear(7, dim), nn.Linear(dim, 3)
        self.blocks = nn.Sequential(*[MLPBlock(dim) for _ in range(blocks)])

    def forward(self, x, y):
        return F.cross_entropy(self.out(self.blocks(self.inp(x))), y)


class Transformer(nn.Module):
    """nn.TransformerEncoder (train mode: the slow path, dropout 0.1) under a causal mask."""

    def __init__(self, dim: int = 32, blocks: int = 3):
        super().__init__()
        self.emb, self.head = nn.Embedding(50, dim), nn.Linear(dim, 50)
        layer = nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.1, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, blocks, enable_nested_tensor=False)

    def forward(self, ids, y):
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        h = self.enc(self.emb(ids), mask=mask, is_causal=True)
        return F.cross_entropy(self.head(h).flatten(0, 1), y.flatten())


class KeywordBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.lin, self.gate = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x, *, scale, mask=None, bias=None):
        h = torch.tanh(self.lin(x)) * torch.sigmoid(self.gate(x)) * scale
        if mask is not None:
            h = h * mask
        return x + (h if bias is None else h + bias)


class Keywords(nn.Module):
    def __init__(self, dim: int = 20, blocks: int = 3):
        super().__init__()
        self.layers = nn.ModuleList(KeywordBlock(dim) for _ in range(blocks))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        mask = (x > -0.5).float()
        for layer in self.layers:
            x = layer(x, scale=torch.full((1,), 0.7), mask=mask, bias=self.bias)
        return x.square().mean()


class Tied(nn.Module):
    """The head tied to the embedding, and one block applied three times (ALBERT's sharing)."""

    def __init__(self, dim: int = 24):
        super().__init__()
        self.emb, shared = nn.Embedding(40, dim), MLPBlock(dim)
        self.blocks = nn.ModuleList([shared, shared, shared])
        self.head = nn.Linear(dim, 40, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids, y):
        h = self.emb(ids)
        for block in self.blocks:
            h = block(h)
        return F.cross_entropy(self.head(h).flatten(0, 1), y.flatten())


class TupleBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.a, self.b = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x, aux):
        h = torch.relu(self.a(x))
        return x + self.b(h), aux + h.pow(2).mean(), "a note"


class Tuples(nn.Module):
    def __init__(self, dim: int = 16, blocks: int = 4):
        super().__init__()
        self.layers = nn.ModuleList(TupleBlock(dim) for _ in range(blocks))

    def forward(self, x):
        aux = x.new_zeros(())
        for layer in self.layers:
            x, aux, _ = layer(x, aux)
        return x.abs().mean() + 0.1 * aux


class BasicBlock(nn.Module):
    def __init__(self, inp: int, out: int, stride: int):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(inp, out, 3, stride, 1, bias=False), nn.BatchNorm2d(out)
        self.c2, self.b2 = nn.Conv2d(out, out, 3, 1, 1, bias=False), nn.BatchNorm2d(out)
        same = stride == 1 and inp == out
        self.skip = (
            nn.Identity() if same else nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False), nn.BatchNorm2d(out))
        )

    def forward(self, x):
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.skip(x))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.fc = nn.Conv2d(3, 6, 3, padding=1), nn.Linear(12, 4)
        self.stages = nn.Sequential(
            BasicBlock(6, 6, 1), BasicBlock(6, 6, 1), BasicBlock(6, 12, 2), BasicBlock(12, 12, 1)
        )

    def forward(self, x, y):
        return F.cross_entropy(self.fc(self.stages(self.stem(x)).mean((2, 3))), y)


MODELS = {
    "mlp": MLP,
    "transformer": Transformer,
    "keywords": Keywords,
    "tied": Tied,
    "tuples": Tuples,
    "resnet": ResNet,
}
BLOCKS = {"mlp": 4, "transformer": 3, "keywords": 3, "tied": 1, "tuples": 4, "resnet": 4}


def batch(name: str, i: int) -> tuple:
    """Micro-batch ``i`` of model ``name``: random, odd sizes."""
    g = torch.Generator().manual_seed(100 + i)
    if name == "mlp":
        return torch.randn(5, 7, generator=g), torch.randint(0, 3, (5,), generator=g)
    if name == "transformer":
        return torch.randint(0, 50, (3, 9), generator=g), torch.randint(0, 50, (3, 9), generator=g)
    if name == "tied":
        return torch.randint(0, 40, (3, 7), generator=g), torch.randint(0, 40, (3, 7), generator=g)
    if name == "resnet":
        return torch.randn(3, 3, 9, 11, generator=g), torch.randint(0, 4, (3,), generator=g)
    return (torch.randn(6, 20 if name == "keywords" else 16, generator=g),)


def train(name: str, session=None, autocast: bool = False):
    """Losses, gradients per optimizer step and the final state (buffers included) of STEPS SGD
    steps of MICRO_BATCHES micro-batches, all inside one ``session(model)`` block (or none)."""
    torch.manual_seed(0)
    model = MODELS[name]()
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grads = [], []
    block = session(model) if session else contextlib.nullcontext()
    with block:
        for step in range(STEPS):
            optimizer.zero_grad()
            for micro in range(MICRO_BATCHES):
                with torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext():
                    loss = model(*batch(name, step * MICRO_BATCHES + micro))
                loss.backward()
                losses.append(loss.detach().clone())
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
            optimizer.step()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return (losses, grads, state), block, model


def assert_identical(got, want):
    for i, (a, b) in enumerate(zip(got[0], want[0], strict=True)):
        assert torch.equal(a, b), f"loss differs at micro-batch {i}"
    for step, (a, b) in enumerate(zip(got[1], want[1], strict=True)):
        for name in b:
            assert torch.equal(a[name], b[name]), f"gradient of {name} differs at step {step}"
    for name in want[2]:
        assert torch.equal(got[2][name], want[2][name]), f"{name} differs after training"


_references = {}


def reference(name: str, autocast: bool = False):
    if (name, autocast) not in _references:
        _references[name, autocast] = train(name, autocast=autocast)[0]
    return _references[name, autocast]


def policy_args(policy: str, blocks: int, store=None) -> dict:
    """offload()'s arguments for ``policy``. offload_adaptive measures the store's bandwidth (a probe
    of random bytes, which must leave the model's dropout masks alone); the planner is given a slow
    store, so that it recomputes."""
    if policy in ("keep", "recompute", "save_on_cpu"):
        return {"policy": policy}
    args = {"store": store or HostStore(), "min_bytes": 0}
    if policy == "plan":
        return args | {"policy": Plan(tuple((OFFLOAD, RECOMPUTE, KEEP)[i % 3] for i in range(blocks)), 0.0, 0, 0.0)}
    if policy == "planner":
        return args | {"policy": "planner", "budget": 0.5, "bandwidth": 1e3}
    return args | {"policy": policy, "keep_last": 0}


POLICIES = ["keep", "recompute", "save_on_cpu", "offload_all", "offload_adaptive", "planner", "plan"]


def check(name: str, policy: str, autocast: bool = False):
    sessions = []

    def session(model):
        sessions.append(offload(model, **policy_args(policy, BLOCKS[name])))
        return sessions[-1]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # A tiny model's blocks may save less than their inputs: no plan reaches the budget, said.
        warnings.filterwarnings("ignore", "SSDTrain planner: no plan fits", UserWarning)
        got, _, _ = train(name, session, autocast)
    assert_identical(got, reference(name, autocast))
    if policy in ("offload_all", "plan"):
        assert sessions[0].stats.total.offloaded_tensors > 0


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", list(MODELS))
def test_every_policy_on_user_models_matches_a_plain_run_bit_for_bit(name, policy):
    check(name, policy)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", ["transformer", pytest.param("resnet", marks=pytest.mark.full)])
def test_every_policy_under_cpu_bf16_autocast_matches_a_plain_run(name, policy):
    check(name, policy, autocast=True)


# -- what a recomputation must leave as it was ------------------------------------------------------
def test_recomputing_a_batchnorm_block_updates_its_running_statistics_once():
    """The recomputation in backward runs BatchNorm's forward again: its running mean, variance and
    batch count must still be those of one forward per micro-batch."""
    want = reference("resnet")[2]
    got = train("resnet", lambda model: offload(model, policy="recompute"))[0][2]
    block = "stages.0.b1"
    assert (
        int(got[f"{block}.num_batches_tracked"]) == int(want[f"{block}.num_batches_tracked"]) == STEPS * MICRO_BATCHES
    )
    assert torch.equal(got[f"{block}.running_mean"], want[f"{block}.running_mean"])
    assert torch.equal(got[f"{block}.running_var"], want[f"{block}.running_var"])


@pytest.mark.parametrize("policy", ["recompute", "plan"])
def test_recomputing_a_block_called_with_substituted_parameters_uses_them(policy):
    """torch.func.functional_call puts other tensors in the parameters' places for one call (a
    meta-learner's fast weights): the recomputation, run after the call restored them, must run
    with the substituted ones (it ran with the module's own: gradients off by 0.2)."""

    def run(session=None):
        torch.manual_seed(0)
        model = MLP(blocks=3)
        x, y = batch("mlp", 0)
        with session(model) if session else contextlib.nullcontext():
            fast = {name: p - 0.3 * torch.randn_like(p) for name, p in model.named_parameters()}
            torch.manual_seed(5)  # the dropout masks
            torch.func.functional_call(model, fast, (x, y)).backward()
        return [p.grad for p in model.parameters()], [p.clone() for p in model.parameters()]

    args = {"policy": "recompute"} if policy == "recompute" else policy_args("plan", 3, HostStore())
    (want, weights), (got, after) = run(), run(lambda model: offload(model, **args))
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and all(torch.equal(a, b) for a, b in zip(after, weights))


def test_a_parameter_changed_in_place_before_backward_is_refused_as_autograd_refuses_it():
    """A block's weight changed between forward and backward (an optimizer step in between):
    plain autograd raises; recomputing with the changed weight gave other gradients without a word."""
    torch.manual_seed(0)
    model = MLP(blocks=2)

    def step_of_the_first_block():
        with torch.no_grad():
            model.blocks[0].up.weight.mul_(0.9)

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss = model(*batch("mlp", 0))
        step_of_the_first_block()
        loss.backward()
    with offload(model, policy="recompute"):
        loss = model(*batch("mlp", 0))
        step_of_the_first_block()
        with pytest.raises(RuntimeError, match=r"^parameter weight of a recomputed MLPBlock was modified in place"):
            loss.backward()


class SelfCheckpointing(nn.Module):
    """A model that checkpoints its own blocks (torch.utils.checkpoint), BatchNorm in them: in
    backward its checkpoint runs each block's forward again, which updates the running
    statistics again, as it does without any policy."""

    def __init__(self, reentrant: bool):
        super().__init__()
        self.reentrant = reentrant
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.Tanh()) for _ in range(3))

    def forward(self, x):
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.reentrant)
        return x.square().mean()


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_model_checkpointing_its_own_blocks_keeps_its_running_statistics_under_recompute(reentrant):
    def run(session=None):
        torch.manual_seed(0)
        model = SelfCheckpointing(reentrant)
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1), requires_grad=reentrant)
        with session(model) if session else contextlib.nullcontext():
            model(x).backward()
        return model.state_dict(), [p.grad for p in model.parameters()]

    (want_state, want_grads), (got_state, got_grads) = run(), run(lambda m: offload(m, policy="recompute"))
    assert int(want_state["blocks.0.1.num_batches_tracked"]) == 2  # once in forward, once in backward
    assert all(torch.equal(got_state[k], want_state[k]) for k in want_state)
    assert all(torch.equal(a, b) for a, b in zip(got_grads, want_grads))


class CountingBlock(MLPBlock):
    """A block that counts its forwards in a buffer it assigns anew each time (not in place)."""

    def __init__(self, dim: int):
        super().__init__(dim)
        self.register_buffer("seen", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.seen = self.seen + x.shape[0]
        return super().forward(x)


def test_recomputing_a_block_that_assigns_its_buffers_counts_each_forward_once():
    def run(session=None):
        torch.manual_seed(0)
        model = MLP()
        model.blocks = nn.Sequential(*[CountingBlock(24) for _ in range(3)])
        with session(model) if session else contextlib.nullcontext():
            for i in range(3):
                model(*batch("mlp", i)).backward()
        return [int(block.seen) for block in model.blocks], [p.grad for p in model.parameters()]

    want_seen, want_grads = run()
    seen, grads = run(lambda model: offload(model, policy="recompute"))
    assert seen == want_seen == [15, 15, 15]
    assert all(torch.equal(a, b) for a, b in zip(grads, want_grads, strict=True))


def test_a_forward_the_user_put_on_a_block_is_back_after_recomputing_it():
    """A wrapper installed as the block's instance ``forward`` (as accelerate's hooks are) keeps
    running after the ``with`` block that recomputed the block."""
    torch.manual_seed(0)
    model = MLP()
    block, calls = model.blocks[1], []
    inner = block.forward

    def wrapped(x):
        calls.append(x.shape)
        return inner(x)

    block.forward = wrapped
    with offload(model, policy="recompute"):
        model(*batch("mlp", 0)).backward()
    assert len(calls) == 2  # forward and recomputation
    model(*batch("mlp", 1))
    assert len(calls) == 3 and vars(block)["forward"] is wrapped


def test_a_recompute_block_inside_another_restores_both():
    torch.manual_seed(0)
    model = MLP()
    with offload(model, policy="recompute"), offload(model, policy="recompute"):
        model(*batch("mlp", 0)).backward()
    assert all("forward" not in vars(block) for block in model.blocks)


def test_planning_from_a_measured_bandwidth_leaves_dropout_alone():
    """offload_adaptive without ``bandwidth=`` measures the store with random bytes; dropout after
    the plan must draw the masks a plain run draws."""
    want = reference("transformer")
    for policy in ("offload_adaptive", "planner"):
        args = {"store": HostStore(), "policy": policy, "min_bytes": 0} | (
            {"budget": 0.5} if policy == "planner" else {}
        )
        got, session, _ = train("transformer", lambda model, args=args: offload(model, **args))
        assert session.plan is not None
        assert_identical(got, want)


# -- file stores ----------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["offload_all", "offload_adaptive", "planner", "plan"])
def test_a_file_store_in_a_temporary_folder_matches_and_leaves_no_file(tmp_path, policy):
    with real_disk_folder(tmp_path) as folder:
        before = set(os.listdir(folder))
        with DirectFileStore(folder, threads=2, block_bytes=64 << 10) as store:
            args = policy_args(policy, BLOCKS["transformer"], store) | {"always_read_back": True}
            if policy == "planner":
                args["bandwidth"] = 1e12  # a fast store: the planner offloads
            got, session, _ = train("transformer", lambda model: offload(model, **args))
            assert session.stats.store.bytes_written > 0 and session.stats.store.bytes_read > 0
            assert len(store) == 0 and list(store.directory.iterdir()) == []
        assert_identical(got, reference("transformer"))
        assert set(os.listdir(folder)) == before


def test_an_error_inside_the_block_leaves_no_file(tmp_path):
    with real_disk_folder(tmp_path) as folder, DirectFileStore(folder, threads=2, block_bytes=64 << 10) as store:
        torch.manual_seed(0)
        model = Transformer()
        with pytest.raises(KeyError), offload(model, store=store, min_bytes=0, keep_last=0):
            loss = model(*batch("transformer", 0))  # holds what forward saved
            assert list(store.directory.iterdir()), "nothing was written: the test would test nothing"
            raise KeyError("stop")
        assert list(store.directory.iterdir()) == []
        del loss
    assert not list(folder.glob("ssdtrain-*"))


def test_policies_without_a_store_make_no_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for policy in ("keep", "recompute", "save_on_cpu"):
        train("mlp", lambda model, policy=policy: offload(model, policy=policy))
    assert list(tmp_path.iterdir()) == []


# -- bad arguments --------------------------------------------------------------------------------
def one_line(error, message: str) -> None:
    assert re.search(message, str(error.value)), str(error.value)
    assert "\n" not in str(error.value)


def test_bad_arguments_are_one_clear_line(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = MLP()
    monkeypatch.chdir(tmp_path)  # a store made in the working directory would show in tmp_path
    closed = HostStore()
    closed.close()
    cases = [
        (lambda: offload(model, policy="keep", layers=3), "layers must be a non-empty list"),
        (lambda: DirectFileStore(None), "folder must be the path of an existing folder, got None"),
        (lambda: DirectFileStore(""), "folder must be the path of an existing folder, got ''"),
        (lambda: DirectFileStore(tmp_path, threads=True), "threads must be a positive integer, got True"),
        (lambda: EmulatedStore(1.0, inner="host"), "inner must be a Store"),
        (lambda: offload(model, policy="offload-all", store=HostStore()), r"unknown policy 'offload-all': choose one"),
        (lambda: offload(model, policy=None), "unknown policy None"),
        (lambda: DirectFileStore(tmp_path / "missing"), "missing does not exist: pass an existing folder"),
        (lambda: offload(nn.functional.relu, policy="keep"), "takes an nn.Module, got function"),
        (lambda: offload(model, policy="keep", layers=[]), "layers must be a non-empty list"),
        (lambda: offload(nn.Linear(3, 3), policy="keep"), "no list of repeated blocks"),
        (lambda: offload(model, store=str(tmp_path)), "store must be a systems.ssdtrain Store"),
        (lambda: offload(model, policy="offload_all", store=closed), r"the store given \(host\) is closed"),
        (lambda: Offloader(model, closed, policy="offload_all"), r"the store given \(host\) is closed"),
    ]
    for call, message in cases:
        with pytest.raises(UserError) as error:
            call()
        one_line(error, message)
    assert list(tmp_path.iterdir()) == []


def test_an_empty_store_is_still_a_store():
    """A store that holds nothing yet is true: ``if store: store.close()`` closes it, and
    ``store or HostStore()`` keeps it."""
    store = HostStore()
    assert len(store) == 0 and bool(store)
    kept = store or HostStore()
    assert kept is store
    store.close()
    assert store.closed


def test_a_block_listed_twice_is_refused():
    torch.manual_seed(0)
    model = MLP()
    blocks = list(model.blocks)
    for policy, store in (("recompute", None), ("offload_all", HostStore())):
        with pytest.raises(UserError) as error:
            offload(model, policy=policy, store=store, layers=[*blocks, blocks[0]])
        one_line(error, "the same MLPBlock twice")
    assert all("forward" not in vars(block) for block in blocks)


def test_one_block_instead_of_a_list_is_refused():
    torch.manual_seed(0)
    model = MLP()
    with pytest.raises(UserError) as error:
        offload(model, policy="keep", layers=model.blocks[0])
    one_line(error, r"a list of blocks; got one MLPBlock \(pass \[block\]\)")
    session = offload(model, policy="keep", layers=model.blocks)  # a Sequential of the blocks is a list
    assert session.layers == list(model.blocks)


def test_a_plan_with_an_unknown_decision_is_refused():
    """A misspelt decision would otherwise keep its block, silently."""
    torch.manual_seed(0)
    model = MLP()
    with pytest.raises(UserError) as error:
        offload(model, store=HostStore(), policy=Plan((KEEP, "offlaod", KEEP, KEEP), 0.0, 0, 0.0))
    one_line(error, "the plan decides 'offlaod' for a block")


# -- buffers updated in place, checkpoint's own keywords, lazy views ------------------------------
class SpectralBlock(nn.Module):
    """Spectral normalization updates its power-iteration vector in place, then uses it: a
    recomputation from the updated vector would compute another weight."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.lin = nn.utils.parametrizations.spectral_norm(nn.Linear(dim, dim))

    def forward(self, x):
        return x + torch.tanh(self.lin(x))


class ConjugateBlock(nn.Module):
    """Saves a lazy conjugate view (x.conj()) and a lazy negative one (x.conj().imag) for backward."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.w = nn.Parameter(torch.randn(dim, dtype=torch.complex64))

    def forward(self, x):
        z = x * self.w
        return x + z * z.conj() + torch.sin(z.conj().imag) * self.w


class DebugBlock(nn.Module):
    """Keyword arguments named like torch.utils.checkpoint's own (debug, context_fn)."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x, *, debug=False, context_fn=None):
        h = torch.tanh(self.lin(x))
        return x + (3 * h if debug else h) + (0 if context_fn is None else context_fn)


class Stack(nn.Module):
    def __init__(self, block, blocks: int = 3, **kwargs):
        super().__init__()
        self.blocks, self.kwargs = nn.ModuleList(block() for _ in range(blocks)), kwargs

    def forward(self, x):
        for block in self.blocks:
            x = block(x, **self.kwargs)
        return x.real.square().sum() if x.is_complex() else x.square().sum()


BLOCK_CASES = {
    "spectral": lambda: Stack(SpectralBlock),
    "conjugate": lambda: Stack(ConjugateBlock),
    "debug": lambda: Stack(DebugBlock, debug=True, context_fn=0.5),
}


def run_stack(name: str, **policy):
    torch.manual_seed(0)
    model = BLOCK_CASES[name]()
    g = torch.Generator().manual_seed(3)
    dtype = torch.complex64 if name == "conjugate" else torch.float32
    x = torch.randn(5, 16, generator=g, dtype=dtype)
    with offload(model, **policy) if policy else contextlib.nullcontext():
        for _ in range(2):  # two steps: the buffers move between them
            loss = model(x)
            loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, dict(model.named_buffers())


@pytest.mark.parametrize(
    "name, policy",
    [
        ("spectral", {"policy": "recompute"}),
        ("debug", {"policy": "recompute"}),
        ("conjugate", {"policy": "offload_all", "store": HostStore(), "min_bytes": 0, "keep_last": 0}),
        ("conjugate", {"policy": "recompute"}),
    ],
)
def test_stacks_of_awkward_blocks_match_a_plain_run(name, policy):
    """Spectral normalization (a buffer updated in place, then read), keywords named like
    checkpoint's own, and saved lazy conjugate views."""
    want, got = run_stack(name), run_stack(name, **policy)
    assert torch.equal(got[0], want[0])
    for key in want[1]:
        assert torch.equal(got[1][key], want[1][key]), key
    for key in want[2]:
        assert torch.equal(got[2][key], want[2][key]), key


def test_a_buffer_two_submodules_share_stays_one_tensor_in_the_recomputation():
    class Counter(nn.Module):  # bumps the shared buffer in place
        def __init__(self, shared):
            super().__init__()
            self.register_buffer("state", shared)

        def forward(self, x):
            self.state.add_(1.0)
            return x

    class Reader(nn.Module):  # reads it after the bump
        def __init__(self, shared):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("state", shared)

        def forward(self, x):
            return torch.tanh(self.lin(x) * self.state)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            shared = torch.linspace(0.5, 2.0, 4)
            self.counter, self.reader = Counter(shared), Reader(shared)

        def forward(self, x):
            return x + self.reader(self.counter(x))

    def run(policy):
        torch.manual_seed(0)
        model = nn.Sequential(Block(), Block())
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
        with offload(model, policy=policy) if policy else contextlib.nullcontext():
            model(x).square().sum().backward()
        return [p.grad for p in model.parameters()], list(model.buffers())

    (want, want_buffers), (got, got_buffers) = run(None), run("recompute")
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(got_buffers, want_buffers, strict=True))


def test_a_recomputed_block_whose_buffer_another_forward_changed_is_refused():
    class Sometimes(nn.Module):  # changes its buffer only when asked, after reading it
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("scale", torch.ones(4))

        def forward(self, x, bump=False):
            out = self.lin(x) * self.scale
            if bump:
                self.scale.mul_(2)
            return out

    model = nn.Sequential(Sometimes(), Sometimes())
    block = model[0]
    with offload(model, policy="recompute"):
        first = block(torch.randn(3, 4))  # leaves the buffer as it found it
        block(torch.randn(3, 4), bump=True)  # another forward changes it
        with pytest.raises(RuntimeError, match="buffer scale of a recomputed Sometimes changed"):
            first.sum().backward()


@pytest.mark.parametrize("policy", ["offload_adaptive", "planner"])
def test_a_planned_policy_entered_once_per_step_plans_after_the_first(policy):
    torch.manual_seed(0)
    model = MLP()
    session = offload(model, **policy_args(policy, BLOCKS["mlp"]) | {"bandwidth": 1e9, "keep_last": 0})
    offloaded = []
    for step in range(3):
        with session:
            model(*batch("mlp", step)).backward()
        offloaded.append(session.stats.total.offloaded_bytes)
    assert session.decisions is not None and OFFLOAD in session.decisions
    assert offloaded[0] == 0 and offloaded[1] > 0 and offloaded[2] == offloaded[1]


@pytest.mark.parametrize("optimizer", [None, "adamw"])
def test_a_block_around_a_whole_loop_does_not_grow_with_it(monkeypatch, optimizer):
    """With an optimizer each weight saved is a new version every step: one record per version
    grew by every weight saved, every step, without end (24 a step on a 2-layer Qwen3)."""
    from systems.ssdtrain import cache, stats

    monkeypatch.setattr(stats, "PRUNE_AT", 8)
    monkeypatch.setattr(cache, "PRUNE_AT", 8)
    torch.manual_seed(0)
    model = MLP()
    step_weights = torch.optim.AdamW(model.parameters(), lr=1e-3).step if optimizer else lambda: None
    session = offload(model, store=HostStore(), min_bytes=0, keep_last=0)
    with session:
        sizes = []
        for step in range(30):
            model(*batch("mlp", step)).backward()
            step_weights()
            sizes.append((len(session.stats._seen), len(session.offloader.cache._transfers)))
    assert max(seen for seen, _ in sizes[10:]) <= 4 * max(seen for seen, _ in sizes[:3]) + 8
    assert max(transfers for _, transfers in sizes[10:]) <= 4 * max(transfers for _, transfers in sizes[:3]) + 8


def test_blocks_are_composite_modules_before_lists_of_single_operators():
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tables = nn.ModuleList(nn.Embedding(4000, 32) for _ in range(2))  # most parameters
            self.layers = nn.ModuleList(MLPBlock(32) for _ in range(3))

    from systems.ssdtrain.layers import find_layers

    model = Model()
    assert find_layers(model) == list(model.layers)
    heads = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))  # no composite block: the operators it is
    assert find_layers(heads) == list(heads)

    class Wrapped(nn.Module):  # composite wrappers of no parameters beside the layers that hold them
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))
            self.acts = nn.ModuleList(nn.Sequential(nn.GELU(), nn.Dropout(0.1)) for _ in range(4))

    wrapped = Wrapped()
    assert find_layers(wrapped) == list(wrapped.layers)


def test_arguments_that_do_not_apply_or_are_out_of_range_are_refused():
    torch.manual_seed(0)
    model = MLP()
    store = HostStore()
    cases = [
        (lambda: offload(model, policy="offload_all", store=store, budget=0.5), "budget= is the planner's"),
        (lambda: offload(model, policy="planner", store=store, budget=True), "needs budget="),
        (lambda: offload(model, policy="planner", store=store, budget=0.5, bandwidth=True), "bandwidth must be"),
        (lambda: offload(model, policy="planner", store=store, budget=0.5, bandwidth=float("inf")), "bandwidth must"),
        (lambda: offload(model, policy="planner", store=store, budget=0.5, bandwidth=0), "bandwidth must"),
        (lambda: offload(model, policy="planner", store=store, budget=1.5), "needs budget="),
        (lambda: offload(model, policy="offload_all", store=store, bandwidth=1e9), "bandwidth= is for the planned"),
        # Out of range and not the policy's: the argument is named as not the policy's, not as the planner's range.
        (lambda: offload(model, policy="offload_all", store=store, budget=1.5), "budget= is the planner's; policy off"),
        (lambda: offload(model, policy="offload_adaptive", store=store, budget=0), "budget= is the planner's"),
        (lambda: offload(model, policy="offload_all", store=store, bandwidth=-1), "bandwidth= is for the planned"),
        (lambda: offload(model, policy="save_on_cpu", keep_last=-1), "keep_last must be a non-negative integer"),
        (lambda: offload(model, policy="save_on_cpu", min_bytes=-5), "min_bytes must be a non-negative integer"),
        (lambda: offload(model, policy="keep", prefetch=True), "prefetch must be a non-negative integer"),
        (lambda: offload(model, policy="keep", layers=[model.blocks[0], model.blocks[0].up]), "lies inside another"),
    ]
    for call, message in cases:
        with pytest.raises(UserError) as error:
            call()
        one_line(error, message)


@pytest.mark.parametrize("policy", ["recompute", "planner"])
def test_a_hugging_face_encoder_decoder_with_its_key_value_cache_on_is_recomputed_as_a_plain_run(policy):
    """T5 with ``use_cache`` on (its default): a recomputed decoder block would find the cache its
    forward filled and save other tensors (torch's CheckpointError). The cache is turned off inside
    the block, with a warning, as Hugging Face's own checkpointing does, and back on after it."""
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(
        vocab_size=61, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_decoder_layers=3, num_heads=4,
        dropout_rate=0.1, decoder_start_token_id=0, pad_token_id=0, use_cache=True,
    )  # fmt: skip
    g = torch.Generator().manual_seed(3)
    source, target = torch.randint(1, 61, (2, 11), generator=g), torch.randint(1, 61, (2, 6), generator=g)

    def steps(wrap, via=lambda model: model, **call):
        torch.manual_seed(0)
        model = transformers.T5ForConditionalGeneration(config).train()
        losses = []
        with wrap(model):
            for _ in range(3):  # the planner profiles the first step and recomputes from the second
                loss = via(model)(input_ids=source, labels=target, **call).loss
                loss.backward()
                losses.append(loss.detach())
        caches = [m.config.use_cache for m in model.modules() if hasattr(m, "config")]
        return losses, {n: p.grad for n, p in model.named_parameters()}, caches

    plain_losses, plain_grads, plain_caches = steps(lambda model: contextlib.nullcontext())
    assert True in plain_caches  # the decoder's own copy of the config has the cache on
    # a slow store: the planner recomputes every block
    options = {"budget": 0.05, "bandwidth": 1e3, "store": HostStore()} if policy == "planner" else {}
    with pytest.warns(UserWarning, match="use_cache is off inside the offload"):
        losses, grads, caches = steps(lambda model: offload(model, policy=policy, **options))
    assert all(torch.equal(a, b) for a, b in zip(plain_losses, losses, strict=True))
    assert all(torch.equal(plain_grads[n], grads[n]) for n in plain_grads)
    assert caches == plain_caches  # each config as it was, after the block
    if policy == "recompute":  # the cache asked for in the call, the config's off: also off
        config.use_cache = False
        with pytest.warns(UserWarning, match="use_cache is off inside the offload"):
            losses, grads, _ = steps(lambda model: offload(model, policy=policy), use_cache=True)
        assert all(torch.equal(a, b) for a, b in zip(plain_losses, losses, strict=True))
        assert all(torch.equal(plain_grads[n], grads[n]) for n in plain_grads)
        # asked for in a call of the model's forward (no hook of the model's runs), its stacks see it
        with pytest.warns(UserWarning, match="use_cache is off inside the offload"):
            losses, grads, _ = steps(lambda m: offload(m, policy=policy), via=lambda m: m.forward, use_cache=True)
        assert all(torch.equal(a, b) for a, b in zip(plain_losses, losses, strict=True))
        assert all(torch.equal(plain_grads[n], grads[n]) for n in plain_grads)


@pytest.mark.parametrize("policy", ["recompute", "offload_all"])
def test_a_model_switched_to_eval_between_forward_and_backward_gets_a_plain_runs_gradients(policy):
    """An evaluation that does not switch back to training before backward: the recomputation runs
    in the mode the forward ran in (dropout's masks, batch statistics), as a plain run's backward
    uses what its forward saved."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.norm, self.drop = nn.Linear(12, 12), nn.BatchNorm1d(12), nn.Dropout(0.3)

        def forward(self, x):
            return self.drop(torch.tanh(self.norm(self.lin(x))))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(3))

        def forward(self, x):
            for block in self.blocks:
                x = x + block(x)
            return x.square().mean()

    def step(model):
        x = torch.randn(9, 12, generator=torch.Generator().manual_seed(5))
        loss = model(x)
        model.eval()  # an evaluation between the forward and its backward
        loss.backward()
        model.train()

    plain = grads_of(Net, step)
    offloaded = {"store": HostStore(), "min_bytes": 0} if policy == "offload_all" else {}
    assert_same_grads(grads_of(Net, step, lambda m: offload(m, policy=policy, **offloaded)), plain)


# -- inputs changed in place, containers, conditional blocks, two models ----------------------------
def grads_of(make, step, session=None) -> list[torch.Tensor]:
    """The gradients of ``step(model)`` run on a fresh ``make()`` (seed 0), inside ``session(model)``."""
    torch.manual_seed(0)
    model = make()
    with session(model) if session else contextlib.nullcontext():
        step(model)
    return [p.grad for p in model.parameters()]


def assert_same_grads(got, want):
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


class TanhBlock(nn.Module):
    """Saves tanh's output, never its input: plain autograd does not mind the input changing later."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x, shift=None):
        if isinstance(shift, tuple | dict):  # a named tuple or an OrderedDict holding it
            shift = shift[0] if isinstance(shift, tuple) else shift["value"]
        elif isinstance(shift, HeldShift):
            shift = shift.value
        return self.lin(torch.tanh(x if shift is None else x + shift))


Shift = collections.namedtuple("Shift", "value")


@dataclasses.dataclass(frozen=True)
class HeldShift:
    value: torch.Tensor


class InPlaceResidual(nn.Module):
    def __init__(self, call: str):
        super().__init__()
        self.blocks, self.call = nn.ModuleList(TanhBlock() for _ in range(3)), call

    def forward(self, x):
        x = x * 1.0
        for block in self.blocks:
            if self.call == "out of place":
                x = x + block(x=x)
            elif self.call == "keyword":
                x += block(x=x)  # changes the block's input after the block ran
            elif self.call == "positional":
                x += block(x)
            else:  # the block's keyword input changed by the model after the block, alone or in a container
                shift = torch.full((16,), 0.25)
                held = {
                    "named tuple": Shift(shift),
                    "ordered dict": collections.OrderedDict(value=shift),
                    "dataclass": HeldShift(shift),
                }
                x = x + block(x, shift=held.get(self.call, shift))
                shift.mul_(2)
        return x.square().mean()


def in_place_step(model):
    model(torch.randn(4, 16, generator=torch.Generator().manual_seed(1))).backward()


def test_a_recomputed_block_whose_keyword_input_is_not_changed_matches_a_plain_run():
    make = lambda: InPlaceResidual("out of place")  # noqa: E731
    assert_same_grads(
        grads_of(make, in_place_step, lambda m: offload(m, policy="recompute")), grads_of(make, in_place_step)
    )


@pytest.mark.parametrize(
    "call", ["keyword", "positional", "keyword changed later", "named tuple", "ordered dict", "dataclass"]
)
def test_an_input_of_a_recomputed_block_changed_in_place_after_it_ran_raises_a_true_error(call):
    """A plain run never needs the input again; the recomputation does, and its values are gone. A
    keyword tensor (bound to the forward, out of torch's sight) must not give other gradients."""
    make = lambda: InPlaceResidual(call)  # noqa: E731
    assert all(g is not None for g in grads_of(make, in_place_step))  # a plain run succeeds
    with pytest.raises(RuntimeError) as error:
        grads_of(make, in_place_step, lambda m: offload(m, policy="recompute"))
    one_line(error, r"an input of a recomputed TanhBlock was modified in place during or after the block's forward")
    assert "without the offloader" not in str(error.value)


def test_a_recomputed_block_that_changes_its_keyword_input_raises_rather_than_changing_it_twice():
    class Halving(TanhBlock):
        def forward(self, x, *, scale):
            out = self.lin(torch.tanh(x + scale))  # nothing saves scale
            scale.mul_(0.5)  # the recomputation would halve it again, and start from the halved one
            return out

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Halving() for _ in range(2))

        def forward(self, x):
            scale = torch.full((16,), 2.0)
            for block in self.blocks:
                x = x + block(x, scale=scale)
            return x.square().mean()

    grads_of(Model, in_place_step)
    with pytest.raises(RuntimeError) as error:
        grads_of(Model, in_place_step, lambda m: offload(m, policy="recompute"))
    one_line(error, "an input of a recomputed Halving was modified in place")


class Attention(nn.Module):
    def __init__(self, dim: int = 16):
        super().__init__()
        self.norm, self.qkv, self.out = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        return x + self.out(torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v)


class FeedForward(nn.Module):
    def __init__(self, dim: int = 16):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class ViTLayout(nn.Module):
    """vit-pytorch's transformer: a ModuleList of ModuleLists, never called themselves."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.ModuleList([Attention(), FeedForward()]) for _ in range(4))

    def forward(self, x):
        for attn, ff in self.layers:
            x = ff(attn(x))
        return x.square().mean()


def vit_steps(model):
    for i in range(3):  # the planned policies profile the first step
        model(torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(i))).backward()


@pytest.mark.parametrize("policy", ["recompute", "offload_all", "offload_adaptive", "planner"])
def test_blocks_inside_lists_of_module_lists_are_the_modules_they_hold(policy):
    from systems.ssdtrain.layers import find_layers

    model = ViTLayout()
    assert find_layers(model) == [m for pair in model.layers for m in pair]  # Attention, FeedForward x 4
    sessions = []

    def session(model):
        sessions.append(offload(model, **policy_args(policy, 8)))
        return sessions[-1]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = grads_of(ViTLayout, vit_steps, session)
    assert_same_grads(got, grads_of(ViTLayout, vit_steps))
    stats = sessions[0].stats
    assert sorted(i for i in stats.layers if i is not None) == list(range(8))  # every block ran under it
    if policy == "offload_all":
        assert stats.total.offloaded_tensors > 0


def test_module_lists_given_as_blocks_are_refused_in_one_line():
    model = ViTLayout()
    with pytest.raises(UserError, match=r"layers lists a ModuleList, which has no forward of its own") as err:
        offload(model, policy="keep", layers=list(model.layers))
    assert "\n" not in str(err.value)


def test_blocks_that_never_run_warn_in_one_line():
    model = ViTLayout()
    unused = nn.Linear(16, 16)
    model.unused = nn.ModuleList([unused])  # a submodule forward never calls
    with pytest.warns(UserWarning) as caught, offload(model, policy="keep", layers=[unused]):
        vit_steps(model)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "none of the 1 blocks ran" in messages[0] and "\n" not in messages[0]


class GraphBlock(MLPBlock):
    def forward(self, x, adjacency=None):  # a sparse input: no storage, no version counter to key it by
        return super().forward(x if adjacency is None else x + torch.sparse.mm(adjacency, x))


class Sometimes(nn.Module):
    """LayerDrop: each block is skipped with probability ``drop`` (global generator); block 1 is also
    skipped in the first forward, the one the planned policies profile."""

    def __init__(self, drop: float = 0.3):
        super().__init__()
        self.blocks, self.drop, self.steps = nn.ModuleList(GraphBlock(16) for _ in range(4)), drop, 0

    def forward(self, x, adjacency=None):
        for i, block in enumerate(self.blocks):
            if (i == 1 and self.steps == 0) or torch.rand(()) < self.drop:
                continue
            x = block(x, adjacency)
        self.steps += 1
        return x.square().mean()


@pytest.mark.parametrize("policy", ["offload_adaptive", "planner"])
def test_a_planned_policy_plans_around_a_block_that_did_not_run_in_the_profiled_step(policy):
    def steps(model):
        for i in range(4):
            model(torch.randn(6, 16, generator=torch.Generator().manual_seed(i))).backward()

    sessions = []

    def session(model):
        sessions.append(offload(model, **policy_args(policy, 4) | {"keep_last": 0}))
        return sessions[-1]

    assert_same_grads(grads_of(Sometimes, steps, session), grads_of(Sometimes, steps))
    assert sessions[0].decisions[1] == KEEP and len(sessions[0].plan.decisions) == 4


@pytest.mark.parametrize("given", ["sparse", "inference"])
@pytest.mark.parametrize("policy", ["offload_adaptive", "planner"])
def test_a_planned_policy_takes_sparse_and_inference_inputs_and_profiles_a_training_forward(policy, given):
    """A sparse block input (no storage), or a forward under inference_mode (its tensors have no
    version counter) before the first backward, which must not be taken for the profiled step."""
    sparse = (torch.eye(6) * 0.5).to_sparse() if given == "sparse" else None

    def steps(model):
        for i in range(3):
            x = torch.randn(6, 16, generator=torch.Generator().manual_seed(i))
            if given == "inference":
                with torch.inference_mode():
                    model(x)  # evaluation (the first skips block 1)
            model.train()
            model(x, sparse).backward()
            model.eval()

    def make():
        return Sometimes(drop=0.0).eval()

    sessions = []

    def session(model):
        sessions.append(offload(model, **policy_args(policy, 4) | {"keep_last": 0}))
        return sessions[-1]

    assert_same_grads(grads_of(make, steps, session), grads_of(make, steps))
    assert sessions[0].plan is not None


def test_two_models_each_in_its_own_offload_are_both_offloaded():
    """A GAN's generator and discriminator (or a teacher and its student), each under offload_all in
    one with statement: only the innermost saved-tensor hooks run, yet each model's blocks must be
    offloaded by its own offloader, and the gradients be those of a plain run."""

    def make():
        return nn.ModuleDict({"g": MLP(), "d": nn.Sequential(*[MLPBlock(3) for _ in range(3)])})

    def step(models):
        for i in range(2):
            x, _ = batch("mlp", i)
            models["d"](models["g"].out(models["g"].blocks(models["g"].inp(x)))).square().mean().backward()

    sessions = []

    def session(models):
        stack = contextlib.ExitStack()
        for name in ("g", "d"):
            sessions.append(stack.enter_context(offload(models[name], store=HostStore(), min_bytes=0, keep_last=0)))
        return stack

    assert_same_grads(grads_of(make, step, session), grads_of(make, step))
    assert [s.stats.total.offloaded_tensors > 0 for s in sessions] == [True, True]
    # each counted its own blocks: 4 of the generator, 3 of the discriminator
    assert [sorted(i for i in s.stats.layers if i is not None) for s in sessions] == [[0, 1, 2, 3], [0, 1, 2]]


@pytest.mark.parametrize("outer, inner", [("save_on_cpu", "offload_all"), ("offload_all", "save_on_cpu")])
def test_save_on_cpu_beside_another_models_offload_is_refused(outer, inner):
    """torch's save_on_cpu hooks take every tensor saved in their block: beside another offload()
    one model's tensors would be taken by the other's policy without a word."""
    g, d = MLP(), MLP()
    stores = {name: HostStore() if name != "save_on_cpu" else None for name in (outer, inner)}
    with offload(g, store=stores[outer], policy=outer, min_bytes=0):
        with pytest.raises(UserError) as error:
            with offload(d, store=stores[inner], policy=inner, min_bytes=0):
                pass
        one_line(error, "save_on_cpu's hooks take every tensor saved inside its with block")
    with offload(d, store=stores[inner], policy=inner, min_bytes=0):  # alone it runs, once the other has left
        pass


def test_an_encoder_decoder_entered_in_eval_mode_and_trained_inside_is_recomputed_as_a_plain_run():
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(
        vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    ids = torch.randint(1, 128, (2, 7), generator=torch.Generator().manual_seed(0))

    def make():
        return transformers.T5ForConditionalGeneration(config).eval()

    def step(model):
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()

    with pytest.warns(UserWarning, match="use_cache is off inside the offload"):
        got = grads_of(make, step, lambda m: offload(m, policy="recompute"))
    assert_same_grads(got, grads_of(make, step))


class NoisyBlock(nn.Module):
    """Draws a mask from a torch.Generator: its own, one in a dict it holds, or one it is given."""

    def __init__(self, where: str):
        super().__init__()
        self.lin, self.where = nn.Linear(8, 8), where
        self.generator = torch.Generator().manual_seed(5)
        self.holder = {"noise": [torch.Generator().manual_seed(6)]}

    def forward(self, x, given=None, *, options=None):
        generator = {
            "held": self.generator,
            "in a dict": self.holder["noise"][0],
            "an argument": given,
            "a keyword's tuple": (options or {}).get("pair", (None, None))[1],
        }[self.where]
        keep = torch.rand(x.shape, generator=generator) > 0.5
        return x + torch.tanh(self.lin(x)) * keep


@pytest.mark.parametrize("where", ["held", "in a dict", "an argument", "a keyword's tuple"])
@pytest.mark.parametrize("policy", ["recompute", "a plan"])
def test_a_recomputed_block_drawing_from_a_generator_of_its_own_matches_a_plain_run(where, policy):
    """Recomputation replays the generators a block holds or is given, as it does the global
    ones: its masks in backward are the forward's, and the generators are left where a plain run
    leaves them (a draw between forward and backward, and after, sees the same numbers)."""

    def run(recomputed: bool):
        torch.manual_seed(0)
        blocks = nn.ModuleList(NoisyBlock(where) for _ in range(3))
        given = torch.Generator().manual_seed(7)
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
        args = {"recompute": {"policy": "recompute"}, "a plan": {"policy": Plan((RECOMPUTE, KEEP, RECOMPUTE), 0, 0, 0)}}
        block = offload(blocks, layers=list(blocks), **args[policy]) if recomputed else contextlib.nullcontext()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with block:
                for _ in range(2):
                    h = x
                    for b in blocks:
                        h = b(h, given, options={"pair": (None, given)})
                    between = torch.rand(3, generator=given)  # the user's draw before backward
                    h.square().sum().backward()
        after = [torch.rand(3, generator=g) for b in blocks for g in (b.generator, b.holder["noise"][0])]
        grads = [p.grad.clone() for p in blocks.parameters()]
        return grads, [between, torch.rand(3, generator=given), *after]

    (grads, draws), (want_grads, want_draws) = run(True), run(False)
    for got, want in zip(grads + draws, want_grads + want_draws, strict=True):
        assert torch.equal(got, want)


def test_always_read_back_must_be_true_or_false():
    from systems.ssdtrain import Offloader

    model = MLP()
    calls = [
        lambda: offload(model, policy="offload_all", store=HostStore(), always_read_back="no"),
        lambda: offload(model, policy="save_on_cpu", always_read_back="no"),
        lambda: Offloader(model, HostStore(), always_read_back="no"),
    ]
    for call in calls:
        with pytest.raises(UserError) as error:
            call()
        one_line(error, "always_read_back must be True or False, got 'no'")


def test_another_librarys_checkpoint_gets_the_positional_inputs_with_the_keywords_bound():
    """DeepSpeed's checkpoint moves every tensor it is given to the host and empties the caller's:
    a mask shared by every block must stay out of its hands (bound to the forward instead)."""
    from systems.ssdtrain.recompute import checkpointed

    handed = []

    def spy(function, *args):
        handed.append([tuple(a.shape) for a in args])
        return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False)

    model = InPlaceResidual("keyword changed later")
    with checkpointed(list(model.blocks), spy):
        in_place_step(model)  # the shift changed in place is bound, out of the checkpoint's sight: no error
    assert handed == [[(4, 16)]] * 3  # x only: the shift, a keyword tensor, was not handed over


# -- lazy modules, frozen blocks, frozen weights under autocast ----------------------------------
class LazyBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.up, self.down = nn.LazyLinear(2 * dim), nn.LazyLinear(dim)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


class Lazy(nn.Module):
    def __init__(self, dim: int = 12, blocks: int = 3):
        super().__init__()
        self.blocks = nn.Sequential(*[LazyBlock(dim) for _ in range(blocks)])

    def forward(self, x):
        return self.blocks(x).square().mean()


def test_a_model_with_uninitialized_lazy_modules_is_refused_in_one_line_and_trains_once_initialized():
    # Before any forward a lazy module's parameters have no size: torch raised its own ValueError from
    # deep inside find_layers or the first step, and the storages they get later would not be known
    # as the model's, so the weights would have been offloaded as activations.
    torch.manual_seed(0)
    model = Lazy()
    for call in (
        lambda: offload(model, policy="keep"),
        lambda: offload(model, store=HostStore(), layers=list(model.blocks)),
        lambda: Offloader(model, HostStore(), layers=list(model.blocks)),
        lambda: find_layers(model),
    ):
        with pytest.raises(UserError) as error:
            call()
        one_line(error, "holds a LazyLinear not yet initialized .* run one forward")
    x = torch.randn(5, 12)
    model(x)  # the dummy batch the error asks for
    plain = {n: g for n, g in zip(*_grads(model, x))}
    with offload(model, store=HostStore(), min_bytes=0, keep_last=0) as session:
        names, grads = _grads(model, x)
    for name, grad in zip(names, grads):
        assert torch.equal(grad, plain[name]), name
    assert session.stats.total.offloaded_bytes > 0 and session.stats.total.parameter_bytes > 0


def _grads(model: nn.Module, x: torch.Tensor) -> tuple[list[str], list[torch.Tensor]]:
    model.zero_grad()
    model(x).backward()
    return [n for n, _ in model.named_parameters()], [p.grad.clone() for p in model.parameters()]


def test_frozen_blocks_that_save_nothing_are_said_to_be_frozen_not_held_by_another_hook():
    # Fine-tuning a head on a frozen backbone: the blocks save nothing for backward because nothing in
    # them needs a gradient; the warning used to blame another saved-tensor hook.
    torch.manual_seed(0)
    model = MLP()
    model.inp.requires_grad_(False)
    model.blocks.requires_grad_(False)
    x, y = batch("mlp", 0)
    torch.manual_seed(1)
    model(x, y).backward()
    plain = model.out.weight.grad.clone()
    model.zero_grad()
    torch.manual_seed(1)  # the same dropout masks
    with pytest.warns(UserWarning) as caught, offload(model, store=HostStore(), min_bytes=0):
        model(x, y).backward()
    assert torch.equal(model.out.weight.grad, plain)
    messages = [str(w.message) for w in caught if "offloaded nothing" in str(w.message)]
    assert len(messages) == 1 and "\n" not in messages[0]
    assert "frozen" in messages[0] and "another saved-tensor hook" not in messages[0]


class FrozenCast(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.trained, self.frozen = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return x + torch.tanh(self.trained(x)) + self.frozen(x)


def test_under_autocast_a_frozen_weights_cast_is_offloaded_and_a_trained_weights_is_not():
    # As docs/llm_offload.md says: autocast keeps one cast of each trained weight (the model's bytes);
    # a frozen weight's cast is new at each use, held only for backward, so it goes like an activation.
    torch.manual_seed(0)
    dim = 16
    model = nn.Sequential(*[FrozenCast(dim) for _ in range(3)])
    x = torch.randn(4, dim, requires_grad=True)

    def step():
        model.zero_grad()
        x.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        loss.backward()
        return [p.grad.clone() for p in model.parameters() if p.requires_grad] + [x.grad.clone()]

    plain = step()
    puts = []

    class Recording(HostStore):
        def _put(self, key, src, ready):
            puts.append(src.numel())
            return super()._put(key, src, ready)

    with offload(model, store=Recording(), min_bytes=0, keep_last=0) as session:
        got = step()
    for a, b in zip(got, plain, strict=True):
        assert torch.equal(a, b)
    weight_cast = dim * dim * 2  # one bf16 weight
    assert puts.count(weight_cast) == 3  # each block's frozen weight, once
    assert [session.stats.layers[i].parameter_bytes for i in range(3)] == [weight_cast] * 3  # the trained weight's


@dataclasses.dataclass(frozen=True)
class FrozenConfig:
    dim: int = 16
    use_cache: bool = True


class FrozenConfigBlock(nn.Module):
    def __init__(self, config: FrozenConfig):
        super().__init__()
        self.config, self.lin = config, nn.Linear(config.dim, config.dim)

    def forward(self, x):
        return x + torch.tanh(self.lin(x))


class FrozenConfigModel(nn.Module):
    """A model of one's own whose config (a frozen dataclass) has a use_cache field."""

    def __init__(self):
        super().__init__()
        self.config = FrozenConfig()
        self.blocks = nn.ModuleList(FrozenConfigBlock(self.config) for _ in range(3))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x.square().mean()


@pytest.mark.parametrize("policy", ["recompute", "plan"])
def test_recomputing_a_model_whose_own_config_cannot_change_matches_a_plain_run(policy):
    # Turning Hugging Face's key-value cache off assigned config.use_cache on any config that has
    # one: a frozen dataclass of the user's raised FrozenInstanceError as the block was entered.
    x = torch.randn(4, 16)
    torch.manual_seed(0)
    model = FrozenConfigModel()
    model(x).backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    args = {"policy": policy}
    if policy == "plan":
        args = {"policy": Plan((RECOMPUTE, OFFLOAD, KEEP), 0.0, 0, 0.0), "store": HostStore(), "min_bytes": 0}
    with offload(model, **args):
        model(x).backward()
    for a, b in zip([p.grad for p in model.parameters()], plain, strict=True):
        assert torch.equal(a, b)
    assert model.config.use_cache is True


@pytest.mark.parametrize("policy", ["keep", "recompute", "offload_all", "planner", "plan"])
def test_a_copy_of_the_model_made_inside_the_block_trains_its_own_weights(policy):
    # Keeping the best model or starting an EMA (copy.deepcopy(model)) inside the with block copied
    # the hooks of the step with the model: the offloader's locks raised "cannot pickle", and a
    # recomputed block's forward, copied as it was, would have run the original block's weights.
    def run(session) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        torch.manual_seed(0)
        model = MLP()
        x, y = batch("mlp", 0)
        with session(model) if session else contextlib.nullcontext():
            for i in range(2):
                model(*batch("mlp", i)).backward()
            copied = copy.deepcopy(model)
            torch.save(model, io.BytesIO())  # pickles as the copy does
            model(x, y).backward()  # the block goes on with the model
        with torch.no_grad():
            copied.blocks[0].up.weight.mul_(0.5)  # the copy's own weights: the model's must not follow them
        copied.zero_grad()
        torch.manual_seed(3)
        copied(x, y).backward()
        return [p.grad.clone() for p in copied.parameters()], [p.grad.clone() for p in model.parameters()]

    want = run(None)
    got = run(lambda model: offload(model, **policy_args(policy, BLOCKS["mlp"])))
    for a, b in zip(got[0] + got[1], want[0] + want[1], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("policy", ["offload_adaptive", "planner"])
def test_a_forward_with_gradients_that_had_no_backward_is_not_profiled(policy):
    """A validation loss taken with gradients on, before the first training step, was added to the
    profile: every block's saved bytes counted twice, and the planner planned for a step of twice
    the size (another plan). The profile is of the forward whose backward runs."""

    def profile(validate_first: bool):
        torch.manual_seed(0)
        model = MLP()
        session = offload(model, **policy_args(policy, BLOCKS["mlp"]) | {"bandwidth": 1e9, "keep_last": 0})
        with session:
            if validate_first:
                model(*batch("mlp", 9))  # never backpropagated
            model(*batch("mlp", 0)).backward()
            model(*batch("mlp", 1)).backward()
        return session.plan

    plain, validated = profile(False), profile(True)
    assert plain is not None and validated is not None
    assert validated.decisions == plain.decisions
    assert validated.budget_bytes == plain.budget_bytes
