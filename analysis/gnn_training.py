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
# over the faster of the CPU baselines (`cpu_gather`, and `cpu_gather_workers` where it ran) and the
# CPU cost, per dataset and model. Epoch times are medians
# of the timed epochs; bars span the interquartile range.

# %% tags=["parameters"]
machine = "local"
scale = "cpu"
figure = "paper_figs/local/gnn_training-cpu.png"
summary = "paper_figs/local/gnn_training-cpu.md"
results = {}  # topic -> its results files, passed by the workflow

# %%
from pathlib import Path

from analysis.common import load_results, machine_label, summarize
from workloads.gnn.pipelines import PIPELINES, ROLE
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
CPU_BASELINES = [p for p in PIPELINES if ROLE[p] == "baseline"]


def fastest_baseline(rows):
    """The faster CPU baseline's row among ``rows`` (one group's medians), or None."""
    found = rows[rows.variant.isin(CPU_BASELINES)]
    return None if found.empty else found.loc[found["median"].idxmin()]


# %% [markdown]
# ## Key numbers

# %%
lines = [
    f"# GNN training on `{machine}` at scale `{scale}`",
    "",
    machine_label(provenance),
    "",
    "| dataset (nodes, edges) | model | pipeline | epoch s | x fastest CPU baseline | x all_in_gpu | CPU core-s/epoch "
    "| val acc |",
    "|---|---|---|---|---|---|---|---|",
]
for (dataset, model, layers, fanouts), g in epoch.groupby(["dataset", "model", "layers", "fanouts"]):
    fastest = fastest_baseline(g)
    top = g[g.variant == "all_in_gpu"]["median"]
    for variant in [v for v in PIPELINES if v in set(g.variant)]:
        row = g[g.variant == variant].iloc[0]
        c = cpu[(cpu.dataset == dataset) & (cpu.model == model) & (cpu.fanouts == fanouts) & (cpu.variant == variant)][
            "median"
        ]
        a = acc[(acc.dataset == dataset) & (acc.model == model) & (acc.fanouts == fanouts) & (acc.variant == variant)][
            "median"
        ]
        speedup = f"{fastest['median'] / row['median']:.2f}" if fastest is not None else ""
        vs_top = f"{row['median'] / top.iloc[0]:.2f}" if not top.empty else ""
        lines.append(
            f"| {dataset} ({row.nodes:,}, {row.edges:,}) | {model} {layers}L {fanouts} | {variant} | "
            f"{row['median']:.3f} | {speedup} | {vs_top} | {c.iloc[0]:.2f} | {a.iloc[0]:.3f} |"
        )
lines += [
    "",
    "x fastest CPU baseline: the epoch time of the faster of "
    + " and ".join(f"`{b}`" for b in CPU_BASELINES)
    + " (those that ran) over the pipeline's, per dataset and model.",
]
Path(summary).parent.mkdir(parents=True, exist_ok=True)
Path(summary).write_text("\n".join(lines) + "\n")
print("\n".join(lines))

# %% [markdown]
# ## Figure: the training speedup per dataset, where the epoch goes, and the CPU it costs
#
# One group per dataset (and model, where several ran), one bar per pipeline in its colour. The
# phases (sampling, feature gathering and transfer, training) were timed in separate epochs with
# a device sync between them, which adds time; the split is drawn as their shares of the epoch
# time measured without syncs, so a stack is exactly as tall as the epoch.

# %%
from matplotlib.patches import Patch

from analysis import style

runs = sorted(
    set(zip(epoch.dataset, epoch.model, epoch.layers, epoch.fanouts)),
    key=lambda r: epoch[epoch.dataset == r[0]].edges.iloc[0],
)
# Phases in greys (a colour is a pipeline's): the bar's outline says whose epoch it is.
PHASE_COLOURS = {"sample": "#ffffff", "gather": "#737373", "train": "#d9d9d9"}
PHASE_HATCHES = {"sample": "...", "gather": "", "train": ""}
PHASE_NAMES = {"sample": "sampling", "gather": "feature gather + transfer", "train": "training"}
variants = [v for v in PIPELINES if v in set(epoch.variant)]
fig, (ax_speed, ax_time, ax_cpu) = style.panels(3, cols=3, width=6.2, height=4.2)
bar = 0.8 / len(variants)
short = {d: d.removeprefix("ogbn-") for d, *_ in runs}
run_labels = [short[d] if len(runs) == len(short) else f"{short[d]}\n{m}, {n} layers" for d, m, n, _ in runs]
for i, (dataset, model, _layers, fanouts) in enumerate(runs):
    sel = lambda d: d[(d.dataset == dataset) & (d.model == model) & (d.fanouts == fanouts)]  # noqa: E731
    e, p, c = sel(epoch), sel(phases), sel(cpu)
    fastest = fastest_baseline(e)
    base = e.iloc[0:0]["median"] if fastest is None else e[e.variant == fastest.variant]["median"]
    for j, variant in enumerate(variants):
        x = i + (j - (len(variants) - 1) / 2) * bar
        row = e[e.variant == variant]
        if row.empty:
            continue
        median, q25, q75 = row[["median", "q25", "q75"]].iloc[0]
        if not base.empty:
            speedup = base.iloc[0] / median
            ax_speed.bar(x, speedup, bar, color=style.color(variant), label=style.readable(variant))
            # The range: the faster baseline's median over this pipeline's quartiles (epochs of one process).
            ax_speed.errorbar(
                x,
                speedup,
                yerr=[[speedup - base.iloc[0] / q75], [base.iloc[0] / q25 - speedup]],
                color="#333333",
                capsize=2,
                elinewidth=0.8,
                fmt="none",
            )
            ax_speed.annotate(
                f"{speedup:.2f}",
                (x, speedup),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=6.5,
                rotation=90,
            )
        shares = {ph: p[(p.variant == variant) & (p.phase == ph)]["median"].sum() for ph in PHASE_COLOURS}
        total = sum(shares.values())
        bottom = 0.0
        for ph, value in shares.items():
            height = median * value / total if total else 0.0
            ax_time.bar(
                x,
                height,
                bar,
                bottom=bottom,
                color=PHASE_COLOURS[ph],
                hatch=PHASE_HATCHES[ph],
                edgecolor=style.color(variant),
                linewidth=1.5,
            )
            bottom += height
        ax_time.errorbar(
            x, median, yerr=[[median - q25], [q75 - median]], color="#333333", capsize=2, elinewidth=0.8, fmt="none"
        )
        ax_cpu.bar(x, c[c.variant == variant]["median"].iloc[0], bar, color=style.color(variant))
for ax in (ax_speed, ax_time, ax_cpu):
    ax.set_xticks(range(len(runs)), run_labels)
    ax.grid(axis="x", visible=False)
style.reference_line(ax_speed, 1.0, "faster CPU baseline", kind="parity")
style.reference_line(ax_speed, 1.6, "paper: up to 1.6x", kind="target")
ax_speed.margins(y=0.15)
ax_speed.set(
    ylabel="speedup over the faster CPU baseline",
    title="Epoch-time speedup per dataset\n(whiskers: interquartile range)",
)
ax_time.set(
    ylabel="epoch time (s)", title="Where an epoch goes: phase shares of the epoch\n(bar outline: the pipeline)"
)
ax_cpu.set(ylabel="CPU time per epoch (core-seconds)", title="CPU cost per epoch")
entries = style.collect_legend([ax_speed])
entries |= {
    f"phase: {PHASE_NAMES[ph]}": Patch(facecolor=c, hatch=PHASE_HATCHES[ph], edgecolor="#333333")
    for ph, c in PHASE_COLOURS.items()
}
style.legend_below(fig, entries, columns=4)
what = {(m, layers, f) for _, m, layers, f in runs}
setup = "; ".join(f"{m}, {layers} layers, fan-out {f}" for m, layers, f in sorted(what))
style.title(
    fig,
    f"PyTorch-Direct in minibatch GNN training ({setup}; synthetic graphs with the datasets' statistics)",
    machine_label(provenance),
)
style.save(fig, figure)
