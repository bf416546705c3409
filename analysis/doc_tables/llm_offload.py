"""The activation offloading doc's tables: each policy's step time and activation peak over keep's,
per process where the part was run in several, from the committed results of the H200; one policy's
speedup over another; the targets, met or missed; and the CPU scale's run."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from analysis.common import summarize
from analysis.doc_tables import Table, load, results_files, same_code_processes, table
from harness.errors import UserError
from harness.results import load_provenance
from systems.ssdtrain import POLICIES, STORES

MACHINE, SCALE, TOPIC = "h200", "h200", "llm_offload"
KEYS = ["dataset", "variant", "role", "policy", "store", "emulated_gbps"]
ROLE_ORDER = ("baseline", "peer", "optimized")
GIB = 2**30


def process_files(part: str, machine: str = MACHINE) -> list[Path]:
    """The committed file of ``part`` on ``machine`` and the same part's reruns (other processes)
    that measured the same code, committed first: a rerun of other code says nothing of this code's
    spread."""
    return same_code_processes(machine, TOPIC, part, SCALE)


def over(files: Sequence[Path]) -> str:
    """What a range spans: ``the range over 3 processes of the same code (the committed run and its
    reruns)``, or the committed run alone where no rerun measured its code."""
    if len(files) == 1:
        return "from the committed run alone (no rerun measured the same code)"
    return f"the range over {len(files)} processes of the same code (the committed run and its reruns)"


def ratios(frame, metric: str) -> pd.Series:
    """Each variant's median ``metric`` over keep's, per model, within the frame's one process."""
    medians = summarize(frame, metric, KEYS).set_index(["dataset", "variant"])["median"]
    keep = medians.xs("keep", level="variant")
    return medians / keep.reindex(medians.index.get_level_values("dataset")).to_numpy()


def per_process(files: Sequence[Path], metric: str) -> pd.DataFrame:
    """:func:`ratios` of every file (one process each), a column per process."""
    return pd.concat({str(f): ratios(_load_one(f), metric) for f in files}, axis=1)


@functools.cache
def _load_one(file: Path) -> pd.DataFrame:
    # Several tables read the same process's file; the frame is only read, never changed.
    return load([file], TOPIC)


def span(values, digits: int = 3) -> str:
    """``a–b`` over processes, or one number where they round alike; empty where none measured."""
    values = [v for v in values if v == v]
    if not values:
        return ""
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}–{high}"


def store_text(row) -> str:
    if pd.notna(row.emulated_gbps) and row.emulated_gbps != "":
        return f"{float(row.emulated_gbps):g} GB/s (emulated)"
    return str(row.store)


def _given(value) -> bool:
    """Whether a configuration cell holds a value (not None, NaN, pandas' NA or empty)."""
    return value is not None and not pd.isna(value) and value != ""


def setting_text(row) -> str:
    """What sets a policy apart beyond its name: torch's activation memory budget (`` 0.5``), the
    budget a plan was made within, a fraction of what keep saves (`` within 0.2``), or the torch
    budget whose predicted bytes and peak it was made within (`` as budget 0.5``); else empty."""
    budget = getattr(row, "activation_budget", None)
    if row.policy == "torch_budget" and _given(budget):
        return f" {float(budget):g}"
    matched = getattr(row, "matched_budget", None)
    if _given(matched):
        return f" as budget {float(matched):g}"
    fraction = getattr(row, "budget_fraction", None)
    return f" within {float(fraction):g}" if _given(fraction) else ""


def variant_label(row) -> str:
    """The policy and its setting, then its store: ``offload_all, 55 GB/s (emulated)``,
    ``planner within 0.5, host``, ``torch_budget 0.2``."""
    name = f"{row.policy}{setting_text(row)}"
    return name if pd.isna(row.store) or row.store == "" else f"{name}, {store_text(row)}"


def _rank(registry, name) -> tuple:
    names = registry.names()
    return (names.index(name), "") if name in names else (len(names), str(name))


def order(setups: pd.DataFrame) -> list[str]:
    """Variants by role (baselines, peers, the technique), then as the registries list them."""

    def key(variant):
        v = setups.loc[variant]
        role = ROLE_ORDER.index(v.role) if v.role in ROLE_ORDER else len(ROLE_ORDER)
        has_store = pd.notna(v.store) and v.store != ""
        gbps = float(v.emulated_gbps) if pd.notna(v.emulated_gbps) and v.emulated_gbps != "" else -1.0
        return (
            variant != "keep",
            role,
            _rank(POLICIES, v.policy),
            _rank(STORES, v.store) if has_store else (-1, ""),
            gbps,
        )

    return sorted(setups.index, key=key)


def _setups(frame) -> pd.DataFrame:
    columns = ["role", "policy", "store", "emulated_gbps", "activation_budget", "budget_fraction", "matched_budget"]
    return frame.drop_duplicates("variant").set_index("variant").reindex(columns=columns)


def frontier_plans(frame, file: Path) -> set[str]:
    """The variants of ``frame`` (one results file, ``file``) planned within one of
    ``frontier_budgets`` rather than the part's ``planner_budget``, or at one of
    ``frontier_matched``: points of the planner's frontier, not the plan a user of the part's
    settings runs."""
    budget = load_provenance(file).get("parameters", {}).get("planner_budget")
    fractions = pd.to_numeric(frame.budget_fraction, errors="coerce")
    matched = pd.to_numeric(frame.get("matched_budget", pd.Series(index=frame.index)), errors="coerce")
    return set(frame[(fractions.notna() & (fractions != budget)) | matched.notna()].variant)


@table("llm_offload-h200-policies", topic=TOPIC)
def policies() -> Table:
    """Part policies on the headline model: ratios to keep over every process, achieved write GB/s."""
    files = process_files("policies")
    committed = load(files[:1], TOPIC)
    (dataset,) = set(committed.dataset)
    time, peak = per_process(files, "time").loc[dataset], per_process(files, "activation_peak").loc[dataset]
    keep_time = summarize(committed, "time", KEYS).set_index("variant")["median"]["keep"]
    keep_rate = summarize(committed, "flop_rate", KEYS).set_index("variant")["median"]["keep"]
    keep_peak = summarize(committed, "activation_peak", KEYS).set_index("variant")["median"]["keep"]
    written = summarize(committed, "bytes_written", KEYS).set_index("variant")["median"]
    writing = summarize(committed, "write_seconds", KEYS).set_index("variant")["median"]
    setups = _setups(committed)
    lines = ["| variant | step time x keep | activation peak x keep | achieved write GB/s |", "|---|---|---|---|"]
    for variant in order(setups):
        if variant == "keep":
            lines.append(f"| keep ({keep_time:.3f} s, {keep_rate:.0f} TFLOP/s) | 1 | 1 ({keep_peak / GIB:.2f} GiB) | |")
            continue
        gbps = written.get(variant, 0) / writing[variant] / 1e9 if writing.get(variant, 0) > 0 else None
        achieved = f"{gbps:.2f}" if gbps is not None and written.get(variant, 0) > 0 else ""
        digits = 2 if time.loc[variant].max() > 2 else 3  # slow variants to two places
        lines.append(
            f"| {variant_label(setups.loc[variant])} | {span(time.loc[variant], digits)} | {span(peak.loc[variant])} "
            f"| {achieved} |"
        )
    note = (
        f"{dataset}: medians of the timed steps; each ratio taken within one process, {over(files)}. "
        "Achieved write GB/s: the committed run's bytes written over the time the store had a write in flight."
    )
    return Table(lines, files, note=note)


# Part models: the columns of the comparison per model (the host store and the baselines).
MODEL_COLUMNS = (
    ("offload_all host", "offload_all_host"),
    ("planner host", "planner_host"),
    ("recompute", "recompute"),
    ("torchtune", "torchtune_offload"),
)


def per_model(frame, columns, memory_metric: str, memory_word: str) -> list[str]:
    """A row per model of ``frame`` (one process): keep's step, then each column's time and
    ``memory_metric`` over keep's."""
    time, memory = ratios(frame, "time"), ratios(frame, memory_metric)
    keep_time = summarize(frame, "time", KEYS).set_index(["dataset", "variant"])["median"]
    header = " | ".join(f"{name}: time, {memory_word} x keep" for name, _ in columns)
    lines = [f"| model | keep s | {header} |", "|---" * (2 + len(columns)) + "|"]
    for dataset in sorted(set(frame.dataset), key=lambda d: (d.startswith("llama"), d)):
        cells = []
        for _, variant in columns:
            key = (dataset, variant)
            cells.append(f"{time[key]:.2f}, {memory[key]:.2f}" if key in time.index else "")
        lines.append(f"| {dataset} | {keep_time[(dataset, 'keep')]:.3f} | " + " | ".join(cells) + " |")
    return lines


@table("llm_offload-h200-models", topic=TOPIC)
def models() -> Table:
    """Part models (one process): each model's keep step and each column's time and peak over keep's."""
    files = results_files(MACHINE, TOPIC, ["models"], SCALE)
    lines = per_model(load(files, TOPIC), MODEL_COLUMNS, "activation_peak", "peak")
    note = "One process; medians of the timed steps; the activation peak above weights, gradients and AdamW's state."
    return Table(lines, files, note=note)


# Part shapes: the columns, a variant each.
SHAPE_COLUMNS = (
    ("recompute", "recompute"),
    ("DeepSpeed CPU checkpointing", "deepspeed_offload"),
    ("offload_all, host", "offload_all_host"),
    ("offload_all, 55 GB/s emulated", "offload_all_emulated_55gbps"),
    ("planner, host", "planner_host"),
)


@table("llm_offload-h200-shapes", topic=TOPIC)
def shapes() -> Table:
    """Part shapes: keep's step, rate and peak, and each column's ratios to keep over every process."""
    files = process_files("shapes")
    committed = load(files[:1], TOPIC)
    time, peak = per_process(files, "time"), per_process(files, "activation_peak")
    medians = {
        metric: summarize(committed, metric, KEYS).set_index(["dataset", "variant"])["median"]
        for metric in ("time", "flop_rate", "activation_peak")
    }
    shapes_of = committed.drop_duplicates("dataset").set_index("dataset")
    recomputed = committed[committed.variant == "planner_host"].drop_duplicates("dataset").set_index("dataset")
    header = " | ".join(f"{name}: time, peak x keep" for name, _ in SHAPE_COLUMNS)
    lines = [f"| shape | keep: step, TFLOP/s, activation peak | {header} |", "|---" * (2 + len(SHAPE_COLUMNS)) + "|"]
    for dataset in sorted(shapes_of.index, key=lambda d: int(shapes_of.loc[d].hidden)):
        s = shapes_of.loc[dataset]
        keep = (dataset, "keep")
        cells = [
            f"{medians['time'][keep]:.3f} s, {medians['flop_rate'][keep]:.0f}, "
            f"{medians['activation_peak'][keep] / GIB:.1f} GiB"
        ]
        for _, variant in SHAPE_COLUMNS:
            key = (dataset, variant)
            if key not in time.index:
                cells.append("")
                continue
            cell = f"{span(time.loc[key])}, {span(peak.loc[key])}"
            if variant == "planner_host" and dataset in recomputed.index:
                cell += f" ({int(float(recomputed.loc[dataset].layers_recomputed))} of {int(s.layers)} recomputed)"
            cells.append(cell)
        lines.append(f"| {int(s.hidden)}x{int(s.layers)} | " + " | ".join(cells) + " |")
    note = (
        f"Sequence 1024, micro-batch 16; each ratio taken within one process, {over(files)}; keep's figures from "
        "the committed run."
    )
    return Table(lines, files, note=note)


BOUNDED = {"offload_all": "keep", "offload_all_compiled": "compiled_keep"}  # offloading policy -> its keep


class BoundRow(NamedTuple):
    dataset: str
    variant: str
    label: str  # variant_label's
    compiled: bool  # offload_all_compiled on compiled blocks, against compiled keep
    bound: float  # bytes: the activation-peak reduction the store's bandwidth allows at no time overhead
    reduction: float  # bytes: the reference keep's activation peak less the variant's (medians)
    slower: float  # the variant's median step time over the reference keep's


def bound_rows(file: Path) -> list[BoundRow]:
    """Per run of ``file`` of a policy of :data:`BOUNDED` (see :func:`bound_rows_of`)."""
    return bound_rows_of(_load_one(file), load_provenance(file))


def bound_rows_of(frame: pd.DataFrame, record: dict) -> list[BoundRow]:
    """Per run of ``offload_all`` (against keep) and ``offload_all_compiled`` (against compiled keep)
    in one process's rows ``frame`` and provenance ``record``: the bound (the run's own
    ``bound_activation_bytes`` row where it wrote one; else from the profile of the blocks it ran,
    ``profile`` or ``profile_compiled``, and the store's bandwidth: emulated, nominal; real, the probe),
    the measured activation-peak reduction below its keep's and the step time over its keep's. A run
    without its keep, a profile or a bandwidth has no row: it is not measured."""
    from systems.ssdtrain.bound import bound_of_profile
    from systems.ssdtrain.planning import profiles_of_record

    peak = summarize(frame, "activation_peak", KEYS).set_index(["dataset", "variant"])["median"]
    time = summarize(frame, "time", KEYS).set_index(["dataset", "variant"])["median"]
    recorded = summarize(frame, "bound_activation_bytes", KEYS).set_index(["dataset", "variant"])["median"]
    out = []
    for dataset, model in sorted(record.get("models", {}).items()):
        runs = frame[(frame.dataset == dataset) & frame.policy.isin(list(BOUNDED))].drop_duplicates("variant")
        for row in runs.sort_values("variant", key=lambda v: v.map(order_of_bounded), kind="stable").itertuples():
            compiled, reference = row.policy != "offload_all", BOUNDED[row.policy]
            if not all((dataset, v) in peak.index and (dataset, v) in time.index for v in (reference, row.variant)):
                continue
            bound = recorded.get((dataset, row.variant))
            if bound is None:
                profile = model.get("profile_compiled" if compiled else "profile")
                emulated = _given(row.emulated_gbps)
                probed = model.get("store_gbps", {}).get(row.store) or model.get("plans", {}).get(row.store, {}).get(
                    "bandwidth_gbps"
                )
                gbps = float(row.emulated_gbps) if emulated else probed
                if profile is None or gbps is None:
                    continue
                layers = profiles_of_record(profile)
                keep_last = int(float(row.keep_last)) if _given(row.keep_last) else 1
                bound = bound_of_profile(layers, gbps * 1e9, keep_last).activation_bytes
            reduction = peak[(dataset, reference)] - peak[(dataset, row.variant)]
            slower = time[(dataset, row.variant)] / time[(dataset, reference)]
            out.append(BoundRow(dataset, row.variant, variant_label(row), compiled, bound, reduction, slower))
    return out


def order_of_bounded(variant: str) -> int:
    """The compiled runs after the eager ones, each in the order of the file."""
    return int(str(variant).startswith("offload_all_compiled"))


@table("llm_offload-h200-bound", topic=TOPIC)
def bound() -> Table:
    """The offloading bound beside offload_all's measured reduction, parts policies and shapes."""
    files = results_files(MACHINE, TOPIC, ["policies", "shapes"], SCALE)
    lines = [
        "| model | offload_all to | bound GiB | measured reduction GiB | share of the bound | step time x keep |",
        "|---|---|---|---|---|---|",
    ]
    for file in files:
        for found in bound_rows(file):
            bound_bytes, reduction, slower = found.bound, found.reduction, found.slower
            share = f"{reduction / bound_bytes:.2f}" if bound_bytes > 0 else ""
            # On compiled blocks: against compiled keep, from the compiled blocks' profile.
            store = found.label.removeprefix("offload_all, ").replace("offload_all_compiled, ", "compiled blocks, ")
            dataset = found.dataset
            lines.append(
                f"| {dataset} | {store} | {bound_bytes / GIB:.2f} | {reduction / GIB:.2f} | {share} | {slower:.3f} |"
            )
    note = (
        "The committed runs (one process each): the bound the run recorded, or else the bound from its recorded "
        "profile and the store's bandwidth (emulated: nominal; host memory and files: the probe the plans used), "
        "backward taken as twice forward; the measured reduction is keep's activation peak less offload_all's. On "
        "compiled blocks (offload_all_compiled): the compiled blocks' profile, against compiled keep's peak and time."
    )
    return Table(lines, files, note=note)


# --- one policy against another, the targets, the CPU scale ----------------------------------------


def speedups(time: pd.DataFrame, dataset: str, policy: str, against: str) -> list[float]:
    """``against``'s step time over ``policy``'s on ``dataset``, one value per process that ran both
    (above 1: ``policy`` is faster), from :func:`per_process` step times."""
    if (dataset, policy) not in time.index or (dataset, against) not in time.index:
        return []
    time = time.loc[dataset]
    return [a / p for p, a in zip(time.loc[policy], time.loc[against]) if p == p and a == a]


def versus(part: str, pairs: Sequence[tuple[str, str]]) -> Table:
    """A row per (policy, against) of ``pairs``, a column per model of ``part``: the speedup's range
    over processes and, beside it, both policies' activation peaks over keep's (a speedup means
    little without what each holds: the faster one may hold several times more)."""
    files = process_files(part)
    committed = load(files[:1], TOPIC)
    shapes_of = committed.drop_duplicates("dataset").set_index("dataset")
    datasets = sorted(shapes_of.index, key=lambda d: int(shapes_of.loc[d].hidden))
    setups = _setups(committed)
    time = per_process(files, "time")
    peak = per_process(files, "activation_peak")

    def peak_of(dataset, variant) -> str:
        return span(peak.loc[(dataset, variant)]) if (dataset, variant) in peak.index else "?"

    header = " | ".join(f"{int(shapes_of.loc[d].hidden)}x{int(shapes_of.loc[d].layers)}" for d in datasets)
    lines = [f"| policy | against | {header} |", "|---" * (2 + len(datasets)) + "|"]
    for policy, against in pairs:
        cells = []
        for dataset in datasets:
            found = speedups(time, dataset, policy, against)
            shown = span(found, 2 if found and max(found) > 2 else 3)
            peaks = f" (peaks {peak_of(dataset, policy)} and {peak_of(dataset, against)})"
            cells.append(shown + peaks if shown else "")
        if not any(cells):
            raise ValueError(f"doc table: {policy} against {against} is measured on no model of part {part}")
        names = [variant_label(setups.loc[v]) for v in (policy, against)]
        lines.append(f"| {names[0]} | {names[1]} | " + " | ".join(cells) + " |")
    micro_batches = sorted({int(float(b)) for b in committed.micro_batch})
    note = (
        f"Micro-batch {', '.join(map(str, micro_batches))}: the speedup is the other policy's median step time over "
        "the policy's (above 1, the policy is faster), taken within one process; in brackets the policy's "
        "activation peak and the other's, each over keep's (the lower holds less memory); "
        f"{over(files)}."
    )
    return Table(lines, files, note=note)


# The other libraries against SSDTrain's offloading, and offloading and the planner against recompute
# (the fastest of the baselines that save memory, where the peers are the slowest), at micro-batch 4.
PEERS = (
    ("offload_all_host", "torchtune_offload"),
    ("offload_all_host", "save_on_cpu"),
    ("offload_all_host", "recompute"),
    ("planner_host", "recompute"),
)
# At the paper's shapes: DeepSpeed's CPU checkpointing against torch's recompute and SSDTrain's policies,
# and SSDTrain's against recompute.
SHAPE_PEERS = (
    ("recompute", "deepspeed_offload"),
    ("planner_host", "deepspeed_offload"),
    ("offload_all_host", "deepspeed_offload"),
    ("offload_all_host", "recompute"),
    ("planner_host", "recompute"),
)


@table("llm_offload-h200-peers", topic=TOPIC)
def peers() -> Table:
    """Part policies: SSDTrain's offloading against the peers that move activations to the host."""
    return versus("policies", PEERS)


@table("llm_offload-h200-shape_peers", topic=TOPIC)
def shape_peers() -> Table:
    """Part shapes: DeepSpeed's CPU checkpointing, recompute and the planner against each other."""
    return versus("shapes", SHAPE_PEERS)


# The technique's targets: a peak cut at a step-time overhead, and the planner's gain over recompute.
PEAK_CUT, OVERHEAD, PLANNER_GAIN = 0.45, 1.05, 1.15
PLANNERS = ("planner", "planned_compiled")  # the planner, eager and on compiled blocks: the accuracy target's
EQUAL_PEAK = 1.05  # "at equal activation peak": the planner's peak within 5% of recompute's


def model_label(frame, dataset: str) -> str:
    row = frame[frame.dataset == dataset].iloc[0]
    return f"{int(row.hidden)}x{int(row.layers)}, micro-batch {int(float(row.micro_batch))}"


def best_cut(time: pd.DataFrame, peak: pd.DataFrame, setups: pd.DataFrame):
    """Of one model's :func:`per_process` step times and peaks: the optimized variant with the
    largest peak cut in its worst process among those within ``OVERHEAD`` of keep's time in every
    process, as (variant, cuts, times); None where none is."""
    best = None
    for variant in time.index:
        if setups.loc[variant].role != "optimized" or not (time.loc[variant].dropna() <= OVERHEAD).all():
            continue
        cuts = list(1 - peak.loc[variant].dropna())
        if best is None or min(cuts) > min(best[1]):
            best = (variant, cuts, list(time.loc[variant].dropna()))
    return best


def checked_exactly(frames) -> tuple[int, int]:
    """How many SSDTrain (optimized) variants, and on how many models, the committed frames timed
    with a step bit-identical to keep's (every exact eager policy: the part stops otherwise)."""
    from systems.ssdtrain import POLICIES

    pairs = set()
    for frame in frames:
        for row in frame[frame.role == "optimized"].drop_duplicates(["dataset", "variant"]).itertuples():
            entry = POLICIES[row.policy]
            if entry.exact and not entry.compiled:
                pairs.add((row.dataset, row.variant))
    return len(pairs), len({dataset for dataset, _ in pairs})


def percent(values, signed: bool = False) -> str:
    """``12%`` or ``2–4%`` (``signed``: ``+3%``, ``−12–+4%``): fractions as whole percents, their
    range where they differ."""
    form = "{:+.0%}" if signed else "{:.0%}"
    low, high = (form.format(v).replace("-", "−") for v in (min(values), max(values)))
    return low if low == high else f"{low.removesuffix('%')}–{high}"


# The bound target: offload_all to pinned host reaches this share of its store's bound at this step time over
# compiled keep's (on compiled blocks; on eager ones, for comparison, over keep's).
BOUND_SHARE, BOUND_STORE = 0.85, "host"


def bound_target_rows(where: str, processes: Sequence[list[BoundRow]], dataset: str) -> list[str]:
    """The bound target's rows of one model: ``processes`` holds :func:`bound_rows_of` of each process.
    On compiled blocks (the target's row) and, labelled, on eager blocks: the share of the bound the
    measured reduction reached and the step time over its keep's, ranged over the processes that ran it;
    met where every such process reaches both. Not measured where none did."""
    out = []
    for compiled, name in ((True, "compiled blocks, x compiled keep"), (False, "eager blocks, x eager keep")):
        found = [
            r
            for rows in processes
            for r in rows
            if r.dataset == dataset and r.compiled == compiled and r.variant.endswith(f"_{BOUND_STORE}")
        ]
        if not found or any(r.bound <= 0 for r in found):
            out.append(f"| {where} ({name}) | not measured | not measured |")
            continue
        shares, times = [r.reduction / r.bound for r in found], [r.slower for r in found]
        met = min(shares) >= BOUND_SHARE and max(times) <= OVERHEAD
        out.append(
            f"| {where} ({name}) | {found[0].label}: {span(shares, 2)} of the bound at {span(times)}x time "
            f"({len(found)} of {len(processes)} processes) | {'yes' if met else 'no'} |"
        )
    return out


# The planner's accuracy target: its predicted activation peak and step time within this of the measured ones.
PREDICTION_TOLERANCE = 0.10


def prediction_errors(frame: pd.DataFrame, record: dict) -> dict[tuple[str, str], tuple[float, float | None]]:
    """Per planned run (dataset, variant) of one process: the predicted activation peak
    (``predicted_activation_peak``; where a run has none, its predicted activation bytes when
    forward ends) over the measured ``activation_peak`` (the allocator's peak of forward and
    backward above the weights, gradients and optimizer state), and the predicted step time over
    the measured ``time`` less the run's own AdamW step (``optimizer_seconds`` in the provenance:
    the prediction is of forward and backward, the measured step holds the optimizer's too), each
    less 1; the time's None where the optimizer's seconds were not recorded (the prediction has
    nothing like-for-like to meet)."""
    medians = {
        m: summarize(frame, m, KEYS).set_index(["dataset", "variant"])["median"]
        for m in (
            "predicted_time",
            "predicted_activation_bytes",
            "predicted_activation_peak",
            "activation_peak",
            "time",
        )
    }
    out = {}
    for key in medians["predicted_activation_bytes"].index:
        if key not in medians["activation_peak"].index or key not in medians["time"].index:
            continue
        predicted_peak = medians["predicted_activation_peak"].get(key, medians["predicted_activation_bytes"][key])
        peak = predicted_peak / medians["activation_peak"][key] - 1
        optimizer = record.get("models", {}).get(key[0], {}).get("optimizer_seconds", {}).get(key[1])
        step = medians["time"][key] - float(pd.Series(optimizer).median()) if optimizer else None
        predicted = medians["predicted_time"].get(key)
        timing = predicted / step - 1 if step and step > 0 and predicted is not None else None
        out[key] = (peak, timing)
    return out


def prediction_rows(where: str, processes: Sequence[dict], labels: dict[str, str], dataset: str) -> list[str]:
    """The accuracy target's rows of one model: per planned variant (``labels``: variant -> label) the
    range over processes of :func:`prediction_errors`; met where both are within the tolerance in every
    process that ran it, not measured where a process has no like-for-like time."""
    out = []
    for variant, label in labels.items():
        errors = [p[(dataset, variant)] for p in processes if (dataset, variant) in p]
        if not errors:
            continue
        peaks, times = [e[0] for e in errors], [e[1] for e in errors]
        peak_ok = max(abs(e) for e in peaks) <= PREDICTION_TOLERANCE
        if any(t is None for t in times):
            time_cell, met = "time not measured (no optimizer step's seconds recorded)", "not measured"
        else:
            time_cell = f"time {percent(times, signed=True)}"
            met = "yes" if peak_ok and max(abs(t) for t in times) <= PREDICTION_TOLERANCE else "no"
        met = "no" if not peak_ok else met
        out.append(
            f"| {where} | {label}: peak {percent(peaks, signed=True)}, {time_cell} ({len(errors)} of {len(processes)} "
            f"processes) | {met} |"
        )
    return out


@table("llm_offload-h200-targets", topic=TOPIC)
def targets() -> Table:
    """The targets against parts policies and shapes (every process) and the committed part models."""
    peak_rows, planner_rows, bound_target, accuracy, files, frames = [], [], [], [], [], []
    overhead = f"{OVERHEAD - 1:.0%}"
    for part in ("policies", "shapes"):
        part_files = process_files(part)
        committed = load(part_files[:1], TOPIC)
        files += part_files
        frames.append(committed)
        # The plans each part runs at its planner_budget: the frontier's other plans have a table of their own.
        committed = committed[~committed.variant.isin(frontier_plans(committed, part_files[0]))]
        setups = _setups(committed)
        time, peak = (per_process(part_files, m) for m in ("time", "activation_peak"))
        time, peak = (t[t.index.get_level_values("variant").isin(setups.index)] for t in (time, peak))
        hidden = committed.drop_duplicates("dataset").set_index("dataset").hidden
        bounds = [bound_rows(f) for f in part_files]
        errors = [prediction_errors(_load_one(f), load_provenance(f)) for f in part_files]
        planned = {v: variant_label(setups.loc[v]) for v in setups.index if setups.loc[v].policy in PLANNERS}
        for dataset in sorted(hidden.index, key=lambda d: int(hidden[d])):
            where = model_label(committed, dataset)
            bound_target += bound_target_rows(where, bounds, dataset)
            accuracy += prediction_rows(where, errors, planned, dataset) or [
                f"| {where} | not measured | not measured |"
            ]
            best = best_cut(time.loc[dataset], peak.loc[dataset], setups)
            if best is None:
                peak_rows.append(f"| {where} | no SSDTrain policy within {overhead} of keep's time | no |")
            else:
                variant, cuts, times = best
                met = "yes" if min(cuts) >= PEAK_CUT else "no"
                label = variant_label(setups.loc[variant])
                cut = f"−{percent([max(c, 0.0) for c in cuts])}" if max(cuts) >= 0.005 else "no cut"
                peak_rows.append(f"| {where} | {label}: {cut} at {span(times)}x keep's time | {met} |")
            planners = [v for v in setups.index if setups.loc[v].policy == "planner"]
            gains = [g for v in planners for g in speedups(time, dataset, v, "recompute")]
            if gains:
                planner_peak = list(peak.loc[dataset].loc[planners].stack())
                recompute_peak = list(peak.loc[(dataset, "recompute")].dropna())
                met = min(gains) >= PLANNER_GAIN and max(planner_peak) <= EQUAL_PEAK * min(recompute_peak)
                planner_rows.append(
                    f"| {where} | {span(gains)}x, at a peak of {span(planner_peak)} x keep "
                    f"(recompute's: {span(recompute_peak)}) | {'yes' if met else 'no'} |"
                )
    model_files = results_files(MACHINE, TOPIC, ["models"], SCALE)
    frames.append(load(model_files, TOPIC))
    variants, models_checked = checked_exactly(frames)
    lines = [
        "| model | measured | met? |",
        "|---|---|---|",
        f"| **activation peak −{PEAK_CUT:.0%} at ≤ {overhead} step-time overhead** | best SSDTrain policy | |",
        *peak_rows,
        f"| **planner ≥ {PLANNER_GAIN}x faster than recompute at equal activation peak** | every planner store | |",
        *planner_rows,
        f"| **offload_all to pinned host reaches ≥ {BOUND_SHARE:.0%} of the bandwidth bound on the activation peak "
        f"at ≤ {overhead} time overhead over compiled keep** | share of the bound, step time | |",
        *bound_target,
        f"| **the planner's predicted activation peak and step time within {PREDICTION_TOLERANCE:.0%} of the measured "
        "ones** | prediction over measured, less 1 | |",
        *accuracy,
        "| **losses and gradients bit-identical to keep for every store and policy** | | |",
        f"| every committed model | {variants} SSDTrain variants on {models_checked} models, each checked before "
        "it was timed | yes |",
    ]
    note = (
        "Ratios to keep taken within one process, the range over the processes of each part that measured the same "
        f"code (the committed run and its reruns); a policy is within {overhead} where it is in every process, and "
        "its peak cut is ranged the same way. A part stops when a checked step differs from keep's, so every timed "
        "variant passed its check. The bound: the run's recorded bound, else the one from its recorded profile of "
        "the blocks it ran (compiled or eager) and the store's probed bandwidth, against the measured reduction of "
        "the activation peak below its keep's; met where every process that ran it reaches both. The planner's "
        "predictions (eager and on compiled blocks, each store, at the part's budget) against the measured "
        "activation peak (the allocator's, above weights, gradients and optimizer state) and the measured step "
        "time less the run's own AdamW step, which the prediction leaves out (runs that did not record it: not "
        "measured); met where both are within the tolerance in every process."
    )
    return Table(lines, [*files, *model_files], note=note)


# torch's activation memory budgets the planner's frontier must dominate, and the planner it is.
FRONTIER_BUDGETS = (0.2, 0.8)  # the range of torch budgets the target covers, both ends included
FRONTIER_PLANNER = "planned_compiled"  # the planner on compiled blocks: compiled against compiled


def dominating(time: pd.DataFrame, peak: pd.DataFrame, against: str, candidates: Sequence[str]) -> pd.Series:
    """Per candidate, in how many processes it is at least as fast and holds at most the peak of
    ``against`` (one model's :func:`per_process` step times and peaks; processes where either side
    is missing do not count)."""
    counts = {}
    for candidate in candidates:
        wins = 0
        for process in time.columns:
            pair = [time.at[v, process] for v in (candidate, against)] + [
                peak.at[v, process] for v in (candidate, against)
            ]
            if all(value == value for value in pair):
                wins += pair[0] <= pair[1] and pair[2] <= pair[3]
        counts[candidate] = wins
    return pd.Series(counts, dtype=int)


FRONTIER_PARTS = ("policies", "frontier_models")  # the parts whose models the frontier target names


@table("llm_offload-h200-frontier", topic=TOPIC)
def planner_frontier() -> Table:
    """Parts FRONTIER_PARTS on the H200: see :func:`frontier_on`."""
    return frontier_on(MACHINE, FRONTIER_PARTS)


@table("llm_offload-h100-frontier", topic=TOPIC)
def planner_frontier_h100() -> Table:
    """Part frontier_models on the H100 (the only part of the frontier measured there)."""
    return frontier_on("h100", ("frontier_models",))


def frontier_on(machine: str, frontier_parts: Sequence[str]) -> Table:
    """Parts ``frontier_parts`` of ``machine``: for each of torch's activation memory budgets in
    FRONTIER_BUDGETS, whether a plan of the compiled planner holds at most its peak at no more step
    time, in every process. A part not yet measured says so in a row of its own."""
    lines = [
        "| model | torch's budget | its time, peak x keep | a plan as fast and as small | in processes | met? |",
        "|---|---|---|---|---|---|",
    ]
    low, high = FRONTIER_BUDGETS
    sources, spans = [], []
    for part in frontier_parts:
        try:
            files = process_files(part, machine)
        except UserError:  # not measured on this machine yet
            lines.append(f"| the models of part `{part}` | {low:g}–{high:g} | not measured | | | |")
            continue
        sources += files
        spans.append(f"Part {part}: {over(files)}. ")
        lines += _frontier_rows(files, low, high)
    note = (
        f"Step time and activation peak over eager keep's, medians of one process. {''.join(spans)}A plan of the "
        "planner on compiled blocks counts in a process where both its time and its peak are at most the budget's; "
        "met where one plan does so in every process."
    )
    if not sources:
        return Table(lines, [], not_measured=f"Source: none yet (no part of {', '.join(frontier_parts)} on {machine}).")
    return Table(lines, sources, note=note)


def _frontier_rows(files: Sequence[Path], low: float, high: float) -> list[str]:
    """The frontier table's rows for one part's processes (``files``, the committed one first)."""
    committed = load(files[:1], TOPIC)
    time, peak = per_process(files, "time"), per_process(files, "activation_peak")
    setups = _setups(committed)
    lines = []
    for dataset, rows in committed.groupby("dataset"):
        budgets = rows[rows.policy == "torch_budget"].drop_duplicates("variant")
        budgets = budgets[budgets.activation_budget.between(low, high)].sort_values("activation_budget")
        plans = sorted(set(rows[rows.policy == FRONTIER_PLANNER].variant))
        where = model_label(committed, dataset)
        if budgets.empty:
            lines.append(f"| {where} | {low:g}–{high:g} | not measured in the committed run | | | |")
        for row in budgets.itertuples():
            own = f"{span(time.loc[(dataset, row.variant)])}, {span(peak.loc[(dataset, row.variant)])}"
            counts = dominating(time.loc[dataset], peak.loc[dataset], row.variant, plans) if plans else pd.Series()
            processes = int(time.loc[(dataset, row.variant)].notna().sum())
            if counts.empty or counts.max() == 0:
                lines.append(f"| {where} | {row.activation_budget:g} | {own} | none | 0 of {processes} | no |")
                continue
            best = counts[counts == counts.max()].index[0]
            own_of_best = f"{span(time.loc[(dataset, best)])}, {span(peak.loc[(dataset, best)])}"
            plan = f"{variant_label(setups.loc[best])}: {own_of_best}"
            met = "yes" if counts.max() == processes else "no"
            lines.append(
                f"| {where} | {row.activation_budget:g} | {own} | {plan} | {counts.max()} of {processes} | {met} |"
            )
    return lines


# tokens/s ratios the target asks for; torch's best budget counts compiled keep (its default budget, 1.0)
MEMORY_BOUND_TARGETS = {"recompute": 1.15, "torch's best budget": 1.05}


def capped_speeds(file: Path) -> pd.DataFrame:
    """One memory_bound process: per model, variant and micro-batch timed (every one that fits under
    the cap; runs of older code timed only the largest), the median tokens/s, with the role."""
    keys = ["dataset", "variant", "role", "policy", "micro_batch", "memory_cap_gib"]
    return summarize(_load_one(file), "tokens_per_second", keys)


def fastest(speeds: pd.DataFrame) -> pd.DataFrame:
    """One row per model and variant of a memory_bound summary: its micro-batch of the highest
    median tokens/s (the part times every micro-batch that fits; runs of older code, the largest)."""
    speeds = speeds.reset_index(drop=True)
    return speeds.loc[speeds.groupby(["dataset", "variant"], sort=False)["median"].idxmax()]


@table("llm_offload-h200-memory_bound", topic=TOPIC)
def memory_bound() -> Table:
    """Part memory_bound on the H200: see :func:`memory_bound_on`."""
    return memory_bound_on(MACHINE, "H200")


@table("llm_offload-h100-memory_bound", topic=TOPIC)
def memory_bound_h100() -> Table:
    """Part memory_bound on the H100: see :func:`memory_bound_on`."""
    return memory_bound_on("h100", "H100")


def memory_bound_on(machine: str, gpu: str) -> Table:
    """Part memory_bound of ``machine`` (a ``gpu``): every variant's tokens/s at its fastest
    micro-batch under the cap; each SSDTrain configuration's over recompute's and over torch's best
    budget's at theirs, per process; met where a configuration reaches both targets in every process."""
    header = [
        "| model, cap | variant | micro-batch | tokens/s | x recompute | x torch's best budget | met? |",
        "|---|---|---|---|---|---|---|",
    ]
    try:
        files = process_files("memory_bound", machine)
    except UserError:
        return Table(
            header + ["| every model | every variant | not measured | | | | |"],
            [],
            not_measured=f"Source: none yet (part `memory_bound` has not run on the {gpu}).",
        )
    speeds = [capped_speeds(f) for f in files]
    lines = header + capped_rows(speeds, load(files[:1], TOPIC))
    targets = " and ".join(f"{v:g}x {k}" for k, v in MEMORY_BOUND_TARGETS.items())
    only_largest = all(s.groupby(["dataset", "variant"]).size().max() == 1 for s in speeds)
    where = (
        "its largest micro-batch that fits under the cap (these runs timed no other)"
        if only_largest
        else "its fastest micro-batch among those that fit under the cap (each process's; several where the "
        "processes differ, its largest in parentheses where that is another)"
    )
    note = (
        f"Tokens per second of each variant at {where}, the global batch fixed; medians of the timed steps, "
        f"{over(files)}; ratios taken within each process, each variant at its fastest there (torch's best budget: "
        "the fastest of its budgets and compiled keep, its default budget of 1.0); an SSDTrain "
        f"configuration meets the target where it reaches {targets} in every process."
    )
    return Table(lines, files, note=note)


def capped_rows(speeds: Sequence[pd.DataFrame], committed: pd.DataFrame) -> list[str]:
    """The memory_bound table's rows: ``speeds`` has one :func:`capped_speeds` frame per process
    (the committed one first), ``committed`` the committed file's rows (shapes and settings)."""
    setups = _setups(committed)
    lines = []
    for dataset, rows in speeds[0].groupby("dataset", sort=False):
        rows = fastest(rows)
        fitted = committed[(committed.dataset == dataset) & (committed.metric == "fits") & (committed.value == 1)]
        largest = fitted.groupby("variant").micro_batch.max()
        first = committed[committed.dataset == dataset].iloc[0]
        where = f"{int(first.hidden)}x{int(first.layers)}, {float(rows.memory_cap_gib.iloc[0]):g} GiB"

        def of(process: pd.DataFrame, variant: str) -> pd.DataFrame:
            return process[(process.dataset == dataset) & (process.variant == variant)]

        def tokens(process: pd.DataFrame, variant: str) -> float:
            found = of(process, variant)["median"]
            return float(found.max()) if not found.empty else float("nan")  # NaN: not run in that process

        # torch's budgets, and compiled keep: its default budget (1.0), what a user compiling would run
        budgets = [v for v in rows[rows.policy.isin(["torch_budget", "compiled_keep"])].variant]
        against = {
            "recompute": [tokens(p, "recompute") for p in speeds],
            # a budget that did not run in a process (out of memory) is left out there, not taken as its best
            "torch's best budget": [
                max((t for v in budgets if (t := tokens(p, v)) == t), default=float("nan")) for p in speeds
            ],
        }
        for row in rows.set_index("variant").loc[order(setups.loc[rows.variant])].reset_index().itertuples():
            got = [tokens(p, row.variant) for p in speeds]
            cells, met = ["", ""], ""
            if row.role == "optimized":
                reached = True
                for i, (name, target) in enumerate(MEMORY_BOUND_TARGETS.items()):
                    ratio = [g / a for g, a in zip(got, against[name]) if g == g and a == a]
                    cells[i] = f"{span(ratio, 2)}x" if ratio else "not measured"
                    reached &= len(ratio) == len(speeds) and min(ratio) >= target
                met = "yes" if reached else "no"
            label = variant_label(setups.loc[row.variant])
            # each process's fastest micro-batch: the tokens/s range is over these, not the committed run's
            batches = sorted(
                {int(float(fastest(found).micro_batch.iloc[0])) for p in speeds if len(found := of(p, row.variant))}
            )
            top = int(float(largest.get(row.variant, max(batches))))
            shown = ", ".join(map(str, batches)) + ("" if top in batches else f" (largest {top})")
            lines.append(f"| {where} | {label} | {shown} | {span(got, 0)} | {cells[0]} | {cells[1]} | {met} |")
    return lines


# The CPU scale: the columns per model.
CPU_COLUMNS = (
    ("offload_all host", "offload_all_host"),
    ("offload_all file", "offload_all_file"),
    ("planner host", "planner_host"),
    ("recompute", "recompute"),
)


@table("llm_offload-cpu", topic=TOPIC)
def cpu() -> Table:
    """Parts policies and models at the cpu scale (one process each): time and activation bytes over keep's."""
    files = results_files("cpu-2core", TOPIC, ["policies", "models"], "cpu")
    lines = per_model(load(files, TOPIC), CPU_COLUMNS, "activation_bytes", "bytes")
    note = (
        "One process per part on 2 CPU cores; medians of the timed steps; the activation bytes are those kept "
        "where they were made (a CPU has no activation peak to read)."
    )
    return Table(lines, files, note=note)
