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
    add_line(f"disk {r.variant} (O_DIRECT)", f"{r.block_bytes / MiB:g} MiB requests, {r.threads} threads", r, "GB/s")
for _, r in bw[bw.part == "host_memcpy"].iterrows():
    add_line("host memcpy (read+write)", f"{r.size_bytes / MiB:.0f} MiB, {r.threads} threads", r, "GB/s")
Path(summary).parent.mkdir(parents=True, exist_ok=True)
Path(summary).write_text("\n".join(lines) + "\n")
print("\n".join(lines))

# %% [markdown]
# ## Figure
#
# The headline: PCIe copies, zero-copy reads, the GPU's memory and matrix multiply against its
# datasheet (where the suite knows the GPU), the disk and host memory copies. Supporting figure:
# contiguous zero-copy reads and reads by host allocation (`-zero_copy`).

# %%
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
panels = [
    p
    for p in (
        "pcie_copy",
        "uva_read:random",
        "uva_read:sorted",
        "uva_read:contiguous",
        "uva_alloc",
        "device",
        "hbm_copy",
        "matmul",
        "disk",
        "host_memcpy",
    )
    if p.split(":")[0] in probes or (p == "uva_alloc" and len(allocations) > 1) or p == "device"
]
pinned_h2d = None
if "pcie_copy" in probes:
    pc = bw[bw.part == "pcie_copy"]
    largest = pc.size_bytes.max()
    pinned_h2d = pc[(pc.variant == "h2d") & (pc.host_memory == "pinned") & (pc.size_bytes == largest)]["median"].iloc[0]


def draw(ax, panel) -> None:
    probe, _, order = panel.partition(":")
    if probe == "pcie_copy":
        for (variant, memory), d in pc.groupby(["variant", "host_memory"]):
            errorbars(
                ax,
                d.assign(mib=d.size_bytes / MiB),
                "mib",
                f"{variant}, {memory}",
                linestyle="-" if memory == "pinned" else ":",
            )
        if peaks.get("pcie"):
            ax.axhline(
                peaks["pcie"], color="#444444", linestyle=":", label=f"PCIe 5.0 x16 peak ({peaks['pcie']:g} GB/s)"
            )
        ax.set(xscale="log", xlabel="transfer size (MiB)", ylabel="bandwidth (GB/s)", title="PCIe copies (cudaMemcpy)")
    elif probe == "uva_read":
        d_all = bw[(bw.part == "uva_read") & (bw.variant == order)]
        for g, d in d_all.groupby("granularity_bytes"):
            errorbars(ax, d.assign(gib=d.table_bytes / GiB), "gib", f"{g} B rows")
        if pinned_h2d is not None:
            ax.axhline(pinned_h2d, color="grey", linestyle="--", linewidth=1, label="pinned H2D copy")
        ax.set(
            xscale="log",
            xlabel="table size (GiB, pinned host memory)",
            ylabel="bandwidth (GB/s)",
            title=f"GPU zero-copy reads, {order} rows",
            ylim=(0, None),
        )
    elif probe == "uva_alloc":
        for (allocation, order), d in uva_all[uva_all.variant.isin(["random", "sorted"])].groupby(
            ["host_memory", "variant"]
        ):
            for g, dash in ((512, "-"), (2048, "--")):
                dg = d[d.granularity_bytes == g]
                if not dg.empty:
                    errorbars(
                        ax,
                        dg.assign(gib=dg.table_bytes / GiB),
                        "gib",
                        f"{allocation}, {order}, {g} B",
                        linestyle=dash if order == "random" else ":",
                    )
        ax.set(
            xscale="log",
            xlabel="table size (GiB)",
            ylabel="bandwidth (GB/s)",
            ylim=(0, None),
            title="Zero-copy reads by host allocation\n(solid 512 B random, dashed 2 KiB random, dotted sorted)",
        )
        ax.legend(fontsize=6, ncol=1, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    elif probe == "device" and peaks:
        # The GPU's own ceilings as shares of the datasheet's: one bar each, the value beside it.
        shown = []
        for r in bw[bw.part == "hbm_copy"].sort_values("size_bytes").tail(1).itertuples():
            shown.append((f"HBM copy, {r.size_bytes / MiB:.0f} MiB", r.median / 1e3, peaks["hbm"], "TB/s"))
        for r in rate[rate.device == "cuda"].itertuples():
            if r.variant in peaks:
                shown.append((f"matmul {r.variant}, n={r.matrix_dim}", r.median, peaks[r.variant], "TFLOP/s"))
        for i, (_text, value, peak, unit) in enumerate(shown):
            ax.barh(i, value / peak, color="#4d4d4d")
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
        ax.set(
            xlim=(0, 1.45),
            xlabel=f"share of the datasheet peak ({peaks['source']})",
            title="GPU memory and matrix multiply against the datasheet",
        )
        ax.grid(axis="y", visible=False)
    elif probe == "hbm_copy":
        d = bw[bw.part == "hbm_copy"]
        ax.bar(
            [f"{s / MiB:.0f} MiB" for s in d.size_bytes],
            d["median"] / 1e3,
            yerr=[(d["median"] - d.q25) / 1e3, (d.q75 - d["median"]) / 1e3],
            capsize=3,
        )
        ax.set(ylabel="TB/s (bytes read + written)", title="HBM device-to-device copy")
    elif probe == "matmul":
        ax.bar(
            [f"{r.variant}\n({r.device}, n={r.matrix_dim})" for r in rate.itertuples()],
            rate["median"],
            yerr=[rate["median"] - rate.q25, rate.q75 - rate["median"]],
            capsize=3,
        )
        ax.set(ylabel="TFLOP/s", title="Dense matrix multiply (random inputs)")
    elif probe == "disk":
        d_all = bw[bw.part == "disk"]
        for (variant, threads), d in d_all.groupby(["variant", "threads"]):
            errorbars(
                ax,
                d.assign(mib=d.block_bytes / MiB),
                "mib",
                f"{variant}, {threads} thr",
                linestyle={"write": "-", "overwrite": "--", "read": ":"}[variant],
            )
        ax.set(
            xscale="log",
            xlabel="request size (MiB)",
            ylabel="bandwidth (GB/s)",
            ylim=(0, None),
            title=f"Disk, O_DIRECT sequential ({d_all.size_bytes.max() / MiB:.0f} MiB file)",
        )
        ax.legend(fontsize=6.5, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    elif probe == "host_memcpy":
        d = bw[bw.part == "host_memcpy"].sort_values("threads")
        ax.bar([str(t) for t in d.threads], d["median"], yerr=[d["median"] - d.q25, d.q75 - d["median"]], capsize=3)
        ax.set(
            xlabel="threads",
            ylabel="bandwidth (GB/s, bytes read + written)",
            title=f"Host memcpy ({d.size_bytes.max() / MiB:.0f} MiB)",
        )
    if ax.get_legend() is None and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))  # beside the panel, off the data


def include(panel) -> bool:
    if panel == "device":
        return bool(peaks) and ("hbm_copy" in probes or not rate.empty)
    return not (peaks and panel in ("hbm_copy", "matmul"))  # in the datasheet panel instead


panels = [p for p in panels if include(p)]
SUPPORTING = {"uva_read:contiguous", "uva_alloc"}
for chosen, what in (
    ([p for p in panels if p not in SUPPORTING], None),
    ([p for p in panels if p in SUPPORTING], "zero_copy"),
):
    if not chosen:
        continue
    fig, axes = style.panels(len(chosen), cols=2, width=6.6, height=3.9)
    for ax, panel in zip(axes, chosen):
        draw(ax, panel)
    style.title(
        fig,
        "Machine ceilings: what this machine's links, memories and math reach (medians, bars: interquartile range)",
        machine_label(provenance),
    )
    style.save(fig, figure, what)
