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
# over the faster of the CPU baselines (`cpu_gather`, and `cpu_gather_workers` where it ran), the
# CPU cost and the GPU memory each keeps, per part (one graph) and model. Epoch times are medians
# of the timed epochs. A run is one measuring process: the committed results and each re-run of
# the same code (`results/<machine>/gnn_training/reruns/<run>/`); every ratio is taken within a
# run and quoted with its range over the runs, and an ordering is stated only where every run
# agrees (`analysis/doc_tables/gnn_training.py`, which the doc's tables share).
# The summary ends with the targets, judged per dataset and model, CPU budget and run.

# %% tags=["parameters"]
machine = "local"
scale = "cpu"
figure = "paper_figs/local/gnn_training-cpu.png"
summary = "paper_figs/local/gnn_training-cpu.md"
results = {}  # topic -> its results files, passed by the workflow

# %%
import re
from pathlib import Path

from analysis.common import load_results, machine_label, same_code_reruns, summarize
from analysis.doc_tables.gnn_training import (
    BASELINE,
    BOUND_AT_MOST,
    COMMITTED,
    GROUP,
    at_largest_cpu_budget,
    epoch_medians,
    joined_to_dataset_parts,
    ordering,
    per_group,
    pipeline_label,
    quoted,
    ratios,
    target_lines,
    with_runs,
)
from workloads.gnn.pipelines import PIPELINE_KINDS, in_order
from workloads.gnn.pipelines import PYTORCH_DIRECT as PYTORCH_DIRECT_NAME
from workloads.gnn_training import BUDGET_SWEEPS
from workloads.gnn_training.schema import SCHEMA

frame, provenance = load_results(results["gnn_training"], SCHEMA)
rerun_files, other_code = same_code_reruns(results.get("gnn_training_reruns", []), results["gnn_training"])
reruns = load_results(rerun_files, SCHEMA)[0] if rerun_files else None
# The headline numbers at each part's largest CPU budget; every budget in the supporting figure,
# the CPU-budget sweep parts joined to the dataset parts whose graphs they train.
by_budget = joined_to_dataset_parts(frame)
all_rows = with_runs(frame, reruns)  # every part and CPU budget, for the targets
every_run = at_largest_cpu_budget(all_rows)
frame = every_run[every_run.run == COMMITTED]
RUNS = [COMMITTED] + sorted(set(every_run.run) - {COMMITTED})
KEYS = [*GROUP, "variant"]
epoch = summarize(frame, "epoch_time", KEYS)  # the committed run's, for times, phases and costs
cpu = summarize(frame, "cpu_time", KEYS)
phases = summarize(frame, "phase_time", [*KEYS, "phase"])
acc = summarize(frame, "accuracy", KEYS)
medians = epoch_medians(every_run)
CPU_BASELINES = in_order(every_run[every_run.role == "baseline"].variant)  # those the results hold
# What the speedups are over, as the figure says it: "the faster" only where there were several.
OVER = "the faster CPU baseline" if len(CPU_BASELINES) > 1 else "".join(CPU_BASELINES) or "the CPU baseline"
# Each pipeline's speedup over the faster CPU baseline and its epoch against all_in_gpu's, per
# group: the committed run's first, then each re-run's.
speedup = {v: per_group(ratios(medians, v, BASELINE)) for v in set(medians.variant)}
vs_all_in_gpu = {v: per_group(ratios(medians, "all_in_gpu", v)) for v in set(medians.variant)}  # v's / all_in_gpu's
# What each part's notes say about GPU memory: {part: notes}.
NOTES = {record.get("part"): record for record in provenance if record.get("part") not in BUDGET_SWEEPS}
print(machine_label(provenance))
print(f"runs: {', '.join(RUNS)}")
for f in other_code:
    print(f"left out (measured at other code, or on other hardware, than the committed run): {f}")


def select(rows, key):
    """The rows of one group (a tuple of GROUP's values)."""
    mask = True
    for column, value in zip(GROUP, key):
        mask = mask & (rows[column] == value)
    return rows[mask]


def budgets_of(part) -> list[float]:
    return [float(b) for b in NOTES.get(part, {}).get("gpu_memory_budget_gib", [])]


def not_run_resident(part) -> dict[str, float]:
    """GiB resident of the pipelines a part did not run because they fit no GPU budget (from the
    notes' reasons, which give the resident size first)."""
    found = {}
    for name, why in NOTES.get(part, {}).get("skipped_pipelines", {}).items():
        size = re.search(r"([0-9.]+) GiB resident", why)
        if "does not fit any GPU memory budget" in why and size:
            found[name] = float(size[1])
    return found


def smallest_fitting_budget(key, variant) -> float | None:
    """The smallest budget ``variant`` fits in group ``key`` (resident data and peak), None for none."""
    rows = select(frame[(frame.metric == "fits_gpu_budget") & (frame.variant == variant)], key)
    fitting = sorted(rows[rows.value == 1].gpu_memory_budget)
    return fitting[0] if fitting else None


GROUPS = sorted({tuple(k) for k in epoch[GROUP].itertuples(index=False)}, key=lambda k: (k[6], k[2] != "sage", k[3]))


# %% [markdown]
# ## Key numbers


# %%
def memory_cells(key, variant) -> str:
    rows = select(frame[frame.variant == variant], key)
    resident = rows[rows.metric == "gpu_resident_bytes"].value
    peak = rows[rows.metric == "peak_gpu_memory"].value
    if resident.empty:
        return " |  |  | "
    fits = smallest_fitting_budget(key, variant)
    return f" | {resident.max() / 2**30:.2f} | {peak.max() / 2**30:.2f} | {'none' if fits is None else f'{fits:g}'}"


lines = [
    f"# GNN training on `{machine}` at scale `{scale}`",
    "",
    machine_label(provenance),
    "",
    f"Runs: {len(RUNS)} ({', '.join(RUNS)}); ratios are the committed run's, the range over every run in brackets.",
    "",
    "| dataset (nodes, edges) | model | pipeline | epoch s | x fastest CPU baseline | x all_in_gpu | CPU core-s/epoch "
    "| val acc | GPU resident GiB | GPU peak GiB | smallest budget fitting, GiB |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]
for key in GROUPS:
    part, dataset, model, layers, fanouts, nodes, edges = key
    g = select(epoch, key)
    for variant in in_order(g.variant):
        row = g[g.variant == variant].iloc[0]
        c = select(cpu, key)
        a = select(acc, key)
        spd = quoted(speedup[variant][key]) if key in speedup.get(variant, {}) else ""
        top = quoted(vs_all_in_gpu[variant][key]) if key in vs_all_in_gpu.get(variant, {}) else ""
        lines.append(
            f"| {dataset} ({nodes:,}, {edges:,}) | {model} {layers}L {fanouts} | {variant} | {row['median']:.3f} "
            f"| {spd} | {top} | {c[c.variant == variant]['median'].iloc[0]:.2f} "
            f"| {a[a.variant == variant]['median'].iloc[0]:.3f}{memory_cells(key, variant)} |"
        )
lines += [
    "",
    "x fastest CPU baseline: the epoch time of "
    + (
        f"the faster of {' and '.join(f'`{b}`' for b in CPU_BASELINES)} (those that ran)"
        if len(CPU_BASELINES) > 1
        else "the only CPU baseline measured, " + "".join(f"`{b}`" for b in CPU_BASELINES) + ","
    )
    + " over the pipeline's, per dataset and model; x all_in_gpu: the pipeline's epoch over "
    "all_in_gpu's (below 1: faster). Smallest budget: of the configured GPU memory budgets, the smallest that "
    "holds the pipeline's resident data and its peak.",
    "",
    "## Orderings (stated only where every run agrees)",
    "",
    "| dataset | model | comparison | verdict |",
    "|---|---|---|---|",
]
PAIRS = [("zero_copy_overlap", "zero_copy"), ("zero_copy_overlap", "all_in_gpu"), ("zero_copy", BASELINE)]
orderings = len(lines)
for key in GROUPS:
    for faster, slower in PAIRS:
        found = per_group(ratios(medians, faster, slower)).get(key)
        if found:
            lines.append(
                f"| {key[1]} | {key[2]} {key[3]}L | {faster} vs {slower} | {ordering(found, faster, slower)} |"
            )
if len(lines) == orderings:  # every pair has a GPU pipeline
    compared = ", ".join(sorted({*sum(PAIRS, ())} - {BASELINE}))
    lines += ["", f"None: no pair of the pipelines compared here ({compared}) was measured on a dataset."]
# The targets, per dataset and model, CPU budget and run (the doc's table, from this machine's rows).
lines += ["", "## Targets (met where every run meets them)", "", *target_lines(all_rows)]
# GPU memory budgets, from the notes: which pipelines remain at each budget, and why the others do not.
for part, notes in sorted(NOTES.items()):
    budgets = budgets_of(part)
    if not budgets:
        continue
    lines += ["", f"## GPU memory budgets, part {part}", ""]
    misses = notes.get("does_not_fit", {})
    ran = in_order(frame[frame.part == part].variant)
    for budget in budgets:
        missed = misses.get(f"{budget:g} GiB", {})
        out = {case.split(", ")[0] for case in missed}
        remain = [v for v in ran if v not in out]
        lines.append(f"- {budget:g} GiB: remain {', '.join(remain) or 'none'}")
        lines += [f"  - not {case}: {why}" for case, why in sorted(missed.items())]
# The figure's stacks of phases, as numbers: each phase timed alone in one more epoch (a device
# sync at every phase), beside the timed epoch, in which the phases overlap. (The figure names them
# the same, PHASES below.)
PHASE_NAMES = {"sample": "sampling", "gather": "feature gather + transfer", "train": "training"}
if not phases.empty:
    lines += [
        "",
        "## Where an epoch goes (committed run; seconds)",
        "",
        "Each phase timed alone in one more epoch, with a device sync at every phase; in the timed epoch "
        "the phases overlap, so their sum need not match it.",
        "",
        f"| dataset | model | pipeline | {' | '.join(PHASE_NAMES.values())} | sum of phases | timed epoch |",
        "|---|---|---|" + "---|" * (len(PHASE_NAMES) + 2),
    ]
    for key in GROUPS:
        e, p = select(epoch, key), select(phases, key)
        for variant in in_order(p.variant):
            seconds = [p[(p.variant == variant) & (p.phase == ph)]["median"].sum() for ph in PHASE_NAMES]
            timed = e[e.variant == variant]["median"]
            cells = " | ".join(f"{s:.3f}" for s in seconds)
            epoch_cell = f"{timed.iloc[0]:.3f}" if not timed.empty else ""
            lines.append(
                f"| {key[1]} | {key[2]} {key[3]}L {key[4]} | {variant} | {cells} | {sum(seconds):.3f} | {epoch_cell} |"
            )
Path(summary).parent.mkdir(parents=True, exist_ok=True)
Path(summary).write_text("\n".join(lines) + "\n")
print("\n".join(lines))

# %% [markdown]
# ## Figure: speedup per run, the epoch against all-in-GPU, where the epoch goes, the CPU it costs, GPU memory
#
# One group per part (and model, where several ran), one bar per pipeline in its colour. Ratio
# panels: the bar is the committed run with its value written up from its foot; where re-runs
# exist, a dot each run and the whisker the range over the runs. The phases (sampling, feature
# gathering and transfer, training) were timed in one more epoch with a device sync at every phase
# boundary; they are drawn stacked in the seconds measured, beside a tick at the timed epoch (no
# syncs), where the phases overlap: sampling workers and the CPU gather run while the GPU trains,
# so a stack can be taller than its epoch (or shorter, by what falls outside the phases: a
# loader's start-up). A phase is told by its pattern, never by a colour, so that a colour always
# means a pipeline. GPU memory: what each pipeline keeps resident
# (hatched: not run, over every budget), its peak, and the smallest configured budget it fits.

# %%
from matplotlib.colors import to_rgb
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.patheffects import withStroke

from analysis import style

# Phases bottom to top. Each segment is drawn in the pipeline's own colour; the phase is the
# pattern: white with dots in that colour, the colour with white stripes, the colour alone.
PATTERN_WORDS = {"dots": "dotted", "stripes": "striped", "solid": "solid"}
PHASES = {
    phase: (f"{PHASE_NAMES[phase]} ({PATTERN_WORDS[look]})", look)
    for phase, look in (("sample", "dots"), ("gather", "stripes"), ("train", "solid"))
}
NEUTRAL = "#444444"  # the phase legend's swatches: the colour of the reference lines, no pipeline's
EPOCH_TICK = "#000000"  # the timed epoch across each stack of phases
TICK_HALO = [withStroke(linewidth=4, foreground="white")]  # so the tick shows on a black stack too
SHORT_NAMES = {"papers100M": "papers"}  # "papers100M-like" runs into its neighbour's label
NEVER_RUN = {name for k in GROUPS for name in not_run_resident(k[0])}  # over every GPU budget: drawn hatched
variants = in_order(set(epoch.variant) | NEVER_RUN)
has_all_in_gpu = any(vs_all_in_gpu.get(v) for v in variants if v != "all_in_gpu")
has_memory = "gpu_resident_bytes" in set(frame.metric) or any(not_run_resident(k[0]) for k in GROUPS)
has_fits = "fits_gpu_budget" in set(frame.metric)
names = ["speed"] + (["all_in_gpu"] if has_all_in_gpu else []) + ["time", "cost"]
names += (["memory"] if has_memory else []) + (["fits"] if has_fits else [])


def grid(names: list[str]) -> list[list[str]]:
    """Rows of two panels (three for five or six); where a row would have a gap, the epoch
    breakdown, the panel with the most bars, takes the spare cells at the end."""
    cols = 2 if len(names) <= 4 else 3
    spare = -len(names) % cols
    cells = [n for n in names if n != "time" or not spare] + ["time"] * (1 + spare if spare else 0)
    return [cells[i : i + cols] for i in range(0, len(cells), cols)]


layout = grid(names)
fig, ax = style.mosaic(layout, width=6.2 * len(layout[0]), height=4.2 * len(layout))
axes = [ax[n] for n in names]
bar = 0.8 / len(variants)
several_models = len({k[2:5] for k in GROUPS}) > 1
labels = []
for _part, dataset, model, layers, _fanouts, nodes, _edges in GROUPS:
    size = f"{nodes / 1e6:.1f} M" if nodes >= 1e6 else f"{nodes / 1e3:.0f} K" if nodes >= 1e4 else f"{nodes:,}"
    name = dataset.removeprefix("ogbn-")
    for long, short in SHORT_NAMES.items():
        name = name.replace(long, short)
    labels.append(f"{name}\n{size} nodes" + (f"\n{model} {layers}L" if several_models else ""))


def phase_look(look: str, colour: str) -> dict:
    """Fill, hatch and hatch colour of a phase drawn in ``colour``."""
    dots = look == "dots"
    return {
        "facecolor": "white" if dots else colour,
        "hatch": {"dots": "....", "stripes": "////", "solid": ""}[look],
        "hatchcolor": colour if dots else "white",
    }


def phase_segment(axis, x, bottom, height, phase, colour) -> None:
    axis.bar(x, height, bar, bottom=bottom, edgecolor="none", linewidth=0, **phase_look(PHASES[phase][1], colour))


VALUES = []  # (panel, x, committed value, bar colour): written once the panel's scale is known


def ratio_bars(axis, x, values, color, label):
    """The committed run's bar; where re-runs exist, each run's dot and the whisker over their range."""
    axis.bar(x, values[0], bar, color=color, label=label)
    if len(values) > 1:
        axis.errorbar(
            x,
            values[0],
            yerr=[[values[0] - min(values)], [max(values) - values[0]]],
            color="#333333",
            capsize=2,
            elinewidth=0.8,
            fmt="none",
        )
        axis.plot([x] * len(values), values, "o", color="#333333", markersize=2.5, label="_run")
    VALUES.append((axis, x, values[0], color))


def write_values() -> None:
    """Each ratio written up its bar from the foot, inside it, where no line and no neighbour's
    label is (white on a dark bar); above a bar too short to hold it."""
    for axis, x, value, colour in VALUES:
        inside = value > 0.15 * axis.get_ylim()[1]
        dark = sum(c * w for c, w in zip(to_rgb(colour), (0.299, 0.587, 0.114))) < 0.55
        axis.annotate(f"{value:.2f}", (x, 0 if inside else value), xytext=(0, 3), textcoords="offset points",
                      ha="center", va="bottom", fontsize=6.5, rotation=90,
                      color="white" if inside and dark else "black")  # fmt: skip


for i, key in enumerate(GROUPS):
    e, p, c = select(epoch, key), select(phases, key), select(cpu, key)
    budgets = budgets_of(key[0])
    skipped = not_run_resident(key[0])
    for j, variant in enumerate(variants):
        x = i + (j - (len(variants) - 1) / 2) * bar
        colour = style.color(variant)
        if key in speedup.get(variant, {}):
            ratio_bars(ax["speed"], x, speedup[variant][key], colour, pipeline_label(variant))
        if has_all_in_gpu and variant != "all_in_gpu" and key in vs_all_in_gpu.get(variant, {}):
            ratio_bars(ax["all_in_gpu"], x, vs_all_in_gpu[variant][key], colour, pipeline_label(variant))
        if has_memory and variant in skipped:  # never run: its resident data, from the notes
            ax["memory"].bar(x, skipped[variant], bar, color="white", edgecolor=colour, hatch="//", linewidth=1.2)
        if has_fits and variant in skipped:
            ax["fits"].bar(x, len(budgets) + 1, bar, color="white", edgecolor=colour, hatch="//", linewidth=1.2)
        row = e[e.variant == variant]
        if row.empty:
            continue
        median, q25, q75 = row[["median", "q25", "q75"]].iloc[0]
        bottom = 0.0
        for ph in PHASES:  # the seconds each phase took, as measured: they overlap in a timed epoch
            seconds = p[(p.variant == variant) & (p.phase == ph)]["median"].sum()
            phase_segment(ax["time"], x, bottom, seconds, ph, colour)
            bottom += seconds
        ax["time"].hlines(median, x - bar / 2, x + bar / 2, color=EPOCH_TICK, linewidth=1.6, zorder=3,
                          path_effects=TICK_HALO)  # fmt: skip
        ax["time"].errorbar(x, median, yerr=[[median - q25], [q75 - median]], color=EPOCH_TICK, capsize=2,
                            elinewidth=0.8, fmt="none", zorder=3)  # fmt: skip
        ax["cost"].bar(x, c[c.variant == variant]["median"].iloc[0], bar, color=colour)
        mine = select(frame[frame.variant == variant], key)
        resident = mine[mine.metric == "gpu_resident_bytes"].value
        if has_memory and not resident.empty:
            ax["memory"].bar(x, resident.max() / 2**30, bar, color=colour)
            peak = mine[mine.metric == "peak_gpu_memory"].value
            if not peak.empty:
                ax["memory"].plot(x, peak.max() / 2**30, "_", color="#333333", markersize=7, markeredgewidth=1.5)
        if has_fits and budgets and not mine[mine.metric == "fits_gpu_budget"].empty:
            fits = smallest_fitting_budget(key, variant)
            height = len(budgets) + 1 if fits is None else budgets.index(fits) + 1
            ax["fits"].bar(x, height, bar, color=colour if fits is not None else "white", edgecolor=colour,
                           hatch="" if fits is not None else "//", linewidth=1.2)  # fmt: skip
for axis in axes:
    axis.set_xticks(range(len(GROUPS)), labels)
    axis.grid(axis="x", visible=False)
style.reference_line(ax["speed"], 1.0, OVER.removeprefix("the "), kind="parity")
# The paper's speedup is PyTorch-Direct's: drawn, and named in the title, where one of its pipelines
# ran (as registered: a user's own optimized pipeline is another technique, not PyTorch-Direct).
PYTORCH_DIRECT = {kind.name for kind in PIPELINE_KINDS if kind.technique == PYTORCH_DIRECT_NAME}
direct = sorted(set(every_run[every_run.role == "optimized"].variant) & PYTORCH_DIRECT)
if direct:
    style.reference_line(ax["speed"], 1.6, "paper: up to 1.6x", kind="target")
ax["speed"].margins(y=0.15)
runs_note = f"bar: committed run; dots, whisker: {len(RUNS)} runs" if len(RUNS) > 1 else "one run"
ax["speed"].set(ylabel=f"speedup over {OVER}", title=f"Epoch-time speedup\n({runs_note})")
if has_all_in_gpu:
    style.reference_line(ax["all_in_gpu"], 1.0, "all in GPU memory", kind="parity")
    style.reference_line(ax["all_in_gpu"], BOUND_AT_MOST, f"target: {BOUND_AT_MOST:.2f}x", kind="target")
    ax["all_in_gpu"].margins(y=0.15)
    ax["all_in_gpu"].set(
        ylabel="epoch time / all-in-GPU-memory epoch time",
        title=f"Epoch time against features all in GPU memory (below 1: faster)\n({runs_note})",
    )
write_values()
ax["time"].set(
    ylabel="time per epoch (s)",
    title="Where an epoch goes (committed run): each phase's seconds, stacked,\n"
    "timed phase by phase in one more epoch; tick: the timed epoch,\n"
    "in which the phases overlap, so a stack need not match its tick",
)
ax["cost"].set(ylabel="CPU time per epoch (core-seconds)", title="CPU cost per epoch (committed run)")
all_budgets = sorted({b for k in GROUPS for b in budgets_of(k[0])})
if has_memory:
    for budget in all_budgets:
        style.reference_line(ax["memory"], budget, f"{budget:g} GiB budget", kind="ceiling")
    ax["memory"].set(ylabel="GPU memory (GiB)", title="Resident on the GPU (bar) and peak (tick)\nhatched: not run")
if has_fits:
    ax["fits"].set_yticks(range(1, len(all_budgets) + 2), [f"{b:g} GiB" for b in all_budgets] + ["none"])
    ax["fits"].set(
        ylabel="smallest GPU budget it fits",
        title="Smallest GPU memory budget each fits\n(resident and peak; hatched: none)",
    )
entries = style.collect_legend([ax["speed"]])
entries |= {f"phase: {text}": Patch(edgecolor=NEUTRAL, **phase_look(look, NEUTRAL)) for text, look in PHASES.values()}
entries["timed epoch (interquartile range)"] = Line2D([], [], color=EPOCH_TICK, linewidth=1.6, path_effects=TICK_HALO)
entries |= {
    f"{pipeline_label(v)}: not run (over every GPU budget)": Patch(
        facecolor="white", edgecolor=style.color(v), hatch="//"
    )
    for v in variants
    if v in NEVER_RUN
}
if len(RUNS) > 1:
    entries["one run"] = Line2D([], [], marker="o", color="#333333", linestyle="", markersize=3)
style.legend_below(fig, entries, columns=4)
what = {(m, layers, f) for _, _, m, layers, f, *_ in GROUPS}
setup = "; ".join(f"{m}, {layers} layers, fan-out {f}" for m, layers, f in sorted(what))
others = sorted(set(every_run[every_run.role == "optimized"].variant) - PYTORCH_DIRECT)  # a user's techniques
if direct:
    measured = "PyTorch-Direct in minibatch GNN training"
elif others:
    measured = f"Minibatch GNN training: {', '.join(others)} (no PyTorch-Direct pipeline ran)"
else:
    measured = "Minibatch GNN training, CPU pipelines only"
style.title(fig, f"{measured} ({setup}; synthetic graphs with the datasets' statistics)", machine_label(provenance))
style.save(fig, figure)

# %% [markdown]
# ## Supporting figure: epoch time against the CPU budget
#
# Where a graph was measured at several CPU budgets (the scale's `cpu_budgets`, or the CPU-budget
# sweep parts beside its dataset part), each pipeline's epoch time against the cores it ran on,
# one panel per group (committed run).

# %%
budgeted = by_budget[by_budget.metric == "epoch_time"].dropna(subset=["cpu_budget"])
by_cores = summarize(budgeted, "epoch_time", [*KEYS, "cpu_budget"])
multi = [k for k in GROUPS if select(by_cores, k).cpu_budget.nunique() > 1]
for chunk, start in enumerate(range(0, len(multi), style.MAX_PANELS), 1):
    shown = multi[start : start + style.MAX_PANELS]
    fig, axes = style.panels(len(shown), cols=3, width=4.6, height=3.4)
    for axis, key in zip(axes, shown):
        rows = select(by_cores, key)
        for variant in in_order(rows.variant):
            line = rows[rows.variant == variant].sort_values("cpu_budget")
            colour, dash = style.style(variant)
            axis.plot(line.cpu_budget, line["median"], marker="o", color=colour, linestyle=dash,
                      label=pipeline_label(variant))  # fmt: skip
        axis.set(xlabel="CPU budget (cores)", ylabel="epoch time (s)", title=f"{key[1]}, {key[2]} {key[3]} layers")
    style.legend_below(fig, style.collect_legend(axes), columns=4)
    style.title(fig, "Epoch time against the cores each pipeline may use", machine_label(provenance))
    style.save(fig, figure, "cpu_budgets" if len(multi) <= style.MAX_PANELS else f"cpu_budgets_{chunk}")
