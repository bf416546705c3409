"""The offloading bound (systems/ssdtrain/bound.py): hand-computed profiles, and random ones against
an independent time-stepped simulation of the write queue and an exhaustive search of the reads."""

import itertools
import random

import pytest

from harness.errors import UserError
from systems.ssdtrain import planning
from systems.ssdtrain.bound import bound_of_profile, offload_bound, written_by_forward_end
from systems.ssdtrain.planning import KEEP, OFFLOAD, LayerProfile


def test_a_slow_store_writes_the_leading_block_and_half_the_next():
    # 100 B per 1 s block at 50 B/s: block 0's bytes (0-1 s) are written by 2 s, block 1's (1-2 s)
    # queue behind them and half are written by the end of forward (3 s); block 2 is kept.
    bound = offload_bound([100, 100, 100], [1, 1, 1], [2, 2, 2], write_bandwidth=50)
    assert bound.written_by_forward_end == (100.0, 50.0, 0.0)
    assert bound.activation_bytes == pytest.approx(150) and not bound.read_limited


def test_slow_reads_cap_the_bound():
    # Reads at 10 B/s: blocks 0 and 1 must be back before backward reaches block 0, 4 s in: 40 B.
    bound = offload_bound([100, 100, 100], [1, 1, 1], [2, 2, 2], write_bandwidth=50, read_bandwidth=10)
    assert bound.activation_bytes == pytest.approx(40) and bound.read_limited
    # At 30 B/s: block 1 by 2 s (60 B, its 50 B fit) and both by 4 s (120 B of the 150 written).
    assert offload_bound([100, 100, 100], [1, 1, 1], [2, 2, 2], 50, 30).activation_bytes == pytest.approx(120)


def test_a_fast_store_frees_every_block_but_the_kept_ones():
    bound = offload_bound([300, 60, 10, 7], [1, 1, 1, 1], [2, 2, 2, 2], write_bandwidth=1e9, keep_last=2)
    assert bound.written_by_forward_end == (300.0, 60.0, 0.0, 0.0)
    assert bound.activation_bytes == pytest.approx(360)


def test_the_bound_is_the_cost_models_offload_all_reduction_when_reads_keep_up():
    profiles = [LayerProfile(100, 5, 1.0) for _ in range(3)]
    bound = bound_of_profile(profiles, bandwidth=50.0)
    plan = planning.predict(profiles, [OFFLOAD, OFFLOAD, KEEP], bandwidth=50.0, keep_seconds=9.0)
    assert bound.activation_bytes == pytest.approx(300 - plan.predicted_activation_bytes)


def _simulated_writes(saved, forward, bandwidth, keep_last, steps_per_second=2000):
    """The FIFO queue stepped in small time steps (an independent reference of the closed form)."""
    n = len(saved)
    offloaded = [float(s) if i < n - keep_last else 0.0 for i, s in enumerate(saved)]
    waiting = [0.0] * n  # arrived, not yet written
    for i in range(n):
        steps = round(forward[i] * steps_per_second)
        for _ in range(steps):
            waiting[i] += offloaded[i] / steps
            budget = bandwidth / steps_per_second
            for j in range(i + 1):  # oldest first
                take = min(budget, waiting[j])
                waiting[j] -= take
                budget -= take
    return [offloaded[i] - waiting[i] for i in range(n)]


def test_random_profiles_match_a_stepped_queue_and_an_exhaustive_read_search():
    rng = random.Random(7)
    for _ in range(6):
        n = rng.randint(2, 4)
        saved = [rng.randint(1, 9) for _ in range(n)]
        forward = [rng.choice([0.5, 1.0, 1.5]) for _ in range(n)]
        backward = [rng.choice([0.5, 1.0, 2.0]) for _ in range(n)]
        write, read = rng.choice([2.0, 4.0, 8.0]), rng.choice([1.0, 2.0, 6.0])
        keep_last = rng.randint(0, 1)
        written = written_by_forward_end(saved, forward, write, keep_last)
        assert written == pytest.approx(_simulated_writes(saved, forward, write, keep_last), abs=0.02)
        # Exhaustive over x_i in quarter bytes: the most that obeys both limits.
        grid = [[k / 4 for k in range(int(w * 4) + 1)] for w in written]
        best = 0.0
        for x in itertools.product(*grid):
            if all(sum(x[i:]) <= read * sum(backward[i + 1 :]) + 1e-9 for i in range(n)):
                best = max(best, sum(x))
        got = offload_bound(saved, forward, backward, write, read, keep_last).activation_bytes
        assert best <= got + 1e-9 and got - best < 0.25 * n


def test_bad_profiles_are_refused_in_one_line():
    with pytest.raises(UserError, match="per block"):
        offload_bound([1, 2], [1.0], [1.0, 1.0], 1.0)
    with pytest.raises(UserError, match="positive"):
        offload_bound([1], [1.0], [1.0], 0.0)
    with pytest.raises(UserError, match="negative"):
        offload_bound([-1], [1.0], [1.0], 1.0)
    with pytest.raises(UserError, match="finite"):
        offload_bound([1], [float("nan")], [1.0], 1.0)
    with pytest.raises(UserError, match="positive"):
        offload_bound([1], [1.0], [1.0], float("nan"))
    with pytest.raises(UserError, match="keep_last"):
        offload_bound([1], [1.0], [1.0], 1.0, keep_last=0.5)
    with pytest.raises(UserError, match="keep_last"):
        offload_bound([1], [1.0], [1.0], 1.0, keep_last=2)
    with pytest.raises(UserError, match="per block"):
        offload_bound([], [], [], 1.0)
