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
# # Minibatch GNN training: where each epoch's time goes
#
# Epoch time of each feeding pipeline (`workloads.gnn_training`), its breakdown, the speedup
# over the CPU-gather baseline and the CPU cost, per dataset and model. Epoch times are medians
# of the timed epochs; bars span the interquartile range.

# %% tags=["parameters"]
machine = "local"
scale = "cpu"
figure = "paper_figs/local/gnn_training-cpu.png"
summary = "paper_figs/local/gnn_training-cpu.md"
results = {}  # topic -> its results files, passed by the workflow

# %%
from pathlib import Path

from analysis.common import layout_with_title, load_results, machine_label, panel_grid, summarize
from workloads.gnn.pipelines import PIPELINES
from workloads.gnn_training.schema import SCHEMA

frame, provenance = load_results(results["gnn_training"], SCHEMA)
KEYS = ["dataset", "model", "layers", "fanouts", "variant", "nodes", "edges"]
epoch = summarize(frame, "epoch_time", KEYS)
cpu = summarize(frame, "cpu_time", KEYS)
phases = summarize(frame, "phase_time", KEYS + ["phase"])
acc = summarize(frame, "accuracy", KEYS)
# Tables and panels below are per dataset name: one graph size per name, or they would mix sizes.
sizes = epoch.groupby("dataset")[["nodes", "edges"]].nunique()
if (sizes > 1).any(axis=None):
    raise ValueError(
        f"results of one dataset at several graph sizes: {list(sizes[(sizes > 1).any(axis=1)].index)}; "
        "render them from separate results folders"
    )
print(machine_label(provenance))

# %% [markdown]
# ## Key numbers

# %%
lines = [
    f"# GNN training on `{machine}` at scale `{scale}`",
    "",
    machine_label(provenance),
    "",
    "| dataset (nodes, edges) | model | pipeline | epoch s | x cpu_gather | x all_in_gpu | CPU core-s/epoch "
    "| val acc |",
    "|---|---|---|---|---|---|---|---|",
]
for (dataset, model, layers, fanouts), g in epoch.groupby(["dataset", "model", "layers", "fanouts"]):
    base = g[g.variant == "cpu_gather"]["median"]
    top = g[g.variant == "all_in_gpu"]["median"]
    for variant in [v for v in PIPELINES if v in set(g.variant)]:
        row = g[g.variant == variant].iloc[0]
        c = cpu[(cpu.dataset == dataset) & (cpu.model == model) & (cpu.fanouts == fanouts) & (cpu.variant == variant)][
            "median"
        ]
        a = acc[(acc.dataset == dataset) & (acc.model == model) & (acc.fanouts == fanouts) & (acc.variant == variant)][
            "median"
        ]
        speedup = f"{base.iloc[0] / row['median']:.2f}" if not base.empty else ""
        vs_top = f"{row['median'] / top.iloc[0]:.2f}" if not top.empty else ""
        lines.append(
            f"| {dataset} ({row.nodes:,}, {row.edges:,}) | {model} {layers}L {fanouts} | {variant} | "
            f"{row['median']:.3f} | {speedup} | {vs_top} | {c.iloc[0]:.2f} | {a.iloc[0]:.3f} |"
        )
Path(summary).parent.mkdir(parents=True, exist_ok=True)
Path(summary).write_text("\n".join(lines) + "\n")
print("\n".join(lines))

# %% [markdown]
# ## Figure: one row per dataset

# %%
runs = sorted(set(zip(epoch.dataset, epoch.model, epoch.layers, epoch.fanouts)))
fig, axes = panel_grid(3 * len(runs), width=4.6, height=3.4, cols=3)
COLORS = {"sample": "tab:orange", "gather": "tab:blue", "train": "tab:green"}
for i, (dataset, model, layers, fanouts) in enumerate(runs):
    ax_time, ax_speed, ax_cpu = axes[3 * i : 3 * i + 3]
    sel = lambda d: d[(d.dataset == dataset) & (d.model == model) & (d.fanouts == fanouts)]  # noqa: E731
    e, p, c = sel(epoch), sel(phases), sel(cpu)
    variants = [v for v in PIPELINES if v in set(e.variant)]
    bottom = [0.0] * len(variants)
    for phase, color in COLORS.items():
        heights = [p[(p.variant == v) & (p.phase == phase)]["median"].sum() for v in variants]
        ax_time.bar(variants, heights, bottom=bottom, color=color, label=phase if i == 0 else None)
        bottom = [b + h for b, h in zip(bottom, heights)]
    medians = [e[e.variant == v]["median"].iloc[0] for v in variants]
    spread = [
        [m - e[e.variant == v]["q25"].iloc[0] for v, m in zip(variants, medians)],
        [e[e.variant == v]["q75"].iloc[0] - m for v, m in zip(variants, medians)],
    ]
    ax_time.errorbar(
        variants,
        medians,
        yerr=spread,
        fmt="k_",
        markersize=14,
        capsize=3,
        label="epoch time (timed without phase syncs)" if i == 0 else None,
    )
    ax_time.set(ylabel="s per epoch", title=f"{dataset}, {model} {layers} layers ({fanouts})")
    if "cpu_gather" in variants:
        base = medians[variants.index("cpu_gather")]
        bars = ax_speed.bar(variants, [base / m for m in medians], color="tab:purple")
        ax_speed.bar_label(bars, fmt="%.2fx", fontsize=7)
        ax_speed.margins(y=0.12)
        ax_speed.axhline(1, color="grey", linewidth=1)
        if "all_in_gpu" in variants:  # the gap to the upper bound, at a glance
            ax_speed.axhline(
                base / medians[variants.index("all_in_gpu")],
                color="tab:red",
                linestyle="--",
                linewidth=1,
                label="all_in_gpu" if i == 0 else None,
            )
    ax_speed.set(ylabel="speedup over cpu_gather", title="Epoch-time speedup")
    ax_cpu.bar(variants, [c[c.variant == v]["median"].iloc[0] for v in variants], color="tab:gray")
    ax_cpu.set(ylabel="CPU core-s per epoch", title="CPU cost")
    for ax in (ax_time, ax_speed, ax_cpu):
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
        ax.grid(alpha=0.3, axis="y")
if runs:
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7, loc="lower right")
layout_with_title(
    fig,
    f"Minibatch GNN training: {machine}, scale '{scale}' (measured; synthetic graphs with the "
    f"datasets' statistics, scaled)\n{machine_label(provenance)}",
)
Path(figure).parent.mkdir(parents=True, exist_ok=True)
fig.savefig(figure, dpi=120)
