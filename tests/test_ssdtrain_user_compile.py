"""``offload()`` on blocks the user compiled (``layers[i] = torch.compile(layers[i])`` or
``block.compile()``): every policy runs the blocks compiled, a recomputed block's compiled forward
again in backward, with losses and gradients bit-identical to the same compiled model without
offloading, and Dynamo never tracing SSDTrain's hooks; a model compiled as a whole is refused in one
line; a planned policy times warm compiled blocks, not their compilation.

Most tests compile with a counting AOTAutograd backend that runs the traced graphs as they are
(fast: no code generation), which tells where each compiled forward ran; one ``full`` test runs
inductor, whose compile of a tiny Qwen3 takes tens of seconds on 2 CPU cores."""

import contextlib
import gc
import logging
import re
import time
import warnings
from collections import Counter

import pytest
import torch
import transformers
from test_ssdtrain_api import assert_identical as compare_runs
from torch import nn

from harness.errors import UserError
from systems.ssdtrain import HostStore, find_layers, offload
from systems.ssdtrain.cache import TensorCache
from systems.ssdtrain.engine import in_backward
from systems.ssdtrain.planning import KEEP, OFFLOAD, RECOMPUTE

logging.getLogger("transformers").setLevel(logging.ERROR)
BLOCKS, MICRO_BATCHES, STEPS = 3, 2, 2


def qwen3(seed: int = 0):
    config = transformers.Qwen3Config(
        vocab_size=96, hidden_size=32, intermediate_size=56, num_hidden_layers=BLOCKS, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, use_cache=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    return transformers.Qwen3ForCausalLM(config).train()


def counting_backend(calls: Counter, compile_seconds: float = 0.0):
    """An AOTAutograd backend that runs the traced forward and backward graphs as they are and
    counts each run in ``calls``: ``("forward", "forward")`` for a compiled forward run in forward,
    ``("forward", "backward")`` for one run in backward (a recomputation), ``("backward", ...)``.
    ``compile_seconds``: how long compiling a forward graph takes (a slow compiler)."""
    from torch._dynamo.backends.common import aot_autograd

    def compiler(graph: str):
        def compile_graph(module, example_inputs):
            time.sleep(compile_seconds if graph == "forward" else 0.0)

            def run(args):
                calls[graph, "backward" if in_backward() else "forward"] += 1
                return module(*args)

            run._boxed_call = True
            return run

        return compile_graph

    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"))


def compile_blocks(model: nn.Module, how: str, **options) -> None:
    """The user's compile of each block: torch's wrapper put in the list, or the block's .compile()."""
    layers = model.model.layers
    for index, layer in enumerate(layers):
        if how == "wrapped":
            layers[index] = torch.compile(layer, **options)
        else:
            layer.compile(**options)


def ids_of(index: int) -> torch.Tensor:
    return torch.randint(0, 96, (3, 17), generator=torch.Generator().manual_seed(20 + index))


def train(model: nn.Module, session=None, between_forwards=None):
    """Losses and gradients of STEPS optimizer steps of MICRO_BATCHES micro-batches, in one ``with``."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses, grads = [], []
    with session if session is not None else contextlib.nullcontext():
        for step in range(STEPS):
            for micro in range(MICRO_BATCHES):
                if between_forwards is not None:
                    between_forwards(step * MICRO_BATCHES + micro)
                ids = ids_of(step * MICRO_BATCHES + micro)
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                losses.append(loss.detach().clone())
            grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
            optimizer.step()
            optimizer.zero_grad()
    return losses, grads


def assert_identical(got, want):
    compare_runs(got, want, STEPS * MICRO_BATCHES)


def every_other(index: int) -> str:
    return (OFFLOAD, RECOMPUTE, KEEP)[index % 3]


def policy_args(policy: str) -> dict:
    """offload()'s arguments (a planned policy on a fixed bandwidth: a slow store makes the planner
    recompute, an infinitely fast one SSDTrain's rule offload)."""
    if policy in ("keep", "recompute"):
        return {"policy": policy}
    args = {"store": HostStore(), "min_bytes": 0}
    if policy == "callable":
        return args | {"policy": every_other}
    if policy == "planner":
        return args | {"policy": "planner", "budget": 0.5, "bandwidth": 1e3}
    if policy == "offload_adaptive":
        return args | {"policy": policy, "bandwidth": 1e15}
    return args | {"policy": policy}


@pytest.fixture
def dynamo():
    """Dynamo's caches and counters emptied before and after (each test compiles afresh)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield torch._dynamo.utils.counters
    torch._dynamo.reset()


_references = {}


def compiled_keep(how: str) -> tuple:
    """The reference: the same model, compiled the same way, trained without offload()."""
    if how not in _references:
        model = qwen3()
        compile_blocks(model, how, backend=counting_backend(Counter()))
        _references[how] = train(model)
    return _references[how]


@pytest.mark.parametrize("how", ["wrapped", "method"])
@pytest.mark.parametrize("policy", ["keep", "recompute", "offload_all", "offload_adaptive", "planner", "callable"])
def test_every_policy_runs_compiled_blocks_compiled_and_matches_compiled_keep(dynamo, how, policy):
    """Every forward runs each block's compiled forward, a recomputed block runs it again in
    backward (so it is never run eager), the hooks run outside the compiled code (Dynamo breaks no
    graph on them; each block's saved tensors are its own), and the step is bit-identical to the
    compiled model without offload() (the same compiled graphs, run again or fed from the store)."""
    want = compiled_keep(how)
    dynamo.clear()
    calls = Counter()
    model = qwen3()
    compile_blocks(model, how, backend=counting_backend(calls))
    session = offload(model, **policy_args(policy))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = train(model, session)
    said = [str(w.message).splitlines()[0] for w in caught if re.search("SSDTrain|Dynamo", str(w.message))]
    assert not said  # neither SSDTrain nor Dynamo (tracing SSDTrain's hooks) has anything to say
    assert_identical(got, want)
    assert not dynamo["graph_break"], f"Dynamo traced SSDTrain's hooks: {dict(dynamo['graph_break'])}"
    forwards = STEPS * MICRO_BATCHES
    assert calls["forward", "forward"] == BLOCKS * forwards  # every block compiled in every forward
    assert calls["backward", "backward"] == BLOCKS * forwards
    stats = session.stats
    assert all(stats.layers[i].packed_tensors > 0 for i in range(BLOCKS))
    decisions = session.decisions
    recomputed = decisions.count(RECOMPUTE)
    if policy == "recompute":
        assert recomputed == BLOCKS and calls["forward", "backward"] == BLOCKS * forwards
    elif policy == "callable":
        assert decisions == [OFFLOAD, RECOMPUTE, KEEP] and calls["forward", "backward"] == forwards
    elif policy == "planner":
        # Planned after the warm-up and the timed forward (the compiled blocks' first forward
        # compiles): its recomputations run in the last forwards' backwards, compiled.
        assert recomputed and OFFLOAD not in decisions
        assert calls["forward", "backward"] == recomputed * (forwards - 2)
    else:
        assert calls["forward", "backward"] == 0
    if policy in ("offload_all", "offload_adaptive", "callable"):
        assert stats.total.offloaded_tensors > 0 and OFFLOAD in decisions


def test_a_compiled_block_is_the_wrapper_the_model_calls_and_the_users_compile_is_put_back():
    """find_layers takes torch's wrappers as the blocks (also where only some blocks are compiled),
    a wrapped module given in layers= stands for its wrapper, and a .compile()'d block has its
    compiled call back, and no forward of SSDTrain's, when the block ends (as also on an error)."""
    model = qwen3()
    layers = model.model.layers
    inner = [layers[0], layers[1]]
    layers[0], layers[1] = torch.compile(layers[0], backend="eager"), torch.compile(layers[1], backend="eager")
    assert find_layers(model) == list(layers)  # wrappers and the uncompiled last block: one list
    session = offload(model, policy="keep", layers=[inner[0], inner[1], layers[2]])
    assert session.layers == list(layers)
    blocks = qwen3().model.layers
    for block in blocks:
        block.compile(backend="eager")
    compiled_calls = [block._compiled_call_impl for block in blocks]
    stack = Stack(blocks)
    for failing in (False, True):
        with contextlib.suppress(RuntimeError), offload(stack, policy="keep"):
            assert all(block._compiled_call_impl is None and "forward" in vars(block) for block in blocks)
            if failing:
                raise RuntimeError("a step that fails")
        assert [block._compiled_call_impl for block in blocks] == compiled_calls
        assert all("forward" not in vars(block) for block in blocks)


def test_the_users_compile_is_put_back_when_the_step_fails_to_start(monkeypatch):
    """A failure after the blocks were taken apart (here the cache refusing to start a step) leaves
    each .compile()'d block as the user compiled it."""
    blocks = qwen3().model.layers
    for block in blocks:
        block.compile(backend="eager")
    compiled_calls = [block._compiled_call_impl for block in blocks]

    def refuse(self):
        raise RuntimeError("the store is gone")

    monkeypatch.setattr(TensorCache, "start_step", refuse)
    with pytest.raises(RuntimeError, match="the store is gone"), offload(Stack(blocks), policy="keep"):
        pass
    assert [block._compiled_call_impl for block in blocks] == compiled_calls
    assert all("forward" not in vars(block) for block in blocks)


class Stack(nn.Module):
    def __init__(self, blocks: nn.ModuleList):
        super().__init__()
        self.blocks = blocks

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@pytest.mark.parametrize(
    "compile_whole",
    [
        pytest.param(lambda model: torch.compile(model, backend="eager"), id="torch.compile(model)"),
        pytest.param(lambda model: model.compile(backend="eager") or model, id="model.compile()"),
        pytest.param(
            lambda model: setattr(model, "model", torch.compile(model.model, backend="eager")) or model,
            id="torch.compile(model.model)",
        ),
    ],
)
@pytest.mark.parametrize("policy", ["keep", "recompute", "offload_all"])
def test_a_model_compiled_as_a_whole_is_refused_in_one_line(compile_whole, policy):
    model = compile_whole(qwen3())
    store = {"store": HostStore(), "min_bytes": 0} if policy == "offload_all" else {}
    with pytest.raises(UserError, match=r"compiled as a whole .*compile each block instead") as err:
        offload(model, policy=policy, **store)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("fullgraph", [False, True])
def test_a_compiled_model_called_inside_the_block_is_refused_at_its_first_block(dynamo, fullgraph):
    """The loop calls a compiled model that offload() was not given: the first hook that finds
    itself traced by Dynamo raises in one line (with fullgraph=True, Dynamo's own error gives the
    reason)."""
    model = qwen3()
    compiled = torch.compile(model, backend=counting_backend(Counter()), fullgraph=fullgraph)
    ids = ids_of(0)
    error = UserError if not fullgraph else torch._dynamo.exc.Unsupported
    with pytest.raises(error, match="ran inside .*compiled as a whole.*compile each block instead") as err:
        with offload(model, policy="keep"):
            compiled(input_ids=ids, labels=ids).loss.backward()
    assert fullgraph or "\n" not in str(err.value)


class _Stemmed(nn.Module):
    """A stem that saves tensors before the first block, then three blocks."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(16, 64)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 64), nn.Tanh()) for _ in range(3))

    def forward(self, x):
        x = torch.tanh(self.stem(x))
        for block in self.blocks:
            x = x + block(x)
        return x


def test_a_compiled_model_whose_stem_saves_first_is_refused_before_any_storage_is_read(dynamo, capfd):
    """Dynamo traces the saved-tensor hook at the stem's first saved tensor: it refuses there,
    before it reads a storage (a traced one is a fake's, whose weak reference torch reported as
    an error when freed, a dozen times above the one line)."""
    model = _Stemmed()
    capfd.readouterr()
    with pytest.raises(UserError, match=r"^SSDTrain: a saved-tensor hook ran inside .*compiled as a whole") as err:
        with offload(model, store=HostStore(), min_bytes=0):
            torch.compile(model, backend="eager")(torch.randn(8, 16)).sum().backward()
    gc.collect()
    assert "\n" not in str(err.value)
    assert "Exception ignored" not in capfd.readouterr().err


COMPILE_SECONDS = 0.5


def test_a_planned_policy_times_warm_compiled_blocks_not_their_compilation(dynamo):
    """The compiled blocks' first forward compiles (here a compiler taking half a second per graph): the
    plan waits for the second forward's times, made at the third forward's start, so its predicted
    step is the warm blocks', not the compiler's. A block entered once per step
    plans at the end of the second one."""
    for per_step in (False, True):
        torch._dynamo.reset()
        model = qwen3()
        compile_blocks(model, "method", backend=counting_backend(Counter(), compile_seconds=COMPILE_SECONDS))
        session = offload(model, store=HostStore(), policy="planner", budget=0.5, bandwidth=1e3, min_bytes=0)
        planned_by_forward = []

        def note_plan(forward: int, session=session) -> None:
            planned_by_forward.append(session.plan is not None)

        if per_step:
            for forward in range(3):
                note_plan(forward)
                with session:
                    ids = ids_of(forward)
                    model(input_ids=ids, labels=ids).loss.backward()
        else:
            train(model, session, between_forwards=note_plan)
        planned = [False, False, True] if per_step else [False, False, False, True]
        assert planned_by_forward == planned
        # Timed while compiling, keep's step alone would be predicted at 3 x COMPILE_SECONDS or more;
        # warm, the step is predicted at a tenth of a second or so here (a loaded machine: more).
        assert session.plan.predicted_seconds < 2 * COMPILE_SECONDS, session.plan


@pytest.mark.full
def test_inductor_compiled_blocks_offloaded_and_recomputed_match_compiled_keep(dynamo):
    """With inductor (the default backend), .compile()'d blocks offloaded, recomputed and kept give
    compiled keep's losses and gradients bit for bit on a CPU: the recomputation runs the same
    compiled forward, and the offloaded tensors come back as they were."""
    reference = qwen3()
    compile_blocks(reference, "method")
    want = train(reference)
    model = qwen3()
    compile_blocks(model, "method")
    session = offload(model, store=HostStore(), policy=every_other, min_bytes=0, always_read_back=True)
    dynamo.clear()
    got = train(model, session)
    assert_identical(got, want)
    assert session.stats.total.offloaded_tensors > 0
    assert not dynamo["graph_break"], f"Dynamo traced SSDTrain's hooks: {dict(dynamo['graph_break'])}"
