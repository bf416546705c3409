"""The timing harness: what it counts, what it reports, and its refusals.

What a clock reads is checked against a clock the test advances itself (``FakeClock``), so no
assertion depends on how busy the machine is; CPU time is checked on work that spends it."""

import time
import types
from pathlib import Path

import pytest

from harness import resources, timing
from harness.timing import Measurement, measure


class FakeClock:
    """Stands in for the ``time`` module that harness.timing reads: its perf_counter moves only
    when the test calls ``advance``."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


def test_runs_warmup_plus_repeat_and_times_each_repetition(clock):
    calls = []
    durations = iter([7.0, 7.0] + [0.002, 0.004, 0.010, 0.008, 0.006])

    def fn():
        calls.append(1)
        clock.advance(next(durations))

    m = measure(fn, device="cpu", repeat=5, warmup=2)
    assert len(calls) == 7
    assert len(m.seconds) == len(m.cpu_core_seconds) == 5
    assert m.clock == "monotonic"
    # Each sample is its own call's time (warm-up calls are not timed), in the order of the calls.
    assert m.seconds == pytest.approx((0.002, 0.004, 0.010, 0.008, 0.006))
    assert m.median == pytest.approx(0.006)
    assert m.spread == pytest.approx((0.004, 0.008))


def test_cpu_time_counts_busy_work_but_not_sleep():
    def busy():  # burn 50 ms of this process's CPU time, however busy the machine is
        end = time.process_time() + 0.05
        while time.process_time() < end:
            pass

    m_busy = measure(busy, device="cpu", repeat=3, warmup=0)
    m_sleep = measure(lambda: time.sleep(0.05), device="cpu", repeat=3, warmup=0)
    assert min(m_busy.cpu_core_seconds) >= 0.045
    assert max(m_sleep.cpu_core_seconds) < 0.02


def test_peak_rss_is_reset_before_each_repetition():
    baseline = resources.rss_bytes()
    sizes = iter([256 << 20, 0])  # a large allocation in the first repetition only

    def allocate():
        block = bytearray(next(sizes))  # zero-filled by the allocator: every page is touched
        del block

    m = measure(allocate, device="cpu", repeat=2, warmup=0, track_memory=True)
    first, second = m.peak_rss_bytes
    assert first >= baseline + (200 << 20)
    # Without the reset the second repetition would report the first one's peak.
    assert second < first - (150 << 20)
    assert len(m.pinned_host_bytes) == 2


def test_spread_of_one_sample_is_that_sample():
    m = Measurement(clock="monotonic", seconds=(0.25,), cpu_core_seconds=(0.1,))
    assert m.median == 0.25 and m.spread == (0.25, 0.25)


@pytest.mark.parametrize("kwargs", [dict(repeat=0, warmup=0), dict(repeat=1, warmup=-1)])
def test_refuses_bad_counts(kwargs):
    with pytest.raises(ValueError):
        measure(lambda: None, device="cpu", **kwargs)


def test_refuses_unknown_device():
    with pytest.raises(ValueError, match="device"):
        measure(lambda: None, device="tpu", repeat=1, warmup=0)


@pytest.mark.parametrize(
    ("device", "kind"), [("cuda", "cuda"), ("cuda:1", "cuda"), (0, "cuda"), ("cpu", "cpu"), ("cpu:0", "cpu")]
)
def test_a_device_is_taken_any_way_torch_takes_one(device, kind):
    import torch

    assert timing.device_kind(device) == kind
    assert timing.device_kind(torch.device(str(device) if not isinstance(device, int) else "cuda")) == kind


@pytest.mark.parametrize("device", ["mps", "tpu:0", True, None])
def test_a_device_that_is_neither_refused(device):
    with pytest.raises(ValueError, match="device"):
        timing.device_kind(device)


def test_a_cpu_device_object_times_on_the_host_clock(clock):
    import torch

    m = measure(lambda: clock.advance(0.25), device=torch.device("cpu"), repeat=2, warmup=0)
    assert m.clock == "monotonic" and m.seconds == (0.25, 0.25)


def test_phase_clock_adds_up_each_phase(clock):
    from harness.timing import PhaseClock

    phases = PhaseClock("cpu")
    for _ in range(3):
        with phases.phase("a"):
            clock.advance(0.01)
        clock.advance(5.0)  # between phases: counted in neither
        with phases.phase("b"):
            clock.advance(0.02)
    assert phases.totals == pytest.approx({"a": 0.03, "b": 0.06})


def test_wall_clock_includes_the_waits_at_both_ends(clock):
    seconds = timing.wall_clock(
        lambda: clock.advance(0.5), "cpu", before=lambda: clock.advance(9.0), after=lambda: clock.advance(0.25)
    )
    assert seconds == pytest.approx(0.75)  # the closing wait is inside, the opening one is not


def test_cpu_time_of_finished_children_can_be_included():
    import subprocess
    import sys

    before_self, before_all = resources.cpu_core_seconds(), resources.cpu_core_seconds(include_children=True)
    subprocess.run(
        [sys.executable, "-c", "import time\nend = time.process_time() + 0.2\nwhile time.process_time() < end: pass"],
        check=True,
    )
    assert resources.cpu_core_seconds(include_children=True) - before_all >= 0.19
    assert resources.cpu_core_seconds() - before_self < 0.1


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="running children are read from Linux /proc")
def test_cpu_time_of_running_children_is_included_and_not_counted_twice_when_they_end():
    import subprocess
    import sys

    before = resources.cpu_core_seconds(include_children=True)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nend = time.process_time() + 0.3\n"
            "while time.process_time() < end: pass\nprint(flush=True)\nsys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    child.stdout.readline()  # it has spent its 0.3 s and now waits, still running
    running = resources.cpu_core_seconds(include_children=True) - before
    child.communicate("")
    ended = resources.cpu_core_seconds(include_children=True) - before
    assert 0.29 <= running < 0.8
    assert ended == pytest.approx(running, abs=0.1)


@pytest.mark.gpu
@pytest.mark.parametrize("device", ["cuda:0", 0])
def test_marks_on_a_gpu_named_any_way_wait_for_the_gpu(device):
    import torch

    start = timing.mark(device)
    torch.cuda._sleep(50_000_000)  # ~tens of ms of GPU time, not host time
    end = timing.mark(device)
    torch.cuda.synchronize()
    assert isinstance(start, torch.cuda.Event) and timing.elapsed(start, end) > 1e-3
