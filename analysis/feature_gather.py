# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # PyTorch-Direct: zero-copy feature gathering
#
# Effective bandwidth (rows delivered to GPU memory x row size, per second) of each way of
# getting sampled feature rows into GPU memory, measured by `workloads.feature_gather`, against
# the same machine's ceilings (`workloads.ceilings`). Medians of the repetitions; bars span the
# interquartile range. Every ratio below compares numbers from the same run.

# %% tags=["parameters"]
machine = "local"
scale = "cpu"
figure = "paper_figs/local/feature_gather-cpu.png"
summary = "paper_figs/local/feature_gather-cpu.md"
results = {}  # topic -> its results files, passed by the workflow

# %%
from pathlib import Path

import pandas as pd

from analysis.common import errorbars, load_results, machine_label, same_code_reruns, summarize
from harness.registry import COMPETITOR_ROLES, ENTRY_ROLES
from systems.pytorch_direct import dispatch
from systems.pytorch_direct.gather_variants import GATHER_VARIANTS
from workloads.ceilings.schema import SCHEMA as CEILINGS
from workloads.feature_gather.schema import SCHEMA
from workloads.feature_gather.tables import TABLE_MEMORY

frame, provenance = load_results(results["feature_gather"], SCHEMA)
GiB, MiB = 1 << 30, 1 << 20
CONFIG = list(SCHEMA.config)


def medians(part, metric="bandwidth"):
    """Median and IQR per variant and configuration of one part."""
    rows = frame[frame.part == part]
    used = [c for c in CONFIG if rows[c].notna().any()]
    return summarize(rows, metric, ["variant"] + used)


parts = set(frame.part)
print(machine_label(provenance))
print(sorted(parts))

# The same machine's ceilings at the same scale, where measured (the workflow passes them).
ceil = None
if results.get("ceilings"):
    ceil_frame, _ = load_results(results["ceilings"], CEILINGS)
    ceil = summarize(
        ceil_frame, "bandwidth", ["part", "variant", "host_memory", "size_bytes", "table_bytes", "granularity_bytes"]
    )
pinned_copy = None
if ceil is not None and (ceil.part == "pcie_copy").any():
    pc = ceil[(ceil.part == "pcie_copy") & (ceil.variant == "h2d") & (ceil.host_memory == "pinned")]
    pinned_copy = pc.sort_values("size_bytes")["median"].iloc[-1]


def random_read_ceiling(row_bytes, order="random"):
    """Zero-copy reads at this row size, by table size (ceilings' uva_read), of host memory pinned
    as the gathers' tables are (in place: registered)."""
    if ceil is None:
        return None
    c = ceil[
        (ceil.part == "uva_read")
        & (ceil.variant == order)
        & (ceil.granularity_bytes == row_bytes)
        & (ceil.host_memory == TABLE_MEMORY)
    ]
    return None if c.empty else c.sort_values("table_bytes")


def ceiling_at(row_bytes, table_bytes, order="random"):
    c = random_read_ceiling(row_bytes, order)
    if c is None or not (c.table_bytes == table_bytes).any():
        return None
    return c[c.table_bytes == table_bytes]["median"].iloc[0]


# %% [markdown]
# ## The variants: from the rows, described by the registry where it knows them
#
# Every variant in the results is shown, whether or not the registry
# (systems/pytorch_direct/gather_variants) knows it. Its role comes from its rows; its family
# (the kind of path: tables quote the fastest of each family of competitors) and whether it is a
# diagnostic (a kernel timed alone, not a path) from its entry, and for a variant the registry
# does not know, the family is its own name. Order: by role (baselines, peers, optimized, upper
# bounds), then as registered, then by name.

# %%
REGISTERED = {entry.name: entry for entry in GATHER_VARIANTS}


def _role(variant, roles) -> str:
    """A variant's role in the rows; where files of different dates disagree, its entry's."""
    roles = set(roles)
    if len(roles) == 1:
        return roles.pop()
    return REGISTERED[variant].role if variant in REGISTERED else sorted(roles)[0]


ROLE = {variant: _role(variant, g) for variant, g in frame.groupby("variant")["role"]}
_registered_order = {name: i for i, name in enumerate(REGISTERED)}


def _order_key(variant):
    role = ROLE.get(variant, "")
    return (
        ENTRY_ROLES.index(role) if role in ENTRY_ROLES else len(ENTRY_ROLES),
        _registered_order.get(variant, len(_registered_order)),
        variant,
    )


def ordered(variants) -> list:
    return sorted(set(variants), key=_order_key)


VARIANTS = ordered(frame.variant)


def family(variant) -> str:
    return REGISTERED[variant].family if variant in REGISTERED else variant


def is_diagnostic(variant) -> bool:
    return variant in REGISTERED and REGISTERED[variant].kernel_only


def is_competitor(variant) -> bool:
    return ROLE.get(variant) in COMPETITOR_ROLES


COMPETITORS = [v for v in VARIANTS if is_competitor(v)]
OPTIMIZED = [v for v in VARIANTS if ROLE.get(v) == "optimized" and not is_diagnostic(v)]
# The suite's own kernel, sorted or not: the variants of the dispatch table's kernel paths.
KERNELS = [dispatch.VARIANT_OF_PATH[p] for p in ("kernel", "kernel_sorted")]


def families_of(variants) -> dict[str, list]:
    """Competitor families among ``variants``, in order: family -> its variants."""
    out = {}
    for v in ordered(variants):
        if is_competitor(v):
            out.setdefault(family(v), []).append(v)
    return out


def best_of(values: dict, names) -> tuple[str | None, float | None]:
    """The fastest of ``names`` measured in ``values`` (variant -> GB/s), or (None, None)."""
    present = [n for n in names if n in values and pd.notna(values[n])]
    if not present:
        return None, None
    name = max(present, key=values.get)
    return name, values[name]


def size_label(nbytes):
    return f"{nbytes / GiB:g} GiB" if nbytes >= GiB else f"{nbytes / MiB:g} MiB"


def cell(value, digits=1):
    return "" if value is None or pd.isna(value) else f"{value:.{digits}f}"


print({v: (ROLE[v], family(v)) for v in VARIANTS})


# %% [markdown]
# ## Targets and key numbers

# %%
lines = [
    f"# Feature gathering on `{machine}` at scale `{scale}`",
    "",
    machine_label(provenance),
    "",
    "Effective bandwidth = rows delivered x row size / time, in GB/s (10^9 B/s); medians of the repetitions.",
    "",
]

if "table_sizes" in parts:
    ts = medians("table_sizes")
    times = medians("table_sizes", "time")
    ts_families = families_of(ts.variant)
    lines += [
        "## Targets (part table_sizes, fp32 rows; ratios from the same run)",
        "",
        "Ceilings come from the same machine's ceilings run: pinned copy, and the random / sorted "
        "zero-copy read rate at the same row and table size.",
        "",
        "The best optimized path is the fastest of "
        + ", ".join(f"`{v}`" for v in OPTIMIZED if v in set(ts.variant))
        + ". Each competitor family's columns are its fastest variant in the cell ("
        + "; ".join(f"{f}: " + ", ".join(f"`{v}`" for v in vs) for f, vs in ts_families.items())
        + "); the fastest competitor is the fastest of them all (baselines and peers), where this run "
        "measured them.",
        "",
        "| row | table | indices | best optimized path | GB/s | ms per gather | "
        + "".join(f"{f} GB/s | x {f} | " for f in ts_families)
        + "fastest competitor GB/s | x fastest competitor | / pinned copy | / random-read ceiling "
        "| / sorted-read ceiling | target |",
        "|---|---|---|---|---|---|" + "---|---|" * len(ts_families) + "---|---|---|---|---|---|",
    ]
    for (row_bytes, table_bytes, dist), g in ts.groupby(["row_bytes", "table_bytes", "distribution"]):
        values = dict(zip(g.variant, g["median"]))
        best_name, best = best_of(values, OPTIMIZED)
        if best_name is None:
            continue
        competitor_cells = []
        for names in ts_families.values():
            name, rate = best_of(values, names)
            competitor_cells.append(f"{rate:.1f} ({name}) | {best / rate:.2f}" if rate else "n/a | n/a")
        name, rate = best_of(values, COMPETITORS)
        competitor_cells.append(f"{rate:.1f} ({name}) | {best / rate:.2f}" if rate else "n/a | n/a")
        target = {2048: "≥ 0.92 of pinned copy, ≥ 2x CPU"}.get(row_bytes, "")
        if row_bytes == 512 and table_bytes >= 16 * GiB:
            target = "≥ 1.6x CPU" if dist == "uniform" else "≥ 2x CPU"
        if row_bytes == 128 and table_bytes == 4 * GiB and dist == "uniform":
            target = "≥ 1x CPU"
        copy = f"{best / pinned_copy:.3f}" if pinned_copy else "n/a"
        ratios = []
        for order in ("random", "sorted"):
            c = ceiling_at(row_bytes, table_bytes, order)
            ratios.append(f"{best / c:.2f}" if c else "n/a")
        t = times[
            (times.variant == best_name)
            & (times.row_bytes == row_bytes)
            & (times.table_bytes == table_bytes)
            & (times.distribution == dist)
        ]["median"].iloc[0]
        lines.append(
            f"| {row_bytes} B | {table_bytes / GiB:g} GiB | {dist} | {best_name} | {best:.1f} | {t * 1e3:.2f} | "
            + " | ".join(competitor_cells)
            + f" | {copy} | {ratios[0]} | {ratios[1]} | {target} |"
        )
    # Each variant the dispatch table routes (it records the path it took) against every competitor.
    dispatched = ordered(frame[(frame.part == "table_sizes") & frame.path.notna()].variant)
    uniform = ts[ts.distribution == "uniform"]
    peers = [v for v in ordered(uniform.variant) if ROLE.get(v) == "peer"]
    baseline_families = {f: vs for f, vs in families_of(uniform.variant).items() if ROLE.get(vs[0]) == "baseline"}
    for routed in dispatched:
        lines += [
            "",
            f"### `{routed}`, the measured dispatch (`UnifiedTensor[idx]`), against every competitor, uniform rows",
            "",
            f"`{routed}` takes the path that the GPU's dispatch table (systems/pytorch_direct/dispatch.py) "
            "picked from earlier table_sizes runs, and adds the suite's bounds check. Ratios are its rate over "
            "each peer's, each baseline family's fastest and the fastest competitor's, from the same run.",
            "",
            "| row | table | path taken | GB/s | / pinned copy | "
            + "".join(f"x {p} | " for p in peers)
            + "".join(f"x {f} | " for f in baseline_families)
            + "x fastest competitor |",
            "|---|---|---|---|---|" + "---|" * (len(peers) + len(baseline_families) + 1),
        ]
        paths = frame[(frame.part == "table_sizes") & (frame.variant == routed)]
        for (row_bytes, table_bytes), g in uniform.groupby(["row_bytes", "table_bytes"]):
            values = dict(zip(g.variant, g["median"]))
            if routed not in values:
                continue
            d = values[routed]
            taken = paths[(paths.row_bytes == row_bytes) & (paths.table_bytes == table_bytes)]["path"]
            cells = [f"{d / values[p]:.2f}" if p in values else "n/a" for p in peers]
            for names in [*baseline_families.values(), COMPETITORS]:
                _, rate = best_of(values, names)
                cells.append(f"{d / rate:.2f}" if rate else "n/a")
            lines.append(
                f"| {row_bytes} B | {table_bytes / GiB:g} GiB | {', '.join(sorted(set(taken.dropna())))} | {d:.1f} | "
                + (f"{d / pinned_copy:.3f}" if pinned_copy else "n/a")
                + f" | {' | '.join(cells)} |"
            )
    lines += ["", "### Ablation (part table_sizes): GB/s of each variant", ""]
    steps = ordered(ts.variant)
    lines += ["| row | table | indices | " + " | ".join(steps) + " |", "|---|---|---|" + "---|" * len(steps)]
    for (row_bytes, table_bytes, dist), g in ts.groupby(["row_bytes", "table_bytes", "distribution"]):
        values = dict(zip(g.variant, g["median"]))
        lines.append(
            f"| {row_bytes} B | {table_bytes / GiB:g} GiB | {dist} | "
            + " | ".join(cell(values.get(s)) for s in steps)
            + " |"
        )
    lines.append("")

if "row_sizes" in parts:
    rs = medians("row_sizes")
    variants = ordered(rs.variant)
    lines += [
        "## Row sizes (part row_sizes: uniform rows, one table size)",
        "",
        "| dtype | dim | row | " + " | ".join(variants) + " |",
        "|---|---|---|" + "---|" * len(variants),
    ]
    for (dtype, dim, row_bytes), g in rs.groupby(["dtype", "dim", "row_bytes"]):
        values = dict(zip(g.variant, g["median"]))
        lines.append(f"| {dtype} | {dim} | {row_bytes} B | " + " | ".join(cell(values.get(v)) for v in variants) + " |")
    lines.append("")
    # Every variant that is not a competitor, over the fastest competitor of the same case.
    contenders = [v for v in variants if not is_competitor(v)]
    competitors = [v for v in variants if is_competitor(v)]
    if contenders and competitors:
        lines += [
            "Speedup of each variant over the fastest competitor (baseline or peer) of the same case:",
            "",
            "| dtype | dim | row | fastest competitor GB/s | " + " | ".join(f"x {v}" for v in contenders) + " |",
            "|---|---|---|---|" + "---|" * len(contenders),
        ]
        for (dtype, dim, row_bytes), g in rs.groupby(["dtype", "dim", "row_bytes"]):
            values = dict(zip(g.variant, g["median"]))
            name, rate = best_of(values, competitors)
            if rate is None:
                continue
            lines.append(
                f"| {dtype} | {dim} | {row_bytes} B | {rate:.1f} ({name}) | "
                + " | ".join(cell(values.get(v, float("nan")) / rate, 2) for v in contenders)
                + " |"
            )
        lines.append("")

    def by_case(medians_of_a_run: pd.DataFrame) -> pd.DataFrame:
        """Variants as columns, by (dtype, row size): each case is one measurement, never a mean
        of two dtypes' medians."""
        return medians_of_a_run.pivot_table(
            index=["dtype", "row_bytes"], columns="variant", values="median", aggfunc="first"
        )

    wide = by_case(rs)
    # The same in each re-run of the same code: an ordering is said only where every process has it.
    same_code, _ = same_code_reruns(
        [f for f in results.get("feature_gather_reruns", []) if Path(f).name.startswith("row_sizes-")],
        [f for f in results["feature_gather"] if Path(f).name.startswith("row_sizes-")],
    )
    wides = [wide]
    for rerun in same_code:
        wides.append(
            by_case(summarize(load_results([rerun], SCHEMA)[0], "bandwidth", ["variant", "dtype", "row_bytes"]))
        )
    kernels = [v for v in KERNELS if v in wide]

    def case(key) -> str:
        return f"{key[1]} B {key[0]}"

    if kernels:
        best_zc = wide[kernels].max(axis=1)
        kernel_name = " or ".join(f"`{k}`" for k in kernels)
        for fam, names in families_of(wide.columns).items():
            wins = []  # per process, the cases where the family's fastest beats the kernel's
            for w in wides:
                here = [n for n in names if n in w]
                mine = [k for k in kernels if k in w]
                if here and mine:
                    wins.append(set(w.index[w[here].max(axis=1) > w[mine].max(axis=1)]))
            processes = f"the {len(wins)} processes that measured both" if len(wins) > 1 else "one process"
            every = sorted(set.intersection(*wins)) if wins else []
            some = sorted(set.union(*wins) - set(every)) if wins else []
            speedups = (best_zc / wide[names].max(axis=1)).dropna()
            lines.append(
                f"Cases at which {fam} ({', '.join(names)}) beats the suite's kernel ({kernel_name})"
                + (f" in every one of {processes}" if len(wins) > 1 else " (one process)")
                + f": {', '.join(map(case, every)) or 'none'}"
                + (f"; in some of them only: {', '.join(map(case, some))}" if some else "")
                + f". Speedup of the suite's kernel over the fastest of {fam} in the committed run: "
                + ", ".join(f"{case(k)} {s:.2f}x" for k, s in speedups.items())
                + "."
            )
        for bound in (v for v in wide.columns if ROLE.get(v) == "upper_bound"):
            gap = wide[bound] / best_zc
            lines.append(
                f"{bound} gathers {gap.min():.1f}x to {gap.max():.1f}x faster than the suite's kernel ({kernel_name})."
            )
    # CPU cost: core-seconds the process spent per GB delivered.
    cpu = medians("row_sizes", "cpu_time")
    cpu["core_s_per_gb"] = cpu["median"] / (cpu.batch_rows * cpu.row_bytes / 1e9)
    per_variant = cpu.groupby("variant")["core_s_per_gb"].median()
    lines += [
        "",
        "CPU core-seconds per GB delivered (median over row sizes): "
        + ", ".join(f"{v} {per_variant[v]:.3f}" for v in variants if v in per_variant)
        + ".",
        "",
    ]

if "cpu_threads" in parts:
    ct = medians("cpu_threads")
    thread_counts = sorted(set(ct.threads))
    lines += [
        "## CPU gathers by threads (part cpu_threads)",
        "",
        "| row | " + " | ".join(f"{t} thr" for t in thread_counts) + " |",
        "|---|" + "---|" * len(thread_counts),
    ]
    for variant in ordered(ct.variant):
        for row_bytes, g in ct[ct.variant == variant].groupby("row_bytes"):
            values = dict(zip(g.threads, g["median"]))
            lines.append(
                f"| {row_bytes} B {variant} | " + " | ".join(cell(values.get(t)) for t in thread_counts) + " |"
            )
    lines.append("")

Path(summary).parent.mkdir(parents=True, exist_ok=True)
Path(summary).write_text("\n".join(lines) + "\n")
print("\n".join(lines))

# %% [markdown]
# ## Figure: the headline comparison, bandwidth by row size and by table size
#
# The technique's kernels, the hot-row cache, the dispatched path and the all-in-GPU bound are
# drawn bold, and in each panel the fastest baseline and the fastest peer as measured there (the
# competitors the tables quote speedups against); every other variant thin and light. Supporting
# figures: the skewed (Zipf) reads (`-skewed`), and batch size, CPU threads, bf16 rows, thread caps
# and locality (`-knobs`).

# %%
import math
import textwrap

from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

from analysis import style

style.entry_labels(GATHER_VARIANTS)  # a user's own entries under the labels they register

MEASURED = machine_label(provenance)
# Always bold: the suite's paths that the figures are about, and the bound. The competitors drawn
# bold are picked per panel from its data (emphasised()).
SUITE_EMPHASISED = {*KERNELS, "split", "hot_cache", "default", "all_in_gpu"}
BOLD_COMPETITORS = "each panel's fastest baseline and peer"
BOLD = f"bold: the suite's paths, the bound and {BOLD_COMPETITORS}"
# A colour is a variant's, its line style too (style.VARIANT_STYLE); where one panel shows several
# row sizes, the marker tells them apart. The unsorted-read rate is a wide band in a colour no
# variant has, so that it never reads as a variant's line.
ROW_MARKERS = {128: "o", 512: "s", 2048: "^"}
CEILING_BAND = "#c9b99a"
INK = "#444444"  # words and legend keys that are not a variant's
# Bandwidths on a log axis: ticks at 1, 2 and 5 of every decade, however many the axis spans.
ONE_TWO_FIVE = ((math.inf, (1, 2, 5)),)


def row_marker(row_bytes):
    return ROW_MARKERS.get(int(row_bytes), "D")


def fastest_of_role(data, points, role) -> str | None:
    """The variant of ``role`` in ``data`` (medians) fastest at the most of the panel's points
    (``points``: the columns that tell them apart), a tie to the higher sum of medians."""
    rows = data[data.variant.map(ROLE.get) == role]
    if rows.empty:
        return None
    wide = rows.pivot_table(index=points, columns="variant", values="median")
    wins = wide.idxmax(axis=1).value_counts()
    return max(wins.index, key=lambda v: (wins[v], wide[v].sum()))


def emphasised(data, points) -> set:
    """The variants drawn bold in a panel of ``data``: the suite's, and its fastest baseline and peer."""
    fastest = {fastest_of_role(data, points, role) for role in COMPETITOR_ROLES}
    return SUITE_EMPHASISED | (fastest - {None})


def draw_variant(ax, data, x, variant, label, bold, linestyle=None, marker=None, hollow=False):
    """Medians with interquartile bars; ``bold``: a variant of the headline comparison, drawn bold,
    else thin and light. ``marker`` set: the panel tells row sizes apart by it, so every line's
    markers show."""
    errorbars(
        ax,
        data,
        x,
        label,
        style.color(variant),
        linestyle or style.style(variant)[1],
        marker=marker or "o",
        markersize=5 if marker else (4 if bold or hollow else 2.5),
        fillstyle="none" if hollow else "full",
        linewidth=2.2 if bold else 1.0,
        alpha=1.0 if bold else 0.55,
        zorder=3 if bold else 2,
    )


def ceiling_lines(ax, row_bytes=None):
    """The pinned copy as a labelled reference line; at one row size, the ceilings probe's rate of
    unsorted zero-copy reads by table size as a labelled band."""
    if pinned_copy is not None:
        style.reference_line(ax, pinned_copy, "pinned copy", "ceiling")
    c = random_read_ceiling(row_bytes) if row_bytes else None
    if c is not None:
        x = c.table_bytes / GiB
        ax.plot(x, c["median"], color=CEILING_BAND, linewidth=7, alpha=0.6, solid_capstyle="round", zorder=1)
        # The probe's unsorted reads: no bound for a path that sorts its ids or lets the CPU take a
        # share (sorted, split pass it on large tables), so not labelled a ceiling.
        style.margin_label(ax, c["median"].iloc[-1], "unsorted zero-copy reads", "#8a7651")


def measured_ticks(ax, values, unit="") -> None:
    """Ticks of a log x axis at the measured values (table sizes, row sizes), in plain numbers; a
    label less than half an octave right of the one before it goes a line lower (200 and 256)."""
    values = sorted(set(float(v) for v in values))
    lowered, previous = set(), None
    for v in values:
        if previous is not None and previous not in lowered and v < math.sqrt(2) * previous:
            lowered.add(v)
        previous = v
    ax.xaxis.set_major_locator(FixedLocator(values))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: ("\n" if v in lowered else "") + f"{v:g}{unit}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def note_below(ax, text) -> None:
    """Words under the panel's x label, where they cover no line."""
    ax.text(0.5, -0.2, text, transform=ax.transAxes, ha="center", va="top", fontsize=7.5, color=INK)


def note_coinciding(ax, curves: dict, tolerance=0.06) -> None:
    """Say under the panel which three or more lines (label -> medians over the same x) lie within
    ``tolerance`` of each other at every x: drawn on top of each other, they are not told apart."""
    groups = []
    for label, values in curves.items():
        for group in groups:
            first = curves[group[0]]
            common = first.index.intersection(values.index)
            if len(common) and ((values[common] - first[common]).abs() <= tolerance * first[common]).all():
                group.append(label)
                break
        else:
            groups.append([label])
    crowded = [g for g in groups if len(g) >= 3]
    if crowded:
        lines = [f"on top of each other (within {100 * tolerance:.0f}%): " + "; ".join(g) for g in crowded]
        note_below(ax, "\n".join(textwrap.fill(line, 80, break_on_hyphens=False) for line in lines))


# The Zipf panels leave out, to stay legible, the unsorted steps of the suite's kernel, whose
# skewed curves the uniform panels already tell; every competitor and every other variant, a new
# one included, is drawn, so the hot-row cache is seen against the fastest of them. Hot-first
# layouts are drawn for the variants whose point is that layout (sorted reads, the hot-row cache),
# dashed with hollow markers.
SKEWED_PANELS_LEAVE_OUT = {"naive", "aligned", "vectorized"}
HOT_FIRST_SHOWN = {"sorted", "hot_cache"}


def draw_log_log(ax, data, x, xlabel, title, ceilings=False) -> None:
    """Bandwidth of each variant of ``data`` against ``x``, both axes log scale; ``ceilings``:
    with the pinned copy's line."""
    bold = emphasised(data, x)
    for variant in ordered(data.variant):
        draw_variant(ax, data[data.variant == variant], x, variant, style.readable(variant), variant in bold)
    if ceilings:
        ceiling_lines(ax)
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="bandwidth (GB/s, log scale)", title=title)
    style.log_ticks(ax.xaxis, grouped=True)
    style.log_ticks(ax.yaxis, steps=ONE_TWO_FIVE, minor=True)


def draw_row_sizes(ax, dtype) -> None:
    """Bandwidth by row size, one dtype (the bf16 rows are a panel of the knobs figure)."""
    data = medians("row_sizes")
    data = data[data.dtype == dtype]
    paths = data[~data.variant.map(is_diagnostic)]  # a kernel timed alone: in the tables, not among the paths
    title = f"By row size, {dtype} rows ({size_label(data.table_bytes.max())} table, uniform rows)"
    draw_log_log(ax, paths, "row_bytes", "row size (bytes, log scale)", title, ceilings=True)
    measured_ticks(ax, data.row_bytes)  # the measured sizes, not powers of two that are near them


def draw_table_sizes(ax, dist, row_bytes) -> None:
    data = medians("table_sizes")
    d_all = data[data.row_bytes == row_bytes]
    if dist == "uniform":
        d_all = d_all[d_all.distribution == "uniform"]
        shown = [(v, "uniform") for v in ordered(d_all.variant) if not is_diagnostic(v)]
    else:
        zipf = sorted(x for x in set(d_all.distribution) if x.startswith("zipf") and "hot_first" not in x)[0]
        on_zipf = ordered(d_all[d_all.distribution == zipf].variant)
        shown = [(v, zipf) for v in on_zipf if v not in SKEWED_PANELS_LEAVE_OUT and not is_diagnostic(v)]
        shown += [(v, f"{zipf}-hot_first") for v in on_zipf if v in HOT_FIRST_SHOWN]
    drawn = pd.concat([d_all[(d_all.variant == v) & (d_all.distribution == dist)] for v, dist in shown])
    bold = emphasised(drawn, ["distribution", "table_bytes"])
    curves = {}
    for variant, distribution in shown:
        d = d_all[(d_all.variant == variant) & (d_all.distribution == distribution)]
        if not d.empty:
            hot = distribution.endswith("hot_first")
            label = style.readable(variant) + (", hot rows first" if hot else "")
            d = d.assign(gib=d.table_bytes / GiB)
            draw_variant(ax, d, "gib", variant, label, variant in bold, "--" if hot else None, hollow=hot)
            curves[label] = d.set_index("gib")["median"]
    ceiling_lines(ax, row_bytes if dist == "uniform" else None)
    if dist != "uniform":
        note_coinciding(ax, curves)
    ax.set(
        xscale="log",
        xlabel="table size (GiB, log scale)",
        ylabel="bandwidth (GB/s)",
        ylim=(0, None),
        title=f"{row_bytes}-byte rows, {'uniform' if dist == 'uniform' else 'Zipf-skewed'} reads",
    )
    measured_ticks(ax, d_all.table_bytes / GiB)


def draw_batch_sizes(ax) -> None:
    data = medians("batch_sizes")
    title = f"By batch size ({int(data.row_bytes.iloc[0])}-byte rows, {size_label(data.table_bytes.max())} table)"
    draw_log_log(ax, data, "batch_rows", "rows per gather (log scale)", title)


def draw_by_row_size(ax, part) -> None:
    """CPU threads or locality windows: one line per variant and row size, the row size the marker."""
    data = medians(part)
    x = "threads" if part == "cpu_threads" else "kib"
    data = data.assign(kib=data.window_bytes / 1024) if part == "locality" else data
    bold = emphasised(data, ["row_bytes", x])
    for variant in ordered(data.variant):
        for row_bytes, d in data[data.variant == variant].groupby("row_bytes"):
            draw_variant(ax, d, x, variant, style.readable(variant), variant in bold, marker=row_marker(row_bytes))
    if part == "cpu_threads":
        ax.set(xlabel=style.axis_label("threads"), ylabel="bandwidth (GB/s)", ylim=(0, None))
        ax.set_title("CPU gathers by thread count")
        ax.set_xticks(sorted(set(data.threads)))
    else:
        union = (data.windows * data.window_bytes).iloc[0] / MiB
        ax.set(
            xscale="log",
            xlabel="window size (KiB, log scale)",
            ylabel="bandwidth (GB/s)",
            ylim=(0, None),
            title=f"The same {union:.0f} MiB of rows in windows\n"
            f"spread over a {size_label(data.table_bytes.max())} table",
        )
        style.log_ticks(ax.xaxis, grouped=True)


def draw_thread_cap(ax) -> None:
    # Variants measured with a cap (max_threads recorded; 0: none) are curves over the cap, the
    # row size their marker; the others (no cap to set) are levels, labelled beside the panel.
    data = medians("thread_cap")
    capped = ordered(data[data.max_threads.notna()].variant)
    uncapped = ordered(data[data.max_threads.isna()].variant)
    for row_bytes, d in data.groupby("row_bytes"):
        for variant in uncapped:
            v = d[d.variant == variant]
            if not v.empty:
                level = v["median"].iloc[0]
                ax.axhline(level, color=style.color(variant), linestyle=":", linewidth=1.2, label="_ref")
                words = f"{style.readable(variant)},\n{row_bytes}-byte rows\n(no cap to set)"
                style.margin_label(ax, level, words, style.color(variant))
        for variant in capped:
            v = d[d.variant == variant]
            draw_variant(ax, v[v.max_threads > 0], "max_threads", variant, style.readable(variant),
                         variant in SUITE_EMPHASISED, marker=row_marker(row_bytes))  # fmt: skip
            # The same kernel without a cap, what a cap's share is read against: a dashed level in
            # its colour, unlabelled (the curve of its row size runs up to it; a label would sit on
            # the uncapped variants' labels, a few GB/s away).
            free = v[v.max_threads == 0]
            if not free.empty:
                ax.axhline(
                    free["median"].iloc[0], color=style.color(variant), linestyle="--", linewidth=0.9, label="_ref"
                )
    tables = ", ".join(size_label(b) for b in sorted(set(data.table_bytes.dropna())))
    names = ", ".join(map(style.readable, capped))
    ax.set(
        xscale="log",
        xlabel="cap on the gather's GPU threads (log scale)",
        ylabel="bandwidth (GB/s)",
        ylim=(0, None),
        title=f"Capped GPU threads: {names}\n({tables} table; dashed: the same, no cap)",
    )
    measured_ticks(ax, data.max_threads[data.max_threads > 0].dropna())


def draw(ax, panel) -> None:
    part, _, rest = panel.partition(":")
    if part == "row_sizes":
        draw_row_sizes(ax, rest or "fp32")
    elif part == "table_sizes":
        dist, row_bytes = rest.split(":")
        draw_table_sizes(ax, dist, int(row_bytes))
    elif part == "batch_sizes":
        draw_batch_sizes(ax)
    elif part in ("cpu_threads", "locality"):
        draw_by_row_size(ax, part)
    elif part == "thread_cap":
        draw_thread_cap(ax)


def legend_entries(axes) -> dict:
    """Label -> handle of every labelled line of ``axes``, in the order first seen; a variant drawn
    bold in any panel has its bold line in the legend."""

    def width(handle) -> float:
        line = getattr(handle, "lines", [handle])[0]  # an errorbar's: its line of medians
        return line.get_linewidth() if line is not None else 0.0

    entries = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if not label.startswith("_") and (label not in entries or width(handle) > width(entries[label])):
                entries[label] = handle
    return entries


def grid(count: int) -> list[list[int]]:
    """Panel places on a 6-column grid: no empty cell (five panels: three above two)."""
    rows = {1: [1], 2: [2], 3: [3], 4: [2, 2], 5: [3, 2], 6: [3, 3]}[count]
    layout, first = [], 0
    for n in rows:
        layout.append([first + i for i in range(n) for _ in range(6 // n)])
        first += n
    return layout


def gather_figure(panels, heading, what=None, row_sizes_legend=False) -> None:
    layout = grid(len(panels))
    width = {1: 6.5, 2: 12.5, 3: 16.0}[max(len(set(row)) for row in layout)]
    fig, named = style.mosaic([[str(i) for i in row] for row in layout], width=width, height=4.3 * len(layout))
    axes = [named[str(i)] for i in range(len(panels))]
    for ax, panel in zip(axes, panels):
        draw(ax, panel)
    entries = legend_entries(axes)
    order = {style.readable(v): i for i, v in enumerate(VARIANTS)}
    entries = dict(sorted(entries.items(), key=lambda item: order.get(item[0].split(", hot")[0], len(order))))
    if row_sizes_legend:
        shown = frame[frame.part.isin(["cpu_threads", "thread_cap", "locality"])]
        entries |= {
            f"{r}-byte rows": Line2D([], [], color=INK, marker=row_marker(r), linestyle="none")
            for r in sorted({int(r) for r in shown.row_bytes})
        }
    style.legend_below(fig, entries, columns=5)
    style.title(fig, heading, MEASURED)
    style.save(fig, figure, what)


what = (
    "Feature gathering into GPU memory"
    if (frame.device == "cuda").any()
    else "CPU feature gathering (no GPU here: rows gathered into host memory, no transfer)"
)
ts_rows = sorted(set(medians("table_sizes").row_bytes)) if "table_sizes" in parts else []
dtypes = set(frame[frame.part == "row_sizes"].dtype)
headline = (["row_sizes:fp32"] if "fp32" in dtypes else []) + [f"table_sizes:uniform:{r}" for r in ts_rows]
skewed = [f"table_sizes:zipf:{r}" for r in ts_rows]
knobs = [
    p for p in ("batch_sizes", "cpu_threads", "row_sizes:bf16", "thread_cap", "locality") if p.split(":")[0] in parts
]
knobs = [p for p in knobs if p != "row_sizes:bf16" or "bf16" in dtypes]
groups = [(headline[:6], None), (skewed[:6], "skewed"), (knobs, "knobs")]
if not headline:  # no headline parts: the first group with panels is the figure
    groups = [g for g in groups if g[0]]
    groups[0] = (groups[0][0], None)
PANEL_NAMES = {
    "row_sizes:fp32": "row size",
    "batch_sizes": "batch size",
    "cpu_threads": "CPU threads",
    "row_sizes:bf16": "bf16 rows",
    "thread_cap": "thread caps",
    "locality": "locality",
}


def panel_names(panels: list[str]) -> list[str]:
    """What the panels vary, each once, in their order: the titles name only what is drawn."""
    names = []
    for panel in panels:
        name = PANEL_NAMES.get(panel, "table size")  # table_sizes:<dist>:<row bytes>
        names += [name] if name not in names else []
    return names


def headline_heading(panels: list[str]) -> str:
    several = frame.variant.nunique() > 1
    bold = f" ({BOLD})" if several else ""
    return f"{what}: bandwidth{' of each path' if several else ''}, by {' and '.join(panel_names(panels))}{bold}"


for panels, name in groups:
    if panels:
        heading = {
            None: headline_heading(panels),
            "skewed": f"{what}: Zipf-skewed reads (dashed, hollow markers: hot rows stored first; "
            f"bold: the suite's paths and {BOLD_COMPETITORS})",
            "knobs": f"{what}: {', '.join(panel_names(panels))} (marker: row size; {BOLD})",
        }[name]
        gather_figure(panels, heading, name, row_sizes_legend=name == "knobs")
