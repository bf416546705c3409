"""The share of the machine's CPU time other processes took while a part ran (harness/contention.py),
recorded with the part and named on every figure's machine label where it is large."""

import subprocess
import sys
import time

import pytest

from harness import contention
from harness.contention import CpuSample, others_share


def test_the_others_share_is_the_machines_busy_time_less_this_process_over_its_capacity():
    start = CpuSample(machine_busy_s=100.0, own_s=10.0, at_s=50.0)
    # 4 s on 2 CPUs: 8 CPU-seconds; the machine was busy 6 of them, this process 2: the others 4.
    assert others_share(start, CpuSample(106.0, 12.0, 54.0), cpus=2) == pytest.approx(0.5)
    assert others_share(start, CpuSample(102.0, 12.0, 54.0), cpus=2) == 0.0  # this process alone
    assert others_share(start, CpuSample(130.0, 10.0, 54.0), cpus=2) == 1.0  # counters' rounding: at most all
    assert others_share(start, start) is None and others_share(None, start) is None


def test_a_process_that_is_not_this_ones_counts_as_another(tmp_path):
    if contention.sample() is None:
        pytest.skip("the kernel gives no /proc/stat here")
    busy = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.time() + 30\nwhile time.time() < end: pass"]
    )
    try:
        time.sleep(0.3)  # started and spinning
        start = contention.sample()
        time.sleep(1.0)
        end = contention.sample()
    finally:
        busy.kill()
        busy.wait()
    # One CPU's worth of capacity: the spinning process alone fills most of it (whatever else runs
    # only adds to the others' share).
    assert others_share(start, end, cpus=1) >= 0.5


def test_a_missing_proc_stat_gives_no_sample(tmp_path):
    assert contention.sample(tmp_path / "stat") is None
    (tmp_path / "stat").write_text("intr 1 2 3\n")
    assert contention.sample(tmp_path / "stat") is None
