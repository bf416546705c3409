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

from analysis.common import errorbars, load_results, machine_label, panel_grid, summarize
from analysis.style import VARIANT_STYLE
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


STYLE = VARIANT_STYLE
ZERO_COPY = ["naive", "aligned", "vectorized", "sorted", "hot_cache", "split", "default"]
CPU_BASELINES = ["cpu_gather", "cpu_gather_pipelined"]  # speedups are quoted against the faster
STOCK_TORCH = ["torch_uva", "torch_uva_sorted"]


def best_of(values: dict, names) -> tuple[str | None, float | None]:
    """The fastest of ``names`` measured in ``values`` (variant -> GB/s), or (None, None)."""
    present = [n for n in names if n in values]
    if not present:
        return None, None
    name = max(present, key=values.get)
    return name, values[name]


def size_label(nbytes):
    return f"{nbytes / GiB:g} GiB" if nbytes >= GiB else f"{nbytes / MiB:g} MiB"


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
    lines += [
        "## Targets (part table_sizes, fp32 rows; ratios from the same run)",
        "",
        "Ceilings come from the same machine's ceilings run: pinned copy, and the random / sorted "
        "zero-copy read rate at the same row and table size.",
        "",
        "The CPU baseline is the faster of `cpu_gather` and `cpu_gather_pipelined`, stock torch the "
        "faster of `torch_uva` and `torch_uva_sorted` (where this run measured them).",
        "",
        "| row | table | indices | best zero-copy path | GB/s | ms per gather | CPU baseline GB/s | x CPU "
        "| stock torch GB/s | x stock torch | / pinned copy | / random-read ceiling | / sorted-read ceiling "
        "| target |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    times = medians("table_sizes", "time")
    for (row_bytes, table_bytes, dist), g in ts.groupby(["row_bytes", "table_bytes", "distribution"]):
        zc = g[g.variant.isin(ZERO_COPY)]
        b = zc.loc[zc["median"].idxmax()]
        values = dict(zip(g.variant, g["median"]))
        cpu_name, cpu = best_of(values, CPU_BASELINES)
        torch_name, stock = best_of(values, STOCK_TORCH)
        stock_cells = f"{stock:.1f} ({torch_name}) | {b['median'] / stock:.2f}" if stock else "n/a | n/a"
        target = {2048: "≥ 0.92 of pinned copy, ≥ 2x CPU"}.get(row_bytes, "")
        if row_bytes == 512 and table_bytes >= 16 * GiB:
            target = "≥ 1.6x CPU" if dist == "uniform" else "≥ 2x CPU"
        if row_bytes == 128 and table_bytes == 4 * GiB and dist == "uniform":
            target = "≥ 1x CPU"
        copy = f"{b['median'] / pinned_copy:.3f}" if pinned_copy else "n/a"
        ratios = []
        for order in ("random", "sorted"):
            c = ceiling_at(row_bytes, table_bytes, order)
            ratios.append(f"{b['median'] / c:.2f}" if c else "n/a")
        t = times[
            (times.variant == b.variant)
            & (times.row_bytes == row_bytes)
            & (times.table_bytes == table_bytes)
            & (times.distribution == dist)
        ]["median"].iloc[0]
        lines.append(
            f"| {row_bytes} B | {table_bytes / GiB:g} GiB | {dist} | {b.variant} | {b['median']:.1f} | "
            f"{t * 1e3:.2f} | {cpu:.1f} ({cpu_name}) | {b['median'] / cpu:.2f} | {stock_cells} | {copy} | "
            f"{ratios[0]} | {ratios[1]} | {target} |"
        )
    if "default" in set(ts.variant):
        lines += [
            "",
            "### The default path (`UnifiedTensor[idx]`) against every peer, uniform rows",
            "",
            "`default` takes the path that the GPU's dispatch table (systems/pytorch_direct/dispatch.py) "
            "picked from earlier table_sizes runs, and adds the suite's bounds check. Ratios are default "
            "over each peer, from the same run.",
            "",
            "| row | table | path taken | GB/s | / pinned copy | x torch_uva | x torch_uva_sorted "
            "| x wholegraph | x CPU baseline |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        paths = frame[(frame.part == "table_sizes") & (frame.variant == "default")]
        for (row_bytes, table_bytes), g in ts[ts.distribution == "uniform"].groupby(["row_bytes", "table_bytes"]):
            values = dict(zip(g.variant, g["median"]))
            if "default" not in values:
                continue
            d = values["default"]
            taken = paths[(paths.row_bytes == row_bytes) & (paths.table_bytes == table_bytes)]["path"]
            cells = [
                f"{d / values[p]:.2f}" if p in values else "n/a"
                for p in ("torch_uva", "torch_uva_sorted", "wholegraph")
            ]
            _, cpu = best_of(values, CPU_BASELINES)
            lines.append(
                f"| {row_bytes} B | {table_bytes / GiB:g} GiB | {', '.join(sorted(set(taken.dropna())))} | {d:.1f} | "
                + (f"{d / pinned_copy:.3f}" if pinned_copy else "n/a")
                + f" | {' | '.join(cells)} | {d / cpu:.2f} |"
            )
    lines += ["", "### Ablation (part table_sizes): GB/s of each step", ""]
    steps = [
        *CPU_BASELINES,
        *STOCK_TORCH,
        "wholegraph",
        "naive",
        "vectorized",
        "sorted",
        "hot_cache",
        "split",
        "default",
    ]
    steps = [s for s in steps if s in set(ts.variant)]
    lines += ["| row | table | indices | " + " | ".join(steps) + " |", "|---|---|---|" + "---|" * len(steps)]
    for (row_bytes, table_bytes, dist), g in ts.groupby(["row_bytes", "table_bytes", "distribution"]):
        values = dict(zip(g.variant, g["median"]))
        lines.append(
            f"| {row_bytes} B | {table_bytes / GiB:g} GiB | {dist} | "
            + " | ".join(f"{values[s]:.1f}" if s in values else "" for s in steps)
            + " |"
        )
    lines.append("")

if "row_sizes" in parts:
    rs = medians("row_sizes")
    variants = [v for v in STYLE if v in set(rs.variant)]
    lines += [
        "## Row sizes (part row_sizes: uniform rows, one table size)",
        "",
        "| dtype | dim | row | " + " | ".join(variants) + " |",
        "|---|---|---|" + "---|" * len(variants),
    ]
    for (dtype, dim, row_bytes), g in rs.groupby(["dtype", "dim", "row_bytes"]):
        values = dict(zip(g.variant, g["median"]))
        lines.append(f"| {dtype} | {dim} | {row_bytes} B | " + " | ".join(f"{values[v]:.1f}" for v in variants) + " |")
    lines.append("")
    wide = rs.pivot_table(index="row_bytes", columns="variant", values="median")
    kernels = [v for v in ("vectorized", "sorted") if v in wide]
    if kernels:
        best_zc = wide[kernels].max(axis=1)
        best_cpu = wide[[c for c in CPU_BASELINES if c in wide]].max(axis=1)
        cpu_wins = [int(r) for r in wide.index[best_cpu > best_zc]]
        lines.append(f"Row sizes at which the CPU baseline beats the best zero-copy kernel: {cpu_wins or 'none'}.")
        lines.append(
            "Speedup of the best zero-copy kernel over the faster CPU baseline, by row size: "
            + ", ".join(f"{int(r)} B {s:.2f}x" for r, s in (best_zc / best_cpu).items())
            + "."
        )
        stock = [c for c in STOCK_TORCH if c in wide]
        if stock:
            lines.append(
                "Speedup of the best zero-copy kernel over the faster stock torch path on the alias, by row size: "
                + ", ".join(f"{int(r)} B {s:.2f}x" for r, s in (best_zc / wide[stock].max(axis=1)).items())
                + "."
            )
        if "all_in_gpu" in wide:
            gap = wide["all_in_gpu"] / best_zc
            lines.append(
                f"All-in-GPU gathers {gap.min():.1f}x to {gap.max():.1f}x faster than the best zero-copy kernel."
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
    lines += [
        "## CPU gather by threads (part cpu_threads)",
        "",
        "| row | " + " | ".join(f"{t} thr" for t in sorted(set(ct.threads))) + " |",
        "|---|" + "---|" * len(set(ct.threads)),
    ]
    for (variant, row_bytes), g in ct.groupby(["variant", "row_bytes"]):
        values = dict(zip(g.threads, g["median"]))
        lines.append(f"| {row_bytes} B {variant} | " + " | ".join(f"{values[t]:.1f}" for t in sorted(values)) + " |")
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
LEGEND_ORDER = {name: i for i, name in enumerate(["pinned copy", "random-read ceiling", *STYLE])}
shared_legend = {}


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
        for variant in STYLE:
            for dtype, marker_style in (("fp32", "-"), ("bf16", "--")):
                d = data[(data.variant == variant) & (data.dtype == dtype)]
                if not d.empty:
                    errorbars(
                        ax, d, "row_bytes", f"{variant}" if dtype == "fp32" else None, STYLE[variant][0], marker_style
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
            shown = [
                ("cpu_gather", "uniform"),
                ("cpu_gather_pipelined", "uniform"),
                ("torch_uva", "uniform"),
                ("torch_uva_sorted", "uniform"),
                ("wholegraph", "uniform"),
                ("naive", "uniform"),
                ("vectorized", "uniform"),
                ("sorted", "uniform"),
                ("split", "uniform"),
                ("default", "uniform"),
            ]
        else:
            zipf = sorted(x for x in set(d_all.distribution) if x.startswith("zipf") and "hot_first" not in x)[0]
            shown = [
                ("cpu_gather", zipf),
                ("cpu_gather_pipelined", zipf),
                ("torch_uva_sorted", zipf),
                ("sorted", zipf),
                ("hot_cache", zipf),
                ("split", zipf),
                ("sorted", f"{zipf}-hot_first"),
                ("hot_cache", f"{zipf}-hot_first"),
            ]
        for variant, distribution in shown:
            d = d_all[(d_all.variant == variant) & (d_all.distribution == distribution)]
            if not d.empty:
                hot = distribution.endswith("hot_first")
                errorbars(
                    ax,
                    d.assign(gib=d.table_bytes / GiB),
                    "gib",
                    variant + (", hot-first" if hot else ""),
                    STYLE[variant][0],
                    ":" if hot else STYLE[variant][1],
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
        for variant in STYLE:
            d = data[data.variant == variant]
            if not d.empty:
                errorbars(ax, d, "batch_rows", variant, *STYLE[variant])
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
            errorbars(ax, d, "threads", f"{row_bytes} B, {variant}", row_colors[row_bytes], STYLE[variant][1])
        ax.set(xlabel="CPU threads", ylabel="GB/s", ylim=(0, None), title="CPU baselines by thread count")
    elif part == "thread_cap":
        for (row_bytes, d), color in zip(data.groupby("row_bytes"), ("tab:blue", "tab:orange", "tab:green")):
            stock = d[d.variant == "torch_uva"]
            d = d[d.variant == "vectorized"]
            full = d[d.max_threads == 0]
            d = d[d.max_threads > 0]
            if not stock.empty:
                ax.axhline(
                    stock["median"].iloc[0], color=color, linestyle="-.", linewidth=1, label=f"{row_bytes} B, torch_uva"
                )
            errorbars(ax, d, "max_threads", f"{row_bytes} B rows", color)
            if not full.empty:
                ax.axhline(
                    full["median"].iloc[0], color=color, linestyle=":", linewidth=1, label=f"{row_bytes} B, no cap"
                )
        ax.set(
            xscale="log",
            xlabel="thread cap of the gather",
            ylabel="GB/s",
            ylim=(0, None),
            title="vectorized gather with capped threads",
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
                STYLE[variant][1],
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
    ordered = sorted(shared_legend.items(), key=lambda item: LEGEND_ORDER.get(item[0].split(",")[0], len(LEGEND_ORDER)))
    columns = 7
    legend_rows = -(-len(ordered) // columns)
    fig.legend(
        [h for _, h in ordered],
        [label for label, _ in ordered],
        loc="lower center",
        ncol=columns,
        fontsize=8,
        frameon=False,
    )
bottom = (0.3 * legend_rows + 0.1) / fig.get_figheight()
fig.tight_layout(rect=(0, bottom, 1, 1))
Path(figure).parent.mkdir(parents=True, exist_ok=True)
fig.savefig(figure, dpi=130)
