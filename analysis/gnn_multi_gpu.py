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
from collections import Counter
from pathlib import Path

from analysis.common import load_results, machine_label, summarize
from analysis.doc_tables.gnn_training import pipeline_label
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


def measured_label(provenance) -> str:
    """Where and when it was measured, each kind of GPU named once with its count ("2x NVIDIA H200
    (driver ...)"), not once per GPU."""
    label = machine_label(provenance)
    gpus = [f"{g['name']} (driver {g['driver']})" for g in provenance[0]["machine"]["gpus"]]
    counted = ", ".join(f"{n}x {gpu}" if n > 1 else gpu for gpu, n in Counter(gpus).items())
    return label.replace(", ".join(gpus), counted, 1) if gpus else label


MEASURED = measured_label(provenance)
print(MEASURED)

# %% [markdown]
# ## Key numbers

# %%
lines = [
    f"# Multi-GPU GNN training on `{machine}` at scale `{scale}`",
    "",
    MEASURED,
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
# ## Figure: epoch time, scaling efficiency and per-rank feature bandwidth against the ranks
#
# On a machine that measured one world size there is nothing to scale: the figure is one compact
# panel per graph and model, each pipeline's epoch time at that size as a bar with its per-rank
# feature bandwidth written beside it, and its title says that no scaling was measured there.

# %%
from analysis import style

runs = sorted(set(zip(epoch.dataset, epoch.model, epoch.layers, epoch.fanouts)))
worlds_all = sorted(set(epoch.world_size))
on_gpus = (epoch.device == "cuda").all()
device = "GPUs" if on_gpus else "CPU processes"


def ranks_text(count: int) -> str:
    """The count with its unit: 1 GPU, 2 GPUs, 1 CPU process, ..."""
    one = "GPU" if on_gpus else "CPU process"
    return f"{count} {one if count == 1 else device}"


def run_title(dataset, model, layers, fanouts) -> str:
    return f"{dataset}, {model}, {layers} layers, fan-out {fanouts}"


def threads_note(dataset, model, fanouts) -> str:
    """The torch threads each rank trained with, per world size, from the results: a rank's threads
    are the host's cores split over its ranks, so scaling efficiency compares unequal budgets where
    they differ ("train threads per rank: 24 at 1 GPU, 8 at 2 GPUs; unequal budgets")."""
    if "train_threads" not in frame:  # results from before the thread count was recorded
        return ""
    mine = frame[(frame.dataset == dataset) & (frame.model == model) & (frame.fanouts == fanouts)]
    per_world = mine.dropna(subset=["train_threads"]).groupby("world_size").train_threads.unique()
    if per_world.empty:
        return ""
    counts = {world: "/".join(f"{t:g}" for t in sorted(threads)) for world, threads in per_world.items()}
    if len(set(counts.values())) == 1:
        return f"train threads per rank: {next(iter(counts.values()))} at every size"
    listed = ", ".join(f"{threads} at {ranks_text(world)}" for world, threads in counts.items())
    return f"train threads per rank: {listed}; unequal budgets"


def scaling_figure(chunk, what) -> None:
    with_bw = not per_rank.empty
    cols = 3 if with_bw else 2
    fig, axes = style.panels(cols * len(chunk), cols=cols, width=4.8, height=3.6)
    ranks = f"ranks ({device}), log scale"
    for i, (dataset, model, layers, fanouts) in enumerate(chunk):
        ax_time, ax_eff = axes[cols * i : cols * i + 2]
        ax_bw = axes[cols * i + 2] if with_bw else None
        sel = lambda d: d[(d.dataset == dataset) & (d.model == model) & (d.fanouts == fanouts)]  # noqa: E731
        for variant in [v for v in PIPELINES if v in set(sel(epoch).variant)]:
            e = sel(epoch)[sel(epoch).variant == variant].sort_values("world_size")
            colour, linestyle = style.style(variant)
            ax_time.errorbar(
                e.world_size,
                e["median"],
                yerr=[e["median"] - e.q25, e.q75 - e["median"]],
                color=colour,
                linestyle=linestyle,
                marker="o",
                capsize=2,
                label=pipeline_label(variant),
            )
            ax_eff.plot(e.world_size, e.efficiency, marker="o", color=colour, linestyle=linestyle)
            b = sel(per_rank)[sel(per_rank).variant == variant].sort_values("world_size")
            if ax_bw is not None and not b.empty:
                ax_bw.errorbar(
                    b.world_size,
                    b["median"],
                    yerr=[b["median"] - b.q25, b.q75 - b["median"]],
                    color=colour,
                    linestyle=linestyle,
                    marker="o",
                    capsize=2,
                )
        style.reference_line(ax_eff, 1.0, "linear", kind="parity")
        # From 0: a time axis cut above it would draw 1.6 s -> 1.1 s as a threefold drop.
        ax_time.set(
            xlabel=ranks, ylabel="epoch time (s)", ylim=(0, None), title=run_title(dataset, model, layers, fanouts)
        )
        ax_eff.set(
            xlabel=ranks,
            ylabel="scaling efficiency, T(1) / (N T(N))",
            ylim=(0, 1.2),
            title="Scaling efficiency\n" + threads_note(dataset, model, fanouts),
        )
        if ax_bw is not None:
            ax_bw.set(
                xlabel=ranks,
                ylabel="feature bandwidth per rank (GB/s)",
                ylim=(0, None),
                title="Feature bytes per rank per second",
            )
        for ax in [a for a in (ax_time, ax_eff, ax_bw) if a is not None]:
            ax.set_xscale("log", base=2)
            ax.set_xticks(worlds_all, [str(w) for w in worlds_all])
            ax.set_xlim(worlds_all[0] / 1.3, worlds_all[-1] * 1.3)
            ax.minorticks_off()
    style.legend_below(fig, style.collect_legend(axes), columns=5)
    sizes = f"{worlds_all[0]} to {ranks_text(worlds_all[-1])}"
    style.title(
        fig,
        f"Data-parallel GNN training on {sizes}, every rank reading one shared feature table in host memory "
        "(synthetic graph)",
        MEASURED,
    )
    style.save(fig, figure, what)


def bandwidth_note(variant, bandwidth) -> str:
    """What is written beside a pipeline's bar: its per-rank feature bandwidth, where it moved any."""
    if bandwidth is not None:
        return f"{bandwidth:.1f} GB/s of features per rank"
    return "features held on the GPU" if variant == "all_in_gpu" else ""


def one_size_figure() -> None:
    """One world size: per graph and model, a bar per pipeline, the size other machines scale from."""
    variants = [v for v in PIPELINES if v in set(epoch.variant)]
    fig, axes = style.panels(len(runs), cols=1, width=7.0, height=0.45 * len(variants) + 1.4)
    for ax, run in zip(axes, runs):
        mine = lambda d: d[(d.dataset == run[0]) & (d.model == run[1]) & (d.fanouts == run[3])]  # noqa: E731
        times, bandwidths = mine(epoch), mine(per_rank)
        shown = [v for v in variants if v in set(times.variant)]
        for y, variant in enumerate(shown):
            m, q25, q75 = times[times.variant == variant][["median", "q25", "q75"]].iloc[0]
            ax.barh(y, m, 0.7, color=style.color(variant))
            ax.errorbar(m, y, xerr=[[m - q25], [q75 - m]], color="#333333", capsize=2, fmt="none")
            b = bandwidths[bandwidths.variant == variant]["median"]
            note = bandwidth_note(variant, None if b.empty else b.iloc[0])
            ax.annotate(f"{m:.2f} s" + (f"; {note}" if note else ""), (q75, y), xytext=(6, 0),
                        textcoords="offset points", va="center", fontsize=7.5)  # fmt: skip
        ax.set_yticks(range(len(shown)), [pipeline_label(v) for v in shown])
        ax.invert_yaxis()  # the registry's order, top to bottom
        ax.set_xlim(0, times["q75"].max() * 1.9)  # room for the notes right of the bars
        ax.set(xlabel="epoch time (s)", title=run_title(*run) + " (whiskers: interquartile range)")
        ax.grid(axis="y", visible=False)
    style.title(
        fig,
        f"GNN training on {ranks_text(worlds_all[0])} from a feature table in host memory: "
        "one world size, so no scaling was measured on this machine",
        MEASURED,
    )
    style.save(fig, figure)


if len(worlds_all) == 1:
    one_size_figure()
else:
    per_figure = 2  # two runs of three panels each
    for first in range(0, len(runs), per_figure):
        scaling_figure(runs[first : first + per_figure], None if first == 0 else f"runs_{first // per_figure + 1}")
