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
# # LLM activation offloading (SSDTrain): step time against activation memory
#
# One training step per policy (`workloads.llm_offload`): keep every activation, recompute each
# block (`torch.utils.checkpoint`), `torch.autograd.graph.save_on_cpu`, and SSDTrain's
# `offload_all` into each store (host memory, O_DIRECT files, emulated SSDs). Every policy was
# checked bit-identical to `keep` before it was timed. Step times are medians of the timed steps
# with the interquartile range; the x axis is the saved-activation memory the step held on the
# device (on a GPU: the measured peak above the weights and optimizer state). The lower left wins:
# the "ROK" view of recompute, offload and keep.

# %% tags=["parameters"]
machine = "local"
scale = "cpu"
figure = "paper_figs/local/llm_offload-cpu.png"
summary = "paper_figs/local/llm_offload-cpu.md"
results = {}  # topic -> its results files, passed by the workflow

# %%
from pathlib import Path

import numpy as np

from analysis.common import layout_with_title, load_results, machine_label, panel_grid, summarize
from analysis.style import EMULATED_RAMP, color
from workloads.llm import cost
from workloads.llm.models import spec
from workloads.llm_offload.schema import SCHEMA

frame, provenance = load_results(results["llm_offload"], SCHEMA)
# Part micro_batches (the memory spent on a larger micro-batch) has its own table and panels.
sweep = frame[frame.part == "micro_batches"]
frame = frame[frame.part != "micro_batches"]
KEYS = ["dataset", "variant", "policy", "store", "emulated_gbps"]
step = summarize(frame, "time", KEYS)
rate = summarize(frame, "flop_rate", KEYS)
# On a GPU the measured peak; without one the bytes the hooks saw held on the device.
memory_metric = "activation_peak" if (frame.metric == "activation_peak").any() else "activation_bytes"
memory = summarize(frame, memory_metric, KEYS)
written = summarize(frame, "bytes_written", KEYS)
write_seconds = summarize(frame, "write_seconds", KEYS)
print(machine_label(provenance))

# The suite's fixed colours per variant (analysis/style.py); emulated stores in its blue ramp.
POLICY_COLORS = {
    v: color(v)
    for v in (
        "keep",
        "recompute",
        "save_on_cpu",
        "torchtune_offload",
        "offload_all_host",
        "offload_all_file",
        "offload_all_kvikio",
    )
}
EMULATED_COLORS = EMULATED_RAMP
emulated = sorted(
    {(g, v) for g, v in zip(step.emulated_gbps, step.variant) if v.startswith("offload_all_emulated")},
    key=lambda x: x[0],
)
for i, (_, variant) in enumerate(emulated):
    POLICY_COLORS[variant] = EMULATED_COLORS[min(i, len(EMULATED_COLORS) - 1)]
# The planned policies take their store's colour and a marker of their own.
PLANNED = ("offload_adaptive", "planner")
MARKERS = {"offload_adaptive": "^", "planner": "D"}
for variant in sorted(set(step.variant)):
    for name in PLANNED:
        if variant.startswith(name + "_"):
            POLICY_COLORS[variant] = POLICY_COLORS.get("offload_all_" + variant.removeprefix(name + "_"), "tab:gray")
ORDER = [v for v in POLICY_COLORS if v in set(step.variant)]


def store_label(store: str) -> str:
    """host, file, kvikio, or "N GB/s (emulated)" for emulated_Ngbps."""
    if store.startswith("emulated_"):
        return store.removeprefix("emulated_").replace("gbps", " GB/s (emulated)")
    return store


def label(variant: str) -> str:
    for name in ("offload_all", *PLANNED):
        if variant.startswith(name + "_"):
            return f"{name}, {store_label(variant.removeprefix(name + '_'))}"
    return variant


def marker(variant: str) -> str:
    for name in PLANNED:
        if variant.startswith(name + "_"):
            return MARKERS[name]
    return "s" if variant.startswith("offload_all_emulated") else "o"


def block_costs_of(dataset: str) -> tuple[list[int], list[int]]:
    """The per-block saved bytes and forward FLOPs the run recorded for a model (the formulas of
    workloads/llm/cost.py); runs before they were recorded: the same formulas from the preset and
    the shape columns."""
    for record in provenance:
        blocks = record.get("models", {}).get(dataset, {}).get("blocks")
        if blocks:
            return blocks["saved_bytes"], blocks["forward_flops"]
    row = frame[frame.dataset == dataset].iloc[0]
    shape = {k: int(row[k]) for k in ("hidden", "layers", "sequence", "micro_batch")}
    element = 2 if row["dtype"] == "bfloat16" else 4  # row.dtype would be the Series attribute
    costs = cost.block_costs(spec(row["family"], row["preset"], **shape), element)
    return [c.saved_bytes for c in costs], [c.forward_flops for c in costs]


# %% [markdown]
# ## Key numbers: medians, and ratios to keep from the same run

# %%
lines = [
    f"# LLM activation offloading on `{machine}` at scale `{scale}`",
    "",
    machine_label(provenance),
    "",
    f"Activation memory: `{memory_metric}`. Emulated stores are throttled host memory, not a disk.",
    "",
    "Exposed I/O = the step's time over keep's. Write GB/s = bytes written over the time the store had a "
    "write in flight (achieved, not nominal; blank where the run did not record it). TB/day = bytes written "
    "per step at this step rate for a day: what an SSD would have to endure.",
    "",
    "| model | variant | step s | x keep | exposed I/O s | activation MiB | x keep | written MiB/step "
    "| write GB/s | TB/day | model TFLOP/s |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]
for dataset, g in step.groupby("dataset"):
    keep = g[g.variant == "keep"]["median"]
    keep_mem = memory[(memory.dataset == dataset) & (memory.variant == "keep")]["median"]
    for variant in [v for v in ORDER if v in set(g.variant)]:
        t = g[g.variant == variant]["median"].iloc[0]
        sel = lambda d: d[(d.dataset == dataset) & (d.variant == variant)]["median"]  # noqa: E731
        mem, w, r, ws = sel(memory), sel(written), sel(rate), sel(write_seconds)
        mem_cell = f"{mem.iloc[0] / 2**20:.2f}" if not mem.empty else ""
        mem_ratio = f"{mem.iloc[0] / keep_mem.iloc[0]:.2f}" if not mem.empty and not keep_mem.empty else ""
        w_bytes = w.iloc[0] if not w.empty else 0.0
        achieved = f"{w_bytes / ws.iloc[0] / 1e9:.2f}" if not ws.empty and ws.iloc[0] > 0 else ""
        lines.append(
            f"| {dataset} | {label(variant)} | {t:.4f} | {t / keep.iloc[0]:.2f} | {t - keep.iloc[0]:.4f} | "
            f"{mem_cell} | {mem_ratio} | {w_bytes / 2**20:.2f} | {achieved} | {w_bytes / t * 86400 / 1e12:.3g} | "
            f"{r.iloc[0]:.4g} |"
        )

# The planned policies: what the cost model predicted against what was measured.
predicted = frame[frame.metric.isin(["predicted_time", "predicted_activation_bytes"])]
if not predicted.empty:
    held = summarize(frame, "activation_bytes", KEYS)
    lines += [
        "",
        "## Plans: predicted against measured (systems/ssdtrain/planning.py)",
        "",
        "Layers offloaded / recomputed per plan; the store bandwidth the plan assumed was measured just before. "
        "Predicted activation bytes are the hooks' count at the end of forward, as measured in `activation_bytes`.",
        "",
        "| model | variant | offloaded | recomputed | store GB/s | predicted s | measured s "
        "| predicted MiB | measured MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (dataset, variant), g in predicted.groupby(["dataset", "variant"]):
        first = g.iloc[0]
        value = dict(zip(g.metric, g.value))
        t = step[(step.dataset == dataset) & (step.variant == variant)]["median"].iloc[0]
        h = held[(held.dataset == dataset) & (held.variant == variant)]["median"].iloc[0]
        lines.append(
            f"| {dataset} | {label(variant)} | {first.layers_offloaded} | {first.layers_recomputed} | "
            f"{first.planned_gbps:.2f} | {value['predicted_time']:.4f} | {t:.4f} | "
            f"{value['predicted_activation_bytes'] / 2**20:.2f} | {h / 2**20:.2f} |"
        )

# Part micro_batches: tokens per second at a fixed global batch, by micro-batch.
if not sweep.empty:
    sweep = sweep.assign(tokens=sweep.global_batch * sweep.sequence)
    sweep_keys = ["dataset", "variant", "micro_batch", "global_batch", "sequence"]
    sweep_time = summarize(sweep, "time", sweep_keys)
    sweep_held = summarize(sweep, "activation_bytes", sweep_keys)
    oom = sweep[sweep.metric == "out_of_memory"]
    lines += [
        "",
        "## Micro-batches at a fixed global batch (part micro_batches)",
        "",
        "Tokens per second of one optimizer step over the global batch (gradient accumulation), and the activation "
        "bytes one micro-step holds.",
        "",
        "| model | micro-batch | variant | tokens/s | activation MiB |",
        "|---|---|---|---|---|",
    ]
    for _, r in sweep_time.sort_values(["dataset", "micro_batch", "variant"]).iterrows():
        held_row = sweep_held[
            (sweep_held.dataset == r.dataset)
            & (sweep_held.variant == r.variant)
            & (sweep_held.micro_batch == r.micro_batch)
        ]["median"]
        held_cell = f"{held_row.iloc[0] / 2**20:.1f}" if not held_row.empty else ""
        tokens = r.global_batch * r.sequence / r["median"]
        lines.append(f"| {r.dataset} | {r.micro_batch} | {label(r.variant)} | {tokens:,.0f} | {held_cell} |")
    for _, r in oom.iterrows():
        lines.append(f"| {r.dataset} | {r.micro_batch} | {label(r.variant)} | out of memory | |")
Path(summary).parent.mkdir(parents=True, exist_ok=True)
Path(summary).write_text("\n".join(lines) + "\n")
print("\n".join(lines))

# %% [markdown]
# ## Figure: one panel per model

# %%
datasets = sorted(set(step.dataset))
fig, grid = panel_grid(2 * len(datasets) + (2 if not sweep.empty else 0), width=4.4, height=3.6, cols=2)
for ax, dataset in zip(grid[0::2], datasets):
    for variant in ORDER:
        t = step[(step.dataset == dataset) & (step.variant == variant)]
        mem = memory[(memory.dataset == dataset) & (memory.variant == variant)]
        if t.empty or mem.empty:
            continue
        x, y = mem["median"].iloc[0] / 2**20, t["median"].iloc[0]
        ax.errorbar(
            [x],
            [y],
            yerr=[[y - t["q25"].iloc[0]], [t["q75"].iloc[0] - y]],
            fmt=marker(variant),
            color=POLICY_COLORS[variant],
            markersize=6,
            capsize=3,
            label=label(variant),
        )
    ax.set(
        xlabel=f"activation memory on the device, MiB ({memory_metric})",
        ylabel="s per training step",
        title=dataset,
        ylim=(0, None),
    )
    ax.set_xlim(left=-0.03 * ax.get_xlim()[1])  # a policy that keeps nothing on the device sits at 0: inside
    ax.grid(alpha=0.3)
for ax, dataset in zip(grid[1::2], datasets):
    # What-if: the write bandwidth that hides a block's offload inside its own forward, for a GPU
    # of any speed (SSDTrain's criterion), against the bandwidths the stores reached here.
    saved, flops = block_costs_of(dataset)

    def needed(flop_rate):  # GB/s that writes every block's saved bytes within its own forward
        return max(b / (f / flop_rate) for b, f in zip(saved, flops)) / 1e9

    keep_rate = rate[(rate.dataset == dataset) & (rate.variant == "keep")]["median"]
    here = keep_rate.iloc[0] * 1e12 if not keep_rate.empty else None
    low = min(20e12, here / 3) if here else 20e12  # the range reaches down to the measured rate
    speeds = np.logspace(np.log10(low), np.log10(2e15), 60)
    ax.plot(speeds / 1e12, [needed(F) for F in speeds], color="black", label="needed to hide every write")
    if here:
        ax.plot([here / 1e12], [needed(here)], "ko")
        ax.annotate(
            "keep, measured", (here / 1e12, needed(here)), textcoords="offset points", xytext=(6, 4), fontsize=7
        )
    for variant in ORDER:
        sel = lambda d: d[(d.dataset == dataset) & (d.variant == variant)]["median"]  # noqa: E731
        w, ws = sel(written), sel(write_seconds)
        nominal = step[(step.dataset == dataset) & (step.variant == variant)]["emulated_gbps"]
        if not ws.empty and ws.iloc[0] > 0:
            value, style = w.iloc[0] / ws.iloc[0] / 1e9, "-"
        elif not nominal.empty and nominal.notna().iloc[0]:
            value, style = float(nominal.iloc[0]), ":"
        else:
            continue
        if variant.startswith("offload_all"):
            ax.axhline(value, color=POLICY_COLORS[variant], linestyle=style, linewidth=1.2)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="compute throughput, model TFLOP/s",
        ylabel="write GB/s",
        title=f"{dataset}: needed vs available\n(solid: achieved here; dotted: emulated, nominal)",
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="upper left", fontsize=7, frameon=False)
if not sweep.empty:
    speed_ax, held_ax = grid[-2], grid[-1]
    for variant in [v for v in ORDER + sorted(set(sweep_time.variant)) if v in set(sweep_time.variant)]:
        t = sweep_time[sweep_time.variant == variant].sort_values("micro_batch")
        h = sweep_held[sweep_held.variant == variant].sort_values("micro_batch")
        colour = POLICY_COLORS.get(variant, "tab:gray")
        speed_ax.plot(
            t.micro_batch, t.global_batch * t.sequence / t["median"], "o-", color=colour, label=label(variant)
        )
        held_ax.plot(h.micro_batch, h["median"] / 2**20, "o-", color=colour, label=label(variant))
    title = f"{sweep_time.dataset.iloc[0]}, {int(sweep_time.global_batch.iloc[0])} sequences per step"
    speed_ax.set(xscale="log", xlabel="micro-batch", ylabel="tokens/s", ylim=(0, None), title=title)
    held_ax.set(xscale="log", xlabel="micro-batch", ylabel="activation MiB (activation_bytes)", ylim=(0, None))
    held_ax.set_title("activation bytes one micro-step holds")
    for ax in (speed_ax, held_ax):
        ax.minorticks_off()  # the micro-batches themselves are the ticks
        ax.set_xticks(sorted(set(sweep_time.micro_batch)), [str(b) for b in sorted(set(sweep_time.micro_batch))])
        ax.grid(alpha=0.3)
handles, labels = grid[0].get_legend_handles_labels()
fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7, frameon=False)
layout_with_title(
    fig,
    f"LLM activation offloading: {machine}, scale '{scale}' (measured; emulated stores are throttled host "
    f"memory)\n{machine_label(provenance)}",
)
Path(figure).parent.mkdir(parents=True, exist_ok=True)
fig.savefig(figure, dpi=130, bbox_inches="tight")
