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
# # Machine ceilings
#
# The physical limits of one machine, measured by `workloads.ceilings`: PCIe copies, GPU
# zero-copy reads of pinned host memory, HBM copy, matrix-multiply rate, disk with O_DIRECT and
# host memcpy. Every later figure is compared against these. Each point is the median of the
# repetitions; bars span the interquartile range.

# %% tags=["parameters"]
machine = "local"
scale = "cpu"
figure = "paper_figs/local/ceilings-cpu.png"
summary = "paper_figs/local/ceilings-cpu.md"
results = {}  # topic -> its results files, passed by the workflow

# %%
from pathlib import Path

from analysis.common import errorbars, load_results, machine_label, summarize
from workloads.ceilings.schema import SCHEMA

frame, provenance = load_results(results["ceilings"], SCHEMA)
probes = set(frame["part"])
GiB, MiB = 1 << 30, 1 << 20
print(machine_label(provenance))
print(sorted(probes))

# %% [markdown]
# ## Summary table
# Median bandwidths (GB/s = 10^9 B/s) and rates for the headline configurations.

# %%
bw = summarize(
    frame,
    "bandwidth",
    [
        "part",
        "variant",
        "device",
        "host_memory",
        "size_bytes",
        "table_bytes",
        "granularity_bytes",
        "block_bytes",
        "threads",
    ],
)
# Zero-copy read panels show driver-allocated pinned memory; the allocation panel compares.
uva_all = bw[bw.part == "uva_read"]
bw = bw[(bw.part != "uva_read") | (bw.host_memory == "pinned")]
rate = summarize(frame, "flop_rate", ["part", "variant", "device", "matrix_dim"])
lines = [
    f"# Ceilings of `{machine}` at scale `{scale}`",
    "",
    machine_label(provenance),
    "",
    "| what | configuration | median | IQR |",
    "|---|---|---|---|",
]


def add_line(what, config, row, unit):
    lines.append(f"| {what} | {config} | {row['median']:.3g} {unit} | {row['q25']:.3g} to {row['q75']:.3g} |")


def threads(count) -> str:
    return f"{count} thread" + "s" * (count != 1)


if "pcie_copy" in probes:
    largest = bw[bw.part == "pcie_copy"].size_bytes.max()
    for _, r in bw[(bw.part == "pcie_copy") & (bw.size_bytes == largest)].iterrows():
        add_line(f"PCIe copy {r.variant}", f"{r.host_memory}, {r.size_bytes / MiB:.0f} MiB", r, "GB/s")
if "uva_read" in probes:
    for _, r in uva_all.sort_values(["host_memory", "variant", "table_bytes", "granularity_bytes"]).iterrows():
        add_line(
            f"zero-copy read, {r.variant}, {r.host_memory}",
            f"{r.granularity_bytes} B rows, {r.table_bytes / GiB:g} GiB table",
            r,
            "GB/s",
        )
if "hbm_copy" in probes:
    for _, r in bw[bw.part == "hbm_copy"].iterrows():
        add_line("HBM copy (read+write)", f"{r.size_bytes / MiB:.0f} MiB", r, "GB/s")
for _, r in rate.iterrows():
    add_line(f"matmul {r.variant}", f"{r.device}, n={r.matrix_dim}", r, "TFLOP/s")
for _, r in bw[bw.part == "disk"].iterrows():
    add_line(f"disk {r.variant} (O_DIRECT)", f"{r.block_bytes / MiB:g} MiB requests, {threads(r.threads)}", r, "GB/s")
for _, r in bw[bw.part == "host_memcpy"].iterrows():
    add_line("host memcpy (read+write)", f"{r.size_bytes / MiB:.0f} MiB, {threads(r.threads)}", r, "GB/s")
Path(summary).parent.mkdir(parents=True, exist_ok=True)
Path(summary).write_text("\n".join(lines) + "\n")
print("\n".join(lines))

# %% [markdown]
# ## Figure
#
# The headline: PCIe copies, the GPU's memory and matrix multiply against its datasheet (where the
# suite knows the GPU), zero-copy reads by row and table size, the disk and host memory copies.
# Supporting figure: contiguous zero-copy reads and reads by host allocation (`-zero_copy`).

# %%
from matplotlib.lines import Line2D

from analysis import style

# Datasheet peaks per GPU (NVIDIA's H200 datasheet, SXM form, dense math; the NVL card has the same
# memory bandwidth and lower math peaks): a GPU not listed gets no datasheet comparison.
# PCIe 5.0 x16: 32 GT/s x 16 lanes with 128b/130b coding, per direction.
VENDOR_PEAKS = {
    "H200": {"hbm": 4.8, "fp32": 67.0, "tf32": 494.7, "bf16": 989.5, "pcie": 63.0, "source": "H200 SXM datasheet"},
}
gpu_names = [g["name"] for record in provenance for g in record["machine"]["gpus"]]
peaks = next((v for k, v in VENDOR_PEAKS.items() for name in gpu_names if k in name), {})
allocations = sorted(set(uva_all.host_memory)) if "uva_read" in probes else []

# Colours here mean sizes, thread counts and copy directions, never a gather variant: none of them
# is a colour of style.VARIANT_STYLE. Ordered quantities (row size, threads) take a dark-to-light
# ramp, so that their order reads off the colour; the marker repeats the row size for lines that
# coincide.
SIZE_RAMP = ["#35306f", "#3c4f8a", "#2a788e", "#1f9f88", "#63c05a", "#b5de2b"]
SIZE_MARKERS = ["o", "s", "^", "D", "v", "P"]
THREAD_RAMP = ["#b5de2b", "#1f9f88", "#35306f"]  # few threads light, many dark
DISK_LOOKS = {"write": ("-", "o"), "overwrite": ("--", "s"), "read": (":", "^")}
DISK_WORDS = {"write": "write (new file)", "overwrite": "overwrite (existing file)", "read": "read"}
DIRECTION_COLOURS = {"h2d": "#7570b3", "d2h": "#cd853f"}
MEMORY_LOOKS = {"pinned": ("-", "o", "full"), "pageable": ("--", "s", "none")}  # line, marker, fill
ALLOCATION_LOOKS = {"pinned": ("-", "o"), "registered": ("--", "s"), "registered_thp": (":", "^")}
ALLOCATION_WORDS = {
    "pinned": "driver-pinned (cudaHostAlloc)",
    "registered": "registered (cudaHostRegister)",
    "registered_thp": "registered, 2 MiB huge pages",
}
BAR_COLOUR = "#4f6d7a"
row_sizes = sorted(set(uva_all.granularity_bytes)) if "uva_read" in probes else []


def size_look(row_bytes):
    """(colour, marker) of a row size: its place among the measured row sizes."""
    i = row_sizes.index(row_bytes) if row_bytes in row_sizes else len(row_sizes)
    return SIZE_RAMP[i % len(SIZE_RAMP)], SIZE_MARKERS[i % len(SIZE_MARKERS)]


def legend_under(ax, columns=3, handles=None, title=None) -> None:
    """The panel's legend under its x label, so that no legend widens a column; ``title`` (a note
    on the lines, e.g. which coincide) heads it."""
    kwargs = {"handles": handles} if handles else {}
    ax.legend(
        **kwargs,
        fontsize=7,
        title=title or None,
        title_fontsize=7,
        ncol=columns,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.2),
        frameon=False,
        handlelength=3.0,  # long enough that a dashed or dotted line's pattern shows in its key
    )


def coinciding(curves: dict, tolerance=0.03) -> list[list]:
    """Groups (two or more) of ``curves`` (label -> Series over the same x) that agree within
    ``tolerance`` at every x: lines drawn on top of each other, which the panel says in words."""
    groups = []
    for label, values in curves.items():
        for group in groups:
            first = curves[group[0]]
            if ((values - first).abs() <= tolerance * first.abs()).all():
                group.append(label)
                break
        else:
            groups.append([label])
    return [g for g in groups if len(g) > 1]


def note(ax, text, y=0.45) -> None:
    """A line of words inside the panel, where its lines leave room."""
    ax.text(0.5, y, text, transform=ax.transAxes, ha="center", va="center", fontsize=7.5, color="#444444")


def coinciding_words(curves: dict, unit="GB/s") -> str:
    """Words for the lines of ``curves`` drawn on top of each other, or "" where none are."""
    words = []
    for group in coinciding(curves):
        level = sum(curves[g].median() for g in group) / len(group)
        names = f"all {len(group)} lines" if len(group) == len(curves) else ", ".join(group[:-1]) + f" and {group[-1]}"
        words.append(f"{names} lie on top of each other (about {level:.0f} {unit})")
    return "\n".join(words)


def allocation_words(data) -> str:
    """How far apart the host allocations' reads are, at their widest (same row and table size)."""
    spread = data.groupby(["granularity_bytes", "table_bytes"])["median"].agg(lambda m: m.max() / m.min() - 1)
    if len(set(data.host_memory)) < 2 or spread.empty:
        return ""
    return f"the {len(set(data.host_memory))} allocations differ by at most {100 * spread.max():.0f}%"


def row_size_curves(ax, data) -> dict:
    """One line per row size over table size; returns label -> medians for ``coinciding_words``."""
    curves = {}
    for g, d in data.groupby("granularity_bytes"):
        d = d.assign(gib=d.table_bytes / GiB)
        colour, marker = size_look(g)
        errorbars(ax, d, "gib", f"{g} B rows", colour, marker=marker, markersize=4)
        curves[f"{g} B"] = d.set_index("gib")["median"].sort_index()
    return curves


panels = [
    p
    for p in (
        "pcie_copy",
        "device",
        "uva_read:random",
        "uva_read:sorted",
        "uva_read:contiguous",
        "uva_alloc:random",
        "uva_alloc:sorted",
        "hbm_copy",
        "matmul",
        "disk",
        "host_memcpy",
    )
    if p.split(":")[0] in probes or (p.startswith("uva_alloc") and len(allocations) > 1) or p == "device"
]
pinned_h2d = None
if "pcie_copy" in probes:
    pc = bw[bw.part == "pcie_copy"]
    largest = pc.size_bytes.max()
    pinned_h2d = pc[(pc.variant == "h2d") & (pc.host_memory == "pinned") & (pc.size_bytes == largest)]["median"].iloc[0]


def pinned_copy_line(ax) -> None:
    if pinned_h2d is not None:
        style.reference_line(ax, pinned_h2d, "pinned\nH2D copy", "ceiling")


def bars(ax, labels, data, scale=1.0) -> None:
    ax.bar(
        labels,
        data["median"] / scale,
        yerr=[(data["median"] - data.q25) / scale, (data.q75 - data["median"]) / scale],
        capsize=3,
        color=BAR_COLOUR,
    )


def draw(ax, panel) -> None:
    probe, _, order = panel.partition(":")
    if probe == "pcie_copy":
        for (variant, memory), d in pc.groupby(["variant", "host_memory"]):
            linestyle, marker, fill = MEMORY_LOOKS.get(memory, ("-.", "D", "full"))
            colour = DIRECTION_COLOURS.get(variant, "#444444")
            d = d.assign(mib=d.size_bytes / MiB)
            errorbars(ax, d, "mib", f"{variant}, {memory}", colour, linestyle, marker, markersize=4, fillstyle=fill)
        if peaks.get("pcie"):
            style.reference_line(ax, peaks["pcie"], f"PCIe 5.0 x16\npeak, {peaks['pcie']:g} GB/s", "ceiling")
        ax.set(
            xscale="log",
            xlabel="transfer size (MiB, log scale)",
            ylabel="bandwidth (GB/s)",
            ylim=(0, None),
            title="PCIe copies (cudaMemcpy; h2d: host to device)",
        )
        style.log_ticks(ax.xaxis, grouped=True)  # plain numbers, not powers of ten
        legend_under(ax, columns=4)
    elif probe == "uva_read":
        curves = row_size_curves(ax, bw[(bw.part == "uva_read") & (bw.variant == order)])
        pinned_copy_line(ax)
        ax.set(
            xscale="log",
            xlabel="table size (GiB, log scale; driver-pinned host memory)",
            ylabel="bandwidth (GB/s)",
            title=f"GPU zero-copy reads, {order} rows",
            ylim=(0, None),
        )
        style.log_ticks(ax.xaxis, grouped=True)  # plain numbers, not powers of ten
        legend_under(ax, title=coinciding_words(curves))
    elif probe == "uva_alloc":
        # Colour is the row size as in the other zero-copy panels; line and marker the allocation.
        d_all = uva_all[uva_all.variant == order]
        shown = [g for g in (512, 2048) if (d_all.granularity_bytes == g).any()]
        for (allocation, g), d in d_all[d_all.granularity_bytes.isin(shown)].groupby(
            ["host_memory", "granularity_bytes"]
        ):
            linestyle, marker = ALLOCATION_LOOKS.get(allocation, ("-.", "D"))
            d = d.assign(gib=d.table_bytes / GiB)
            errorbars(ax, d, "gib", None, size_look(g)[0], linestyle, marker, markersize=4, fillstyle="none")
        pinned_copy_line(ax)
        note(ax, allocation_words(d_all[d_all.granularity_bytes.isin(shown)]), y=0.08)
        ax.set(
            xscale="log",
            xlabel="table size (GiB, log scale)",
            ylabel="bandwidth (GB/s)",
            ylim=(0, None),
            title=f"Zero-copy reads by host allocation, {order} rows",
        )
        style.log_ticks(ax.xaxis, grouped=True)  # plain numbers, not powers of ten
        handles = [Line2D([], [], color=size_look(g)[0], linewidth=3, label=f"{g} B rows") for g in shown]
        handles += [
            Line2D([], [], color="#444444", linestyle=ALLOCATION_LOOKS.get(a, ("-.", "D"))[0],
                   marker=ALLOCATION_LOOKS.get(a, ("-.", "D"))[1], fillstyle="none",
                   label=ALLOCATION_WORDS.get(a, a))
            for a in allocations
        ]  # fmt: skip
        legend_under(ax, columns=2, handles=handles)
    elif probe == "device" and peaks:
        # The GPU's own ceilings as shares of the datasheet's: one bar each, the value beside it.
        shown = []
        for r in bw[bw.part == "hbm_copy"].sort_values("size_bytes").tail(1).itertuples():
            shown.append((f"HBM copy, {r.size_bytes / MiB:.0f} MiB", r.median / 1e3, peaks["hbm"], "TB/s"))
        for r in rate[rate.device == "cuda"].itertuples():
            if r.variant in peaks:
                shown.append((f"matmul {r.variant}, n={r.matrix_dim}", r.median, peaks[r.variant], "TFLOP/s"))
        for i, (_text, value, peak, unit) in enumerate(shown):
            ax.barh(i, value / peak, color=BAR_COLOUR)
            ax.annotate(
                f"{value:.3g} of {peak:g} {unit}",
                (value / peak, i),
                xytext=(4, 0),
                textcoords="offset points",
                va="center",
                fontsize=7.5,
            )
        ax.set_yticks(range(len(shown)), [t for t, *_ in shown])
        ax.invert_yaxis()
        ax.axvline(1.0, color="#444444", linestyle=":", linewidth=1)
        ax.annotate(
            "datasheet peak",
            (1.0, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(4, -2),
            textcoords="offset points",
            va="top",
            fontsize=7.5,
            color="#444444",
        )
        ax.set(
            xlim=(0, 1.45),
            xlabel=f"share of the datasheet peak ({peaks['source']})",
            title="GPU memory and matrix multiply against the datasheet",
        )
        ax.grid(axis="y", visible=False)
    elif probe == "hbm_copy":
        d = bw[bw.part == "hbm_copy"]
        bars(ax, [f"{s / MiB:.0f} MiB" for s in d.size_bytes], d, scale=1e3)
        ax.set(ylabel="TB/s (bytes read + written)", title="HBM device-to-device copy")
    elif probe == "matmul":
        bars(ax, [f"{r.variant}\n({r.device}, n={r.matrix_dim})" for r in rate.itertuples()], rate)
        ax.set(ylabel="TFLOP/s", title="Dense matrix multiply (random inputs)")
    elif probe == "disk":
        d_all = bw[bw.part == "disk"]
        thread_counts = sorted(set(d_all.threads))
        colours = dict(zip(thread_counts, THREAD_RAMP[-len(thread_counts) :] if len(thread_counts) <= 3 else SIZE_RAMP))
        for (variant, threads), d in d_all.groupby(["variant", "threads"]):
            linestyle, marker = DISK_LOOKS.get(variant, ("-.", "D"))
            d = d.assign(mib=d.block_bytes / MiB)
            errorbars(ax, d, "mib", None, colours[threads], linestyle, marker, markersize=4)
        ax.set(
            xscale="log",
            xlabel="request size (MiB, log scale)",
            ylabel="bandwidth (GB/s)",
            ylim=(0, None),
            title=f"Disk, O_DIRECT sequential ({d_all.size_bytes.max() / MiB:.0f} MiB file)",
        )
        style.log_ticks(ax.xaxis, grouped=True)  # plain numbers, not powers of ten
        # The legend names the two encodings apart: colour the threads, line and marker the operation.
        handles = [
            Line2D([], [], color=colours[t], linewidth=3, label=f"{t} thread{'s' if t != 1 else ''}")
            for t in thread_counts
        ]
        handles += [
            Line2D([], [], color="#444444", linestyle=ls, marker=m, label=DISK_WORDS[v])
            for v, (ls, m) in DISK_LOOKS.items()
            if v in set(d_all.variant)
        ]
        legend_under(ax, columns=3, handles=handles)
    elif probe == "host_memcpy":
        d = bw[bw.part == "host_memcpy"].sort_values("threads")
        bars(ax, [str(t) for t in d.threads], d)
        ax.set(
            xlabel="CPU threads",
            ylabel="bandwidth (GB/s, bytes read + written)",
            title=f"Host memcpy ({d.size_bytes.max() / MiB:.0f} MiB)",
        )


def include(panel) -> bool:
    if panel == "device":
        return bool(peaks) and ("hbm_copy" in probes or not rate.empty)
    return not (peaks and panel in ("hbm_copy", "matmul"))  # in the datasheet panel instead


panels = [p for p in panels if include(p)]
SUPPORTING = {"uva_read:contiguous", "uva_alloc:random", "uva_alloc:sorted"}
for chosen, what in (
    ([p for p in panels if p not in SUPPORTING], None),
    ([p for p in panels if p in SUPPORTING], "zero_copy"),
):
    if not chosen:
        continue
    cols = 3 if len(chosen) == 3 else 2  # three panels in a row, not two above one
    fig, axes = style.panels(len(chosen), cols=cols, width=6.6 if cols == 2 else 5.2, height=4.4)
    for ax, panel in zip(axes, chosen):
        draw(ax, panel)
    style.title(
        fig,
        "Machine ceilings: what this machine's links, memories and math reach (medians, bars: interquartile range)",
        machine_label(provenance),
    )
    style.save(fig, figure, what)
