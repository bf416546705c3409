"""The cost model, SSDTrain's adaptive rule and the planner (systems/ssdtrain/planning.py) on
profiles whose answers can be worked out by hand, and the profile and bandwidth probe on a real
tiny model and store."""

import concurrent.futures
import dataclasses
import itertools
import json
import random

import pytest
import torch
from torch import nn

from harness.errors import UserError
from systems.ssdtrain import HostStore, planning
from systems.ssdtrain.bound import bound_of_profile
from systems.ssdtrain.planning import KEEP, OFFLOAD, RECOMPUTE, LayerProfile
from systems.ssdtrain.stores import StoreCorrupted
from workloads.llm.data import batches
from workloads.llm.layers import blocks
from workloads.llm.models import build, spec

# Four layers of 1 s forward (2 s backward), each saving 10 B with a 2 B input.
FOUR = [LayerProfile(saved_bytes=10, input_bytes=2, forward_seconds=1.0) for _ in range(4)]


def test_keeping_everything_costs_nothing_and_holds_everything():
    plan = planning.predict(FOUR, [KEEP] * 4, bandwidth=1.0, keep_seconds=12.0, fixed_bytes=7)
    assert (plan.predicted_seconds, plan.predicted_activation_bytes, plan.stall_seconds) == (12.0, 47, 0.0)


def test_a_fast_store_frees_the_offloaded_bytes_without_stalls():
    plan = planning.predict(FOUR, [OFFLOAD, OFFLOAD, KEEP, KEEP], bandwidth=1e6, keep_seconds=12.0)
    assert plan.predicted_activation_bytes == 20
    assert plan.predicted_seconds == pytest.approx(12.0)


def test_a_slow_store_frees_what_it_has_written_and_the_step_waits_for_the_rest():
    # 1 B/s. Layer 0's 10 B stream into the queue during its forward (0 -> 1 s) and are written by
    # 10 s. When forward ends (4 s) 4 B are written and freed, 6 B still held: 30 + 6. Backward
    # reaches layer 1 at 4 + 2 + 2 = 8 s and prefetches layer 0: the 8 B written by then are read
    # back from 8 s to 16 s (the other 2 B stay in memory), and layer 0's backward, due at 10 s,
    # waits 6 s.
    plan = planning.predict(FOUR, [OFFLOAD, KEEP, KEEP, KEEP], bandwidth=1.0, keep_seconds=12.0)
    assert plan.predicted_activation_bytes == 36
    assert plan.stall_seconds == pytest.approx(6.0) and plan.predicted_seconds == pytest.approx(18.0)
    # Layers 0 and 1: layer 1's write waits for layer 0's and ends at 20 s; nothing of it is written
    # by forward's end or by its prefetch at 8 s (none freed, none read); the same 6 s stall on
    # layer 0, and the step (18 s on its clock) then waits 2 s more for layer 1's write.
    plan = planning.predict(FOUR, [OFFLOAD, OFFLOAD, KEEP, KEEP], bandwidth=1.0, keep_seconds=12.0)
    assert plan.predicted_activation_bytes == 20 + 6 + 10
    assert plan.stall_seconds == pytest.approx(8.0) and plan.predicted_seconds == pytest.approx(20.0)


def test_a_write_that_keeps_pace_with_its_layer_ends_with_it():
    # 20 B/s against 10 B saved per 1 s of forward: each layer's write keeps up with the layer and
    # ends when the layer does, so nothing is held when forward ends and the reads (0.5 s each,
    # started a layer ahead) never stall.
    plan = planning.predict(FOUR, [OFFLOAD, OFFLOAD, OFFLOAD, KEEP], bandwidth=20.0, keep_seconds=12.0)
    assert plan.predicted_activation_bytes == 10 and plan.stall_seconds == 0.0
    assert planning.adaptive(FOUR, 20.0, keep_seconds=12.0).decisions == (OFFLOAD, OFFLOAD, OFFLOAD, KEEP)


def test_a_late_read_stalls_backward():
    # 10 B/s: layer 0 is written by 1 s (streamed from its start) and freed. Backward reaches
    # layer 1 at 4 + 2 + 2 = 8 s, asks for layer 0 then, and needs it at 10 s: a 1 s read, no
    # stall. At 2 B/s the write takes 5 s (0 -> 5 s), the read 5 s from 8 s: 3 s late.
    fast = planning.predict(FOUR, [OFFLOAD, KEEP, KEEP, KEEP], bandwidth=10.0, keep_seconds=12.0)
    assert fast.stall_seconds == 0.0 and fast.predicted_activation_bytes == 30
    slow = planning.predict(FOUR, [OFFLOAD, KEEP, KEEP, KEEP], bandwidth=2.0, keep_seconds=12.0)
    assert slow.stall_seconds == pytest.approx(3.0) and slow.predicted_seconds == pytest.approx(15.0)


def test_recomputation_holds_the_input_and_pays_a_forward():
    plan = planning.predict(FOUR, [RECOMPUTE, RECOMPUTE, KEEP, KEEP], bandwidth=1.0, keep_seconds=12.0)
    assert plan.predicted_activation_bytes == 2 + 2 + 10 + 10
    assert plan.predicted_seconds == pytest.approx(14.0)


@pytest.mark.parametrize("bandwidth, offloaded", [(10.0, 3), (5.0, 2), (1.0, 0)])
def test_adaptive_offloads_the_leading_layers_whose_writes_end_with_forward(bandwidth, offloaded):
    # Writes stream from each layer's start. 10 B/s: 1 s writes, layers 0-2 written by 1, 2 and 3 s
    # (forward ends at 4 s); layer 3 is the kept last layer. 5 B/s: 2 s writes, layers 0 and 1 by
    # 2 and 4 s, layer 2's would end at 6 s. 1 B/s: layer 0's alone ends at 10 s: none fits.
    plan = planning.adaptive(FOUR, bandwidth, keep_seconds=12.0, keep_last=1)
    assert plan.decisions == (OFFLOAD,) * offloaded + (KEEP,) * (4 - offloaded)


def test_planner_offloads_when_the_store_keeps_up_and_recomputes_when_it_does_not():
    fast = planning.plan(FOUR, 1e6, keep_seconds=12.0, budget_bytes=20, keep_last=1)
    assert fast.count(OFFLOAD) >= 2 and fast.count(RECOMPUTE) == 0 and fast.predicted_activation_bytes <= 20
    slow = planning.plan(FOUR, 0.01, keep_seconds=12.0, budget_bytes=20, keep_last=1)
    assert slow.count(OFFLOAD) == 0 and slow.count(RECOMPUTE) >= 2 and slow.predicted_activation_bytes <= 20
    # Cheapest within the budget: exactly what keeps it (no more recomputation than needed).
    assert slow.predicted_seconds == pytest.approx(12.0 + slow.count(RECOMPUTE))


def test_planner_never_offloads_the_kept_last_layers_and_says_when_nothing_fits():
    plan = planning.plan(FOUR, 1e6, keep_seconds=12.0, budget_bytes=0, keep_last=2)
    assert plan.decisions[2:] != (OFFLOAD, OFFLOAD) and OFFLOAD not in plan.decisions[2:]
    assert plan.predicted_activation_bytes > 0  # nothing fits 0 B: the least-holding plan


def test_planner_on_many_layers_searches_greedily_and_keeps_the_budget():
    layers = [LayerProfile(10 + i, 2, 1.0 + 0.1 * i) for i in range(14)]
    total = sum(p.saved_bytes for p in layers)
    for bandwidth in (1e6, 1.0):
        plan = planning.plan(layers, bandwidth, keep_seconds=40.0, budget_bytes=total // 3, keep_last=1)
        assert plan.predicted_activation_bytes <= total // 3 and len(plan.decisions) == 14


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: planning.plan([], 1.0, 1.0, 10), "no layers"),
        (lambda: planning.plan(FOUR, 0.0, 1.0, 10), "bandwidth must be positive"),
        (lambda: planning.adaptive(FOUR, 1.0, 1.0, keep_last=5), "keep_last must be between 0 and 4"),
        (lambda: planning.predict(FOUR, [KEEP] * 3, 1.0, 1.0), "one decision of"),
        (lambda: planning.predict(FOUR, [KEEP, KEEP, KEEP, "drop"], 1.0, 1.0), "one decision of"),
    ],
)
def test_bad_input_is_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def tiny_llama():
    """The tiny Llama's spec, model, blocks, one batch and a training step on it."""
    s = spec("llama", "tiny")
    model = build(s, seed=0).model
    batch = next(batches(s, seed=0))

    def step():
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()

    return s, model, [block for _, block in blocks(model)], batch, step


def test_profile_of_a_real_model_matches_what_keep_saves():
    _, model, layers, _, step = tiny_llama()
    profiles, seconds, fixed = planning.profile(model, layers, step, "cpu")
    assert len(profiles) == len(layers) and seconds > 0 and fixed > 0
    for p in profiles:
        assert p.saved_bytes > p.input_bytes > 0 and p.forward_seconds > 0
    # Identical blocks save identical bytes, except that storages shared by every block (the rotary
    # tables) count once, in the first block that saves them.
    assert len({p.saved_bytes for p in profiles[1:]}) == 1 and profiles[0].saved_bytes >= profiles[1].saved_bytes
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


def test_a_recomputed_block_s_input_is_counted_once_and_plans_predict_what_steps_hold():
    """torch's checkpoint saves a recomputed block's positional input through the hooks around it:
    the count of what a step holds must not add it again as the block's input (it did, by one
    hidden-state tensor per recomputed block). Nor may the profile count a storage that every block
    takes (the rotary tables) once per recomputed block: the step holds it once. For these plans
    the predictions are exact (a plan that keeps the first block and recomputes a later one is
    short by the position ids, which the profile counts in the first block: docs/llm_offload.md)."""
    from systems.ssdtrain import POLICIES
    from workloads.llm_offload.checking import one_step

    s, model, layers, batch, step = tiny_llama()
    profiles, _, fixed = planning.profile(model, layers, step, "cpu")
    hidden = batch["input_ids"].numel() * s.hidden * 4  # one float32 hidden state
    exact = [(KEEP,) * len(layers), (RECOMPUTE,) + (KEEP,) * (len(layers) - 1), (RECOMPUTE,) * len(layers)]
    # The shared small storages (position ids, rotary tables) a kept first block does not hold for a
    # recomputed later one, or an offloaded block frees twice: a few KiB of a step's 200 KB.
    shared = batch["input_ids"].shape[1] * 8 + 2 * batch["input_ids"].shape[1] * s.hidden // s.heads * 4
    held = {}
    with HostStore() as store:
        for decisions in itertools.product((KEEP, OFFLOAD, RECOMPUTE), repeat=len(layers)):
            plan = planning.predict(profiles, decisions, 1e12, 1.0, fixed_bytes=fixed)
            policy = POLICIES["planner"].build(model, store=store, plan=plan, min_bytes=0, keep_last=0)
            one_step(model, batch, policy)
            policy.close()
            held[decisions] = measured = policy.history[-1]["activation_bytes"]
            if decisions in exact:
                assert measured == plan.predicted_activation_bytes, decisions
            else:
                assert abs(measured - plan.predicted_activation_bytes) <= shared, decisions
    recomputed_all = held[(RECOMPUTE,) * len(layers)]
    # Every block recomputed holds one hidden state per block (its input) beside the tables and
    # what is saved outside the blocks: less than two per block, as it held with the double count.
    assert len(layers) * hidden + fixed <= recomputed_all < 2 * len(layers) * hidden + fixed


def test_store_bandwidth_is_measured_and_checked():
    with HostStore() as store:
        rate = planning.store_bandwidth(store, "cpu", nbytes=1 << 20, repeat=2)
        assert rate > 0 and len(store) == 0  # the probe frees what it stored


class FlippingStore(HostStore):
    """A host store that flips one bit of every tensor it gives back."""

    def get(self, key, out):
        future = super().get(key, out)
        future.result()
        out.view(-1)[out.numel() // 3] ^= 0x04
        return future


def test_store_bandwidth_refuses_a_store_that_changes_bytes():
    with FlippingStore() as store, pytest.raises(StoreCorrupted, match="FlippingStore returned other bytes"):
        planning.store_bandwidth(store, "cpu", nbytes=(1 << 20) + 7, repeat=1)


class OnceFullStore(HostStore):
    """A host store whose first write fails, as on a disk full for a moment."""

    failed = False

    def _put(self, key, src, ready):
        if not self.failed:
            self.failed = True
            future = concurrent.futures.Future()
            future.set_exception(OSError(28, "No space left on device"))
            return future
        return super()._put(key, src, ready)


def test_a_probe_whose_write_failed_leaves_the_store_as_it_found_it():
    """The failed write's key stayed taken: every later probe failed with "key -1 is already stored"."""
    with OnceFullStore() as store:
        with pytest.raises(OSError, match="No space left on device"):
            planning.store_bandwidth(store, "cpu", nbytes=1 << 16, repeat=1)
        assert len(store) == 0
        assert planning.store_bandwidth(store, "cpu", nbytes=1 << 16, repeat=1) > 0


class KeywordBlock(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.linear = torch.nn.Linear(dim, dim)

    def forward(self, x, *, scale, shift=None):
        return torch.tanh(self.linear(x) * scale + shift)


class KeywordStack(torch.nn.Module):
    """Blocks that take their inputs by keyword too (as Hugging Face's take the attention mask and
    the rotary tables)."""

    def __init__(self, dim: int = 6, count: int = 3):
        super().__init__()
        self.blocks = torch.nn.ModuleList(KeywordBlock(dim) for _ in range(count))

    def forward(self, x, scale, shift):
        for block in self.blocks:
            x = block(x, scale=scale, shift=shift)
        return x.sum()


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "cpu:0"])
def test_profile_counts_keyword_inputs_and_takes_the_device_any_way_torch_does(device, monkeypatch):
    model = KeywordStack()
    g = torch.Generator().manual_seed(3)
    x, scale, shift = torch.randn(5, 6, generator=g), torch.randn(5, 6, generator=g), torch.randn(6, generator=g)
    marks = []
    real_mark = planning.timing.mark
    monkeypatch.setattr(planning.timing, "mark", lambda d: marks.append(d) or real_mark(d))
    profiles, _, _ = planning.profile(model, list(model.blocks), lambda: model(x, scale, shift).backward(), device)
    # The harness's clock is told the device in the one spelling it knows.
    assert marks and set(marks) == {"cpu"}
    # The first block takes x (positional), scale and shift (keywords); the later blocks take their
    # own x and the same scale and shift, which a recomputation of several blocks holds once.
    assert [p.input_bytes for p in profiles] == [(30 + 30 + 6) * 4, 30 * 4, 30 * 4]
    with pytest.raises(UserError, match="not a device torch knows"):
        planning.profile(model, list(model.blocks), lambda: None, "gpu")


@pytest.mark.gpu
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda"), 0])
def test_gpu_profile_times_layers_with_cuda_events_however_the_device_is_named(device, monkeypatch):
    model = KeywordStack(dim=512).cuda()
    x, scale, shift = (
        torch.randn(256, 512, device="cuda"),
        torch.randn(256, 512, device="cuda"),
        torch.randn(512, device="cuda"),
    )
    marks = []
    real_mark = planning.timing.mark
    monkeypatch.setattr(planning.timing, "mark", lambda d: marks.append(d) or real_mark(d))
    profiles, seconds, _ = planning.profile(
        model, list(model.blocks), lambda: model(x, scale, shift).backward(), device
    )
    assert marks and set(marks) == {"cuda"}  # CUDA events, never the host clock
    assert all(p.forward_seconds > 0 for p in profiles) and seconds > 0


# -- compiled layers at torch's activation memory budgets ------------------------------------------

# Four compiled layers of FOUR's shape; at budget 0.5 each holds 4 B for 0.25 s more, at 0.2 each
# holds 3 B for 0.9 s more (recomputing holds the 2 B input for 1 s more).
AT_BUDGETS = [
    LayerProfile(10, 2, 1.0, (planning.Alternative(0.2, 3, 0.9), planning.Alternative(0.5, 4, 0.25))) for _ in range(4)
]


def test_a_budgeted_layer_holds_and_costs_what_its_profile_says():
    plan = planning.predict(AT_BUDGETS, ["budget_0.5", "budget_0.2", KEEP, RECOMPUTE], 1e9, 12.0, fixed_bytes=7)
    assert plan.predicted_activation_bytes == 7 + 4 + 3 + 10 + 2
    assert plan.predicted_seconds == pytest.approx(12.0 + 0.25 + 0.9 + 1.0)
    assert plan.budgets == (0.5, 0.2, None, None) and plan.budgeted == 2
    with pytest.raises(ValueError, match="budget"):
        planning.predict(FOUR, ["budget_0.5", KEEP, KEEP, KEEP], 1e9, 12.0)  # not profiled at 0.5


def test_the_planner_takes_a_budget_where_it_is_cheaper_than_recomputing():
    # Budget 16 B with no store worth using (0.01 B/s): all at 0.5 holds 16 B at +1 s; any plan that
    # recomputes a layer costs 1 s for it alone, and any that keeps one holds 10 + 3 * 3 > 16 B.
    plan = planning.plan(AT_BUDGETS, bandwidth=0.01, keep_seconds=12.0, budget_bytes=16, keep_last=1)
    assert plan.decisions == ("budget_0.5",) * 4
    assert plan.predicted_seconds == pytest.approx(13.0)
    # At 10 B: three recomputed and one at 0.5 (2 + 2 + 2 + 4) at +3.25 s beats two recomputed and
    # two at 0.2 (2 + 2 + 3 + 3) at +3.8 s; one recomputed and three at 0.2 holds 11 B.
    tight = planning.plan(AT_BUDGETS, bandwidth=0.01, keep_seconds=12.0, budget_bytes=10, keep_last=1)
    assert sorted(tight.decisions) == sorted([RECOMPUTE, RECOMPUTE, RECOMPUTE, "budget_0.5"])
    assert tight.predicted_activation_bytes == 10 and tight.predicted_seconds == pytest.approx(15.25)


def test_the_greedy_planner_of_many_layers_reaches_the_budgets_too():
    many = AT_BUDGETS * 3  # 12 layers of 7 choices: beyond the exhaustive search
    plan = planning.plan(many, bandwidth=0.01, keep_seconds=12.0, budget_bytes=48, keep_last=1)
    assert plan.decisions == ("budget_0.5",) * 12


def test_an_offloaded_budgeted_layer_writes_what_it_saves_at_its_budget():
    # Layer 0 at 0.5 offloaded: its 4 B written by 1 s at a fast store, none held; at 1 B/s the write
    # ends at 4 s (forward's end: none held either). Backward reaches layer 1 at 4 + 2 + 2 = 8 s, the
    # read of layer 0 runs from then to 12 s, and layer 1's backward ends at 8 + 2 + 0.9: 1.1 s of stall.
    decisions = ["offload_budget_0.5", "budget_0.2", KEEP, KEEP]
    fast = planning.predict(AT_BUDGETS, decisions, 1e9, 12.0, fixed_bytes=7)
    assert fast.predicted_activation_bytes == 7 + 0 + 3 + 10 + 10
    assert fast.predicted_seconds == pytest.approx(12.0 + 0.25 + 0.9)
    assert (fast.budgets, fast.budgeted, fast.offloaded) == ((0.5, 0.2, None, None), 2, 1)
    slow = planning.predict(AT_BUDGETS, decisions, 1.0, 12.0, fixed_bytes=7)
    assert slow.predicted_activation_bytes == fast.predicted_activation_bytes
    assert (slow.predicted_seconds, slow.stall_seconds) == (pytest.approx(12.0 + 0.25 + 0.9 + 1.1), pytest.approx(1.1))
    assert planning.offloads("offload_budget_0.5") and planning.offloads(OFFLOAD)
    assert not any(map(planning.offloads, (KEEP, RECOMPUTE, "budget_0.5")))
    with pytest.raises(ValueError, match="budget"):
        planning.predict(AT_BUDGETS, ["offload_budget_0.7", KEEP, KEEP, KEEP], 1e9, 12.0)  # not profiled at 0.7


def _budgeted_layers(seed: int) -> list[LayerProfile]:
    """Five random compiled layers with peaks, profiled at two budgets (some bytes unoffloadable)."""
    g = torch.Generator().manual_seed(seed)
    n = lambda high: int(torch.randint(1, high, (1,), generator=g))  # noqa: E731
    layers = []
    for _ in range(5):
        saved, small = n(4000), n(500)
        alternatives = tuple(
            planning.Alternative(b, int(saved * b) + n(300), n(500) / 1000, min(small, n(500))) for b in (0.2, 0.5)
        )
        peaks = {"forward_peak": n(9000) + 4 * saved, "backward_peak": n(9000)}
        layers.append(
            LayerProfile(saved + small, n(300), 0.5 + n(1000) / 1000, alternatives, **peaks, unoffloadable_bytes=small)
        )
    return layers


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("bandwidth", [150.0, 2_000.0, 1e9])
def test_offloading_a_budgeted_layer_is_offloading_what_it_saves_there(seed, bandwidth):
    """Offloaded at a budget, a layer writes, holds and reads back as an offloaded layer whose saved
    bytes are the budget's: the model has one notion of an offloaded layer. (The budgets cost no
    seconds here: what they add is worked out by hand above.)"""
    profiles = [
        dataclasses.replace(p, alternatives=tuple(dataclasses.replace(a, extra_seconds=0.0) for a in p.alternatives))
        for p in _budgeted_layers(seed)
    ]
    for decisions in itertools.product((KEEP, "budget_0.5", "offload_budget_0.5", "offload_budget_0.2"), repeat=5):
        got = planning.predict(profiles, decisions, bandwidth, keep_seconds=10.0)
        # each layer as it runs, at its budget's bytes; an offloaded one's decision OFFLOAD, a budgeted one's KEEP
        plain = [
            LayerProfile(a.saved_bytes, p.input_bytes, p.forward_seconds, unoffloadable_bytes=a.unoffloadable_bytes)
            if (a := p.alternative(d))
            else LayerProfile(p.saved_bytes, p.input_bytes, p.forward_seconds)
            for p, d in zip(profiles, decisions)
        ]
        as_plain = [OFFLOAD if planning.offloads(d) else KEEP for d in decisions]
        want = planning.predict(plain, as_plain, bandwidth, keep_seconds=10.0)
        assert got.predicted_activation_bytes == want.predicted_activation_bytes, decisions
        assert got.predicted_seconds == pytest.approx(want.predicted_seconds), decisions


@pytest.mark.parametrize("seed", range(4))
def test_offloading_a_budgeted_layer_to_an_instant_store_never_costs_time_or_memory(seed):
    profiles = _budgeted_layers(seed)
    for decisions in itertools.product((KEEP, RECOMPUTE, "budget_0.2", "budget_0.5"), repeat=4):
        decisions = (*decisions, KEEP)
        base = planning.predict(profiles, decisions, 1e12, keep_seconds=10.0)
        for i, d in enumerate(decisions):
            if d.startswith("budget_"):
                moved = planning.predict(profiles, [*decisions[:i], "offload_" + d, *decisions[i + 1 :]], 1e12, 10.0)
                assert moved.predicted_seconds == pytest.approx(base.predicted_seconds), (decisions, i)
                assert moved.predicted_peak_bytes <= base.predicted_peak_bytes, (decisions, i)
                small = profiles[i].alternative(d).unoffloadable_bytes
                held = base.predicted_activation_bytes - profiles[i].alternative(d).saved_bytes + small
                assert moved.predicted_activation_bytes == held, (decisions, i)


def test_the_greedy_planner_offloads_at_a_budget_where_the_store_keeps_pace_with_it_only():
    """12 layers (beyond the exhaustive search), a 4 B/s store: a kept layer's 10 B take 2.5 s to
    write, longer than its 1 s forward; what a layer saves at budget 0.5 (4 B) takes 1 s. Within
    10 B, every layer at 0.5 and all but the last offloaded holds 4 B and costs only the budget's
    0.25 s a layer: torch's own point at 0.5, with most of its memory freed."""
    many = AT_BUDGETS * 3
    plan = planning.plan(many, bandwidth=4.0, keep_seconds=12.0, budget_bytes=10, keep_last=1)
    assert plan.decisions == ("offload_budget_0.5",) * 11 + ("budget_0.5",)
    assert plan.predicted_activation_bytes == 4 and plan.predicted_seconds == pytest.approx(15.0)
    assert plan.offloaded == 11 and plan.budgets == (0.5,) * 12


def test_with_budgets_shares_the_backward_change_by_forward_time():
    # Two layers (1 s and 3 s forward) kept: a 10 s step. At budget 0.5 their forwards take 1.5 s and
    # 3 s and the step 12 s: the forwards' change is 0.5 s, the backward's 1.5 s, shared 1:3.
    kept = [LayerProfile(10, 2, 1.0), LayerProfile(20, 4, 3.0)]
    at_half = [LayerProfile(6, 2, 1.5), LayerProfile(9, 4, 3.0)]
    layers = planning.with_budgets(kept, 10.0, {0.5: (at_half, 12.0)})
    (first,), (second,) = layers[0].alternatives, layers[1].alternatives
    assert (first.budget, first.saved_bytes, second.saved_bytes) == (0.5, 6, 9)
    assert first.extra_seconds == pytest.approx(0.5 + 1.5 / 4)
    assert second.extra_seconds == pytest.approx(1.5 * 3 / 4)
    # A budget measured faster than keeping (noise) costs nothing, never less.
    (faster,) = planning.with_budgets(kept, 10.0, {0.5: (at_half, 9.0)})[1].alternatives
    assert faster.extra_seconds == 0.0
    with pytest.raises(ValueError, match="layers"):
        planning.with_budgets(kept, 10.0, {0.5: (at_half[:1], 12.0)})


def test_budgets_six_digits_cannot_tell_apart_get_distinct_decisions():
    from systems.ssdtrain.planning import budget_decision, number_text

    assert budget_decision(0.5) == "budget_0.5" and budget_decision(1.0) == "budget_1"
    assert budget_decision(0.1234567) != budget_decision(0.1234568)
    assert float(budget_decision(0.1234567).removeprefix("budget_")) == 0.1234567
    assert number_text(1234567) == "1234567" and number_text(True) == "True"


# -- storages below min_bytes: held whatever the decision, never written -----------------------
def _with_unoffloadable(seed: int, peaks: bool):
    """Random layers whose saved bytes include some below min_bytes (``unoffloadable_bytes``)."""
    generator = torch.Generator().manual_seed(seed)
    numbers = lambda n, high: torch.randint(1, high, (n,), generator=generator).tolist()  # noqa: E731
    saved, small, inputs, peak = numbers(5, 4000), numbers(5, 1000), numbers(5, 300), numbers(5, 9000)
    forward = [0.5 + s / 1000 for s in numbers(5, 1000)]
    return [
        LayerProfile(
            s + u,
            i,
            f,
            forward_peak=p + 4 * s if peaks else None,  # forward peaks above backward ones: the unwritten bytes count
            backward_peak=p if peaks else None,
            unoffloadable_bytes=u,
        )
        for s, u, i, f, p in zip(saved, small, inputs, forward, peak)
    ]


def _movable_only(profiles, decisions):
    """The same layers with what an offloaded layer cannot move taken out of it (to be held as
    fixed bytes instead): the model must predict the same step."""
    return [
        LayerProfile(p.movable_bytes, p.input_bytes, p.forward_seconds, forward_peak=p.forward_peak,
                     backward_peak=p.backward_peak) if d == OFFLOAD else p
        for p, d in zip(profiles, decisions)
    ]  # fmt: skip


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("bandwidth", [150.0, 2_000.0, 1e9])  # writes behind forward, near it, instant
def test_an_offloaded_layer_holds_what_it_cannot_move_and_writes_only_the_rest(seed, bandwidth):
    """Storages below min_bytes were counted as written and freed: the plan held more than it
    predicted (and its writes were predicted longer than they were)."""
    profiles = _with_unoffloadable(seed, peaks=True)
    for decisions in itertools.product((KEEP, OFFLOAD, RECOMPUTE), repeat=5):
        got = planning.predict(profiles, decisions, bandwidth, keep_seconds=10.0, fixed_bytes=7)
        small = sum(p.unoffloadable_bytes for p, d in zip(profiles, decisions) if d == OFFLOAD)
        moved = planning.predict(_movable_only(profiles, decisions), decisions, bandwidth, 10.0, fixed_bytes=7 + small)
        assert got.predicted_activation_bytes == moved.predicted_activation_bytes, decisions
        assert got.predicted_seconds == pytest.approx(moved.predicted_seconds), decisions
        assert got.predicted_peak_bytes == moved.predicted_peak_bytes, decisions


@pytest.mark.parametrize("seed", range(4))
def test_adaptive_and_the_bound_time_only_the_bytes_offloading_moves(seed):
    profiles = _with_unoffloadable(seed, peaks=False)
    movable = [LayerProfile(p.movable_bytes, p.input_bytes, p.forward_seconds) for p in profiles]
    for bandwidth in (150.0, 400.0, 2_000.0):
        assert (
            planning.adaptive(profiles, bandwidth, 10.0).decisions
            == planning.adaptive(movable, bandwidth, 10.0).decisions
        )
        assert bound_of_profile(profiles, bandwidth) == bound_of_profile(movable, bandwidth)
    # a case where the difference decides: the movable bytes fit the forward's time, all of them do not
    tight = [LayerProfile(1000, 1, 1.0, unoffloadable_bytes=900) for _ in range(3)]
    assert planning.adaptive(tight, 150.0, 9.0).decisions == (OFFLOAD, OFFLOAD, KEEP)


def test_offloading_at_a_budget_as_a_choice_never_makes_the_plan_worse():
    """Six layers at two budgets: 7^5 x 5 plans, past the exhaustive search, though the plans without
    a layer offloaded at a budget (5^5 x 4) are not. Searched greedily, the planner missed the plan
    that offloads three kept layers (0 s, 26 B) for one 1.5 s slower."""
    rows = [(18, 4, 1, (6, 0.75), (9, 0)), (12, 7, 1, (2, 0.5), (1, 0.5)), (10, 10, 3, (0, 1), (10, 0.5)),
            (3, 5, 2, (2, 0.75), (2, 0.25)), (16, 8, 3, (5, 0), (8, 0)), (12, 7, 1, (8, 0.75), (5, 0.75))]  # fmt: skip
    profiles = [
        LayerProfile(s, i, float(f), (planning.Alternative(0.25, *a), planning.Alternative(0.5, *b)))
        for s, i, f, a, b in rows
    ]
    plan = planning.plan(profiles, bandwidth=4.0, keep_seconds=0.0, budget_bytes=38, keep_last=1)
    assert plan.decisions == ("budget_0.5", OFFLOAD, OFFLOAD, OFFLOAD, "budget_0.25", KEEP)
    assert (plan.predicted_seconds, plan.predicted_activation_bytes) == (0.0, 26)


# -- the engine's prefetch depth ---------------------------------------------------------------
@pytest.mark.parametrize(
    "prefetch, seconds",
    # Layers 0 and 1 offloaded to a 5 B/s store: each write (10 B, 2 s) ends with forward (4 s);
    # backward takes 0.5 s a layer. Asked as backward reaches layer 2, layer 1's read ends at 6.5,
    # 1.5 s after layer 1's backward could start; layer 0's, asked then, waits 1.5 s more (1: 9 s).
    # Two layers ahead, layer 1 is asked at 4 s (1 s of wait) and layer 0 as soon as the queue
    # frees (8.5 s); none ahead, each read starts when its layer's backward does (2 s each: 10 s).
    [(0, 10.0), (1, 9.0), (2, 8.5), (4, 8.5)],
)
def test_backward_reads_back_as_many_layers_ahead_as_the_engine_prefetches(prefetch, seconds):
    decisions = [OFFLOAD, OFFLOAD, KEEP, KEEP]
    plan = planning.predict(FOUR, decisions, 5.0, keep_seconds=6.0, backward_ratio=0.5, prefetch=prefetch)
    assert plan.predicted_seconds == pytest.approx(seconds)
    assert plan.predicted_activation_bytes == 20  # what forward leaves does not depend on it


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("bandwidth", [150.0, 2_000.0])
def test_prefetching_further_ahead_never_slows_the_step_nor_lowers_its_peak(seed, bandwidth):
    profiles = _with_unoffloadable(seed, peaks=True)
    profiles[-1] = dataclasses.replace(profiles[-1], head_peak=profiles[-1].backward_peak + 5000)  # the head's too
    for decisions in itertools.product((KEEP, OFFLOAD, RECOMPUTE), repeat=5):
        plans = [planning.predict(profiles, decisions, bandwidth, 10.0, prefetch=p) for p in range(7)]
        for shallower, deeper in itertools.pairwise(plans):
            assert deeper.predicted_seconds <= shallower.predicted_seconds + 1e-9, decisions
            assert deeper.predicted_peak_bytes >= shallower.predicted_peak_bytes, decisions


def test_layers_read_back_from_the_start_of_backward_count_in_the_heads_peak():
    # Two offloaded layers (10 B each, written at once). The head's backward peaked at 80 B in a
    # kept step, before the top layer's backward: 60 B with both in the store (prefetch 0), 70 B
    # once the prefetch reads the top one back from the start of backward, 80 B with both.
    two = [LayerProfile(10, 2, 1.0, forward_peak=30, backward_peak=50, head_peak=h) for h in (None, 80)]
    peaks = [planning.predict(two, [OFFLOAD] * 2, 1e12, 6.0, prefetch=p).predicted_peak_bytes for p in (0, 1, 2)]
    assert peaks == [60, 70, 80]
    # A recomputed top layer holds its input (2 B) during the head's backward, not its 10 B.
    recomputed = planning.predict(two, [KEEP, RECOMPUTE], 1e12, 6.0).predicted_peak_bytes
    assert recomputed == max(80 - 8, 50 + 0, 30)


class _AddOne(torch.nn.Module):
    def forward(self, x):
        return x + 1  # saves nothing for backward: its backward unpacks nothing


def _frozen_linear() -> torch.nn.Module:
    layer = torch.nn.Linear(16, 16, bias=False).requires_grad_(False)
    return layer  # saves its weight alone (a parameter: no activation bytes), and its backward unpacks it


@pytest.mark.parametrize("prefetch", [1, 2, 3])
def test_the_model_asks_for_each_read_where_the_engine_does_past_blocks_that_save_nothing(prefetch):
    """The engine asks for reads at the first tensor a block's backward unpacks: a block that saves
    nothing asks for none, so the read it would have asked for comes from a block below; a frozen
    block that saves only its weight still asks. The cost model's askers, from the profile the
    planners take, are the engine's, block by block."""
    from systems.ssdtrain import Offloader

    torch.manual_seed(0)
    make = {"lin": lambda: torch.nn.Linear(16, 16), "add": _AddOne, "frozen": _frozen_linear}
    kinds = ["lin", "add", "lin", "frozen", "add", "lin", "add", "lin"]
    model = torch.nn.Sequential(*(make[k]() for k in kinds))
    x = torch.randn(4, 16)

    def step():
        model(x).square().sum().backward()  # the loss saves a tensor outside the blocks

    profiles, _, _ = planning.profile(model, list(model), step, "cpu")
    assert [p.saved_bytes > 0 for p in profiles] == [k == "lin" for k in kinds]
    assert [p.asks(OFFLOAD) for p in profiles] == [k != "add" for k in kinds]
    offloader = Offloader(model, HostStore(), keep_last=0, min_bytes=0, prefetch=prefetch, layers=list(model))
    where, asked = [None], {}
    offloader.backward_listeners.append(lambda layer: where.__setitem__(0, layer))
    prefetch_of = offloader.cache.prefetch
    offloader.cache.prefetch = lambda target: (asked.setdefault(target, where[0]), prefetch_of(target))[1]
    with offloader:
        step()
    n = len(kinds)
    engine = {target: n if layer is None else layer for target, layer in asked.items()}
    model_askers = planning._askers(profiles, [OFFLOAD] * n, prefetch)
    assert engine == {i: model_askers[i] for i in range(n) if kinds[i] == "lin"}


def test_a_recorded_profile_keeps_where_backward_asks():
    profiles = [planning.LayerProfile(0, 8, 1.0, packs=True), planning.LayerProfile(10, 8, 1.0, packs=True)]
    record = {
        "saved_bytes": [p.saved_bytes for p in profiles],
        "input_bytes": [8, 8],
        "forward_seconds": [1.0, 1.0],
        "packs": [True, True],
    }
    assert planning.profiles_of_record(record) == profiles
    del record["packs"]  # an older record: where a block saves bytes
    assert [p.asks(OFFLOAD) for p in planning.profiles_of_record(record)] == [False, True]


def test_a_recorded_profile_reads_back_its_peaks_and_budgets_so_its_plans_predict_the_same():
    rng = random.Random(7)
    kept = [
        planning.LayerProfile(
            rng.randrange(1, 1 << 30),
            rng.randrange(1, 1 << 20),
            rng.uniform(1e-3, 1e-2),
            forward_peak=rng.randrange(1 << 30),
            backward_peak=rng.randrange(1 << 30),
            head_peak=rng.randrange(1 << 30) if i == 2 else None,
            saved_at_end=i == 1,
            unoffloadable_bytes=rng.randrange(1 << 10),
            packs=True,
        )
        for i in range(3)
    ]
    at = {
        b: (
            [
                dataclasses.replace(p, saved_bytes=p.saved_bytes // (k + 2), forward_seconds=p.forward_seconds * 1.1)
                for p in kept
            ],
            0.05,
        )
        for k, b in enumerate((0.2, 0.5))
    }
    profiles = planning.with_budgets(kept, 0.04, at)
    record = json.loads(json.dumps(planning.record_of_profiles(profiles)))  # as a results file holds it
    again = planning.profiles_of_record(record)
    assert again == profiles
    decisions = [planning.budget_decision(0.2, offloaded=True), planning.RECOMPUTE, planning.KEEP]
    first, second = (planning.predict(p, decisions, 20e9, 0.04, fixed_bytes=5 << 20) for p in (profiles, again))
    assert first.predicted_peak_bytes is not None and first == second
    # an older record (no peaks, no budgets) still reads, with the peaks unmeasured
    old = {k: v for k, v in record.items() if not k.endswith("_peaks") and not k.startswith("at_budget_")}
    assert all(p.forward_peak is None and p.alternatives == () for p in planning.profiles_of_record(old))


def test_a_read_asked_late_past_a_block_that_saves_nothing_stalls_the_step_as_predicted():
    # Layer 0 (100 B, written by the end of forward) is read back at 1 B/s. With layer 1 saving
    # something, layer 1's backward asks for it (2 s before layer 0's backward begins): a 98 s
    # stall. With layer 1 saving nothing, layer 0's own backward asks: a 100 s stall.
    for saved, stall in ((10, 98.0), (0, 100.0)):
        three = [LayerProfile(100, 1, 1000.0), LayerProfile(saved, 1, 1.0), LayerProfile(10, 1, 1.0)]
        plan = planning.predict(three, [OFFLOAD, KEEP, KEEP], 1.0, 0.0, prefetch=1)
        assert plan.stall_seconds == pytest.approx(stall)


def test_a_prefetch_that_is_not_a_whole_number_of_layers_is_refused():
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="prefetch must be a whole number of layers"):
            planning.predict(FOUR, [KEEP] * 4, 1.0, 12.0, prefetch=bad)


def test_a_compiled_block_s_writes_start_when_its_forward_ends_not_as_it_runs():
    """A compiled block hands what it saves to the hooks when its graph returns, so its write cannot
    overlap its own forward. 1 GB at 2 GB/s from a block of 1 s: arriving through the block's
    second, written by 1.0 s; arriving at once at its end, by 1.5 s. With a next block of 0.1 s,
    forward ends at 1.1 s: the eager block's bytes are all written, the compiled one's 0.8 GB not yet;
    with a next block of 1 s, neither's are left."""
    assert planning._write_end(0.0, 0.0, 1.0, 10**9, 2e9) == 1.0
    assert planning._write_end(0.0, 1.0, 1.0, 10**9, 2e9) == 1.5
    decisions = [OFFLOAD, KEEP]
    for second, left in ((0.1, round(0.4 * 2e9)), (1.0, 0)):
        eager = [LayerProfile(10**9, 10, 1.0), LayerProfile(10, 10, second)]
        compiled = [dataclasses.replace(p, saved_at_end=True) for p in eager]
        on_time, late = (planning.predict(p, decisions, 2e9, 4.0, prefetch=1) for p in (eager, compiled))
        assert on_time.predicted_activation_bytes == 10
        assert late.predicted_activation_bytes == left + 10


def test_only_compiled_blocks_are_profiled_as_saving_when_they_end():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Sequential(nn.Linear(16, 16), nn.Tanh()), nn.Sequential(nn.Linear(16, 16), nn.Tanh()), nn.Linear(16, 1)
    )
    model[0].compile(backend="eager")  # the first block compiled, the second eager
    x = torch.randn(4, 16)
    layers = [model[0], model[1]]
    profiles, _, _ = planning.profile(model, layers, lambda: model(x).sum().backward(), "cpu")
    assert [p.saved_at_end for p in profiles] == [True, False]
    profiles, _, _ = planning.profile(model, layers, lambda: model(x).sum().backward(), "cpu", compiled=True)
    assert [p.saved_at_end for p in profiles] == [True, True]
