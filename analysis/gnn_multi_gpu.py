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

from analysis.common import load_results, machine_label, summarize
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
# ## Figure: epoch time, scaling efficiency and per-rank feature bandwidth against the ranks
#
# On a machine that measured one world size there is nothing to scale: the figure shows each
# pipeline's epoch time and per-rank bandwidth at that size as bars, and says so in its title.

# %%
from analysis import style

MEASURED = machine_label(provenance)
runs = sorted(set(zip(epoch.dataset, epoch.model, epoch.layers, epoch.fanouts)))
worlds_all = sorted(set(epoch.world_size))
device = "GPUs" if (epoch.device == "cuda").all() else "CPU processes"


def run_title(dataset, model, layers, fanouts) -> str:
    return f"{dataset}, {model}, {layers} layers, fan-out {fanouts}"


def scaling_figure(chunk, what) -> None:
    with_bw = not per_rank.empty
    cols = 3 if with_bw else 2
    fig, axes = style.panels(cols * len(chunk), cols=cols, width=4.8, height=3.6)
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
                label=style.readable(variant),
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
        ax_time.set(
            xlabel=f"ranks ({device})", ylabel="epoch time (s)", title=run_title(dataset, model, layers, fanouts)
        )
        ax_eff.set(
            xlabel=f"ranks ({device})",
            ylabel="scaling efficiency, T(1) / (N T(N))",
            ylim=(0, 1.2),
            title="Scaling efficiency",
        )
        if ax_bw is not None:
            ax_bw.set(
                xlabel=f"ranks ({device})",
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
    style.title(
        fig,
        f"Data-parallel GNN training on machine {machine}, one shared feature table in host memory (synthetic graph)",
        MEASURED,
    )
    style.save(fig, figure, what)


def one_size_figure() -> None:
    """One world size: bars per pipeline, the baseline other machines scale from."""
    with_bw = not per_rank.empty
    fig, axes = style.panels(2 if with_bw else 1, cols=2, width=5.5, height=3.8)
    tables = [(axes[0], epoch, "epoch time (s)", "Epoch time")]
    if with_bw:
        tables.append((axes[1], per_rank, "feature bandwidth per rank (GB/s)", "Feature bytes per rank per second"))
    for ax, table, ylabel, heading in tables:
        variants = [v for v in PIPELINES if v in set(table.variant)]
        bar = 0.8 / max(len(variants), 1)
        for i, run in enumerate(runs):
            sel = table[(table.dataset == run[0]) & (table.model == run[1]) & (table.fanouts == run[3])]
            for j, variant in enumerate(variants):
                r = sel[sel.variant == variant]
                if r.empty:
                    continue
                m, q25, q75 = r[["median", "q25", "q75"]].iloc[0]
                x = i + (j - (len(variants) - 1) / 2) * bar
                ax.bar(x, m, bar, color=style.color(variant), label=style.readable(variant))
                ax.errorbar(x, m, yerr=[[m - q25], [q75 - m]], color="#333333", capsize=2, fmt="none")
        ax.set_xticks(range(len(runs)), [run_title(*r).replace(", ", "\n", 1) for r in runs])
        ax.set(ylabel=ylabel, title=heading)
        ax.grid(axis="x", visible=False)
    style.legend_below(fig, style.collect_legend(axes), columns=5)
    style.title(
        fig,
        f"Data-parallel GNN training on machine {machine}, "
        f"{worlds_all[0]} {device[:-1] if worlds_all[0] == 1 else device}: one world size, "
        "no scaling measured here (whiskers: interquartile range)",
        MEASURED,
    )
    style.save(fig, figure)


if len(worlds_all) == 1:
    one_size_figure()
else:
    per_figure = 2  # two runs of three panels each
    for first in range(0, len(runs), per_figure):
        scaling_figure(runs[first : first + per_figure], None if first == 0 else f"runs_{first // per_figure + 1}")
