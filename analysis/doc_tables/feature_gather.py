"""The feature-gathering doc's tables: the measured dispatch table, the targets, WholeGraph, CPU cost.

Ratios are taken within one process (each process's median of each variant), then given as the
range over the processes that measured both sides: a process's machine state (the host
buffer's physical layout) moves every variant of it together.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from analysis.common import summarize
from analysis.doc_tables import REPO_ROOT, Table, load, results_files, same_code_processes, table
from systems.pytorch_direct import dispatch
from workloads.feature_gather.dispatch_table import build, process_files

GiB = 1 << 30
MACHINE, SCALE = "h200", "h200"
CPU_GATHER = ("cpu_gather", "cpu_gather_pipelined")
STOCK = ("torch_uva", "torch_uva_sorted")
# The paths that gather on the GPU alone (not split with the CPU, no cache of hot rows).
GPU_ONLY = ("default", "naive", "aligned", "vectorized", "sorted", "torch_uva", "torch_uva_sorted", "wholegraph")


def _processes(part: str) -> list:
    """The committed file of ``part`` and its re-runs of the same code, each its own process."""
    return same_code_processes(MACHINE, "feature_gather", part, SCALE)


@functools.cache
def _per_process(part: str):
    """Median GB/s per (process, variant, row size, table size) of uniform batches."""
    files = _processes(part)
    frame = load(files, "feature_gather")
    rates = summarize(
        frame[frame.distribution == "uniform"], "bandwidth", ["source", "variant", "row_bytes", "table_bytes"]
    )
    return rates.set_index(["source", "row_bytes", "table_bytes", "variant"])["median"].sort_index(), files


def _span(values, digits: int = 2, suffix: str = "x") -> str:
    low, high = min(values), max(values)
    if f"{low:.{digits}f}" == f"{high:.{digits}f}":
        return f"{low:.{digits}f}{suffix}"
    return f"{low:.{digits}f}–{high:.{digits}f}{suffix}"


def _gib(nbytes) -> str:
    return f"{nbytes / GiB:g}"


@table("feature_gather-h200-dispatch", topic="feature_gather")
def dispatch_cells() -> Table:
    """Every cell of the dispatch table, rebuilt from the results as the table's builder does."""
    files = process_files(REPO_ROOT / "results" / MACHINE / "feature_gather")
    built = build(files)
    rates, same_code = _per_process("table_sizes")
    rows_rates, _ = _per_process("row_sizes")
    both = rates.combine_first(rows_rates)
    lines = [
        "| rows | table GiB | fastest path | suite kernel | suite sorted | stock torch | stock sorted "
        "| suite's best, x best stock path |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cell in sorted(built["cells"], key=lambda c: (c["row_bytes"], c["table_bytes"])):
        gbps = cell["gbps"]
        best = max(gbps, key=gbps.get)
        rates_shown = [f"**{gbps[p]:.1f}**" if p == best else f"{gbps[p]:.1f}" for p in dispatch.PATHS]
        ratios = []
        for source in sorted(set(both.index.get_level_values("source"))):
            try:
                measured = both.loc[(source, cell["row_bytes"], cell["table_bytes"])]
            except KeyError:
                continue
            suite = max(measured[dispatch.VARIANT_OF_PATH[p]] for p in ("kernel", "kernel_sorted"))
            stock = max(measured[dispatch.VARIANT_OF_PATH[p]] for p in ("torch", "torch_sorted"))
            ratios.append(suite / stock)
        lines.append(
            f"| {cell['row_bytes']} B | {_gib(cell['table_bytes'])} | {cell['path']} | "
            + " | ".join(rates_shown)
            + f" | {_span(ratios)} |"
        )
    note = (
        f"GB/s, median over {min(c['processes'] for c in built['cells'])} processes of each process's median; "
        "uniform distinct rows; bold: the fastest path (the table's builder reads every process, of any code). "
        f"The last column is the range over the {len(same_code)} processes of "
        "the committed run's code."
    )
    return Table(lines, files, note=note)


@dataclass(frozen=True)
class Target:
    """A measured goal: ``variant`` (or the fastest of several) over the fastest of ``against`` in
    each cell and process."""

    goal: str
    part: str
    variant: str | tuple[str, ...]
    against: tuple[str, ...]
    threshold: float
    rows: tuple[int, ...] = ()  # row sizes it covers (empty: all)
    tables_from: int = 0  # smallest table size it covers
    tables_to: int = 1 << 62


TARGETS = (
    Target("2 KiB rows, any table: ≥ 1.05x `torch_uva`", "table_sizes", "default", ("torch_uva",), 1.05, (2048,)),
    Target("2 KiB rows, any table: ≥ 2x the faster CPU baseline", "table_sizes", "default", CPU_GATHER, 2.0, (2048,)),
    Target(
        "512 B rows, ≥ 16 GiB: ≥ 1.6x the faster CPU baseline",
        "table_sizes",
        "default",
        CPU_GATHER,
        1.6,
        (512,),
        16 * GiB,
    ),
    Target("the same with `split` (CPU and GPU together)", "table_sizes", "split", CPU_GATHER, 1.6, (512,), 16 * GiB),
    Target(
        "512 B rows, ≥ 16 GiB: ≥ 1.1x `torch_uva_sorted`",
        "table_sizes",
        "default",
        ("torch_uva_sorted",),
        1.1,
        (512,),
        16 * GiB,
    ),
    Target("every `table_sizes` cell: ≥ 1.0x `torch_uva`", "table_sizes", "default", ("torch_uva",), 1.0),
    Target("every cell: ≥ 1.0x `torch_uva_sorted`", "table_sizes", "default", ("torch_uva_sorted",), 1.0),
    Target("every cell: ≥ 1.0x `wholegraph`", "table_sizes", "default", ("wholegraph",), 1.0),
    Target(
        "128 B rows, 4 GiB: ≥ the faster CPU baseline",
        "table_sizes",
        "default",
        CPU_GATHER,
        1.0,
        (128,),
        4 * GiB,
        4 * GiB,
    ),
    Target("the same, the best GPU-only path", "table_sizes", GPU_ONLY, CPU_GATHER, 1.0, (128,), 4 * GiB, 4 * GiB),
    Target("the same with `split`", "table_sizes", "split", CPU_GATHER, 1.0, (128,), 4 * GiB, 4 * GiB),
    Target("row sizes (4 GiB, `row_sizes`): ≥ 1.0x the best stock path", "row_sizes", "default", STOCK, 1.0),
)


def _ratios(rates, target: Target) -> list[float]:
    """``target``'s ratio in every (process, cell) where both sides were measured."""
    found = []
    for (_, row_bytes, table_bytes), measured in rates.groupby(level=[0, 1, 2]):
        measured = measured.droplevel([0, 1, 2])
        if target.rows and row_bytes not in target.rows:
            continue
        if not target.tables_from <= table_bytes <= target.tables_to:
            continue
        against = [measured[v] for v in target.against if v in measured.index]
        variants = (target.variant,) if isinstance(target.variant, str) else target.variant
        mine = [measured[v] for v in variants if v in measured.index]
        if mine and against:
            found.append(max(mine) / max(against))
    return found


@table("feature_gather-h200-targets", topic="feature_gather")
def targets() -> Table:
    parts = {part: _per_process(part) for part in ("table_sizes", "row_sizes")}
    lines = ["| target (default path unless named) | measured, x | pairs below | met? |", "|---|---|---|---|"]
    for target in TARGETS:
        ratios = _ratios(parts[target.part][0], target)
        if not ratios:
            raise ValueError(f"doc table target {target.goal!r}: nothing measured")
        below = sum(r < target.threshold for r in ratios)
        lines.append(
            f"| {target.goal} | {_span(ratios)} | {below} of {len(ratios)} | {'yes' if below == 0 else 'no'} |"
        )
    files = [f for _, files in parts.values() for f in files]
    note = (
        "Each ratio is one process's median over the fastest median it is compared with, in one (row size, table "
        "size) cell; pairs: (cell, process), over the processes that measured both sides."
    )
    return Table(lines, files, note=note)


@table("feature_gather-h200-wholegraph", topic="feature_gather")
def wholegraph() -> Table:
    files = results_files(MACHINE, "feature_gather", ["table_sizes"], SCALE)
    rates, _ = _per_process("table_sizes")
    committed = rates.loc[str(files[0])]
    tables = sorted(set(committed.index.get_level_values("table_bytes")))
    lines = [
        "| rows | " + " | ".join(f"{_gib(t)} GiB" for t in tables) + " |",
        "|---|" + "---|" * len(tables),
    ]
    for row_bytes in sorted(set(committed.index.get_level_values("row_bytes"))):
        cells = []
        for t in tables:
            measured = committed.loc[(row_bytes, t)]
            cells.append(f"{measured['wholegraph']:.1f} ({measured['default'] / measured['wholegraph']:.2f}x)")
        lines.append(f"| {row_bytes} B | " + " | ".join(cells) + " |")
    note = "WholeGraph's GB/s (median), with the default path's speed over it in brackets; uniform distinct rows."
    return Table(lines, files, note=note)


# What tells one measured row of row_sizes from another: both dtypes were measured at some row sizes.
MEASUREMENT = ["variant", "dtype", "row_bytes", "repetition"]


def cpu_per_gb(frame):
    """Median core-seconds per GB delivered of each variant, over every measurement of ``frame``:
    each measurement's CPU time over (bandwidth x wall time). Raises where two rows of one metric
    share a measurement's key rather than keep one of them."""
    timed = frame[frame.metric.isin(["cpu_time", "bandwidth", "time"])]
    sums = timed.pivot(index=MEASUREMENT, columns="metric", values="value")
    per_gb = sums["cpu_time"] / (sums["bandwidth"] * sums["time"])
    return per_gb.groupby(level="variant").median()


@table("feature_gather-h200-cpu_cost", topic="feature_gather")
def cpu_cost() -> Table:
    files = results_files(MACHINE, "feature_gather", ["row_sizes"], SCALE)
    frame = load(files, "feature_gather")
    medians = cpu_per_gb(frame[frame.distribution == "uniform"]).sort_values(ascending=False)
    lines = ["| variant | core-s per GB delivered |", "|---|---|"]
    lines += [f"| `{variant}` | {value:.3g} |" for variant, value in medians.items()]
    note = (
        "Median over every measured row of `row_sizes` (4 GiB table: each row size, both dtypes where both were "
        "measured, each repetition) of CPU time per GB delivered."
    )
    return Table(lines, files, note=note)
