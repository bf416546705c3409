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
# block (`torch.utils.checkpoint`), `torch.autograd.graph.save_on_cpu`, other libraries' offloading
# (peers), and SSDTrain's `offload_all` and planned policies into each store (host memory, O_DIRECT
# files, emulated SSDs): the registries `POLICIES` and `STORES` of `systems/ssdtrain`, whatever
# entries they hold. Every policy was checked bit-identical to `keep` before it was timed. Step
# times are medians of the timed steps with the interquartile range; the x axis is the
# saved-activation memory the step held on the device (on a GPU: the measured peak above the
# weights and optimizer state). The lower left wins: the "ROK" view of recompute, offload and keep.

# %% tags=["parameters"]
machine = "local"
scale = "cpu"
figure = "paper_figs/local/llm_offload-cpu.png"
summary = "paper_figs/local/llm_offload-cpu.md"
results = {}  # topic -> its results files, passed by the workflow

# %%
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import style
from analysis.common import load_results, machine_label, same_code_reruns, summarize
from analysis.doc_tables.llm_offload import fastest, setting_text
from systems.ssdtrain import POLICIES, STORES, planning
from systems.ssdtrain.bound import bound_of_profile
from workloads.llm import cost
from workloads.llm.models import spec
from workloads.llm_offload.schema import SCHEMA

style.entry_labels(POLICIES)  # a user's own entries under the labels they register
style.entry_labels(STORES)
frame, provenance = load_results(results["llm_offload"], SCHEMA)
PARTS_HERE = list(dict.fromkeys(frame.part))  # the parts these results hold, in the order read
# Separate processes of the same parts, where the machine's results have them (the workflow passes
# results/<machine>/llm_offload/reruns/*/): the ratios below are given as ranges over every
# process that measured the committed run's code (a re-run of other code is left out, and named),
# and the figure shows each process.
rerun_files, other_code = same_code_reruns(results.get("llm_offload_reruns", []), results["llm_offload"])
for f in other_code:
    print(f"left out (measured at other code, or on other hardware, than the committed run): {f}")
reruns = load_results(rerun_files, SCHEMA)[0] if rerun_files else frame.iloc[0:0]
reruns = reruns.assign(process=reruns["source"].map(lambda s: Path(s).parent.name))
OWN_PARTS = ["micro_batches", "memory_bound", "convergence"]
capped_reruns = reruns[reruns.part == "memory_bound"]  # each process's point in the capped panel
reruns = reruns[~reruns.part.isin(OWN_PARTS)]  # not compared across processes here
# Parts micro_batches and memory_bound (the memory spent on a larger micro-batch) and convergence
# (loss curves on the generated corpus) have their own tables and panels.
sweep = frame[frame.part == "micro_batches"]
capped = frame[frame.part == "memory_bound"]
curves = frame[(frame.part == "convergence") & (frame.metric == "loss")]
frame = frame[~frame.part.isin(OWN_PARTS)]
# Results of those parts alone (a machine that measured only them) have no step per policy: the
# step table, the frontier, the ratios to keep and the bandwidth what-if are left out, and the
# parts' own tables and panels are what is rendered.
STEPS = not frame.empty
# Rows are told apart by model (dataset) and variant, not by part: a model in two parts would merge.
shared_models = frame.groupby("dataset").part.nunique()
if (shared_models > 1).any():
    raise ValueError(f"models measured in more than one part: {sorted(shared_models[shared_models > 1].index)}")
KEYS = ["dataset", "variant", "policy", "store", "emulated_gbps"]
step = summarize(frame, "time", KEYS)
rate = summarize(frame, "flop_rate", KEYS)
# On a GPU the measured peak; without one the bytes the hooks saw held on the device.
memory_metric = "activation_peak" if (frame.metric == "activation_peak").any() else "activation_bytes"
memory = summarize(frame, memory_metric, KEYS)
written = summarize(frame, "bytes_written", KEYS)
write_seconds = summarize(frame, "write_seconds", KEYS)
print(machine_label(provenance))

# What each variant is, from its rows' own columns (policy, store, the store's bandwidth, role)
# and the registries of systems/ssdtrain; a variant label is never parsed. Its order: by role
# (baselines, peers, the technique), then as the registries list policies and stores (names they
# do not know after, by name), emulated stores by bandwidth.
ROLE_ORDER = {"baseline": 0, "peer": 1, "optimized": 2, "upper_bound": 3}
setups = (
    pd.concat([frame, sweep, capped, curves])
    .drop_duplicates("variant")[
        [
            "variant",
            "role",
            "policy",
            "store",
            "emulated_gbps",
            "activation_budget",
            "budget_fraction",
            "matched_budget",
        ]
    ]
    .set_index("variant")
)


def registry_rank(registry, name) -> tuple:
    names = registry.names()
    return (names.index(name), "") if name in names else (len(names), str(name))


def order_key(variant: str) -> tuple:
    v = setups.loc[variant]
    has_store = pd.notna(v.store)
    return (
        ROLE_ORDER.get(v.role, len(ROLE_ORDER)),
        registry_rank(POLICIES, v.policy),
        registry_rank(STORES, v.store) if has_store else (-1, ""),
        v.emulated_gbps if pd.notna(v.emulated_gbps) else -1.0,
    )


ORDER = sorted(setups.index, key=order_key)


def store_text(v) -> str:
    """host, file, kvikio, or "N GB/s (emulated)" for a store run at an emulated bandwidth."""
    if pd.notna(v.emulated_gbps):
        return f"{v.emulated_gbps:g} GB/s (emulated)"
    return str(v.store)


def label(variant: str) -> str:
    """The policy and its setting (a budget), then its store: ``planner within 0.2, host``."""
    v = setups.loc[variant]
    name = f"{v.policy}{setting_text(v)}"
    return name if pd.isna(v.store) else f"{name}, {store_text(v)}"


ALL_OFFLOADED = "offload_all"  # the policy whose runs measure a store: every block but the last offloaded


def block_costs_of(dataset: str) -> tuple[list[int], list[int]]:
    """The per-block saved bytes and forward FLOPs of a model: the FLOPs the run recorded (the
    formulas of workloads/llm/cost.py), with the saved bytes a profile of the run measured where
    one did (the formulas leave out what eager blocks save beyond them: RMSNorm's statistics, T5's
    attention, 1.2-3x the formula's bytes on the H200), else the formulas'; runs before they were
    recorded: the same formulas from the preset and the shape columns."""
    models = [record.get("models", {}).get(dataset, {}) for record in provenance]
    measured = next((m["profile"]["saved_bytes"] for m in models if m.get("profile", {}).get("saved_bytes")), None)
    for blocks in (m["blocks"] for m in models if m.get("blocks")):
        fits = measured is not None and len(measured) == len(blocks["forward_flops"])
        return (measured if fits else blocks["saved_bytes"]), blocks["forward_flops"]
    row = frame[frame.dataset == dataset].iloc[0]
    shape = {k: int(row[k]) for k in ("hidden", "layers", "sequence", "micro_batch")}
    element = 2 if row["dtype"] == "bfloat16" else 4  # row.dtype would be the Series attribute
    costs = cost.block_costs(spec(row["family"], row["preset"], **shape), element)
    return [c.saved_bytes for c in costs], [c.forward_flops for c in costs]


def profile_keep_seconds(dataset: str) -> float | None:
    """The keep step (forward and backward) the plans were made from, from the run's notes."""
    for record in provenance:
        found = record.get("models", {}).get(dataset, {}).get("profile")
        if found:
            return found["keep_step_seconds"]
    return None


def ratios_to_keep(rows, metric: str):
    """Per (dataset, variant): the median of ``metric`` over the median of keep's, in one process."""
    medians = rows[rows.metric == metric].groupby(["dataset", "variant"]).value.median()
    if "keep" not in medians.index.get_level_values("variant"):
        raise ValueError(f"no {metric} of keep in this process: every ratio is taken against keep's")
    keep = medians.xs("keep", level="variant")
    return medians.div(keep, level="dataset")


# %% [markdown]
# ## Key numbers: medians, and ratios to keep from the same run

# %%
lines = [
    f"# LLM activation offloading on `{machine}` at scale `{scale}`",
    "",
    machine_label(provenance),
    "",
]
# Variants with a store whose checked step wrote nothing to it (min_bytes above every tensor, or a
# plan that kept every block): they ran as keep there, named so their rows are not read as an offloader's.
wrote_nothing = sorted(
    {
        f"{variant} ({dataset})"
        for record in provenance
        for dataset, notes in record.get("models", {}).items()
        for variant in notes.get("checked_without_offloading", [])
    }
)
if wrote_nothing:
    lines += [f"Wrote nothing to their store in the checked step (ran as keep there): {', '.join(wrote_nothing)}.", ""]
if STEPS:
    lines += [
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
else:
    lines.append(
        f"Parts measured here: {', '.join(PARTS_HERE)}. None of them times one training step per policy "
        f"(every part but {', '.join(OWN_PARTS)} does), so there is no step table, no ratio to keep and no "
        "bandwidth what-if: only the tables of these parts."
    )
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
        "Predicted seconds are forward and backward from a profiled keep step; measured seconds also hold the "
        "optimizer step, so compare the time each adds to keep's (extra s). Predicted activation bytes are held "
        "at the end of forward, offloaded layers whose writes are still running counted; against them: the hooks' "
        "`activation_bytes` (a tensor counts as gone once it is handed to the store) and, where a GPU measured "
        "it, the allocator's activation peak over forward and backward (`activation_peak`), which is what a "
        "user's memory budget has to hold.",
        "",
        "| model | variant | offloaded | recomputed | store GB/s | predicted s | measured s | predicted extra s "
        "| measured extra s | predicted MiB | hooks' MiB | allocator peak MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    peaks = summarize(frame, "activation_peak", KEYS)
    for (dataset, variant), g in predicted.groupby(["dataset", "variant"]):
        first = g.iloc[0]
        value = dict(zip(g.metric, g.value))
        t = step[(step.dataset == dataset) & (step.variant == variant)]["median"].iloc[0]
        keep_t = step[(step.dataset == dataset) & (step.variant == "keep")]["median"].iloc[0]
        h = held[(held.dataset == dataset) & (held.variant == variant)]["median"].iloc[0]
        peak = peaks[(peaks.dataset == dataset) & (peaks.variant == variant)]["median"]
        peak_cell = f"{peak.iloc[0] / 2**20:.2f}" if not peak.empty else "not measured"
        # The model predicts forward and backward from the profile's keep step; the measured step
        # also has the optimizer's. The time over keep's compares like with like.
        profiled = profile_keep_seconds(dataset)
        predicted_extra = f"{value['predicted_time'] - profiled:.4f}" if profiled else ""
        lines.append(
            f"| {dataset} | {label(variant)} | {first.layers_offloaded} | {first.layers_recomputed} | "
            f"{first.planned_gbps:.2f} | {value['predicted_time']:.4f} | {t:.4f} | {predicted_extra} | "
            f"{t - keep_t:.4f} | {value['predicted_activation_bytes'] / 2**20:.2f} | {h / 2**20:.2f} | {peak_cell} |"
        )

# The cost model against every offload_all run that has a profile: the model as it is now
# (systems/ssdtrain/planning.py), fed the run's recorded profile, against what the run measured.
model_rows = []
for dataset in sorted(set(step.dataset)):
    profiled = next((r for r in provenance if r.get("models", {}).get(dataset, {}).get("profile")), None)
    record = profiled["models"][dataset] if profiled else None
    # the engine's prefetch in the run the profile is of, as the plans there were made for it
    prefetch = int(profiled.get("parameters", {}).get("prefetch", 1)) if profiled else 1
    if record is None:
        continue
    prof = record["profile"]
    layers = planning.profiles_of_record(prof)
    keep_t = step[(step.dataset == dataset) & (step.variant == "keep")]["median"]
    for _, r in step[(step.dataset == dataset) & (step.policy == ALL_OFFLOADED)].iterrows():
        rows = frame[(frame.dataset == dataset) & (frame.variant == r.variant)]
        if pd.notna(r.emulated_gbps):
            gbps, source = float(r.emulated_gbps), "nominal"
        elif r.store in record.get("plans", {}):  # a real store's plans are noted under its name
            gbps, source = record["plans"][r.store]["bandwidth_gbps"], "probed"
        else:
            continue  # no bandwidth the model could be given for this store
        keep_last = int(rows.keep_last.dropna().iloc[0]) if rows.keep_last.notna().any() else 1
        decisions = [planning.OFFLOAD] * (len(layers) - keep_last) + [planning.KEEP] * keep_last
        plan = planning.predict(
            layers,
            decisions,
            gbps * 1e9,
            prof["keep_step_seconds"],
            fixed_bytes=prof["bytes_saved_outside_layers"],
            prefetch=prefetch,
        )
        model_rows.append(
            (
                dataset,
                label(r.variant),
                f"{gbps:.1f} ({source})",
                plan.predicted_seconds - prof["keep_step_seconds"],
                r["median"] - keep_t.iloc[0],
            )
        )
if model_rows:
    errors = [abs(p_ - m) for *_, p_, m in model_rows]
    lines += [
        "",
        "## The cost model against every offload_all run (systems/ssdtrain/planning.py as it is now)",
        "",
        "The model fed each run's recorded profile and the store's bandwidth (emulated: nominal; real: the probe "
        "the plans used); predicted and measured seconds over keep's step. Mean absolute difference: "
        f"{np.mean(errors):.4f} s over {len(errors)} runs.",
        "",
        "| model | variant | GB/s | predicted extra s | measured extra s |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {d} | {v} | {g} | {p_:.4f} | {m:.4f} |" for d, v, g, p_, m in model_rows]

# The offloading bound (systems/ssdtrain/bound.py): the activation-peak reduction each store's
# bandwidth allows at no time overhead, beside what offload_all freed. From the part's rows where
# it wrote them; otherwise from the run's recorded profile and the store's bandwidth (emulated:
# nominal; real: the probe), as the part computes it.
BOUNDS = {}  # dataset -> [(variant, bound bytes)]
recorded_bounds = summarize(frame, "bound_activation_bytes", KEYS)
for dataset in sorted(set(step.dataset)):
    record = next((r["models"][dataset] for r in provenance if r.get("models", {}).get(dataset, {}).get("profile")), {})
    prof = record.get("profile")
    for _, r in step[(step.dataset == dataset) & (step.policy == ALL_OFFLOADED)].iterrows():
        written_row = recorded_bounds[(recorded_bounds.dataset == dataset) & (recorded_bounds.variant == r.variant)]
        if not written_row.empty:
            BOUNDS.setdefault(dataset, []).append((r.variant, written_row["median"].iloc[0]))
            continue
        probed = record.get("store_gbps", {}).get(r.store) or record.get("plans", {}).get(r.store, {}).get(
            "bandwidth_gbps"
        )
        gbps = float(r.emulated_gbps) if pd.notna(r.emulated_gbps) else probed
        if prof is None or gbps is None:
            continue
        rows = frame[(frame.dataset == dataset) & (frame.variant == r.variant)]
        keep_last = int(rows.keep_last.dropna().iloc[0]) if rows.keep_last.notna().any() else 1
        layers = planning.profiles_of_record(prof)
        BOUNDS.setdefault(dataset, []).append(
            (r.variant, bound_of_profile(layers, gbps * 1e9, keep_last).activation_bytes)
        )
if BOUNDS:
    lines += [
        "",
        "## The offloading bound: what a store's bandwidth could free at no time overhead (systems/ssdtrain/bound.py)",
        "",
        "The bytes a store of the measured bandwidth could write while forward runs and read back while backward "
        "runs, from the profile (per-block saved bytes and forward times, backward twice forward): the largest "
        "activation-peak reduction at keep's step time. Beside it, offload_all's measured reduction of "
        f"{memory_metric} below keep's, and its step time over keep's.",
        "",
        "| model | variant | bound GiB | measured reduction GiB | step time x keep |",
        "|---|---|---|---|---|",
    ]
    for dataset, found in BOUNDS.items():
        keep_held = memory[(memory.dataset == dataset) & (memory.variant == "keep")]["median"]
        keep_t = step[(step.dataset == dataset) & (step.variant == "keep")]["median"]
        for variant, bound_bytes in found:
            held_now = memory[(memory.dataset == dataset) & (memory.variant == variant)]["median"]
            t = step[(step.dataset == dataset) & (step.variant == variant)]["median"]
            reduction = (
                f"{(keep_held.iloc[0] - held_now.iloc[0]) / 2**30:.2f}" if len(keep_held) and len(held_now) else ""
            )
            slower = f"{t.iloc[0] / keep_t.iloc[0]:.3f}" if len(keep_t) and len(t) else ""
            lines.append(f"| {dataset} | {label(variant)} | {bound_bytes / 2**30:.2f} | {reduction} | {slower} |")

# Separate processes: each ratio to keep computed within its process, then the range over processes.
processes = {"the committed run": frame} | {name: rows for name, rows in reruns.groupby("process")}
if len(processes) > 1:
    ratio = {
        metric: pd.concat(
            {name: ratios_to_keep(rows[rows.dataset.isin(reruns.dataset)], metric) for name, rows in processes.items()},
            axis=1,
        )
        for metric in ("time", memory_metric)
    }
    lines += [
        "",
        f"## Ratios to keep over {len(processes)} processes (min to max)",
        "",
        "Each ratio is taken within one process, from medians of its timed steps; processes: "
        + ", ".join(processes)
        + ".",
        "",
        f"| model | variant | step time x keep | {memory_metric} x keep |",
        "|---|---|---|---|",
    ]
    order = {v: i for i, v in enumerate(ORDER)}
    for (dataset, variant), row in sorted(ratio["time"].iterrows(), key=lambda r: (r[0][0], order.get(r[0][1], 99))):
        if variant == "keep":
            continue
        held_row = ratio[memory_metric].loc[(dataset, variant)]
        lines.append(
            f"| {dataset} | {label(variant)} | {row.min():.3f} to {row.max():.3f} | "
            f"{held_row.min():.3f} to {held_row.max():.3f} |"
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
# Part memory_bound: each policy at the largest micro-batch that fits under the memory cap.
if not capped.empty:
    capped_keys = ["dataset", "variant", "micro_batch", "global_batch", "sequence", "memory_cap_gib"]
    capped_speed = summarize(capped, "tokens_per_second", capped_keys)
    capped_fits = capped[capped.metric == "fits"]
    # The part times every micro-batch that fits (runs of older code only the largest): a variant
    # is shown at its fastest, beside the largest that fit.
    ONLY_LARGEST = bool(capped_speed.groupby(["dataset", "variant"]).size().max() == 1)
    capped_speed = fastest(capped_speed)
    fitted = capped_fits[capped_fits.value == 1]
    capped_largest = fitted.groupby(["dataset", "variant"]).micro_batch.max()
    keep_speed = capped_speed[capped_speed.variant == "keep"].set_index("dataset")["median"]
    lines += [
        "",
        "## The largest micro-batch under a memory cap (part memory_bound)",
        "",
        "Each policy's largest micro-batch whose training steps ran under the cap (micro-batches tried: those that "
        "did not fit), the fastest micro-batch timed "
        + ("(these runs timed only the largest)" if ONLY_LARGEST else "(every one that fits is timed)")
        + ", tokens per second there at the fixed global batch, and that over keep's at keep's fastest.",
        "",
        "| model | cap GiB | variant | largest micro-batch | did not fit | fastest timed | tokens/s | x keep |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (dataset, variant), tried in capped_fits.groupby(["dataset", "variant"], sort=False):
        too_big = ", ".join(str(b) for b in sorted(tried[tried.value == 0].micro_batch)) or "none tried"
        speed = capped_speed[(capped_speed.dataset == dataset) & (capped_speed.variant == variant)]
        cap_text = f"{tried.memory_cap_gib.iloc[0]:g}"
        if speed.empty:
            lines.append(f"| {dataset} | {cap_text} | {label(variant)} | none fits | {too_big} | | | |")
            continue
        r = speed.iloc[0]
        ratio = f"{r['median'] / keep_speed[dataset]:.2f}" if dataset in keep_speed.index else ""
        largest = capped_largest.get((dataset, variant), r.micro_batch)
        row_cells = [dataset, cap_text, label(variant), largest, too_big, r.micro_batch, f"{r['median']:,.0f}", ratio]
        lines.append("| " + " | ".join(str(c) for c in row_cells) + " |")
    # The claim's numbers from this one part: the fastest SSDTrain configuration (role optimized)
    # against recompute and against torch's best budget, each at its own fastest micro-batch.
    for dataset, speeds in capped_speed.groupby("dataset"):
        by_variant = speeds.set_index("variant")["median"]
        roles = setups.loc[by_variant.index, "role"]
        policies_of = setups.loc[by_variant.index, "policy"]
        ours = by_variant[roles == "optimized"]
        if ours.empty:
            continue
        best = ours.idxmax()
        against = {"recompute": by_variant.get("recompute")}
        # torch's budgets, and compiled keep: its default budget (1.0), what a user compiling would run
        budgets = by_variant[policies_of.isin(["torch_budget", "compiled_keep"])]
        if not budgets.empty:
            against[f"torch's best budget ({label(budgets.idxmax())})"] = budgets.max()
        said = [f"{ours.max() / v:.2f}x the tokens/s of {name}" for name, v in against.items() if v is not None]
        if said:
            fastest = f"{dataset}: the fastest SSDTrain configuration, {label(best)}, reaches "
            lines += ["", fastest + " and ".join(said)]
# Part convergence: loss curves on the generated Markov language, each checked against keep's.
convergence_notes = next((r for r in provenance if r.get("part") == "convergence"), {})
if not curves.empty:
    lines += [
        "",
        "## Convergence on the generated corpus (part convergence)",
        "",
        f"{convergence_notes.get('steps', '?')} AdamW steps from the same weights and batches; every step's loss "
        "of every policy was checked equal to keep's bit for bit before it was recorded (the part stops otherwise). "
        f"Entropy rate of the language (the floor): {convergence_notes.get('entropy_rate', float('nan')):.3f} nats; "
        f"uniform guessing: {convergence_notes.get('uniform_loss', float('nan')):.3f} nats.",
        "",
        "| model | variant | first loss | mean of the last 10 | equal to keep at every step |",
        "|---|---|---|---|---|",
    ]
    for (dataset, variant), g in curves.groupby(["dataset", "variant"]):
        values = g.sort_values("repetition").value.to_numpy()
        keep_curve = curves[(curves.dataset == dataset) & (curves.variant == "keep")]
        same = "yes" if np.array_equal(values, keep_curve.sort_values("repetition").value.to_numpy()) else "NO"
        lines.append(f"| {dataset} | {label(variant)} | {values[0]:.3f} | {values[-10:].mean():.3f} | {same} |")
Path(summary).parent.mkdir(parents=True, exist_ok=True)
Path(summary).write_text("\n".join(lines) + "\n")
print("\n".join(lines))

# %% [markdown]
# ## Figure: activation memory against step time, per model
# The headline: for each model of parts `policies` and `shapes`, every policy's activation peak
# against its step time (colour: the policy; marker: the store), each policy's points joined, and
# the frontier of all of them (no point both smaller and faster) ringed. Points whose markers or
# whiskers would cover each other are set side by side, so that none hides another. Supporting
# figures: the same view for the models of part `models` (`-models`); ratios to keep per model
# (`-ratios`); the bandwidth what-if (`-bandwidth`); the micro-batch sweep and the convergence
# curves (`-training`).

# %%
from matplotlib.lines import Line2D
from matplotlib.text import Text
from matplotlib.transforms import Bbox

MEASURED = machine_label(provenance)
MEMORY_AXIS = {
    "activation_peak": "activation memory peak on the GPU (GiB)",
    "activation_bytes": "activations held on the device (GiB)",
}[memory_metric]
STORE_HATCHES = {"host": "", "file": "//", "kvikio": "xx", "emulated": ".."}
# Colours that mean no variant, each far from every colour of style.VARIANT_STYLE and of
# style.UNSEEN_PALETTE (a user's own variants), so that a colour in these figures names one policy
# only: the frontier's ring, the ranges over processes, and in the bandwidth what-if the models'
# needed lines and the stores' lines (an emulated SSD, host memory throttled, in a plum of its own,
# dotted, apart from host memory's raspberry where their bandwidths meet; a store no registry knows
# gets UNKNOWN_STORE).
FRONTIER = "#ffee00"
RANGE = "#000080"
NEEDED = "#404000"
STORE_LINE = {"host": "#bb4455", "file": "#114499", "kvikio": "#779966", "emulated": "#774466"}
UNKNOWN_STORE = "#aa77ff"
# The frontier is marked by a ring around the point, open in the middle, so that the point keeps its
# policy's colour against the white of the panel (a filled halo hid the olive and orange points).
FRONTIER_RING = dict(marker="o", markersize=17, mfc="none", mec=FRONTIER, mew=2.2, linestyle="none")
SIDE_BY_SIDE = 9  # points between the centres of markers set side by side


def policy_colour(variant: str) -> str:
    return style.color(setups.loc[variant].policy)


# Bars of one policy's colour (torch's budgets, the planner's plans) each get the next of these,
# none of them a store's hatch, so that the legend tells every bar apart.
SAME_COLOUR_HATCHES = ["", "++", "--", "oo", "||", "**", "OO", "++++", "----", "oooo"]


def same_colour_hatch(colour: str, colours_seen: list[str]) -> str:
    """The hatch of the next bar drawn in ``colour``, given the colours of the bars before it (appended to)."""
    hatch = SAME_COLOUR_HATCHES[colours_seen.count(colour) % len(SAME_COLOUR_HATCHES)]
    colours_seen.append(colour)
    return hatch


def store_of(variant: str):
    v = setups.loc[variant]
    return None if pd.isna(v.store) else ("emulated" if pd.notna(v.emulated_gbps) else str(v.store))


def store_marker(variant: str) -> str:
    return style.store_marker(store_of(variant))


def entry_text(registry, name) -> str:
    """Plain words for a policy or store: the suite's own, or the label a user's entry registered."""
    return style.readable(name, registry[name].display if name in registry else "")


def frontier(points):
    """The points no other point beats on both memory and time, by memory."""
    kept, best = [], float("inf")
    for x, y in sorted(points):
        if y < best:
            kept.append((x, y))
            best = y
    return kept


def rok_points(dataset) -> list[dict]:
    """Every variant of ``dataset`` measured for both step time and memory, in the legend's order:
    its median memory (GiB), median step time and quartiles (s), and each other process's medians."""
    points = []
    for variant in ORDER:
        t = step[(step.dataset == dataset) & (step.variant == variant)]
        mem = memory[(memory.dataset == dataset) & (memory.variant == variant)]
        if t.empty or mem.empty:
            continue
        others = [
            (rows[rows.metric == memory_metric].value.median() / 2**30, rows[rows.metric == "time"].value.median())
            for _, rows in reruns[(reruns.dataset == dataset) & (reruns.variant == variant)].groupby("process")
        ]
        points.append(
            {
                "variant": variant,
                "x": mem["median"].iloc[0] / 2**30,
                "y": t["median"].iloc[0],
                "low": t["q25"].iloc[0],
                "high": t["q75"].iloc[0],
                "others": others,
                "dx": 0.0,  # set by set_apart
            }
        )
    return points


def spans_widely(points) -> bool:
    """Whether the step times span a range a linear axis would flatten (the fast ones in one line)."""
    times = [p["y"] for p in points]
    return bool(times) and max(times) / min(times) > 4


def rok_axes(ax, dataset, points, log: bool) -> None:
    """Scales, limits and words of a panel: whiskers and other processes inside it; one scale for
    every panel of a figure."""
    if not points:  # step times but no memory rows: the panel stays empty and save() refuses it by name
        return
    xs = [p["x"] for p in points] + [x for p in points for x, _ in p["others"]]
    ys = [y for p in points for y in (p["low"], p["high"], *(y for _, y in p["others"]))]
    low, high = min(ys), max(ys)
    if log:
        ax.set_yscale("log")
        pad = max(1.04, (high / low) ** 0.08)  # room for the markers, more over a wide range
        ax.set_ylim(low / pad, high * pad)
        style.log_ticks(ax.yaxis)
    else:  # a close range of times: room around the points, not an axis from zero that flattens them
        pad = 0.08 * (high - low) + 0.01 * high
        ax.set_ylim(low - pad, high + pad)
    ax.set_xlim(0, 1.1 * max(xs))
    ax.set(
        xlabel=MEMORY_AXIS,
        ylabel="step time (s, log scale)" if log else "step time (s)",
        title=style.llm_model_label(dataset),
    )


def set_apart(ax, points) -> None:
    """Sets side by side points of the same memory whose markers or whiskers would overlap (``dx``,
    in GiB): a point whose memory no other shares keeps its place, and so does the first of each
    memory in the legend's order; each other takes the nearest free place, SIDE_BY_SIDE points to
    the right or left, so that the shared memory stays in the middle. Needs the panel's final size."""
    to_px = ax.transData.transform
    step_px = SIDE_BY_SIDE * ax.figure.dpi / 72
    gib_per_px = (ax.get_xlim()[1] - ax.get_xlim()[0]) / ax.bbox.width
    same = 0.003 * ax.get_xlim()[1]  # memories closer than this are one memory
    first_of = {}
    for p in points:
        first_of.setdefault(next((m for m in first_of if abs(m - p["x"]) < same), p["x"]), p["variant"])
    settled = set(first_of.values())
    placed = []  # (x, lowest y, highest y) in pixels
    for p in sorted(points, key=lambda p: p["variant"] not in settled):  # the settled first, in order
        x, y = to_px((p["x"], p["y"]))
        bottom, top = sorted([to_px((p["x"], p["low"]))[1], to_px((p["x"], p["high"]))[1]])
        bottom, top = min(bottom, y - step_px / 2), max(top, y + step_px / 2)
        for k in (0,) if p["variant"] in settled else (0, 1, -1, 2, -2, 3, -3, 4, -4, 5, -5):
            free = all(abs(x + k * step_px - px) > step_px - 0.5 or top < b or bottom > t for px, b, t in placed)
            if free:
                break
        placed.append((x + k * step_px, bottom, top))
        p["dx"] = k * step_px * gib_per_px


def obstacles_of(ax, points, extra=()) -> list:
    """Boxes (pixels) of what a label must not cover: markers, whiskers and ``extra`` boxes."""
    to_px = ax.transData.transform
    pt = ax.figure.dpi / 72
    boxes = list(extra)
    for p in points:
        x, y = to_px((p["x"] + p["dx"], p["y"]))
        boxes.append(Bbox.from_extents(x - 4 * pt, y - 4 * pt, x + 4 * pt, y + 4 * pt))
        low, high = sorted([to_px((0, p["low"]))[1], to_px((0, p["high"]))[1]])
        boxes.append(Bbox.from_extents(x - 2 * pt, low, x + 2 * pt, high))
        for ox, oy in p["others"]:
            cx, cy = to_px((ox + p["dx"], oy))
            boxes.append(Bbox.from_extents(cx - 5 * pt, cy - 5 * pt, cx + 5 * pt, cy + 5 * pt))
    return boxes


# Where a label may go, in points from its point: beside it, then above or below, then further out
# (joined to its point by a thin line).
LABEL_PLACES = [(5, 0), (-5, 0), (0, 6), (0, -6), (6, 6), (6, -6), (-6, 6), (-6, -6)] + [
    (dx * r, dy * r)
    for r in (2, 3, 4)
    for dx, dy in [(6, 0), (-6, 0), (0, 6), (0, -6), (5, 5), (5, -5), (-5, 5), (-5, -5)]
]


def place_labels(ax, labels, obstacles) -> None:
    """Writes each (x, y, text, colour) of ``labels`` at the first of LABEL_PLACES where it stays in
    the panel and covers no obstacle and no label written before (the last place if none is free)."""
    renderer = ax.figure.canvas.get_renderer()
    taken = list(obstacles)
    for x, y, text, colour in labels:
        for i, (dx, dy) in enumerate(LABEL_PLACES):
            far = abs(dx) > 6 or abs(dy) > 6
            note = ax.annotate(
                text,
                (x, y),
                xytext=(dx, dy),
                textcoords="offset points",
                ha="left" if dx > 0 else "right" if dx < 0 else "center",
                va="bottom" if dy > 0 else "top" if dy < 0 else "center",
                fontsize=6.5,
                color=colour,
                zorder=4,
                arrowprops=dict(arrowstyle="-", color=colour, linewidth=0.5, shrinkA=0, shrinkB=4) if far else None,
            )
            note.set_in_layout(False)
            note.update_positions(renderer)
            box = Text.get_window_extent(note, renderer)  # the words, not the leader
            inside = ax.bbox.contains(box.x0, box.y0) and ax.bbox.contains(box.x1, box.y1)
            if (inside and not any(box.overlaps(t) for t in taken)) or i == len(LABEL_PLACES) - 1:
                taken.append(box)
                break
            note.remove()


def rok_draw(ax, dataset, points) -> None:
    """The panel's points (side by side where they would overlap), each policy's points joined, the
    frontier's rings, the offloading bound and the emulated stores' bandwidths. Needs the panel's
    final size."""
    set_apart(ax, points)
    labels, by_policy = [], {}
    for p in points:
        variant, x = p["variant"], p["x"] + p["dx"]
        colour, marker = policy_colour(variant), store_marker(variant)
        ax.errorbar(
            [x],
            [p["y"]],
            yerr=[[p["y"] - p["low"]], [p["high"] - p["y"]]],
            fmt=marker,
            color=colour,
            markersize=6,
            capsize=2,
            zorder=3,
        )
        for ox, oy in p["others"]:
            ax.plot([ox + p["dx"]], [oy], marker, mfc="none", color=colour, markersize=8, alpha=0.7, zorder=3)
        by_policy.setdefault(setups.loc[variant].policy, []).append((p["x"], p["y"], x))
        gbps = setups.loc[variant].emulated_gbps
        if pd.notna(gbps):
            labels.append((x, p["y"], f"{gbps:g}", colour))
    # Each policy's points joined in the order of memory, where they are drawn; not two of the same
    # memory (set side by side, their join would slant as if memory differed).
    same = 0.005 * ax.get_xlim()[1]
    for policy, xy in by_policy.items():
        ordered = sorted(xy)
        for (x0, y0, at0), (x1, y1, at1) in zip(ordered, ordered[1:]):
            if x1 - x0 > same:
                ax.plot([at0, at1], [y0, y1], color=style.color(policy), linewidth=0.8, alpha=0.6, zorder=2)
    on_edge = set(frontier([(p["x"], p["y"]) for p in points]))
    rings = []  # a label on a ring would be written over its yellow: rings are obstacles too
    ring = (FRONTIER_RING["markersize"] + FRONTIER_RING["mew"]) / 2 * ax.figure.dpi / 72
    for p in points:
        if (p["x"], p["y"]) in on_edge:
            ax.plot([p["x"] + p["dx"]], [p["y"]], **FRONTIER_RING, zorder=1.5)
            x, y = ax.transData.transform((p["x"] + p["dx"], p["y"]))
            rings.append(Bbox.from_extents(x - ring, y - ring, x + ring, y + ring))
    bound = bound_line(ax, dataset)
    place_labels(ax, labels, obstacles_of(ax, points, [*rings, *([bound] if bound else [])]))


def bound_tick_text(variant: str) -> str:
    """The words under a bound's tick: an emulated SSD's GB/s, as beside its points; else the store."""
    gbps = setups.loc[variant].emulated_gbps
    if pd.notna(gbps):
        return f"{gbps:g}"
    return {"host": "host", "file": "file", "kvikio": "KvikIO"}.get(store_of(variant), str(store_of(variant)))


def bound_line(ax, dataset):
    """The offloading bound at keep's step time: from keep's memory down by the most any measured
    store could free at no time overhead, a tick where each store's bound ends. Returns its box in
    pixels (None where there is no bound)."""
    keep_t = step[(step.dataset == dataset) & (step.variant == "keep")]["median"]
    keep_held = memory[(memory.dataset == dataset) & (memory.variant == "keep")]["median"]
    if not BOUNDS.get(dataset) or keep_t.empty or keep_held.empty:
        return None
    x0, y = keep_held.iloc[0] / 2**30, keep_t.iloc[0]
    ends = [(x0 - b / 2**30, variant) for variant, b in BOUNDS[dataset]]
    colour = style.color(ALL_OFFLOADED)
    ax.plot([min(x for x, _ in ends), x0], [y, y], color=colour, linestyle="--", linewidth=1.2, zorder=2)
    ax.plot([x for x, _ in ends], [y] * len(ends), "|", color=colour, markersize=12, markeredgewidth=1.5, zorder=2)
    # Which store's bound each tick is (its GB/s, emulated, or its name) below it; ticks closer than
    # a word's width share one label ("55/host"), written at their middle.
    pt = ax.figure.dpi / 72
    groups: list[list[tuple[float, str]]] = []
    for x, variant in sorted(ends):
        at = ax.transData.transform((x, y))[0]
        if groups and at - ax.transData.transform((groups[-1][-1][0], y))[0] < 16 * pt:
            groups[-1].append((x, variant))
        else:
            groups.append([(x, variant)])
    for group in groups:
        words = list(dict.fromkeys(bound_tick_text(variant) for _, variant in group))
        ax.annotate(
            "/".join(words),
            (sum(x for x, _ in group) / len(group), y),
            xytext=(0, -8),
            textcoords="offset points",
            ha="center",
            va="top",
            fontsize=6,
            color=colour,
        )
    (left, middle), (right, _) = ax.transData.transform([(min(x for x, _ in ends), y), (x0, y)])
    # The ticks (6 pt either side) and the words under them (8 pt down, 6 pt type).
    return Bbox.from_extents(left, middle - 15 * pt, right, middle + 6 * pt)


def rok_legend(fig, datasets) -> None:
    shown = set(setups.loc[[v for v in ORDER if (step.dataset.isin(datasets) & (step.variant == v)).any()]].policy)
    entries = {
        entry_text(POLICIES, p): Line2D([], [], color=style.color(p), marker="o", linestyle="-", linewidth=0.8)
        for p in [*POLICIES.names(), *sorted(set(setups.policy) - set(POLICIES.names()))]
        if p in shown
    }
    # Every policy has its colour and every store its marker, a user's own too: each is one entry.
    stores = {store_of(v) for v in ORDER if (step.dataset.isin(datasets) & (step.variant == v)).any()} - {None}
    for store in [*STORES.names(), *sorted(stores - set(STORES.names()))]:
        if store in stores:
            name = "emulated SSD (GB/s beside it)" if store == "emulated" else entry_text(STORES, store)
            marker = style.store_marker(store)
            entries[f"store: {name}"] = Line2D([], [], color="#555555", marker=marker, linestyle="none")
    entries["yellow ring: on the frontier (no point both smaller and faster)"] = Line2D([], [], **FRONTIER_RING)
    if any(BOUNDS.get(d) for d in datasets):
        entries["bound: memory a store's bandwidth frees at keep all's time (|: each store, named below)"] = Line2D(
            [], [], color=style.color(ALL_OFFLOADED), linestyle="--", linewidth=1.2, marker="|", markersize=10
        )
    entries["side by side: points that would cover each other (the same memory)"] = Line2D(
        [], [], color="#555555", marker=r"$\leftrightarrow$", markersize=11, linestyle="none"
    )
    if not reruns[reruns.dataset.isin(datasets)].empty:
        entries["hollow: another process"] = Line2D([], [], color="#555555", marker="o", mfc="none", linestyle="none")
    style.legend_below(fig, entries, columns=5)


def rok_figure(datasets, heading, what=None) -> None:
    fig, axes = style.panels(len(datasets), cols=2, width=6.0, height=4.2)
    point_sets = [rok_points(dataset) for dataset in datasets]
    log = any(spans_widely(points) for points in point_sets)  # one time scale for every panel
    for ax, dataset, points in zip(axes, datasets, point_sets):
        rok_axes(ax, dataset, points, log)
    rok_legend(fig, datasets)
    style.title(fig, heading, MEASURED)
    fig.draw_without_rendering()  # the panels' final sizes, which setting points apart is measured in
    for ax, dataset, points in zip(axes, datasets, point_sets):
        rok_draw(ax, dataset, points)
    style.save(fig, figure, what)


# The headline part's model first, then the paper's shapes by width; part models apart.
rok_rows = frame[frame.part.isin(["policies", "shapes"])].drop_duplicates("dataset")
rok_datasets = [
    r.dataset
    for r in rok_rows.sort_values(
        ["part", "hidden"], key=lambda c: c.map({"policies": 0, "shapes": 1}) if c.name == "part" else c
    ).itertuples()
] or sorted(set(step.dataset))
other_datasets = [d for d in sorted(set(step.dataset)) if d not in rok_datasets]
MAIN_DRAWN = bool(rok_datasets)  # the frontier of the first models is the topic's figure
VIEW = "activation memory against step time; lower left wins"
NOT_MEASURED = "" if "torch_budget" in set(setups.policy) else " (torch's activation-memory budget not measured)"


def families_of(datasets) -> str:
    """ "BERT, GPT-2 and T5": the model families of ``datasets`` in words."""
    names = sorted({style.llm_model_label(d, short=True).split(" ")[0] for d in datasets})
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


for first in range(0, len(rok_datasets), 6):
    rok_figure(
        rok_datasets[first : first + 6],
        f"Activation offloading: {VIEW}{NOT_MEASURED}",
        None if first == 0 else f"more_{first // 6}",
    )
for first in range(0, len(other_datasets), 6):
    shown = other_datasets[first : first + 6]
    rok_figure(
        shown,
        f"Activation offloading on {families_of(shown)}: {VIEW}{NOT_MEASURED}",
        "models" if first == 0 else f"models_{first // 6 + 1}",
    )

# %% [markdown]
# ## Supporting figures: ratios to keep, the bandwidth what-if, micro-batches and convergence

# %%
compared = frame[frame.part.isin(["policies", "models"])]
models = sorted(set(compared.dataset)) or sorted(set(step.dataset))
shared = [v for v in ORDER if all(((step.dataset == d) & (step.variant == v)).any() for d in models)]
shared = [v for v in shared if v != "keep"]


def variant_label(variant: str, row=None) -> str:
    """The variant's label from its setup (``row``: one of its rows where a part sets it apart, as
    part memory_bound's plans, made within the cap's room rather than a budget fraction)."""
    v = setups.loc[variant] if row is None else row
    name = f"{style.readable(v.policy)}{setting_text(v)}"
    if pd.isna(v.store):
        return name
    store = f"{v.emulated_gbps:g} GB/s emulated" if pd.notna(v.emulated_gbps) else style.readable(v.store)
    return f"{name}, {store}"


if STEPS:  # ratios to keep, per model
    # Each ratio to keep within each process (the committed run and every re-run), one column a process:
    # a bar's range where its model was measured in more than one.
    process_ratios = {
        metric: pd.concat({name: ratios_to_keep(rows, metric) for name, rows in processes.items()}, axis=1)
        for metric in ("time", memory_metric)
    }
    fig, axes = style.panels(2, cols=2, width=6.5, height=4.2)
    ranged = False
    for ax, table, metric, what in (
        (axes[0], step, "time", "step time"),
        (axes[1], memory, memory_metric, MEMORY_AXIS.split(" (")[0].split(" on ")[0]),
    ):
        width = 0.8 / max(len(shared), 1)
        tops, bottoms = [1.0], [1.0]
        colours_seen = []  # variants of one policy (torch's budgets, the planner's plans) told apart by hatch
        for j, variant in enumerate(shared):
            centres = np.arange(len(models)) + (j - (len(shared) - 1) / 2) * width
            values = []
            for dataset in models:
                both = table[table.dataset == dataset].set_index("variant")["median"]
                values.append(both[variant] / both["keep"])
            ax.bar(
                centres,
                values,
                width,
                color=policy_colour(variant),
                hatch=STORE_HATCHES.get(store_of(variant), "")
                + same_colour_hatch(policy_colour(variant), colours_seen),
                edgecolor="white",
                linewidth=0,
                label=variant_label(variant),
            )
            tops += values
            bottoms += values
            for centre, value, dataset in zip(centres, values, models):
                over = (
                    process_ratios[metric].loc[(dataset, variant)].dropna()
                    if (dataset, variant) in process_ratios[metric].index
                    else pd.Series(dtype=float)
                )
                if len(over) > 1:
                    ax.errorbar(
                        [centre],
                        [value],
                        yerr=[[value - over.min()], [over.max() - value]],
                        fmt="none",
                        color=RANGE,
                        capsize=2,
                        elinewidth=1,
                        zorder=3,
                    )
                    tops.append(over.max())
                    bottoms.append(over.min())
                    ranged = True
        style.reference_line(ax, 1.0, "keep all", kind="parity")
        ax.set_xticks(range(len(models)), [style.llm_model_label(m, short=True).split(",")[0] for m in models])
        ax.set(title=f"{what.capitalize()} per model, relative to keep all")
        if metric == "time":  # ratios from below 1 to many times: a log axis, ticks wherever bars end
            ax.set_yscale("log")
            ax.set_ylim(min(bottoms) / 1.1, max(tops) * 1.25)
            style.log_ticks(ax.yaxis)
            ax.set_ylabel(f"{what} relative to keep all (log scale)")
        else:
            ax.set_ylim(0, max(tops) * 1.08)
            ax.set_ylabel(f"{what} relative to keep all")
        ax.grid(axis="x", visible=False)
    entries = style.collect_legend(axes)
    counted = len(processes)
    if ranged:
        entries[f"range over {counted} processes, where a model was re-run (bar: the committed run)"] = Line2D(
            [], [], color=RANGE, marker="_", markersize=6, linewidth=1
        )
    style.legend_below(fig, entries, columns=4)
    shapes = sorted({style.llm_model_label(m).split(", ", 3)[-1] for m in models})
    unranged = "" if ranged else "; one process per model"
    style.title(
        fig,
        f"Activation offloading: step time and memory relative to keep all per model ({'; '.join(shapes)}{unranged})",
        MEASURED,
    )
    style.save(fig, figure, "ratios")


# The processor the steps ran on: the GPU, or the CPU of a machine without one (the what-if holds for
# either; the axis names the one whose throughput was measured).
PROCESSOR = "GPU" if any(record["machine"]["gpus"] for record in provenance) else "CPU"


def fit_to_title(fig) -> None:
    """Widens ``fig`` to its title where the title (the machine's line) is the wider: saved tight, a
    narrower figure would leave empty margins beside its panels."""
    fig.draw_without_rendering()
    widest = max((text.get_window_extent().width for text in fig.texts), default=0) / fig.dpi
    fig.set_figwidth(max(fig.get_figwidth(), widest))


# What-if: the write bandwidth that hides a block's offload inside its own forward, for a GPU of
# any speed (SSDTrain's criterion), against the bandwidths the stores reached here. A block's
# needed bandwidth is its saved bytes over its forward time, its FLOPs over the rate: proportional
# to the rate, a straight line on log axes, one per model (models of the same bytes per FLOP share
# one). Lines are named in the margin, labels pushed apart where lines run close.
def grouped_by_bytes_per_flop(datasets) -> list[tuple[float, list[str]]]:
    """(largest saved bytes per forward FLOP of a block, the models with it): models within 1 %
    of each other share one line."""
    groups = []
    for per, dataset in sorted((max(b / f for b, f in zip(*block_costs_of(d))), d) for d in datasets):
        if groups and per <= groups[-1][0] * 1.01:
            groups[-1][1].append(dataset)
        else:
            groups.append((per, [dataset]))
    return groups


def models_text(datasets, sequence: str) -> str:
    """ "BERT 256x4 and GPT-2 256x4, batch 4": short names, a shared batch said once, and the
    words ``sequence`` (", seq 256", said in the title where every model shares it) left out."""
    names = [style.llm_model_label(d, short=True).replace(sequence, "").split(", ", 1) for d in datasets]
    if len({tuple(n[1:]) for n in names}) == 1:
        return " and ".join(n[0] for n in names) + "".join(f", {n}" for n in names[0][1:])
    return "; ".join(", ".join(n) for n in names)


if STEPS:  # the models' needed bandwidths against the stores' achieved ones
    fig, (ax,) = style.panels(1, width=9.5, height=6.0)
    keep_rates = rate[rate.variant == "keep"]["median"] * 1e12
    # Three decades: from well below the slowest rate measured to ten times the fastest.
    low, high = (keep_rates.min() / 30, keep_rates.max() * 10) if not keep_rates.empty else (10e12, 2e15)
    speeds = np.array([low, high])
    names = []  # (height at the right edge, text, colour): named in the margin
    lengths = set(frame.drop_duplicates("dataset").sequence.dropna().astype(int))
    sequence = f", seq {lengths.pop()}" if len(lengths) == 1 else "\n"  # "\n": in no model's name
    entries = {
        "needed by a model (named at right)": Line2D([], [], color=NEEDED, linewidth=1.1),
        "keep all's measured throughput": Line2D([], [], color=style.color("keep"), marker="o", markersize=4, ls=""),
    }
    for per, datasets in grouped_by_bytes_per_flop(sorted(set(step.dataset))):
        ax.plot(speeds / 1e12, per * speeds / 1e9, color=NEEDED, linewidth=1.1)
        names.append((per * high / 1e9, models_text(datasets, sequence), NEEDED))
        for dataset in datasets:
            keep_rate = rate[(rate.dataset == dataset) & (rate.variant == "keep")]["median"]
            if not keep_rate.empty:
                here = keep_rate.iloc[0] * 1e12
                ax.plot([here / 1e12], [per * here / 1e9], "o", color=style.color("keep"), markersize=4, zorder=3)
    n_models = len(names)  # the stores' lines are named after the models'
    for variant in ORDER:
        if setups.loc[variant].policy != ALL_OFFLOADED:
            continue
        sel = lambda d: d[d.variant == variant]["median"]  # noqa: E731
        w, ws = sel(written).sum(), sel(write_seconds).sum()
        nominal = setups.loc[variant].emulated_gbps
        if pd.notna(nominal):  # drawn over a store's solid line where the two meet
            ax.axhline(nominal, color=STORE_LINE["emulated"], linestyle=":", linewidth=1.6, zorder=2.5)
            names.append((nominal, f"emulated SSD, {nominal:g} GB/s", STORE_LINE["emulated"]))
            entries["emulated SSD (host memory throttled), nominal"] = Line2D(
                [], [], color=STORE_LINE["emulated"], linestyle=":", linewidth=1.6
            )
        elif ws > 0:
            store = setups.loc[variant].store
            colour = STORE_LINE.get(store, UNKNOWN_STORE)
            ax.axhline(w / ws / 1e9, color=colour, linestyle="-", linewidth=2.4, alpha=0.8, zorder=2)
            names.append((w / ws / 1e9, f"{style.readable(store)}, {w / ws / 1e9:.3g} GB/s achieved", colour))
            entries[f"{style.readable(store)}, achieved"] = Line2D([], [], color=colour, linewidth=2.4, alpha=0.8)
    ax.set(
        xscale="log",
        yscale="log",
        xlim=(low / 1e12, high / 1e12),
        xlabel=f"compute throughput of the {PROCESSOR} (model TFLOP/s, log scale)",
        ylabel="write bandwidth (GB/s, log scale)",
        title=(
            "Needed write bandwidth against the stores here"
            if len(names) > n_models
            else "Needed write bandwidth (no store line: no run here offloaded every block)"
        )
        + (f" (sequences of {sequence.split()[-1]} tokens)" if sequence.startswith(",") else "")
        + f":\na store's line above a model's at a {PROCESSOR}'s throughput"
        + " hides that model's writes inside its forward",
    )
    style.log_ticks(ax.xaxis)
    style.log_ticks(ax.yaxis)
    style.legend_below(fig, entries, columns=3)
    style.title(
        fig, f"Activation offloading: the write bandwidth an offload needs, for a {PROCESSOR} of any speed", MEASURED
    )
    fit_to_title(fig)
    fig.draw_without_rendering()  # the panel's final height, which the margin's labels are spaced in
    style.margin_labels(ax, names)
    style.save(fig, figure, "bandwidth")

dashes = ["-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 2)), (0, (3, 1, 1, 1))]
training_panels = (2 if not sweep.empty else 0) + (1 if not capped.empty else 0) + (1 if not curves.empty else 0)
if training_panels:
    # One panel alone gets the width of two: the title and the bars' labels would wrap into each other.
    fig, axes = style.panels(
        training_panels, cols=2 if training_panels == 4 else 3, width=5.0 if training_panels > 1 else 9.0, height=3.8
    )
    cells = iter(axes)
    if not sweep.empty:
        speed_ax, held_ax = next(cells), next(cells)
        for variant in [v for v in ORDER if v in set(sweep_time.variant)]:
            t = sweep_time[sweep_time.variant == variant].sort_values("micro_batch")
            h = sweep_held[sweep_held.variant == variant].sort_values("micro_batch")
            colour = policy_colour(variant)
            speed_ax.plot(
                t.micro_batch,
                t.global_batch * t.sequence / t["median"],
                marker=store_marker(variant),
                color=colour,
                label=variant_label(variant),
            )
            held_ax.plot(h.micro_batch, h["median"] / 2**30, marker=store_marker(variant), color=colour)
        micro_all = sorted(set(sweep.micro_batch))
        title = (
            f"{style.llm_model_label(sweep_time.dataset.iloc[0], short=True)}, "
            f"{int(sweep_time.global_batch.iloc[0])} sequences per step"
        )
        if not oom.empty:
            title += f"\nout of memory at micro-batch {', '.join(str(b) for b in sorted(set(oom.micro_batch)))}"
        speed_ax.set(
            xscale="log",
            xlabel=style.axis_label("micro_batch"),
            ylabel="training throughput (tokens/s)",
            ylim=(0, None),
            title=title,
        )
        held_ax.set(
            xscale="log",
            xlabel=style.axis_label("micro_batch"),
            ylabel=style.axis_label("activation_bytes"),
            ylim=(0, None),
            title="Activations one micro-step holds",
        )
        for ax in (speed_ax, held_ax):
            ax.minorticks_off()  # the micro-batches themselves are the ticks
            ax.set_xticks(micro_all, [str(b) for b in micro_all])
    if not capped.empty:
        ax = next(cells)
        shown = [v for v in ORDER if v in set(capped_speed.variant)]
        process_speed = (
            summarize(capped_reruns, "tokens_per_second", [*capped_keys, "process"])
            if not capped_reruns.empty
            else capped_speed.iloc[0:0]
        )
        colours_seen = []  # variants of one policy (torch's budgets) told apart by hatch
        for i, variant in enumerate(shown):
            r = capped_speed[capped_speed.variant == variant].iloc[0]
            colour = policy_colour(variant)
            hatch = same_colour_hatch(colour, colours_seen)
            label = variant_label(variant, capped[capped.variant == variant].iloc[0])
            ax.bar(i, r["median"], color=colour, hatch=hatch, edgecolor="white", label=label)
            others = process_speed[(process_speed.variant == variant) & (process_speed.micro_batch == r.micro_batch)][
                "median"
            ]
            ax.plot(
                [i] * (1 + len(others)),
                [r["median"], *others],
                "o",
                color="black",
                markersize=3,
                zorder=3,
                label="each process's median" if len(others) else None,
            )
            largest = capped_largest.get((r.dataset, variant), r.micro_batch)
            ax.annotate(
                f"b={r.micro_batch}" + (f"\n({largest} fit)" if largest != r.micro_batch else ""),
                (i, r["median"]),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 3),
                textcoords="offset points",
            )
        ticks = [variant_label(v, capped[capped.variant == v].iloc[0]) for v in shown]
        ax.set_xticks(range(len(shown)), ticks, rotation=30, ha="right", fontsize=7)
        highest = max([capped_speed["median"].max(), *process_speed["median"]])
        ax.set(
            ylabel="training throughput (tokens/s)",
            ylim=(0, 1.25 * highest),  # room above the bars for their micro-batch labels (two lines)
            title=f"{style.llm_model_label(capped_speed.dataset.iloc[0], short=True)} under a "
            f"{capped_speed.memory_cap_gib.iloc[0]:g} GiB cap: each at its "
            + ("largest\nmicro-batch (b) that fits" if ONLY_LARGEST else "fastest\nmicro-batch (b) of those that fit")
            + (f" ({1 + process_speed.process.nunique()} processes)" if not process_speed.empty else ""),
        )
    if not curves.empty:
        ax = next(cells)
        elsewhere = set(sweep.variant) | set(capped.variant)  # a variant of the loss curves alone is said so
        for i, variant in enumerate(v for v in ORDER if v in set(curves.variant)):
            g = curves[curves.variant == variant].sort_values("repetition")
            look = (
                dict(linewidth=3.5, alpha=0.35)
                if variant == "keep"
                else dict(linewidth=1.2, linestyle=dashes[i % len(dashes)])
            )
            alone = elsewhere and variant not in elsewhere  # other panels drawn, this variant in none of them
            text = variant_label(variant) + (" (loss panel only)" if alone else "")
            ax.plot(g.repetition + 1, g.value, color=policy_colour(variant), label=text, **look)
        for value, text in (
            (convergence_notes.get("uniform_loss"), "uniform guessing"),
            (convergence_notes.get("entropy_rate"), "entropy rate (floor)"),
        ):
            if value is not None:
                style.reference_line(ax, value, text, kind="ceiling")
        ax.set(
            xlabel="optimizer step",
            ylabel="training loss (nats)",
            ylim=(0, None),
            title=f"{style.llm_model_label(curves.dataset.iloc[0], short=True)} on the generated corpus:\n"
            + (
                "every policy's loss equal to keep all's at every step (the lines coincide)"
                if curves.variant.nunique() > 1
                else "keep only"
            ),
        )
    style.legend_below(fig, style.collect_legend(axes), columns=5)
    subjects = ["micro-batch size"] if not (sweep.empty and capped.empty) else []
    subjects += ["convergence"] if not curves.empty else []
    processes = "one process each" if capped_reruns.empty else "one process each but the capped panel"
    heading = f"Activation offloading in training: {' and '.join(subjects)} ({processes})"
    if training_panels == 1 and not capped.empty:  # the panel's title says its processes
        heading = "Activation offloading in training: throughput under a GPU memory cap" + (
            " (one process)" if capped_reruns.empty else ""
        )
    style.title(fig, heading, MEASURED)
    # The main figure where no part timed a step per policy (no frontier drawn above).
    style.save(fig, figure, "training" if MAIN_DRAWN else None)
