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
# # Data-parallel GNN training from one shared feature table
#
# Epoch time of each pipeline at each world size (`workloads.gnn_multi_gpu`: one rank per GPU,
# or per CPU process on a machine without one), the scaling efficiency T(1) / (N T(N)) (each
# rank keeps its batch size, so N ranks take 1/N of the steps), and the feature bytes each rank
# moved per second of epoch. Epoch times are medians of the timed epochs; bars span the
# interquartile range.

# %% tags=["parameters"]
machine = "local"
scale = "cpu"
figure = "paper_figs/local/gnn_multi_gpu-cpu.png"
summary = "paper_figs/local/gnn_multi_gpu-cpu.md"
results = {}  # topic -> its results files, passed by the workflow

# %%
from pathlib import Path

from analysis.common import errorbars, layout_with_title, load_results, machine_label, panel_grid, summarize
from workloads.gnn_multi_gpu.launch import PIPELINES
from workloads.gnn_multi_gpu.schema import SCHEMA

frame, provenance = load_results(results["gnn_multi_gpu"], SCHEMA)
KEYS = ["dataset", "model", "layers", "fanouts", "variant", "device", "world_size"]
epoch = summarize(frame, "epoch_time", KEYS)
cpu = summarize(frame, "cpu_time", KEYS)
per_rank = summarize(frame, "bandwidth", KEYS)  # over ranks and epochs
acc = summarize(frame, "accuracy", KEYS)
one = epoch[epoch.world_size == 1].set_index(["dataset", "model", "fanouts", "variant"])["median"]


def efficiency(row) -> float:
    key = (row.dataset, row.model, row.fanouts, row.variant)
    return one[key] / (row.world_size * row["median"]) if key in one.index else float("nan")


epoch["efficiency"] = epoch.apply(efficiency, axis=1)
print(machine_label(provenance))

# %% [markdown]
# ## Key numbers

# %%
lines = [
    f"# Multi-GPU GNN training on `{machine}` at scale `{scale}`",
    "",
    machine_label(provenance),
    "",
    "| dataset | model | pipeline | ranks | epoch s | scaling efficiency | per-rank GB/s | CPU core-s/epoch "
    "| val acc |",
    "|---|---|---|---|---|---|---|---|---|",
]


def value_of(table, row, digits: int) -> str:
    """The median of ``table`` for the same run as ``row``, or blank where it was not measured."""
    match = table[
        (table.dataset == row.dataset)
        & (table.model == row.model)
        & (table.fanouts == row.fanouts)
        & (table.variant == row.variant)
        & (table.world_size == row.world_size)
    ]["median"]
    return f"{match.iloc[0]:.{digits}f}" if not match.empty else ""


for _, row in epoch.sort_values(["dataset", "model", "variant", "world_size"]).iterrows():
    lines.append(
        f"| {row.dataset} | {row.model} {row.layers}L {row.fanouts} | {row.variant} | {row.world_size} | "
        f"{row['median']:.3f} | {row.efficiency:.2f} | {value_of(per_rank, row, 1)} | "
        f"{value_of(cpu, row, 2)} | {value_of(acc, row, 3)} |"
    )
Path(summary).parent.mkdir(parents=True, exist_ok=True)
Path(summary).write_text("\n".join(lines) + "\n")
print("\n".join(lines))

# %% [markdown]
# ## Figure: one row per dataset and model

# %%
runs = sorted(set(zip(epoch.dataset, epoch.model, epoch.layers, epoch.fanouts)))
fig, axes = panel_grid(3 * len(runs), width=4.6, height=3.4, cols=3)
for i, (dataset, model, layers, fanouts) in enumerate(runs):
    ax_time, ax_eff, ax_bw = axes[3 * i : 3 * i + 3]
    sel = lambda d: d[(d.dataset == dataset) & (d.model == model) & (d.fanouts == fanouts)]  # noqa: E731
    for variant in [v for v in PIPELINES if v in set(sel(epoch).variant)]:
        errorbars(ax_time, sel(epoch)[sel(epoch).variant == variant], "world_size", variant)
        e = sel(epoch)[sel(epoch).variant == variant].sort_values("world_size")
        ax_eff.plot(e.world_size, e.efficiency, marker="o", label=variant)
        b = sel(per_rank)[sel(per_rank).variant == variant]
        if not b.empty:
            errorbars(ax_bw, b, "world_size", variant)
    if sel(per_rank).empty:
        ax_bw.text(
            0.5,
            0.5,
            "no PCIe transfers to measure\n(CPU ranks, or all-in-GPU only)",
            ha="center",
            va="center",
            transform=ax_bw.transAxes,
            fontsize=8,
            color="grey",
        )
    device = "GPUs" if (sel(epoch).device == "cuda").all() else "CPU processes"
    ax_time.set(
        xlabel=f"ranks ({device})", ylabel="s per epoch", title=f"{dataset}, {model} {layers} layers ({fanouts})"
    )
    ax_eff.axhline(1, color="grey", linewidth=1)
    ax_eff.set(xlabel="ranks", ylabel="T(1) / (N T(N))", title="Scaling efficiency", ylim=(0, 1.2))
    ax_bw.set(xlabel="ranks", ylabel="GB/s per rank", title="Feature bytes per rank per second")
    worlds = sorted(set(sel(epoch).world_size))
    if len(worlds) == 1:  # a one-GPU machine: the point is the baseline that others scale from
        ax_eff.text(
            0.5,
            0.25,
            "one world size measured on this machine:\nno scaling to show",
            ha="center",
            va="center",
            transform=ax_eff.transAxes,
            fontsize=8,
            color="grey",
        )
    for ax in (ax_time, ax_eff, ax_bw):
        ax.set_xscale("log", base=2)
        ax.set_xticks(worlds, [str(w) for w in worlds])
        ax.set_xlim(worlds[0] / 1.3, worlds[-1] * 1.3)
        ax.minorticks_off()
        ax.grid(alpha=0.3)
if runs:
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
layout_with_title(
    fig,
    f"Data-parallel GNN training, one shared feature table: {machine}, scale '{scale}' "
    f"(measured; synthetic graph)\n{machine_label(provenance)}",
)
Path(figure).parent.mkdir(parents=True, exist_ok=True)
fig.savefig(figure, dpi=120)
