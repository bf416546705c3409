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
# # Relational GNN layers: every baseline form on every graph
#
# One layer on the full graph (`workloads.relational_gnn`): RGCN, RGAT and HGT in each form of the
# registry `systems/rgnn/forms` (PyG's layers, per-edge weights, a matrix product per relation
# segment, one grouped GEMM, Hector's variants), inference and training, every form checked against
# the `segment_mm` form before it was timed. The forms, their roles and their order come from the
# rows and the registry: a form the registry does not know still appears everywhere, after the
# known ones. Speedups are over the fastest competitor (role baseline or peer) in float32, and the
# headline speedup is that of one Hector configuration named before anything was timed
# (`HEADLINE`); the fastest of Hector's variants per graph, picked after measuring, is shown beside
# it as an ideal. A step's time is split into its kernels' time and the host's. Times
# are medians of the timed calls with the interquartile range; memory is the intermediate memory
# (the call's peak above what was allocated before the timed loop, GPU only). A form that ran out
# of memory is marked OOM with the allocation that failed.

# %% tags=["parameters"]
machine = "local"
scale = "cpu"
figure = "paper_figs/local/relational_gnn-cpu.png"
summary = "paper_figs/local/relational_gnn-cpu.md"
results = {}  # topic -> its results files, passed by the workflow

# %%
import re
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.common import lacking, load_results, machine_label, same_code_reruns, summarize
from harness.registry import COMPETITOR_ROLES, ENTRY_ROLES
from systems.rgnn.forms import EXACT
from systems.rgnn.forms import FORMS as REGISTRY
from systems.rgnn.forms.hector import HectorForm
from workloads.relational_gnn.schema import SCHEMA


def complete(rows):
    """Rows written before the ``form`` and ``precision`` columns: the variant was its own form,
    in the precision its ``dtype`` said then."""
    rows["form"] = rows["form"].fillna(rows.variant)
    rows["precision"] = rows["precision"].fillna(rows.dtype)
    return rows


frame, provenance = load_results(results["relational_gnn"], SCHEMA, cut_short=True)  # labelled below
frame = complete(frame)
# Other processes of some parts (results/<machine>/relational_gnn/reruns/*/) of the committed
# run's code: the speedups below are also given as their range over every process that measured them.
rerun_files, other_code = same_code_reruns(results.get("relational_gnn_reruns", []), results["relational_gnn"])
rerun_frame, rerun_provenance = load_results(rerun_files, SCHEMA) if rerun_files else (None, [])
reruns = complete(rerun_frame) if rerun_files else frame.iloc[0:0]
# Where and when: every process whose numbers are shown (the ranges take the re-runs in too).
MEASURED = machine_label(provenance + rerun_provenance)
gemm_frame = frame[frame.model == "gemm"]  # part gemm_template: the GEMM template alone
frame = frame[frame.model != "gemm"]
KEYS = ["dataset", "model", "mode", "in_dim", "variant", "edges", "unique_pairs"]
time = summarize(frame, "time", KEYS)
memory = summarize(frame, "intermediate_memory", KEYS)
oom = frame[frame.metric == "out_of_memory"]
failed = frame[frame.metric == "failed_allocation_bytes"]
# Each variant's role, computation and precision, as its rows say.
ROLE, FORM, PRECISION = (dict(zip(frame.variant, frame[c])) for c in ("role", "form", "precision"))
# The registry's forms in its order, then any form it does not know, by role and name.
ROLE_ORDER = {role: i for i, role in enumerate(ENTRY_ROLES)}
unseen = sorted(set(ROLE) - set(REGISTRY.names()), key=lambda v: (ROLE_ORDER.get(ROLE[v], len(ROLE_ORDER)), v))
FORMS = [v for v in REGISTRY.names() if v in ROLE] + unseen
# The float32 comparison: the competitors (baselines and peers) and the optimized forms. A form of
# another precision (the labelled tensor-core variant) is shown beside them, kept out of it.
COMPETITORS = [v for v in FORMS if ROLE[v] in COMPETITOR_ROLES and PRECISION[v] == EXACT]
OPTIMIZED = [v for v in FORMS if ROLE[v] == "optimized" and PRECISION[v] == EXACT]
OTHER_PRECISION = [v for v in FORMS if PRECISION[v] != EXACT]
# The Hector configuration every headline speedup is quoted for: all of its passes on, float32,
# named here before anything is timed. The fastest variant per graph is a pick only a user who
# had timed every variant on their graph could make, and the minimum of several noisy medians
# flatters; it is shown as an ideal, beside the headline and never as it.
HEADLINE = "hector_best"
# Hector's own forms (its generated kernels on a GPU), and the one without passes: the ablation's base.
GENERATED = [v for v in FORMS if v in REGISTRY and isinstance(REGISTRY[v], HectorForm)]
UNOPTIMIZED = next((v for v in GENERATED if v in OPTIMIZED and not REGISTRY[v].passes), None)
# Hector's variants: its generated forms, and those of results from a checkout whose registry had
# forms this one lacks (named hector_*). A user's own optimized form is another technique: listed
# with every form, never counted as Hector's in its ideal or its ablation.
HECTOR = [v for v in OPTIMIZED if v in GENERATED or (v not in REGISTRY and v.startswith("hector"))]
OTHER_TECHNIQUES = [v for v in OPTIMIZED if v not in HECTOR]
# Graphs from the smallest to the largest, so the panels read left to right by size.
GRAPHS = list(frame.drop_duplicates("dataset").sort_values("edges").dataset)
width = 64 if 64 in set(time.in_dim) else max(time.in_dim)  # the main comparison's width (Hector's)
on_gpu = set(frame.device) == {"cuda"}  # else Hector's variants ran its reference backend
print(MEASURED)
for f in other_code:
    print(f"left out (measured at other code, or on other hardware, than the committed run): {f}")

# %% [markdown]
# ## Every model x dataset x form x mode

# %%
lines = [
    f"# Relational GNN layers on `{machine}` at scale `{scale}`",
    "",
    MEASURED,
    "",
    "Time: median of the timed calls. Memory: intermediate memory (GPU). Best: the fastest form of the row's "
    "model, dataset, width and mode. Edges / pairs: edges per distinct (source, relation) pair, the most "
    "compact materialization can save.",
    "",
    "| dataset | edges / pairs | model | width | mode | form | time ms | x best | memory MiB |",
    "|---|---|---|---|---|---|---|---|---|",
]
for (dataset, model, dim, mode), g in time.groupby(["dataset", "model", "in_dim", "mode"]):
    best = g["median"].min()
    ratio = g.edges.iloc[0] / g.unique_pairs.iloc[0]
    for _, r in g.sort_values("median").iterrows():
        held = memory[
            (memory.dataset == dataset)
            & (memory.model == model)
            & (memory.in_dim == dim)
            & (memory["mode"] == mode)
            & (memory.variant == r.variant)
        ]["median"]
        held_cell = f"{held.iloc[0] / 2**20:.1f}" if not held.empty else ""
        lines.append(
            f"| {dataset} | {ratio:.2f} | {model} | {dim} | {mode} | {r.variant} | {r['median'] * 1e3:.3f} | "
            f"{r['median'] / best:.2f} | {held_cell} |"
        )
for _, r in oom.iterrows():
    size = failed[
        (failed.dataset == r.dataset)
        & (failed.model == r.model)
        & (failed.in_dim == r.in_dim)
        & (failed["mode"] == r["mode"])
        & (failed.variant == r.variant)
    ].value
    tried = f" (tried {size.iloc[0] / 2**30:.1f} GiB)" if not size.empty else ""
    lines.append(f"| {r.dataset} | | {r.model} | {r.in_dim} | {r['mode']} | {r.variant} | out of memory{tried} | | |")
# Hector against the fastest competitor that fit, per model x dataset x mode at the main width.


def fastest(rows):
    return rows.loc[rows["median"].idxmin()]


def speedups_over_competitors(table, ours):
    """Per (model, mode, dataset) at the main width: the fastest competitor's row, the fastest of
    ``ours``' rows (one variant: the headline; every optimized form: the ideal), the group's rows,
    and the speedup of the one over the other (medians of one process)."""
    found = {}
    for key, g in table[table.in_dim == width].groupby(["model", "mode", "dataset"]):
        base, hector = g[g.variant.isin(COMPETITORS)], g[g.variant.isin(ours)]
        if not base.empty and not hector.empty:
            best_base, best_ours = fastest(base), fastest(hector)
            found[key] = (best_base, best_ours, g, best_base["median"] / best_ours["median"])
    return found


def geomean(values) -> float:
    return float(np.exp(np.log(np.array(values)).mean()))


def _competitors(found, key) -> set:
    return set(found[key][2].variant) & set(COMPETITORS)


def measured_in(by_process, key) -> list[float]:
    """The speedup of ``key`` in each process that measured it against every competitor the
    committed process had there (a rerun's competitor that failed would leave a slower field), the
    committed one first."""
    committed = by_process[0]
    return [
        found[key][3]
        for found in by_process
        if key in found and _competitors(found, key) >= _competitors(committed, key)
    ]


def geomeans(by_process, keys) -> list[float]:
    """The geomean over ``keys`` in the committed process, then in each other process that measured
    every one of them against every competitor the committed process had there: no process's
    speedup stands in for another's, and none is against a slower field."""
    committed = by_process[0]
    each = [geomean([committed[k][3] for k in keys])]
    for found in by_process[1:]:
        if all(k in found and _competitors(found, k) >= _competitors(committed, k) for k in keys):
            each.append(geomean([found[k][3] for k in keys]))
    return each


def ordering(values) -> str:
    """Which is faster, claimed only where every process agrees (speedup >= 1: Hector)."""
    n = len(values)
    if min(values) >= 1:
        return f"Hector ({n}/{n})"
    if max(values) < 1:
        return f"competitor ({n}/{n})"
    return f"not settled (Hector in {sum(v >= 1 for v in values)}/{n})"


def spread(values) -> str:
    return f"{min(values):.2f}-{max(values):.2f} ({len(values)})" if len(values) > 1 else "(1)"


# The eight dataset-shaped graphs (the paper's comparison) apart from the small real ones and the
# shapes no dataset has (part shapes: named "<...>-shaped" or as the config's user chose).
DATASET_SHAPED = {d for d in GRAPHS if d.endswith("-like")}
KNOWLEDGE = {"nations", "kinships", "umls"}


def group_of(dataset: str) -> str:
    if dataset in DATASET_SHAPED:
        return "dataset-shaped"
    return "real knowledge graphs" if dataset in KNOWLEDGE else "other shapes"


# The competitors each model x mode x graph ran at the main width: any row counts (one that ran out
# of memory ran too).
RAN = (
    frame[(frame.in_dim == width) & frame.variant.isin(COMPETITORS)]
    .groupby(["model", "mode", "dataset"])
    .variant.agg(frozenset)
    .to_dict()
)
# And those tried there that left no row, as the parts' notes name them ("rgcn segment_mm on
# aifb-like at 64, training_graphed": it did not compile, or its step could not be captured; no
# mode named: every mode).
NOTED = re.compile(r"(?P<model>\S+) (?P<variant>\S+) on (?P<dataset>\S+) at (?P<dim>\d+)(?:, (?P<mode>\S+))?")
TRIED = {key: set(forms) for key, forms in RAN.items()}
for record in provenance:
    for where in record.get("skipped", {}):
        noted = NOTED.fullmatch(where)
        if noted and int(noted["dim"]) == width and noted["variant"] in COMPETITORS:
            for mode in [noted["mode"]] if noted["mode"] else set(frame["mode"]):
                TRIED.setdefault((noted["model"], mode, noted["dataset"]), set()).add(noted["variant"])


def comparable(keys) -> tuple[list, dict]:
    """The keys (model, mode, graph) of one model and mode measured against every competitor that
    ran on any of them (:func:`analysis.common.lacking`, the claims table's rule), and the others
    with the competitors they lack. One tried and failed there (it did not compile, or could not be
    captured) counts as tried. Where none has them all, all are kept."""
    missing = lacking({k: TRIED.get(k, set()) for k in keys}, RAN)
    kept = [k for k in keys if k not in missing]
    return (kept, missing) if kept else (list(keys), {})


def left_out_words(left_out: dict, name=str, join: str = ", ") -> list[str]:
    """Each set of graphs left out by :func:`comparable`, with the competitors they were measured
    without (``name``: how a form is written, ``join`` between forms), graphs by size."""
    graphs_by_missing: dict[frozenset, list] = {}
    for (_, _, dataset), missing in left_out.items():
        found = graphs_by_missing.setdefault(missing, [])
        if dataset not in found:
            found.append(dataset)
    return [
        f"{', '.join(sorted(graphs, key=GRAPHS.index))} measured without "
        f"{join.join(name(v) for v in FORMS if v in missing)}"
        for missing, graphs in graphs_by_missing.items()
    ]


main = time[time.in_dim == width]
# The committed process first, then one per rerun folder (reruns/run2/, ...): each is a separate
# process that measured some of the graphs once more.
rerun_of = reruns["source"].map(lambda s: Path(s).parent.name)
processes = [time] + [summarize(rows, "time", KEYS) for _, rows in reruns.groupby(rerun_of)]
headline_by_process = [speedups_over_competitors(t, [HEADLINE]) for t in processes]
ideal_by_process = [speedups_over_competitors(t, HECTOR) for t in processes]
headline, ideal = headline_by_process[0], ideal_by_process[0]
if HECTOR:
    rows, groups = [], {}
    for key, (best_base, best_ours, g, ideal_speedup) in ideal.items():
        model, mode, dataset = key
        unopt = g[g.variant == UNOPTIMIZED]["median"]
        unopt_cell = f"{best_base['median'] / unopt.iloc[0]:.2f}" if not unopt.empty else ""
        if key in headline:
            group = group_of(dataset)
            groups.setdefault((model, mode, group), []).append(key)
            seen = measured_in(headline_by_process, key)
            ours = headline[key][1]
            head_cells = f"{ours['median'] * 1e3:.3f} | {seen[0]:.2f} | {spread(seen)} | {ordering(seen)}"
        else:
            head_cells = "not measured | | | "
        rows.append(
            f"| {model} | {mode} | {dataset} | {best_base.variant} {best_base['median'] * 1e3:.3f} | {head_cells} | "
            f"{unopt_cell} | {best_ours.variant} {best_ours['median'] * 1e3:.3f} | {ideal_speedup:.2f} |"
        )
    lines += [
        "",
        f"## Hector ({HEADLINE}) against the fastest competitor at width {width} "
        "(speedup = competitor time / Hector time)",
        "",
        "Generated CUDA kernels."
        if on_gpu
        else "No GPU here: Hector's variants ran its reference backend (the IR executed with stock torch "
        "operators, one at a time), not generated kernels. These times show that the path works; they "
        "say nothing of Hector's speed.",
        "",
        f"Competitors: the forms of role baseline or peer ({', '.join(COMPETITORS)}); per graph the fastest of "
        f"them in the committed process. Headline: {HEADLINE}, the one Hector configuration named before "
        "timing (every pass on, float32). Range: the headline speedup in every process that measured the row "
        "(their count in brackets). Faster: the side ahead in every process, else not settled. Ideal: the best "
        f"of Hector's variants per graph ({', '.join(HECTOR)}), picked after measuring: no user could pick "
        "it in advance, so it is not the headline. The other columns are the committed process's."
        + (
            f" Not Hector's, so in no column here: {', '.join(OTHER_TECHNIQUES)} (optimized forms of other "
            "techniques; every table of forms lists them)."
            if OTHER_TECHNIQUES
            else ""
        ),
        "",
        f"| model | mode | dataset | fastest competitor, ms | {HEADLINE}, ms | speedup | range (processes) "
        "| faster | unoptimized speedup | ideal: best variant per graph, ms | ideal speedup |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    if groups:
        lines += [
            "",
            f"## Geomean speedup of {HEADLINE} over the fastest competitor at width {width}",
            "",
            "| model | mode | graphs | count | geomean | worst | best | slowdowns | geomean range (processes) "
            "| faster | ideal geomean (best variant per graph) |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
    else:
        lines += ["", f"No rows of {HEADLINE} at width {width}: no headline speedup, the ideal alone."]
    left_out_of_geomeans = []
    for (model, mode, group), keys in sorted(groups.items()):
        keys, left_out = comparable(keys)
        left_out_of_geomeans += [f"{model} {mode} ({group}): {words}" for words in left_out_words(left_out)]
        v = np.array([headline[k][3] for k in keys])
        each = geomeans(headline_by_process, keys)
        lines.append(
            f"| {model} | {mode} | {group} | {len(v)} | {each[0]:.2f} | {v.min():.2f} | {v.max():.2f} | "
            f"{int((v < 1).sum())} | {spread(each)} | {ordering(each)} | {geomean([ideal[k][3] for k in keys]):.2f} |"
        )
    if left_out_of_geomeans:
        lines += [
            "",
            "Left out of the geomeans (measured without a competitor the other graphs of the row had, so "
            "compared against a slower field): " + "; ".join(left_out_of_geomeans) + ".",
        ]
    if groups and len(processes) > 1:
        lines += [
            "",
            "Geomean range: the committed run's geomean and that of each rerun (reruns/run*/, each a separate "
            "process) that measured every graph of the row against every competitor the committed run had there "
            "(count in brackets). Faster: the side ahead in every such process's geomean, else not settled. "
            "Ideal geomean: the committed process's, over the same graphs, of the best variant per graph picked "
            "after measuring.",
        ]
    for widths, label in ((oom.in_dim == width, f"width {width}"), (oom.in_dim != width, "the other widths")):
        ooms = oom[widths].groupby(oom[widths].role == "optimized").size()
        if label.startswith("width") or len(oom[widths]):
            lines += [
                "",
                f"Out of memory at {label}: competitors (baselines and peers) {ooms.get(False, 0)}, "
                f"Hector {ooms.get(True, 0)}.",
            ]
    # Where a step's time goes, for the headline and the competitor it is measured against.
    if headline:
        kernels = (
            frame[(frame.metric == "breakdown_time") & (frame.in_dim == width)]
            .groupby(["model", "mode", "dataset", "variant"])
            .value.sum()
        )
        host = summarize(frame[frame.in_dim == width], "cpu_time", ["model", "mode", "dataset", "variant"])
        host = host.set_index(["model", "mode", "dataset", "variant"])["median"]
        kernel_label = "kernels" if on_gpu else "operators"
        lines += [
            "",
            f"## Where a step's time goes at width {width}: {HEADLINE} and the fastest competitor",
            "",
            f"| model | mode | dataset | form | step ms | {kernel_label} ms | host ms |",
            "|---|---|---|---|---|---|---|",
        ]
        for (model, mode, dataset), (best_base, best_ours, _, _) in headline.items():
            for r in (best_base, best_ours):
                key = (model, mode, dataset, r.variant)
                cells = [f"{kernels[key] * 1e3:.3f}" if key in kernels else "", f"{host[key] * 1e3:.3f}"]
                lines.append(
                    f"| {model} | {mode} | {dataset} | {r.variant} | {r['median'] * 1e3:.3f} | {' | '.join(cells)} |"
                )
        lines += [
            "",
            (
                "step: the median over the timed calls of one call's time on the GPU (CUDA events on its stream "
                "before and after the call, the GPU idle at the start), so it includes any time the GPU waited "
                "for the host. kernels: one more call of the form under torch.profiler, the device time of every "
                "kernel and copy the profiler tied to an operator (Hector's generated kernels included), summed "
                "over the kinds of work (systems/rgnn/breakdown.py); one call, not a median, and kernels that "
                "overlap count each. host: the median over the same timed calls of the process's CPU time (user "
                "and system, all threads) from just before the call was issued until it returned: the host's own "
                "work for a step (Python, dispatch, launches), and any wait the step spent on the GPU inside it. "
                "Step minus kernels is about the time the GPU sat idle within the step; where kernels are well "
                "below step and host is near it, the host sets the step's time (its own work, or a wait inside "
                "the step that keeps it from issuing ahead)."
                if on_gpu
                else "step: the median over the timed calls of one call's wall-clock time. operators: one more "
                "call under torch.profiler, each operator's own CPU time summed over the kinds of work "
                "(systems/rgnn/breakdown.py); one call, not a median, slowed by the profiler's own work. host: "
                "the median over the same timed calls of the process's CPU time (user and system, all threads: it "
                "can exceed the step where operators run on several cores)."
            ),
        ]
    # The first call apart from the step (for a compiled form, its compilation) and graph breaks:
    # per model, mode and form, over the graphs, as seconds and as steps of the same form.
    first_calls = frame[frame.metric.isin(["first_call_time", "graph_breaks"])]
    if not first_calls.empty:
        at = width if (first_calls.in_dim == width).any() else None
        if at is not None:
            first_calls = first_calls[first_calls.in_dim == at]
        where = ["model", "mode", "variant", "dataset", "in_dim"]
        # A row may leave a column empty (graph breaks counted once per form, say): it is kept.
        by = first_calls.groupby([*where, "metric"], dropna=False).value.median().unstack("metric").reset_index()
        by = by.reindex(columns=[*where, "first_call_time", "graph_breaks"])
        by = by.merge(time[[*where, "median"]], on=where, how="left")
        by["in_steps"] = by.first_call_time / by["median"]
        lines += [
            "",
            "## First call and graph breaks"
            + (f" at width {at}" if at is not None else "")
            + ": compilation, kept out of the step times above",
            "",
            "| model | mode | form | graphs | first call s, median (min, max) | in steps, median "
            "| graph breaks, most |",
            "|---|---|---|---|---|---|---|",
        ]

        def first_call_cells(g) -> list[str]:
            first, steps, breaks = g.first_call_time.dropna(), g.in_steps.dropna(), g.graph_breaks.dropna()
            return [
                str(g.dataset.nunique()),
                f"{first.median():.2f} ({first.min():.2f}, {first.max():.2f})" if len(first) else "",
                f"{steps.median():.0f}" if len(steps) else "",
                f"{breaks.max():.0f}" if len(breaks) else "",
            ]

        rank = {v: i for i, v in enumerate(FORMS)}
        for (model, mode, variant), g in sorted(
            by.groupby(["model", "mode", "variant"], dropna=False),
            key=lambda item: (str(item[0][0]), str(item[0][1]), rank.get(item[0][2], len(rank)), item[0][2]),
        ):
            named = ["" if pd.isna(model) else model, "" if pd.isna(mode) else mode, variant]
            lines.append("| " + " | ".join(named + first_call_cells(g)) + " |")
        lines += [
            "",
            "first call: the form's first call in that mode on a graph, timed on its own with the device drained "
            "(for a compiled form, tracing and compiling it), over the graphs measured; no step time above "
            "includes it. in steps: the first call over the same form's median step on the same graph. graph "
            "breaks: where torch.compile split the form's graph (each piece between breaks runs eagerly), the "
            "most on any graph.",
        ]
    # The ablation: each optimized form against unoptimized Hector, geomean over the graphs.
    if UNOPTIMIZED is not None:
        ablation = [v for v in HECTOR if v != UNOPTIMIZED]
        lines += [
            "",
            f"## Hector's ablation at width {width}: speedup over {UNOPTIMIZED}, geomean over the "
            f"{'dataset-shaped ' if DATASET_SHAPED else ''}graphs (worst, best)",
            "",
            "| model | mode | " + " | ".join(ablation) + " |",
            "|---|---|" + "---|" * len(ablation),
        ]
        ablated = main[main.variant.isin(HECTOR) & (main.dataset.isin(DATASET_SHAPED) if DATASET_SHAPED else True)]
        for (model, mode), g in ablated.groupby(["model", "mode"]):
            by = g.pivot_table(index="dataset", columns="variant", values="median")
            cells = []
            for variant in ablation:
                ratio = (by[UNOPTIMIZED] / by[variant]).dropna() if variant in by else by.iloc[:0, 0]
                cells.append(
                    f"{np.exp(np.log(ratio).mean()):.2f} ({ratio.min():.2f}, {ratio.max():.2f})" if len(ratio) else ""
                )
            lines.append(f"| {model} | {mode} | " + " | ".join(cells) + " |")
        # Each form of another precision against the same form in float32 (the tensor-core variant).
        exact_of = {FORM[v]: v for v in FORMS if PRECISION[v] == EXACT}
        compared = [(v, exact_of[FORM[v]]) for v in OTHER_PRECISION if FORM[v] in exact_of]
        if compared:
            lines += [
                "",
                f"## Other precisions at width {width}: speedup of each variant over its form in float32, "
                "geomean over the graphs (worst, best)",
                "",
                "| model | mode | variant | precision | over | speedup |",
                "|---|---|---|---|---|---|",
            ]
            for variant, exact in compared:
                for (model, mode), g in main[main.variant.isin([exact, variant])].groupby(["model", "mode"]):
                    by = g.pivot_table(index="dataset", columns="variant", values="median")
                    if {exact, variant} <= set(by.columns):
                        ratio = (by[exact] / by[variant]).dropna()
                        lines.append(
                            f"| {model} | {mode} | {variant} | {PRECISION[variant]} | {exact} | "
                            f"{geomean(ratio):.2f} ({ratio.min():.2f}, {ratio.max():.2f}) |"
                        )
        # Memory: the headline's against the fastest competitor's, where both fit.
        held = memory[memory.in_dim == width].set_index(["model", "mode", "dataset", "variant"])["median"]
        if not held.empty and headline:
            lines += [
                "",
                f"## Intermediate memory at width {width}: the fastest competitor's and {HEADLINE}'s",
                "",
                "| model | mode | dataset | competitor | MiB | Hector | MiB |",
                "|---|---|---|---|---|---|---|",
            ]
            for (model, mode, dataset), (best_base, best_ours, _, _) in headline.items():
                cells = []
                for r in (best_base, best_ours):
                    key = (model, mode, dataset, r.variant)
                    cells += [r.variant, f"{held[key] / 2**20:.1f}" if key in held else ""]
                lines.append(f"| {model} | {mode} | {dataset} | " + " | ".join(cells) + " |")
# The GEMM template alone against stock torch on equal segment shapes (part gemm_template).
if not gemm_frame.empty:
    gemm = summarize(
        gemm_frame, "time", ["dataset", "precision", "role", "variant", "edges", "relations", "in_dim", "out_dim"]
    )
    lines += [
        "",
        "## Hector's GEMM template against stock torch on equal segment shapes",
        "",
        "float32: TF32 off everywhere. tf32: torch's TF32 on, the template's TF32 variant. bfloat16: bf16 "
        "inputs and results everywhere (the template accumulates in fp32 on its TF32 tensor-core path). "
        "Each call is timed on prepared inputs: the template's tile list and grouped_mm's offsets made once.",
        "",
        "| case | precision | segments | rows | in x out | variant | time ms | TFLOP/s | template speedup |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (case, precision), g in gemm.groupby(["dataset", "precision"]):
        ours = g[g.role == "optimized"]["median"]  # the template
        for _, r in g.sort_values("median").iterrows():
            flops = 2 * r.edges * r.in_dim * r.out_dim
            ratio = f"{r['median'] / ours.iloc[0]:.2f}" if not ours.empty and r.role != "optimized" else ""
            lines.append(
                f"| {case} | {precision} | {r.relations} | {r.edges:,} | {r.in_dim} x {r.out_dim} | {r.variant} | "
                f"{r['median'] * 1e3:.3f} | {flops / r['median'] / 1e12:.2f} | {ratio} |"
            )
# What compact materialization could save: a per-edge value at the widest width, against one per
# distinct (source, relation) pair; and the per-edge weight matrices some forms gather.
lines += [
    "",
    f"## Bytes materialized at width {width} (float32)",
    "",
    "| dataset | edges | distinct (source, relation) pairs | edges / pairs | per-edge messages MiB "
    "| per-pair messages MiB | per-edge weights MiB |",
    "|---|---|---|---|---|---|---|",
]
for _, r in frame.drop_duplicates("dataset").sort_values("edges").iterrows():
    lines.append(
        f"| {r.dataset} | {r.edges:,} | {r.unique_pairs:,} | {r.edges / r.unique_pairs:.2f} | "
        f"{r.edges * width * 4 / 2**20:,.1f} | {r.unique_pairs * width * 4 / 2**20:,.1f} | "
        f"{r.edges * width * width * 4 / 2**20:,.1f} |"
    )
# Time by kind of work, one profiled call per form and mode, on the largest graph.
split = frame[frame.metric == "breakdown_time"].copy()
CLASSES = ["gemm", "aggregation", "gather_scatter", "elementwise", "other"]
if on_gpu:
    # Hector's kernels are launched through CuPy, not by torch operators; the profiler links them
    # to the innermost operator around the launch. The breakdown classes them by entry point since
    # e5fc9bd where that operator is the layer's custom op (inference, backward), and since the
    # commit after it also under the op's autograd wrapper (the training forward). What results
    # measured before left in Hector's "other" is its kernels: on a GPU, shown as their own class.
    hector_other = split.variant.isin(GENERATED) & (split.kernel_class == "other")
    if (split.loc[hector_other, "value"] > 0).any():
        split.loc[hector_other, "kernel_class"] = "generated"
        CLASSES.insert(4, "generated")
largest = GRAPHS[-1]
shares = split[(split.dataset == largest) & (split.in_dim == width)]
if not shares.empty:
    lines += [
        "",
        f"## Time by kind of work on {largest}, width {width} (one profiled call; shares of its total)",
        "",
        *(
            [
                "generated: Hector's generated kernels that the breakdown could not class by kind when these "
                "results were measured (those its layer's autograd wrapper launched in training).",
                "",
            ]
            if "generated" in CLASSES
            else []
        ),
        "| model | mode | form | " + " | ".join(CLASSES) + " | profiled ms |",
        "|---|---|---|" + "---|" * (len(CLASSES) + 1),
    ]
    for (model, mode, form), g in shares.groupby(["model", "mode", "variant"]):
        by = g.set_index("kernel_class").value
        total = by.sum()
        cells = " | ".join(f"{by.get(c, 0) / total:.2f}" for c in CLASSES)
        lines.append(f"| {model} | {mode} | {form} | {cells} | {total * 1e3:.2f} |")
# Where the memory goes: the same profiled call's bytes allocated by kind of work.
allocated = frame[(frame.metric == "breakdown_bytes") & (frame.dataset == largest) & (frame.in_dim == width)]
if not allocated.empty:
    memory_kind = "device" if on_gpu else "host"
    lines += [
        "",
        f"## Memory by kind of work on {largest}, width {width} (the same profiled call; MiB allocated)",
        "",
        f"Each operator's {memory_kind} memory allocated and not freed by itself (its outputs), summed by "
        "kind; a plain allocation counts for the operator that asked for it. Allocation volume, not the peak.",
        "",
        "| model | mode | form | " + " | ".join(CLASSES[:4] + ["other"]) + " | total MiB |",
        "|---|---|---|" + "---|" * 6,
    ]
    for (model, mode, form), g in allocated.groupby(["model", "mode", "variant"]):
        by = g.set_index("kernel_class").value / 2**20
        cells = " | ".join(f"{by.get(c, 0):,.1f}" for c in CLASSES[:4] + ["other"])
        lines.append(f"| {model} | {mode} | {form} | {cells} | {by.sum():,.1f} |")
skipped = {k: v for record in provenance for k, v in record.get("skipped", {}).items()}
cut_short = sorted({record.get("part", "?") for record in provenance if record.get("cut_short")})
if cut_short:
    lines += [
        "",
        f"Cut short (stopped before every form was measured; a form missing on their graphs was not measured): "
        f"{', '.join(cut_short)}.",
    ]
if skipped:
    lines += ["", "Not attempted:", ""] + [f"- {where}: {why}" for where, why in sorted(skipped.items())]
Path(summary).parent.mkdir(parents=True, exist_ok=True)
Path(summary).write_text("\n".join(lines) + "\n")
print("\n".join(lines[:40]))

# %% [markdown]
# ## Figure: Hector's speedup per graph, training and inference, and its ablation
#
# The headline figure: the speedup of `hector_best` over the fastest competitor per graph (a bar
# from 1, so a slowdown points down), one hatch per model, the range over the processes that
# measured the graph, the geomean over the dataset-shaped graphs (those measured without a
# competitor the others had keep their bars, marked *, and stay out of it), an x where a competitor
# ran out of memory, and under each panel the graphs and models measured but not compared, with why.
# Below it the ablation. Supporting figures: every form's time per graph (`-times`), its
# intermediate memory (`-memory`) and the time by kind of work on the largest graph (`-kinds`).

# %%
from matplotlib import patheffects
from matplotlib.container import ErrorbarContainer
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from analysis import style

style.entry_labels(REGISTRY)  # a user's own entries under the labels they register

# What a "-like" graph is, in the same words in every figure that shows one.
GENERATED_WORDS = '"-like" graphs: synthetic, generated with the statistics of the datasets they are named after'


def title_text(text: str, graphs) -> str:
    """A figure's title ``text``, with what the "-like" graphs are where ``graphs`` has one."""
    return f"{text}\n{GENERATED_WORDS}" if set(graphs) & DATASET_SHAPED else text


# Since this commit the GPU breakdown also counts the kernels the profiler links to no operator
# (systems/rgnn/breakdown.py); one measured at earlier code left them out.
COUNTS_UNLINKED_SINCE = "5331b9c"


def counts_every_kernel(record: dict) -> bool:
    """Whether the part of provenance ``record`` measured code that counts every kernel in its
    breakdown: its commit has COUNTS_UNLINKED_SINCE in its history (False where git cannot tell)."""
    commit = record.get("git", {}).get("commit") or ""
    found = subprocess.run(
        ["git", "merge-base", "--is-ancestor", COUNTS_UNLINKED_SINCE, commit], capture_output=True, check=False
    )
    return bool(commit) and found.returncode == 0


MODELS = sorted(
    set(time.model), key=lambda m: (list(style.MODEL_MARKERS).index(m) if m in style.MODEL_MARKERS else 9, m)
)
HATCH = {m: style.MODEL_HATCHES.get(m, "++") for m in MODELS}
# Speedups reported earlier by Hector's authors (geomean over their datasets; REFERENCE.md: an
# earlier version of the paper, unverified for the final one): drawn as targets on the geomeans.
PAPER_GEOMEAN = {
    ("rgcn", "training"): 1.80,
    ("rgcn", "inference"): 1.44,
    ("rgat", "training"): 4.93,
    ("rgat", "inference"): 6.39,
}

PAPER_COLOUR = "#01a9b8"  # the paper's numbers: a hue no form has
# Marks that mean no form are black or grey, never a form's colour: out of memory, not measured,
# and the range over the processes (outlined in white, so that it shows on a dark bar too).
MARK_COLOUR = "#222222"
OUTLINE = [patheffects.withStroke(linewidth=2.8, foreground="white")]


def out_of_memory(model, mode, dataset, variants) -> bool:
    rows = oom[(oom.model == model) & (oom["mode"] == mode) & (oom.dataset == dataset) & (oom.in_dim == width)]
    return rows.variant.isin(variants).any()


def foot_mark(ax, xs, what: str) -> None:
    """A mark at the foot of the panel at ``xs``: ``what`` "oom" (an x: ran out of memory) or
    "absent" (an open square: not measured)."""
    look = {"oom": dict(marker="x", mew=1.5), "absent": dict(marker="s", fillstyle="none", mew=0.9)}[what]
    ax.plot(
        xs,
        [0.03] * len(xs),
        linestyle="none",
        color=MARK_COLOUR,
        markersize=4.5,
        label=f"_{what}",
        transform=ax.get_xaxis_transform(),
        clip_on=False,
        **look,
    )


FOOT_MARKS = {
    "oom": ("x at the foot: ran out of GPU memory", dict(marker="x", mew=1.5)),
    "absent": (
        "open square at the foot: no form of that slot measured on that graph",
        dict(marker="s", fillstyle="none", mew=0.9),
    ),
}


def foot_entries(axes) -> dict:
    """Legend entries of the foot marks drawn in ``axes``, only those that appear."""
    drawn = {line.get_label()[1:] for ax in axes for line in ax.lines}
    return {
        text: Line2D([], [], color=MARK_COLOUR, linestyle="none", markersize=5, **look)
        for what, (text, look) in FOOT_MARKS.items()
        if what in drawn
    }


def range_whisker(ax, x, value, low, high) -> None:
    """A whisker from ``low`` to ``high`` at ``x``, outlined so it shows on any bar."""
    drawn = ax.errorbar(
        x, value, yerr=[[value - low], [high - value]], color=MARK_COLOUR, capsize=2.5, elinewidth=1.1, fmt="none"
    )
    for artist in (*drawn.lines[1], *drawn.lines[2]):
        artist.set_path_effects(OUTLINE)


# Log-scale y ticks (style.log_ticks), enough to read and no more: steps of 1-2-5, with 3 and 7 too
# where the axis spans less than 1.6 decades (a bar at 7.6x read against a top tick of 5x), decades
# alone past 3.2.
LOG_TICK_STEPS = ((1.6, (1, 2, 3, 5, 7)), (3.2, (1, 2, 5)))


CAPTURED = "training_graphed"  # the mode whose whole training step is captured as one CUDA graph
MODE_TITLES = {
    "inference": "Inference",
    "training": "Training",
    CAPTURED: "Training, the whole step captured as one CUDA graph (no host work per step)",
}


def why_not_compared(model, mode, dataset) -> str | None:
    """Why ``model`` on ``dataset`` has no headline speedup in ``mode`` although a form of it was
    measured there; None where it has one, or where nothing of it was measured there."""
    if (model, mode, dataset) in headline:
        return None
    at = (frame.model == model) & (frame["mode"] == mode) & (frame.dataset == dataset) & (frame.in_dim == width)
    if not at.any():
        return None
    if out_of_memory(model, mode, dataset, [HEADLINE]):
        return "Hector ran out of memory"
    timed = set(main[(main.model == model) & (main["mode"] == mode) & (main.dataset == dataset)].variant)
    if HEADLINE not in timed:
        return "Hector not measured (the summary's notes say why)"
    if out_of_memory(model, mode, dataset, COMPETITORS):  # some ran out of memory; the rest were not measured
        return "no competitor measured (some ran out of memory)"
    return "no competitor measured"


def not_compared_note(mode) -> str:
    """One line naming each graph and model of ``mode`` with no comparison, grouped by why."""
    by_reason = {}
    for d in GRAPHS:
        for m in MODELS:
            reason = why_not_compared(m, mode, d)
            if reason:
                by_reason.setdefault(reason, {}).setdefault(d, []).append(style.readable(m))
    return "; ".join(
        "not compared, " + reason + ": " + ", ".join(f"{d} ({', '.join(models)})" for d, models in graphs.items())
        for reason, graphs in by_reason.items()
    )


def speedup_panel(ax, mode, with_geomean: bool = True) -> None:
    """The headline's speedup per graph (bars from 1, log scale), a hatch per model, the range over
    processes, an x where a competitor ran out of memory, then the geomean over the dataset-shaped
    graphs with the paper's targets (``with_geomean``). Graphs with no comparison are left out and
    named under the panel, as are the models missing from a graph that is shown. A graph measured
    without a competitor its siblings had (:func:`comparable`) keeps its bars, marked *, and stays
    out of the geomean; the line under the panel says which competitors it lacked."""
    graphs = [d for d in GRAPHS if any((m, mode, d) in headline for m in MODELS)]
    models = [m for m in MODELS if any((m, mode, d) in headline for d in graphs)]
    shaped = [d for d in graphs if d in DATASET_SHAPED] if with_geomean else []
    geomean_keys, left_out = {}, {}  # per model the keys of its geomean; those left out of it
    for model in models:
        keys = [(model, mode, d) for d in shaped if (model, mode, d) in headline]
        if keys:
            geomean_keys[model], missing = comparable(keys)
            left_out |= missing
    bar = 0.8 / len(models)
    colour = style.color(HEADLINE)
    labels_at = []  # (x, height) of each geomean's label, to make room above them
    for j, model in enumerate(models):
        offset = (j - (len(models) - 1) / 2) * bar
        for i, d in enumerate(graphs):
            key = (model, mode, d)
            if key not in headline:
                continue
            seen = measured_in(headline_by_process, key)
            ax.bar(
                i + offset, seen[0] - 1, bar, bottom=1, color=colour, hatch=HATCH[model], edgecolor="white", linewidth=0
            )
            if out_of_memory(model, mode, d, COMPETITORS):  # no part of the fastest competitor
                foot_mark(ax, [i + offset], "oom")
            if len(seen) > 1:
                range_whisker(ax, i + offset, seen[0], min(seen), max(seen))
    # The geomean: wider bars after a rule, so that each value fits above its own bar.
    geomean_models = list(geomean_keys)
    wide = 0.6
    start = len(graphs) - 0.5 + 0.35
    for j, model in enumerate(geomean_models):
        each = geomeans(headline_by_process, geomean_keys[model])
        x = start + (j + 0.5) * wide
        ax.bar(x, each[0] - 1, wide, bottom=1, color=colour, hatch=HATCH[model], edgecolor="white", linewidth=0)
        if len(each) > 1:
            range_whisker(ax, x, each[0], min(each), max(each))
        top = max(each)
        if (model, mode) in PAPER_GEOMEAN:
            target = PAPER_GEOMEAN[(model, mode)]
            ax.plot(x, target, marker="_", markersize=13, mew=2.5, color=PAPER_COLOUR, linestyle="none")
            if top <= target < 1.4 * top:  # the label goes above the target's tick, not through it
                top = target
        ax.annotate(
            f"{each[0]:.2f}x",
            (x, max(top, 1)),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7.5,
        )
        labels_at.append(max(top, 1))
    ax.set_yscale("log")
    if labels_at:  # room for the labels above the highest of them
        ax.set_ylim(top=max(ax.get_ylim()[1], 1.4 * max(labels_at)))
    style.reference_line(ax, 1.0, "parity", kind="parity")
    # A graph measured for one model of several says so under its name.
    names = []
    for d in graphs:
        present = [m for m in models if (m, mode, d) in headline]
        name = f"{d} ({style.readable(present[0])} only)" if len(present) == 1 < len(models) else d
        names.append(name + ("*" if any((m, mode, d) in left_out for m in models) else ""))
    ticks, names = list(range(len(graphs))), names
    if geomean_models:
        ticks.append(start + wide * len(geomean_models) / 2)
        counts = sorted({len(geomean_keys[m]) for m in geomean_models})
        of = "/".join(str(c) for c in counts) + (" (by model)" if len(counts) > 1 else "")
        names.append(f"geomean over {of}\ndataset-shaped graphs" + ("\n(those marked * left out)" if left_out else ""))
        ax.axvline(len(graphs) - 0.5, color="#888888", linewidth=0.8)
    ax.set_xticks(ticks, names, rotation=30, ha="right")
    if geomean_models:
        last = ax.get_xticklabels()[-1]
        last.set(rotation=0, ha="center")
    style.log_ticks(ax.yaxis, steps=LOG_TICK_STEPS, minor=True, grouped=True, suffix="x")
    right = start + wide * len(geomean_models) + 0.3 if geomean_models else len(graphs) - 0.4
    ax.set(
        ylabel="speedup over the fastest competitor\n(log scale)",
        xlim=(-0.6, right),
        title=f"{MODE_TITLES.get(mode, mode)}: {style.readable(HEADLINE)} (fixed before timing), one layer, "
        f"width {width}",
    )
    notes = [not_compared_note(mode)]
    if left_out:
        words = left_out_words(left_out, style.readable, " or ")
        notes.append(f"* {'; '.join(words)}, which the other dataset-shaped graphs had: left out of the geomean")
    if any(notes):
        ax.set_xlabel("\n".join(n for n in notes if n), fontsize=7.5)
    ax.grid(axis="x", visible=False)


def ablation_panel(ax, mode) -> None:
    """Each Hector variant's speedup over the unoptimized one, geomean over the dataset-shaped
    graphs, whiskers from the worst to the best graph."""
    variants = [v for v in OPTIMIZED if v in GENERATED]
    shown = main[main.variant.isin(variants) & (main["mode"] == mode)]
    shown = shown[shown.dataset.isin(DATASET_SHAPED)] if DATASET_SHAPED else shown
    models = [m for m in MODELS if (shown.model == m).any()]
    bar = 0.8 / len(variants)
    for j, variant in enumerate(variants):
        for i, model in enumerate(models):
            by = shown[shown.model == model].pivot_table(index="dataset", columns="variant", values="median")
            if variant not in by or UNOPTIMIZED not in by:
                continue
            ratio = (by[UNOPTIMIZED] / by[variant]).dropna()
            value = geomean(ratio)
            x = i + (j - (len(variants) - 1) / 2) * bar
            ax.bar(
                x,
                value,
                bar,
                color=style.color(variant),
                hatch=HATCH[model],
                edgecolor="white",
                linewidth=0,
                label=style.readable(variant),
            )
            range_whisker(ax, x, value, ratio.min(), ratio.max())
    style.reference_line(ax, 1.0, "no passes", kind="parity")
    ax.set_xticks(range(len(models)), [style.readable(m) for m in models])
    ax.set(
        ylabel=f"speedup over {style.readable(UNOPTIMIZED)}",
        ylim=(0, None),
        title=f"Ablation, {mode}: geomean over the dataset-shaped graphs\n(whiskers: worst and best graph)",
    )
    ax.grid(axis="x", visible=False)


def model_entries(models) -> dict:
    return {
        style.readable(m): Patch(facecolor=style.color(HEADLINE), hatch=HATCH[m], edgecolor="white") for m in models
    }


RANGE_ENTRY = Line2D([], [], color=MARK_COLOUR, marker="|", linestyle="none", markersize=9, mew=1.2)


def whiskers_drawn(axes) -> bool:
    """Whether any of ``axes`` has a range whisker: one process draws none, and its legend names none."""
    return any(isinstance(c, ErrorbarContainer) for a in axes for c in a.containers)


headline_drawn = bool(OPTIMIZED and headline and on_gpu)
if headline_drawn:
    modes = [m for m in ("inference", "training") if any(k[1] == m for k in headline)]
    has_ablation = UNOPTIMIZED is not None and len([v for v in OPTIMIZED if v in GENERATED]) > 1
    layout = [[f"speedup {m}"] * 2 for m in modes] + ([[f"ablation {m}" for m in modes]] if has_ablation else [])
    if has_ablation and len(modes) == 1:
        layout[-1] = layout[-1] * 2
    fig, ax = style.mosaic(layout, width=15, height=4.2 * len(layout))
    for m in modes:
        speedup_panel(ax[f"speedup {m}"], m)
        if has_ablation:
            ablation_panel(ax[f"ablation {m}"], m)
    entries = model_entries(MODELS)
    if whiskers_drawn([ax[f"speedup {m}"] for m in modes]):  # the ablation's title names its own whiskers
        range_text = "range over the processes" + (" (ablation: worst and best graph)" if has_ablation else "")
        entries[range_text] = RANGE_ENTRY
    entries["paper's geomean (earlier version)"] = Line2D(
        [], [], color=PAPER_COLOUR, marker="_", markersize=12, mew=2.5, linestyle="none"
    )
    entries |= {
        text.replace("ran out", "a competitor ran out"): handle
        for text, handle in foot_entries([ax[f"speedup {m}"] for m in modes]).items()
    }
    if has_ablation:
        entries |= style.collect_legend([ax[f"ablation {modes[0]}"]])
    style.legend_below(fig, entries, columns=6)
    style.title(
        fig,
        title_text(
            "Hector against the fastest competitor per graph; competitors: "
            + "; ".join(map(style.readable, COMPETITORS)),
            {k[2] for k in headline},
        ),
        MEASURED,
    )
    style.save(fig, figure)

# The captured step apart: measured on fewer graphs than the eager modes (some captures do not
# fit or cannot be made), so no geomean, and the competitors are the captured forms.
if headline_drawn and any(k[1] == CAPTURED for k in headline):
    fig, ax = style.mosaic([["captured"]], width=15, height=4.8)
    speedup_panel(ax["captured"], CAPTURED, with_geomean=False)
    entries = model_entries([m for m in MODELS if any(k[0] == m and k[1] == CAPTURED for k in headline)])
    if whiskers_drawn([ax["captured"]]):
        entries["range over the processes"] = RANGE_ENTRY
    entries |= {
        text.replace("ran out", "a competitor ran out"): h for text, h in foot_entries([ax["captured"]]).items()
    }
    style.legend_below(fig, entries, columns=6)
    style.title(
        fig,
        title_text(
            "Hector against the fastest competitor with every form's training step captured as one CUDA graph",
            {k[2] for k in headline if k[1] == CAPTURED},
        ),
        MEASURED,
    )
    style.save(fig, figure, "captured")


# %% [markdown]
# ## Supporting figures: each form's time and memory per graph, and time by kind of work
#
# Per graph the best competitor without torch.compile, the best compiled one (each drawn in its
# own form's colour), then each of Hector's variants: a point at the median with the
# interquartile range. The other competitors are in the summary's table of every form.


# %%
def is_compiled(variant) -> bool:
    return bool(getattr(REGISTRY[variant], "compiles", "")) if variant in REGISTRY else False


COMPETING = [v for v in FORMS if ROLE[v] in COMPETITOR_ROLES]
SLOT_GROUPS = {
    "eager": [v for v in COMPETING if not is_compiled(v)],
    "compiled": [v for v in COMPETING if is_compiled(v)],
}
OURS = [v for v in FORMS if ROLE[v] not in COMPETITOR_ROLES]  # Hector's variants, each its own slot


def slot_value(sel, d, forms):
    """The row of the smallest median among ``forms`` on graph ``d``, or None."""
    rows = sel[(sel.dataset == d) & sel.variant.isin(forms)]
    return rows.loc[rows["median"].idxmin()] if not rows.empty else None


def per_form_panel(ax, table, model, mode, unit) -> None:
    """On each graph: the best eager and the best compiled competitor, then each of Hector's
    variants, a point at the median with the interquartile range (log scale); an x at the foot
    where the slot ran out of memory, an open square where it was not measured."""
    sel = table[(table.model == model) & (table["mode"] == mode) & (table.in_dim == width)]
    at = oom[(oom.model == model) & (oom["mode"] == mode) & (oom.in_dim == width)]
    present = set(sel.variant) | set(at.variant)
    slots = [forms for forms in SLOT_GROUPS.values() if present & set(forms)]
    slots += [[v] for v in OURS if v in present]
    graphs = [d for d in GRAPHS if (sel.dataset == d).any() or (at.dataset == d).any()]
    if not slots:  # nothing of this model and mode at this width: the panel stays empty and save() refuses it
        return
    step = 0.84 / len(slots)
    for j, forms in enumerate(slots):
        offset = (j - (len(slots) - 1) / 2) * step
        gone, absent = [], []
        for i, d in enumerate(graphs):
            r = slot_value(sel, d, forms)
            if r is None:
                (gone if out_of_memory(model, mode, d, forms) else absent).append(i + offset)
                continue
            ax.errorbar(
                i + offset,
                r["median"] * unit,
                yerr=[[(r["median"] - r.q25) * unit], [(r.q75 - r["median"]) * unit]],
                fmt="o",
                markersize=4.2,
                color=style.color(r.variant),
                markeredgecolor="#333333",
                markeredgewidth=0.4,
                elinewidth=1,
                capsize=0,
                label=style.readable(r.variant),
            )
        for what, xs in (("oom", gone), ("absent", absent)):
            if xs:
                foot_mark(ax, xs, what)
    ax.set_yscale("log")
    style.log_ticks(ax.yaxis, steps=LOG_TICK_STEPS, minor=True, grouped=True)
    ax.set_xticks(range(len(graphs)), graphs, rotation=25, ha="right", fontsize=7.5)
    ax.set_xticks(np.arange(len(graphs) - 1) + 0.5, minor=True)  # a rule between graphs
    ax.tick_params(axis="x", which="minor", length=0)
    ax.grid(axis="x", which="major", visible=False)
    ax.grid(axis="x", which="minor", visible=True, color="#cccccc", linewidth=0.8, alpha=1)
    ax.set_xlim(-0.5, len(graphs) - 0.5)
    ax.set_title(f"{style.readable(model)}, {mode}, width {width}")


def slot_words(best: str) -> str:
    """The slots of each graph, left to right, in words (``best``: "fastest" or "leanest")."""
    words = [f"the {best} competitor without torch.compile"] if SLOT_GROUPS["eager"] else []
    words += [f"the {best} compiled one"] if SLOT_GROUPS["compiled"] else []
    colour = " (each in its form's colour)" if words else ""
    return ", ".join(words) + colour + (", then each of Hector's variants" if OURS else "")


def competitors_line(best: str) -> str:
    """Every competitor the slots choose from, so a form that is never the fastest is still seen to be compared."""
    return f"\nthe {best} competitor chosen among: {', '.join(map(style.readable, COMPETING))}" if COMPETING else ""


panels_of = [
    (m, mode)
    for m in MODELS
    for mode in ("inference", "training")
    if ((time.model == m) & (time["mode"] == mode)).any()
]
PER_FIGURE = 4  # two models, each mode a full-width panel: room for every slot on every graph
for what, table, ylabel, unit, best in (
    ("times", time, "time per call (ms, log scale)", 1e3, "fastest"),
    ("memory", memory, "intermediate memory\n(MiB, log scale)", 1 / 2**20, "leanest"),  # two lines: a short panel
):
    if table.empty:
        continue
    for first in range(0, len(panels_of), PER_FIGURE):
        chunk = panels_of[first : first + PER_FIGURE]
        fig, axes = style.panels(len(chunk), cols=1, width=15, height=2.9)
        for ax, (model, mode) in zip(axes, chunk):
            per_form_panel(ax, table, model, mode, unit)
            ax.set_ylabel(ylabel)
        order = {style.readable(v): i for i, v in enumerate(FORMS)}  # the legend in the registry's order
        entries = dict(sorted(style.collect_legend(axes).items(), key=lambda item: order.get(item[0], len(order))))
        entries |= foot_entries(axes)
        style.legend_below(
            fig,
            entries,
            columns=7,
            title=f"on each graph, left to right: {slot_words(best)}; whiskers: interquartile range"
            + competitors_line(best),
        )
        part = "" if len(panels_of) <= PER_FIGURE else f"_{first // PER_FIGURE + 1}"
        # Without Hector's generated kernels there is no headline: every form's times are the figure.
        name = None if not headline_drawn and what == "times" and first == 0 else what + part
        shown = table[table.model.isin([m for m, _ in chunk]) & (table.in_dim == width)].dataset
        style.title(
            fig,
            title_text(
                f"Each form's {'time per call' if what == 'times' else 'intermediate memory'} per graph, "
                f"graphs by edge count: the {best} competitors and Hector's variants",
                set(shown),
            ),
            MEASURED,
        )
        style.save(fig, figure, name)

# Time by kind of work on the largest graph: one stacked bar per form and mode, shares of the call.
# Kinds of work are no forms: colours no form has (analysis/style.py's variants), muted so that
# they read as a different key from the forms' bright ones.
KIND_COLORS = {
    "gemm": "#88ccee",
    "aggregation": "#999933",
    "gather_scatter": "#cc6677",
    "elementwise": "#f0e442",
    "generated": "#332288",
    "other": "#dddddd",
}
models = [m for m in MODELS if not shares.empty and (shares.model == m).any()]
if models:
    rank = {v: i for i, v in enumerate(FORMS)}
    fig, axes = style.panels(min(len(models), 6), cols=3, width=5.6, height=0.17 * 2 * len(FORMS) + 1.2)
    for ax, model in zip(axes, models):
        rows = shares[shares.model == model]
        # Inference then training, the forms in the registry's order (competitors, then Hector's
        # variants from no passes to all passes).
        pairs = {(mode, form) for mode, form in zip(rows["mode"], rows.variant)}
        bars = sorted(pairs, key=lambda p: (p[0] != "inference", p[0], rank.get(p[1], len(rank)), p[1]))
        left = np.zeros(len(bars))
        totals = np.array([rows[(rows["mode"] == mode) & (rows.variant == form)].value.sum() for mode, form in bars])
        for kind in CLASSES:
            values = (
                np.array(
                    [
                        rows[(rows["mode"] == mode) & (rows.variant == form) & (rows.kernel_class == kind)].value.sum()
                        for mode, form in bars
                    ]
                )
                / totals
            )
            ax.barh(range(len(bars)), values, left=left, color=KIND_COLORS[kind], label=kind.replace("_", "/"))
            if kind == "generated":  # a sliver at most: its share written beside the bar
                for y, share in enumerate(values):
                    if share > 0:
                        percent = f"{100 * share:.1f}%" if share >= 5e-4 else "<0.1%"
                        ax.annotate(
                            f"generated {percent}",
                            (1.0, y),
                            xytext=(3, 0),
                            textcoords="offset points",
                            va="center",
                            fontsize=6.5,
                            color=KIND_COLORS[kind],
                            annotation_clip=False,
                        )
            left += values
        ax.set_yticks(range(len(bars)), [f"{style.readable(form)}, {mode}" for mode, form in bars], fontsize=7)
        ax.invert_yaxis()
        ax.set(xlim=(0, 1), xlabel="share of one profiled call", title=f"{style.readable(model)} on {largest}")
        ax.grid(axis="y", visible=False)
    style.legend_below(fig, style.collect_legend(axes[:1]), columns=6, title="kind of work")
    # A breakdown measured before the unlinked kernels were counted is the linked kernels' alone.
    profiled = [r for r in provenance if r.get("part") in set(shares.part)]
    caveat = (
        ""
        if all(counts_every_kernel(r) for r in profiled)
        else "\nshares of the kernels the profiler linked to an operator: kernels it linked to none are not counted"
    )
    style.title(
        fig,
        title_text(
            f"Where a call's time goes, by kind of work, on the largest graph ({largest}, width {width})", [largest]
        )
        + caveat,
        MEASURED,
    )
    style.save(fig, figure, "kinds")
