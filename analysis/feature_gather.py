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

from analysis.common import errorbars, load_results, machine_label, panel_grid, summarize
from analysis.style import style
from harness.registry import COMPETITOR_ROLES, ENTRY_ROLES
from systems.pytorch_direct import dispatch
from systems.pytorch_direct.gather_variants import GATHER_VARIANTS
from workloads.ceilings.schema import SCHEMA as CEILINGS
from workloads.feature_gather.schema import SCHEMA

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
    """Zero-copy reads of driver-pinned memory at this row size, by table size (ceilings' uva_read)."""
    if ceil is None:
        return None
    c = ceil[
        (ceil.part == "uva_read")
        & (ceil.variant == order)
        & (ceil.granularity_bytes == row_bytes)
        & (ceil.host_memory == "pinned")
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
    wide = rs.pivot_table(index="row_bytes", columns="variant", values="median")
    kernels = [v for v in KERNELS if v in wide]
    if kernels:
        best_zc = wide[kernels].max(axis=1)
        kernel_name = " or ".join(f"`{k}`" for k in kernels)
        for fam, names in families_of(wide.columns).items():
            best_family = wide[names].max(axis=1)
            wins = [int(r) for r in wide.index[best_family > best_zc]]
            speedups = (best_zc / best_family).dropna()
            lines.append(
                f"Row sizes at which {fam} ({', '.join(names)}) beats the suite's kernel ({kernel_name}): "
                f"{wins or 'none'}. Speedup of the suite's kernel over the fastest of {fam}, by row size: "
                + ", ".join(f"{int(r)} B {s:.2f}x" for r, s in speedups.items())
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
# ## Figure

# %%
panels = []
if "row_sizes" in parts:
    panels.append("row_sizes")
if "table_sizes" in parts:
    ts_rows = sorted(set(medians("table_sizes").row_bytes))
    panels += [f"table_sizes:uniform:{r}" for r in ts_rows] + [f"table_sizes:zipf:{r}" for r in ts_rows]
panels += [p for p in ("batch_sizes", "cpu_threads", "thread_cap", "locality") if p in parts]
fig, axes = panel_grid(len(panels), width=4.8, height=3.9)
# Panels of variants share one legend below the figure; the others explain their own lines
# (row sizes, thread caps) in a corner their curves leave empty.
SHARED_LEGEND_PARTS = {"row_sizes", "table_sizes", "batch_sizes"}
PANEL_LEGEND_PLACE = {"cpu_threads": "upper left", "thread_cap": "upper left", "locality": "lower right"}
LEGEND_ORDER = {name: i for i, name in enumerate(["pinned copy", "random-read ceiling", *VARIANTS])}
# The Zipf panels leave out, to stay legible, the variants whose skewed curves the uniform panels
# already tell (the unsorted kernel steps, unsorted stock torch, the dispatched path, WholeGraph);
# every other variant, a new one included, is drawn. Hot-first layouts are drawn for the variants
# whose point is that layout (sorted reads, the hot-row cache).
SKEWED_PANELS_LEAVE_OUT = {"naive", "aligned", "vectorized", "default", "torch_uva", "wholegraph"}
HOT_FIRST_SHOWN = {"sorted", "hot_cache"}
shared_legend = {}


def level(ax, rows, color, linestyle, label) -> None:
    """A horizontal line at the median of ``rows`` (one row: a rate with nothing to vary), if any."""
    if not rows.empty:
        ax.axhline(rows["median"].iloc[0], color=color, linestyle=linestyle, linewidth=1, label=label)


def ceiling_lines(ax, row_bytes=None):
    if pinned_copy is not None:
        ax.axhline(pinned_copy, color="grey", linestyle="--", linewidth=1, label="pinned copy")
    c = random_read_ceiling(row_bytes) if row_bytes else None
    if c is not None:
        ax.plot(
            c.table_bytes / GiB, c["median"], color="grey", linestyle=":", linewidth=1.5, label="random-read ceiling"
        )


for ax, panel in zip(axes, panels):
    part, _, rest = panel.partition(":")
    data = medians(part)
    if part == "row_sizes":
        for variant in ordered(data.variant):
            for dtype, marker_style in (("fp32", "-"), ("bf16", "--")):
                d = data[(data.variant == variant) & (data.dtype == dtype)]
                if not d.empty:
                    errorbars(
                        ax, d, "row_bytes", f"{variant}" if dtype == "fp32" else None, style(variant)[0], marker_style
                    )
        if pinned_copy is not None:
            ax.axhline(pinned_copy, color="grey", linestyle="--", linewidth=1, label="pinned copy")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="row size (B); solid fp32, dashed bf16",
            ylabel="GB/s",
            title=f"By row size ({size_label(data.table_bytes.max())} table, uniform)",
        )
    elif part == "table_sizes":
        dist, row_bytes = rest.split(":")
        row_bytes = int(row_bytes)
        d_all = data[data.row_bytes == row_bytes]
        if dist == "uniform":
            d_all = d_all[d_all.distribution == "uniform"]
            shown = [(v, "uniform") for v in ordered(d_all.variant) if not is_diagnostic(v)]
        else:
            zipf = sorted(x for x in set(d_all.distribution) if x.startswith("zipf") and "hot_first" not in x)[0]
            on_zipf = ordered(d_all[d_all.distribution == zipf].variant)
            shown = [(v, zipf) for v in on_zipf if v not in SKEWED_PANELS_LEAVE_OUT and not is_diagnostic(v)]
            shown += [(v, f"{zipf}-hot_first") for v in on_zipf if v in HOT_FIRST_SHOWN]
        for variant, distribution in shown:
            d = d_all[(d_all.variant == variant) & (d_all.distribution == distribution)]
            if not d.empty:
                hot = distribution.endswith("hot_first")
                errorbars(
                    ax,
                    d.assign(gib=d.table_bytes / GiB),
                    "gib",
                    variant + (", hot-first" if hot else ""),
                    style(variant)[0],
                    ":" if hot else style(variant)[1],
                )
        ceiling_lines(ax, row_bytes if dist == "uniform" else None)
        ax.set(
            xscale="log",
            xlabel="table size (GiB)",
            ylabel="GB/s",
            ylim=(0, None),
            title=f"{row_bytes} B rows, {'uniform' if dist == 'uniform' else 'Zipf-skewed'} rows",
        )
    elif part == "batch_sizes":
        for variant in ordered(data.variant):
            errorbars(ax, data[data.variant == variant], "batch_rows", variant, *style(variant))
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="rows per gather",
            ylabel="GB/s",
            title=f"By batch size ({int(data.row_bytes.iloc[0])} B rows, {size_label(data.table_bytes.max())})",
        )
    elif part == "cpu_threads":
        row_colors = dict(zip(sorted(set(data.row_bytes)), ("tab:blue", "tab:orange", "tab:green", "tab:red")))
        for (variant, row_bytes), d in data.groupby(["variant", "row_bytes"]):
            errorbars(ax, d, "threads", f"{row_bytes} B, {variant}", row_colors[row_bytes], style(variant)[1])
        ax.set(xlabel="CPU threads", ylabel="GB/s", ylim=(0, None), title="CPU gathers by thread count")
    elif part == "thread_cap":
        # Variants measured with a cap (max_threads recorded; 0: none) are curves over the cap, and
        # their uncapped rate a dotted line; the others (no cap to set) are dash-dotted lines.
        capped = ordered(data[data.max_threads.notna()].variant)
        uncapped = ordered(data[data.max_threads.isna()].variant)
        for (row_bytes, d), color in zip(data.groupby("row_bytes"), ("tab:blue", "tab:orange", "tab:green")):
            for variant in uncapped:
                level(ax, d[d.variant == variant], color, "-.", f"{row_bytes} B, {variant}")
            for variant in capped:
                v = d[d.variant == variant]
                named = f", {variant}" if len(capped) > 1 else ""
                full = v[v.max_threads == 0]
                errorbars(
                    ax, v[v.max_threads > 0], "max_threads", f"{row_bytes} B rows{named}", color, style(variant)[1]
                )
                level(ax, full, color, ":", f"{row_bytes} B{named}, no cap")
        ax.set(
            xscale="log",
            xlabel="thread cap of the gather",
            ylabel="GB/s",
            ylim=(0, None),
            title=f"{', '.join(capped)} with capped threads",
        )
        ax.set_ylim(0, ax.get_ylim()[1] * 1.6)  # headroom: the legend sits above the curves
    elif part == "locality":
        row_colors = dict(zip(sorted(set(data.row_bytes)), ("tab:blue", "tab:orange", "tab:green")))
        for (variant, row_bytes), d in data.groupby(["variant", "row_bytes"]):
            errorbars(
                ax,
                d.assign(kib=d.window_bytes / 1024),
                "kib",
                f"{row_bytes} B, {variant}",
                row_colors[row_bytes],
                style(variant)[1],
            )
        union = (data.windows * data.window_bytes).iloc[0] / MiB
        ax.set(
            xscale="log",
            xlabel="window size (KiB)",
            ylabel="GB/s",
            ylim=(0, None),
            title=f"Same {union:.0f} MiB of rows, in windows\nspread over a {size_label(data.table_bytes.max())} table",
        )
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if part in SHARED_LEGEND_PARTS:
        # Variants keep one colour everywhere: one legend for all these panels, off the data.
        shared_legend.update(zip(labels, handles))
    elif handles:
        ax.legend(fontsize=6, loc=PANEL_LEGEND_PLACE[part])

what = (
    "Feature gathering into GPU memory"
    if (frame.device == "cuda").any()
    else "CPU feature gathering (no GPU here: rows gathered into host memory, no transfer)"
)
fig.suptitle(
    f"{what}: {machine}, scale '{scale}' (measured; median, bars = IQR)\n{machine_label(provenance)}", fontsize=9
)
legend_rows = 0
if shared_legend:
    entries = sorted(shared_legend.items(), key=lambda item: LEGEND_ORDER.get(item[0].split(",")[0], len(LEGEND_ORDER)))
    columns = 7
    legend_rows = -(-len(entries) // columns)
    fig.legend(
        [h for _, h in entries],
        [label for label, _ in entries],
        loc="lower center",
        ncol=columns,
        fontsize=8,
        frameon=False,
    )
bottom = (0.3 * legend_rows + 0.1) / fig.get_figheight()
fig.tight_layout(rect=(0, bottom, 1, 1))
Path(figure).parent.mkdir(parents=True, exist_ok=True)
fig.savefig(figure, dpi=130)
