"""GNN training's measured tables, and the per-run reduction the notebook shares with them.

A run is one measuring process: the committed results file of a part, or one of its re-runs
(``results/<machine>/gnn_training/reruns/<run>/``) of the same code. A ratio (a speedup,
an epoch against all_in_gpu) is taken within a run, from that run's median epochs, and quoted as
its committed value with the range over every run; an ordering (one pipeline faster than another)
is stated only where it holds in every run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from analysis import style
from analysis.common import same_code_reruns
from analysis.doc_tables import REPO_ROOT, Table, load, results_files, table
from harness.results import load_provenance
from workloads.gnn.pipelines import PIPELINE_KINDS
from workloads.gnn_training import BUDGET_SWEEPS

# One group: a part's graph and a model (a part is one graph size: papers and papers_full share a name).
GROUP = ["part", "dataset", "model", "layers", "fanouts", "nodes", "edges"]
COMMITTED = "committed"  # the run of the committed results files
BASELINE = "fastest CPU baseline"  # per group and run, the faster of the role-baseline pipelines
MACHINE, SCALE = "h200", "h200"
PARTS = ("products", "reddit", "papers", "papers_full")  # the doc's rows, in this order where measured
# all_in_gpu keeps the features in GPU memory: it bounds the feature transfer, and bounded the epoch
# only where it sampled and prepared batches ahead as the pipelines do (in committed runs it sampled
# in series with training, and pipelines beat it). So the GNN figures say what it is, not that it is
# a bound (style's label, "bound", is right for feature gathering alone).
GNN_LABELS = {"all_in_gpu": "all in GPU memory (no feature transfer)"}


def pipeline_label(variant: str) -> str:
    """Plain words for a GNN training pipeline, in every GNN figure and legend."""
    registered = PIPELINE_KINDS[variant].label if variant in PIPELINE_KINDS else ""  # a user's pipeline's own
    return GNN_LABELS.get(variant) or style.readable(variant, registered)


def with_runs(committed: pd.DataFrame, reruns: pd.DataFrame | None = None) -> pd.DataFrame:
    """The committed rows and the re-runs' together, with a ``run`` column: ``committed``, or the
    name of the re-run's folder (``run2``, ...)."""
    frames = [committed.assign(run=COMMITTED)]
    if reruns is not None and not reruns.empty:
        frames.append(reruns.assign(run=reruns["source"].map(lambda s: Path(s).parent.name)))
    return pd.concat(frames, ignore_index=True)


def at_largest_cpu_budget(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows measured at each part's and run's largest CPU budget (all its cores, as the
    headline numbers are), and rows that record no budget (measured before budgets existed). The
    CPU-budget sweeps (a few pipelines of a dataset part's graph on fewer cores) are left to the
    budget figure (:func:`joined_to_dataset_parts`)."""
    frame = frame[~frame.part.isin(BUDGET_SWEEPS)] if "part" in frame else frame
    if "cpu_budget" not in frame or frame.cpu_budget.isna().all():
        return frame
    keys = ["part", "run"] if "run" in frame else ["part"]
    largest = frame.groupby(keys, dropna=False)["cpu_budget"].transform("max")
    return frame[frame.cpu_budget.isna() | (frame.cpu_budget == largest)]


def joined_to_dataset_parts(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with each CPU-budget sweep's rows named after the dataset part whose graph it
    trains (``products_2_cores`` -> ``products``): one group per graph and model, its points at
    every budget."""
    return frame.assign(part=frame.part.map(lambda part: BUDGET_SWEEPS.get(part, (part,))[0]))


def epoch_medians(frame: pd.DataFrame) -> pd.DataFrame:
    """Median epoch time per group, run and pipeline (columns GROUP, run, variant, role, median)."""
    rows = frame[frame.metric == "epoch_time"]
    return (
        rows.groupby([*GROUP, "run", "variant", "role"], dropna=False)["value"].median().rename("median").reset_index()
    )


def _times(medians: pd.DataFrame, variant: str) -> pd.Series:
    """Epoch medians of ``variant`` (or, for BASELINE, of the faster baseline) by (group, run)."""
    if variant == BASELINE:
        rows = medians[medians.role == "baseline"]
        return rows.groupby([*GROUP, "run"], dropna=False)["median"].min()
    rows = medians[medians.variant == variant]
    return rows.set_index([*GROUP, "run"])["median"]


def ratios(medians: pd.DataFrame, variant: str, against: str) -> pd.DataFrame:
    """``against``'s epoch over ``variant``'s (above 1: ``variant`` is faster), per group and run
    where both ran; columns GROUP, run, ratio."""
    mine, theirs = _times(medians, variant), _times(medians, against)
    both = (theirs / mine).dropna()
    return both.rename("ratio").reset_index()


def per_group(ratio_rows: pd.DataFrame) -> dict[tuple, list[float]]:
    """The ratios of each group, the committed run's first, then the re-runs' by name."""
    out = {}
    ordered = ratio_rows.assign(first=ratio_rows.run != COMMITTED).sort_values(["first", "run"])
    for key, rows in ordered.groupby(GROUP, dropna=False, sort=False):
        out[key] = rows.ratio.tolist()
    return out


def holds_in_all_runs(values: Sequence[float], above: float = 1.0) -> bool:
    """Whether every run's ratio is above ``above`` (an ordering is stated only then); False
    without any run."""
    return bool(values) and min(values) > above


def ordering(values: Sequence[float], faster: str, slower: str) -> str:
    """``faster`` ahead of ``slower`` in words, with the count of runs, claimed only where every
    run agrees (``values``: slower's epoch over faster's, one per run)."""
    n = len(values)
    if holds_in_all_runs(values):
        return f"{faster} faster in every run ({n}/{n})"
    if values and max(values) < 1:
        return f"{slower} faster in every run ({n}/{n})"
    return f"not settled ({faster} faster in {sum(v > 1 for v in values)}/{n})"


def quoted(values: Sequence[float], digits: int = 2) -> str:
    """The committed run's ratio and, with more than one run, the range over every run."""
    first = f"{values[0]:.{digits}f}x"
    if len(values) < 2:
        return first
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return f"{first} ({low}–{high}x, {len(values)} runs)"


# --- the doc's tables ------------------------------------------------------------------------------


def committed_and_reruns(machine: str = MACHINE, scale: str = SCALE) -> tuple[list[Path], list[Path]]:
    """The committed files of the parts measured on ``machine``, and their re-runs of the same code."""
    folder = REPO_ROOT / "results" / machine / "gnn_training"
    parts = [p for p in PARTS if (folder / f"{p}-{scale}.csv").exists()]
    committed = results_files(machine, "gnn_training", parts, scale)
    reruns = sorted(folder.glob(f"reruns/*/*-{scale}.csv"))
    kept, _ = same_code_reruns([str(f) for f in reruns], [str(f) for f in committed])
    return committed, [Path(f) for f in kept]


def _label(group: tuple) -> str:
    part, dataset, model, layers, fanouts, nodes, edges = group
    short = dataset.removeprefix("ogbn-")
    size = f"{nodes / 1e6:.1f} M nodes" if nodes >= 1e6 else f"{nodes / 1e3:.0f} K nodes"
    return f"{short} ({size}, {edges / 1e6:.0f} M edges), {model.upper() if model == 'gat' else 'SAGE'} {layers}"


@table("gnn_training-h200", topic="gnn_training")
def epochs_h200() -> Table:
    """Epoch seconds per pipeline (committed run), the overlap's speedup over the faster CPU
    baseline and its epoch against all_in_gpu, each with its range over the runs."""
    committed, reruns = committed_and_reruns()
    frame = load(committed, "gnn_training")
    frame = at_largest_cpu_budget(with_runs(frame, load(reruns, "gnn_training") if reruns else None))
    medians = epoch_medians(frame)
    from workloads.gnn.pipelines import in_order

    shown = in_order(medians.variant)
    speed = per_group(ratios(medians, "zero_copy_overlap", BASELINE))
    bound = per_group(ratios(medians, "zero_copy_overlap", "all_in_gpu"))
    lines = [
        "| graph, model | " + " | ".join(shown) + " | overlap speedup | overlap / all_in_gpu | overlap vs zero_copy |",
        "|---|" + "---|" * (len(shown) + 3),
    ]
    first = medians[medians.run == COMMITTED]
    order = {p: i for i, p in enumerate(PARTS)}
    groups = sorted(
        first.groupby(GROUP, dropna=False), key=lambda g: (order.get(g[0][0], 99), g[0][2] != "sage", g[0][3])
    )
    versus = per_group(ratios(medians, "zero_copy_overlap", "zero_copy"))
    for key, rows in groups:
        times = rows.set_index("variant")["median"]
        cells = [f"{times[p]:.3f}" if p in times else "–" for p in shown]
        # all_in_gpu's epoch over the overlap's, inverted: the overlap's epoch as a multiple of all_in_gpu's
        bound_cell = quoted([1 / v for v in bound[key]]) if key in bound else "–"
        lines.append(
            f"| {_label(key)} | {' | '.join(cells)} | {quoted(speed[key]) if key in speed else '–'} "
            f"| {bound_cell} | {ordering(versus[key], 'overlap', 'zero_copy') if key in versus else '–'} |"
        )
    runs = frame.run.nunique()
    note = (
        "Epoch seconds: medians of the timed epochs of the committed run. Ratios are taken within each run "
        f"({runs} run{'s' if runs > 1 else ''}: the committed files"
        + (" and their re-runs of the same code" if runs > 1 else "")
        + "), the committed run's first, the range over the runs in brackets; an ordering is stated only where "
        "it holds in every run. Overlap speedup: the faster CPU baseline's epoch over zero_copy_overlap's."
    )
    return Table(lines, [*committed, *reruns], note=note)


def _frame_h200() -> tuple[pd.DataFrame, list[Path]]:
    committed, reruns = committed_and_reruns()
    frame = with_runs(load(committed, "gnn_training"), load(reruns, "gnn_training") if reruns else None)
    return at_largest_cpu_budget(frame), [*committed, *reruns]


def _groups(rows: pd.DataFrame) -> list[tuple]:
    order = {p: i for i, p in enumerate(PARTS)}
    keys = {tuple(k) for k in rows[GROUP].itertuples(index=False)}
    return sorted(keys, key=lambda k: (order.get(k[0], 99), k[2] != "sage", k[3]))


def verdict(values: Sequence[float], target: float, at_most: bool) -> str:
    """Whether every run meets a target (a ratio at most, or at least, ``target``)."""
    met = [v <= target if at_most else v >= target for v in values]
    n = len(met)
    if all(met):
        return f"met in every run ({n}/{n})"
    if not any(met):
        return f"missed in every run ({n}/{n})"
    return f"met in {sum(met)}/{n} runs"


@table("gnn_training-h200-targets", topic="gnn_training")
def targets_h200() -> Table:
    """The overlapped zero-copy pipeline against its two targets, per graph and model, per run."""
    frame, files = _frame_h200()
    medians = epoch_medians(frame)
    bound = per_group(ratios(medians, "all_in_gpu", "zero_copy_overlap"))  # the overlap's epoch / all_in_gpu's
    speed = per_group(ratios(medians, "zero_copy_overlap", BASELINE))
    lines = [
        "| graph, model | overlap / all_in_gpu | at most 1.15x | speedup over the faster CPU baseline "
        "| at least 1.6x |",
        "|---|---|---|---|---|",
    ]
    for key in _groups(medians[medians.run == COMMITTED]):
        if key not in bound and key not in speed:
            continue
        b, s = bound.get(key), speed.get(key)
        lines.append(
            f"| {_label(key)} | {quoted(b) if b else '–'} | {verdict(b, 1.15, at_most=True) if b else '–'} "
            f"| {quoted(s) if s else '–'} | {verdict(s, 1.6, at_most=False) if s else '–'} |"
        )
    note = (
        "Targets of the overlapped zero-copy pipeline (zero_copy_overlap): an epoch at most 1.15x all_in_gpu's, and "
        "at least 1.6x faster than the faster CPU baseline. Each ratio within a run; a target is met where every "
        "run meets it."
    )
    return Table(lines, files, note=note)


@table("gnn_training-h200-cost", topic="gnn_training")
def cost_h200() -> Table:
    """CPU core-seconds per epoch and validation accuracy per pipeline (committed run)."""
    frame, files = _frame_h200()
    first = frame[frame.run == COMMITTED]
    from workloads.gnn.pipelines import in_order

    cpu = first[first.metric == "cpu_time"].groupby([*GROUP, "variant"], dropna=False)["value"].median()
    acc = first[first.metric == "accuracy"].groupby([*GROUP, "variant"], dropna=False)["value"].median()
    shown = in_order(first.variant)
    lines = [
        "| graph, model | " + " | ".join(f"{p} core-s" for p in shown) + " | validation accuracy |",
        "|---|" + "---|" * (len(shown) + 1),
    ]
    for key in _groups(first):
        cells = [f"{cpu[(*key, p)]:.1f}" if (*key, p) in cpu.index else "–" for p in shown]
        accuracies = [acc[(*key, p)] for p in shown if (*key, p) in acc.index]
        span = f"{min(accuracies):.3f}" + (
            f"–{max(accuracies):.3f}" if max(accuracies) - min(accuracies) >= 5e-4 else ""
        )
        lines.append(f"| {_label(key)} | {' | '.join(cells)} | {span} |")
    note = (
        "CPU core-seconds per epoch (median of the timed epochs of the committed run): the training process and its "
        "sampling workers together. Validation accuracy after the timed and the instrumented epochs, over the "
        "pipelines."
    )
    return Table(lines, files, note=note)


# --- the CPU baselines on a 2-core machine ---------------------------------------------------------

CPU_MACHINE = "cpu-2core"
CPU_PARTS = ("products", "reddit", "papers")


def _split(rows: pd.DataFrame) -> str:
    """How a pipeline's cores were shared: loader workers x their threads + training threads."""
    first = rows.iloc[0]
    if pd.isna(first.threads_per_worker) or not first.sampler_workers:
        return f"{int(first.train_threads)} training threads"
    return (
        f"{int(first.sampler_workers)} worker x {int(first.threads_per_worker)} + {int(first.train_threads)} training"
    )


@table("gnn_training-cpu", topic="gnn_training")
def epochs_cpu() -> Table:
    """Epoch seconds of the CPU pipelines on a 2-core machine (one process per part), how each
    shared the cores, and each one's epoch over cpu_gather's."""
    files = results_files(CPU_MACHINE, "gnn_training", CPU_PARTS, "cpu")
    frame = load(files, "gnn_training")
    rows = frame[frame.metric == "epoch_time"]
    lines = ["| graph, model | pipeline | cores | epoch s | x cpu_gather |", "|---|---|---|---|---|"]
    order = {p: i for i, p in enumerate(CPU_PARTS)}
    groups = sorted(rows.groupby(GROUP, dropna=False), key=lambda g: (order[g[0][0]], g[0][2] != "sage", g[0][3]))
    for key, group in groups:
        medians = group.groupby("variant")["value"].median()
        for variant, pipeline_rows in sorted(group.groupby("variant"), key=lambda v: v[0] != "cpu_gather"):
            ratio = medians[variant] / medians["cpu_gather"]
            lines.append(
                f"| {_label(key)} | {variant} | {_split(pipeline_rows)} | {medians[variant]:.3f} | {ratio:.2f} |"
            )
    epochs = sorted(set(rows.groupby([*GROUP, "variant"], dropna=False).size()))
    backends = sorted(
        {
            f"{name} {version}"
            for file in files
            for name, version in load_provenance(file).get("packages", {}).items()
            if name in ("pyg-lib", "torch-sparse")
        }
    )
    note = (
        f"Epoch seconds: medians of {'/'.join(map(str, epochs))} timed epochs, one process per part, all of the "
        f"machine's 2 cores for every pipeline; PyG's sampling backend: {', '.join(backends) or 'none installed'}. "
        "x cpu_gather: the pipeline's epoch over cpu_gather's, above 1 slower."
    )
    return Table(lines, files, note=note)
