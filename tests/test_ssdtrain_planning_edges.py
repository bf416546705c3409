"""The cost model and the planners (systems/ssdtrain/planning.py) at their edges: ties, the
exhaustive search's limit, kept-last layers, compiled blocks' write start, instant stores and what
a plan records. Every expected value is worked out by hand in the test's comments."""

import math

import pytest

from systems.ssdtrain import planning
from systems.ssdtrain.planning import KEEP, OFFLOAD, RECOMPUTE, Alternative, LayerProfile

# Four layers of 1 s forward (2 s backward), each saving 10 B with a 2 B input.
FOUR = [LayerProfile(saved_bytes=10, input_bytes=2, forward_seconds=1.0) for _ in range(4)]
# FOUR compiled at two budgets: at 0.5 a layer holds 4 B for 0.25 s more, at 0.2 3 B for 0.9 s more.
AT_BUDGETS = [LayerProfile(10, 2, 1.0, (Alternative(0.2, 3, 0.9), Alternative(0.5, 4, 0.25))) for _ in range(4)]


def test_adaptive_starts_a_compiled_block_s_write_when_its_forward_ends():
    """Adaptive's rule times the writes as the cost model does: a compiled block's saved tensors
    reach the hooks when its forward ends, so its write starts then, not with its forward. At 5 B/s
    a 10 B write takes 2 s. Eager: layer 0 written 0 -> 2 s, layer 1 2 -> 4 s (forward ends at 4 s):
    two layers. Compiled: layer 0 written 1 -> 3 s, layer 1 3 -> 5 s, past the end of forward: one."""
    eager = planning.adaptive(FOUR, 5.0, keep_seconds=12.0, keep_last=1)
    assert eager.decisions == (OFFLOAD, OFFLOAD, KEEP, KEEP)
    compiled = [LayerProfile(10, 2, 1.0, saved_at_end=True) for _ in range(4)]
    plan = planning.adaptive(compiled, 5.0, keep_seconds=12.0, keep_last=1)
    assert plan.decisions == (OFFLOAD, KEEP, KEEP, KEEP)
    # Layer 0 is written by 3 s: nothing of it held at 4 s. Layer 1's backward (8 -> 10 s) asks for
    # it at 8 s; the 2 s read ends as layer 0's backward begins: no stall.
    assert (plan.predicted_activation_bytes, plan.predicted_seconds, plan.stall_seconds) == (30, 12.0, 0.0)


def test_a_recomputed_layer_without_input_bytes_asks_for_no_read():
    """The engine asks for reads at the first tensor a layer's backward unpacks; a recomputed layer's
    is its input, so one whose input is counted nowhere (0 B) asks for none and the read of the layer
    below is asked by that layer's own backward. Layer 0 (100 B, written by the end of its 1000 s
    forward) is read back at 1 B/s. Forward ends at 1002 s; layer 2's backward runs 1002 -> 1004 s,
    layer 1's (2 s and its 1 s forward again) 1004 -> 1007 s. Asked by layer 1 at 1004 s, the read
    would end at 1104 s; asked by layer 0 at 1007 s, it ends at 1107 s: a 100 s stall."""
    three = [LayerProfile(100, 1, 1000.0), LayerProfile(10, 0, 1.0), LayerProfile(10, 1, 1.0)]
    plan = planning.predict(three, [OFFLOAD, RECOMPUTE, KEEP], 1.0, 0.0, prefetch=1)
    assert plan.stall_seconds == pytest.approx(100.0)
    assert plan.predicted_seconds == pytest.approx(1.0 + 100.0)
    # With a 1 B input the recomputed layer asks, at 1004 s: 1104 - 1007 = 97 s of stall.
    three[1] = LayerProfile(10, 1, 1.0)
    asked_by_layer_1 = planning.predict(three, [OFFLOAD, RECOMPUTE, KEEP], 1.0, 0.0, prefetch=1)
    assert asked_by_layer_1.stall_seconds == pytest.approx(97.0)


def test_the_planner_never_offloads_a_kept_last_layer_at_a_budget_either():
    """The last ``keep_last`` layers are never offloaded, kept or at a budget. With an instant store
    (1e12 B/s) and a budget of 0 B nothing fits, so the least-holding plan is taken: layers 0-2
    offloaded (0 B; kept rather than at a budget, which costs seconds) and the last one recomputed
    (its 2 B input: less than 3 B at budget 0.2), 12 s + 1 s for the recomputation."""
    plan = planning.plan(AT_BUDGETS, 1e12, keep_seconds=12.0, budget_bytes=0, keep_last=1)
    assert plan.decisions == (OFFLOAD, OFFLOAD, OFFLOAD, RECOMPUTE)
    assert (plan.predicted_activation_bytes, plan.predicted_seconds) == (2, 13.0)


def test_the_greedy_planner_never_offloads_a_kept_last_layer():
    """Beyond the exhaustive search (14 layers), the greedy's offloaded leading runs stop below the
    kept last layer. Instant store, 0 B budget: 13 layers offloaded and the last recomputed (2 B,
    40 s + 1 s), never all 14 offloaded (0 B)."""
    layers = [LayerProfile(10, 2, 1.0) for _ in range(14)]
    plan = planning.plan(layers, 1e12, keep_seconds=40.0, budget_bytes=0, keep_last=1)
    assert plan.decisions == (OFFLOAD,) * 13 + (RECOMPUTE,)
    assert (plan.predicted_activation_bytes, plan.predicted_seconds) == (2, 41.0)


def test_the_greedy_planner_recomputes_the_lowest_of_equal_layers_first():
    """14 equal layers (beyond the exhaustive search) and a store too slow to use (0.01 B/s): within
    140 - 24 B, three layers must hold their 2 B input instead of 10 B. Each costs 1 s, so every
    choice of three is as good; the greedy, and so the plan, takes the lowest layers."""
    layers = [LayerProfile(10, 2, 1.0) for _ in range(14)]
    plan = planning.plan(layers, 0.01, keep_seconds=40.0, budget_bytes=116, keep_last=1)
    assert plan.decisions == (RECOMPUTE,) * 3 + (KEEP,) * 11
    assert (plan.predicted_activation_bytes, plan.predicted_seconds) == (116, 43.0)


def test_the_greedy_planner_weighs_a_move_against_what_the_layer_costs_already():
    """12 layers (beyond the exhaustive search), a store too slow to use. Layer kinds alternate:
    X (10 B, 1 s forward; recomputed 2 B for +1 s; at budget 0.5 9 B for +5 s) and Y (10 B, 0.5 s
    forward; recomputed 3 B for +0.5 s; at budget 0.5 4 B for +0.4 s). Within 78 B the best plan
    recomputes every Y (6 x 7 B freed for 3 s; every Y at the budget and one X recomputed frees 44 B
    for 3.4 s). The greedy reaches it: from keep, Y to the budget frees 15 B/s, Y recomputed 14 B/s,
    X recomputed 8 B/s; then Y from the budget to recomputed frees 1 B for 0.5 - 0.4 s more, 10 B/s,
    before any X. (Priced at its whole 0.5 s, 2 B/s, X went first and the plan took 3.4 s.)"""
    x = LayerProfile(10, 2, 1.0, (Alternative(0.5, 9, 5.0),))
    y = LayerProfile(10, 3, 0.5, (Alternative(0.5, 4, 0.4),))
    plan = planning.plan([x, y] * 6, 0.01, keep_seconds=20.0, budget_bytes=78, keep_last=1)
    assert plan.decisions == (KEEP, RECOMPUTE) * 6
    assert plan.predicted_activation_bytes == 6 * 10 + 6 * 3
    assert plan.predicted_seconds == pytest.approx(20.0 + 6 * 0.5)


def test_the_search_is_exhaustive_at_exactly_exhaustive_choices():
    """Five compiled layers at three budgets, none kept last: 9^5 = 3^10 choices, EXHAUSTIVE itself,
    so every plan is predicted, among them one the greedy cannot build (a layer kept below layers
    offloaded at a budget). Layer 0 holds 1000 B whatever it runs as (its budgets and its
    recomputation cost 1 s; offloading it at 4 B/s takes 250 s). Layers 1-4 hold 10 B kept (2.5 s to
    write at 4 B/s, longer than their 1 s forward) or 4 B at budget 0.5 for nothing more (1 s to
    write). Within 1004 B: layer 0 kept, layers 1-3 offloaded at 0.5 and layer 4 at 0.5. The writes
    (1 -> 2, 2 -> 3, 3 -> 4 s) end by the end of forward (5 s): 1000 + 4 B held. Backward (2 s a
    layer) asks for layer 3 at 5 s, layer 2 at 7 s, layer 1 at 9 s; each 1 s read ends before the
    layer's backward begins: no stall, no extra seconds."""
    assert 9**5 == planning.EXHAUSTIVE
    costly = tuple(Alternative(b, 1000, 1.0) for b in (0.2, 0.5, 0.8))
    cheap = (Alternative(0.2, 3, 0.5), Alternative(0.5, 4, 0.0), Alternative(0.8, 8, 0.0))
    profiles = [LayerProfile(1000, 1000, 1.0, costly)] + [LayerProfile(10, 10, 1.0, cheap)] * 4
    plan = planning.plan(profiles, 4.0, keep_seconds=10.0, budget_bytes=1004, keep_last=0)
    assert plan.decisions == (KEEP, "offload_budget_0.5", "offload_budget_0.5", "offload_budget_0.5", "budget_0.5")
    assert (plan.predicted_activation_bytes, plan.predicted_seconds, plan.stall_seconds) == (1004, 10.0, 0.0)


def test_in_a_layer_s_backward_the_layers_it_asked_for_are_read_back():
    """Layer 0 offloaded to an instant store; layer 1's backward peaked at 2000 B in a kept step, the
    largest segment. With prefetch 1 (or 2: from the start of backward) layer 0 is read back by the
    time layer 1's backward runs: its 100 B are held again, 2000 B. With prefetch 0 layer 0 is read
    at its own backward: layer 1's holds 100 B less, 1900 B (the head's: 1350 - 100)."""
    profiles = [
        LayerProfile(100, 10, 1.0, forward_peak=300, backward_peak=150),
        LayerProfile(200, 20, 1.0, forward_peak=300, backward_peak=2000),
        LayerProfile(400, 40, 1.0, forward_peak=700, backward_peak=720, head_peak=1350),
    ]
    peaks = [
        planning.predict(profiles, [OFFLOAD, KEEP, KEEP], 1e12, 1.0, prefetch=p).predicted_peak_bytes for p in (0, 1, 2)
    ]
    assert peaks == [1900, 2000, 2000]


def test_every_layer_may_be_kept_last():
    """keep_last may be every layer: nothing is offloaded, and the planner recomputes instead. Within
    20 B three of FOUR's layers hold their 2 B input (16 B) for 3 s more; adaptive keeps them all."""
    assert planning.adaptive(FOUR, 10.0, keep_seconds=12.0, keep_last=4).decisions == (KEEP,) * 4
    plan = planning.plan(FOUR, 1e6, keep_seconds=12.0, budget_bytes=20, keep_last=4)
    assert (plan.count(OFFLOAD), plan.count(RECOMPUTE), plan.count(KEEP)) == (0, 3, 1)
    assert (plan.predicted_activation_bytes, plan.predicted_seconds) == (16, 15.0)


def test_an_instant_store_frees_every_offloaded_layer_the_last_one_too():
    """At an infinite bandwidth the last layer's write ends exactly when forward does: nothing of it
    is left (not an infinite rate times no time, which is no number), and its read costs nothing."""
    plan = planning.predict(FOUR, [OFFLOAD] * 4, math.inf, 12.0, fixed_bytes=7)
    assert (plan.predicted_activation_bytes, plan.predicted_seconds, plan.stall_seconds) == (7, 12.0, 0.0)


def test_plans_record_what_they_were_made_for():
    """A plan carries the store's bandwidth, the engine's prefetch its prediction is for, and the
    budget it was made within: offload() warns when its prefetch differs, and results record them."""
    plan = planning.predict(FOUR, [OFFLOAD, KEEP, KEEP, KEEP], 5.0, 12.0, prefetch=2)
    assert (plan.bandwidth, plan.prefetch, plan.budget_bytes) == (5.0, 2, None)
    planned = planning.plan(FOUR, 7.0, keep_seconds=12.0, budget_bytes=33, keep_last=1, prefetch=3)
    assert (planned.bandwidth, planned.prefetch, planned.budget_bytes, planned.peak_budget_bytes) == (7.0, 3, 33, None)
    assert planning.adaptive(FOUR, 9.0, keep_seconds=12.0, prefetch=0).prefetch == 0
