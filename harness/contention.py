"""How much of the machine's CPU time other processes took while a part was measured.

A number measured while something else ran (a test run, a build, another part under
``snakemake --cores all``) is slower and noisier than the machine can do, and its spread alone does
not say why. The kernel counts every CPU's busy time (``/proc/stat``); this process counts its own
and its finished children's (``os.times``: threads, sampling workers, compilers). What is left over
the part's wall time is the others' share of the machine, which the provenance records and every
figure's machine label names when it is large enough to matter.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
# /proc/stat's columns of the aggregate "cpu" line that are busy time: user, nice, system, irq,
# softirq, steal (guest time is already inside user; idle and iowait are not busy).
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)
NOTED_SHARE = 0.10  # from this share of the machine's CPU time on, a label names the others' use


@dataclass(frozen=True)
class CpuSample:
    machine_busy_s: float  # every CPU's busy time since boot
    own_s: float  # this process's CPU time and its waited-for children's
    at_s: float  # time.monotonic()


def sample(stat: Path = PROC_STAT) -> CpuSample | None:
    """The counters now, or None where the kernel does not give them (not Linux)."""
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    busy = sum(int(fields[1 + i]) for i in _BUSY_COLUMNS if 1 + i < len(fields)) / ticks
    own = os.times()
    return CpuSample(busy, own.user + own.system + own.children_user + own.children_system, time.monotonic())


def others_share(start: CpuSample | None, end: CpuSample | None, cpus: int | None = None) -> float | None:
    """The share (0-1) of the machine's CPU time between ``start`` and ``end`` that other processes
    used; None where either sample is missing or no time passed."""
    if start is None or end is None or end.at_s <= start.at_s:
        return None
    capacity = (end.at_s - start.at_s) * (cpus or os.cpu_count() or 1)
    others = (end.machine_busy_s - start.machine_busy_s) - (end.own_s - start.own_s)
    return min(max(others / capacity, 0.0), 1.0)
