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
from harness.results import load_provenance, results_in
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


def committed_and_reruns(
    machine: str = MACHINE, scale: str = SCALE, parts: Sequence[str] = PARTS
) -> tuple[list[Path], list[Path]]:
    """The committed files of ``parts`` measured on ``machine``, and their re-runs of the same code."""
    folder = REPO_ROOT / "results" / machine / "gnn_training"
    parts = [p for p in parts if results_in(folder, f"{p}-{scale}")]
    committed = results_files(machine, "gnn_training", parts, scale)
    reruns = sorted(f for p in parts for f in results_in(folder, f"reruns/*/{p}-{scale}"))
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


# --- the targets --------------------------------------------------------------------------------

ALL = "all"  # the CPU budget of a dataset part's largest (all cores) run
BOUND_AT_MOST = 1.10  # zero_copy_overlap's epoch over all_in_gpu's
SPEEDUP_AT_LEAST = 1.0  # over the fastest CPU baseline, at every CPU budget
FEW_CORES, SPEEDUP_FEW_CORES = 4, 1.3  # ... and at FEW_CORES or fewer
CPU_SHARE_AT_MOST = 1 / 5  # zero_copy_overlap's CPU core-seconds per epoch over that baseline's
FIT_BUDGET_GIB = 24.0  # papers_full: the pipelines that fit this GPU memory budget
TARGET_BUDGETS = (2, 4, 8, ALL)  # the budgets every target graph is judged at, "not measured" where missing
TARGET_PARTS = {"products": "products-like", "papers": "papers100M-like (25%)", "papers_full": "papers100M-like, full"}
NEEDED_BASELINES = ("cpu_gather", "cpu_gather_workers")  # the fastest CPU baseline is the faster of these
ZERO_COPY = ("zero_copy", "zero_copy_overlap")
NOT_MEASURED = "not measured"


def with_budgets(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (every part, with runs) with the budget sweeps joined to their dataset parts and
    a ``budget`` column: a sweep's cores, ALL for a dataset part's largest budget in its run (or
    none recorded: measured before budgets existed, on all cores), else the cores recorded."""
    for column in ("cpu_budget", "gpu_memory_budget"):  # files from before these were recorded
        if column not in frame:
            frame = frame.assign(**{column: float("nan")})
    recorded = frame.cpu_budget.astype(float)  # nullable integers: NaN where none was recorded
    largest = recorded.groupby([frame.part, frame.run], dropna=False).transform("max")
    sweep = frame.part.map(lambda part: BUDGET_SWEEPS.get(part, (None, float("nan")))[1]).astype(float)
    own = recorded.isna() | (recorded == largest)
    budget = [
        int(s) if s == s else ALL if is_all else int(r) for s, is_all, r in zip(sweep, own, recorded, strict=True)
    ]
    cores = recorded.fillna(sweep)
    return joined_to_dataset_parts(frame.assign(budget=budget, cores=cores))


def _runs_of(rows: pd.DataFrame, metric: str) -> dict[str, dict[str, float]]:
    """{run: {pipeline: median of ``metric``}} of one group and budget, the committed run first."""
    medians = rows[rows.metric == metric].groupby(["run", "variant"])["value"].median()
    runs = sorted({r for r, _ in medians.index}, key=lambda r: (r != COMMITTED, r))
    return {run: medians[run].to_dict() for run in runs}


def _judged(met: Sequence[bool]) -> str:
    """Met where every run meets the target."""
    n, hits = len(met), sum(met)
    return "met" if hits == n else f"missed in {n - hits}/{n} runs"


def _spread(values: Sequence[float], digits: int = 2) -> str:
    if len(values) < 2:
        return "–"
    return f"{min(values):.{digits}f}–{max(values):.{digits}f}x"


def _row(label: str, target: str, values: Sequence[float], verdict: str, note: str = "") -> str:
    value = f"{values[0]:.2f}x{note}" if values else "–"
    return f"| {label} | {target} | {value} | {_spread(values)} | {len(values)} | {verdict} |"


def _missing(label: str, target: str, why: str) -> str:
    return f"| {label} | {target} | – | – | 0 | {NOT_MEASURED}: {why} |"


def _bound_rows(label: str, rows: pd.DataFrame) -> list[str]:
    """Target 1: all_in_gpu no slower than any other pipeline in every run, and the overlap's
    epoch at most BOUND_AT_MOST of it."""
    first = "all_in_gpu no slower than every other pipeline"
    second = f"zero_copy_overlap / all_in_gpu ≤ {BOUND_AT_MOST:.2f}x"
    runs = {r: t for r, t in _runs_of(rows, "epoch_time").items() if "all_in_gpu" in t and len(t) > 1}
    if not runs:
        why = "all_in_gpu not run beside another pipeline at all cores"
        return [_missing(label, first, why), _missing(label, second, why)]
    versus = [t["all_in_gpu"] / min(v for p, v in t.items() if p != "all_in_gpu") for t in runs.values()]
    beaten = {}  # pipeline -> runs in which it was faster than all_in_gpu
    for times in runs.values():
        for pipeline, seconds in times.items():
            beaten[pipeline] = beaten.get(pipeline, 0) + (seconds < times["all_in_gpu"])
    faster = [f"{p} ({k}/{len(runs)} runs)" for p, k in beaten.items() if k]
    verdict = "met" if not faster else f"missed: beaten by {', '.join(faster)}"
    lines = [_row(label, first + " (its epoch / the fastest other's)", versus, verdict)]
    overlap = [t["zero_copy_overlap"] / t["all_in_gpu"] for t in runs.values() if "zero_copy_overlap" in t]
    if overlap:
        lines.append(_row(label, second, overlap, _judged([v <= BOUND_AT_MOST for v in overlap])))
    else:
        lines.append(_missing(label, second, "zero_copy_overlap not run"))
    return lines


def _budget_name(budget, rows: pd.DataFrame) -> str:
    if budget != ALL:
        return f"{int(budget)} cores"
    cores = sorted({int(c) for c in rows.cores.dropna()})
    return "all cores (" + (", ".join(map(str, cores)) if cores else "count not recorded") + ")"


def _cpu_rows(label: str, budget, rows: pd.DataFrame) -> list[str]:
    """Target 2 at one CPU budget: the overlap's speedup over the fastest CPU baseline, and its CPU
    core-seconds per epoch over that baseline's, per run."""
    where = _budget_name(budget, rows)
    few = bool(rows.cores.notna().all() and rows.cores.max() <= FEW_CORES) if not rows.empty else budget != ALL
    least = SPEEDUP_FEW_CORES if few else SPEEDUP_AT_LEAST
    speed_target = f"{where}: zero_copy_overlap speedup over the fastest CPU baseline ≥ {least:.1f}x"
    cpu_target = f"{where}: its CPU core-s per epoch / that baseline's ≤ {CPU_SHARE_AT_MOST:.2f}x"
    epochs, cpu = _runs_of(rows, "epoch_time"), _runs_of(rows, "cpu_time")
    baselines = set(rows[rows.role == "baseline"].variant)
    runs = {r: t for r, t in epochs.items() if "zero_copy_overlap" in t and baselines & set(t)}
    if not runs:
        why = "zero_copy_overlap not run" if baselines else "no CPU baseline run"
        return [_missing(label, speed_target, why if not rows.empty else "not run at this budget")]
    speed, share, fastest = [], [], []
    for run, times in runs.items():
        base = min((p for p in times if p in baselines), key=times.get)
        fastest.append(base)
        speed.append(times[base] / times["zero_copy_overlap"])
        if "zero_copy_overlap" in cpu.get(run, {}) and base in cpu[run]:
            share.append(cpu[run]["zero_copy_overlap"] / cpu[run][base])
    lacking = [b for b in NEEDED_BASELINES if any(b not in t for t in runs.values())]
    note = f" vs {fastest[0]}"

    def verdict(values, met) -> str:
        found = _judged(met)
        if lacking:  # against a weaker field than the target's: the value stands, the target is not judged
            return f"{NOT_MEASURED}: no {', '.join(lacking)} (against the baselines run: {found})"
        return found

    lines = [_row(label, speed_target, speed, verdict(speed, [v >= least for v in speed]), note)]
    if share:
        lines.append(_row(label, cpu_target, share, verdict(share, [v <= CPU_SHARE_AT_MOST for v in share]), note))
    else:
        lines.append(_missing(label, cpu_target, "no cpu_time recorded"))
    return lines


def _fit_row(label: str, rows: pd.DataFrame) -> str:
    """Target 3: which pipelines fit FIT_BUDGET_GIB of GPU memory (the recorded fits_gpu_budget)."""
    target = f"fits a {FIT_BUDGET_GIB:g} GiB GPU budget: zero_copy and zero_copy_overlap"
    fits = rows[(rows.metric == "fits_gpu_budget") & (rows.gpu_memory_budget == FIT_BUDGET_GIB)]
    if fits.empty:
        return _missing(label, target, f"no fit recorded at {FIT_BUDGET_GIB:g} GiB")
    every = fits.groupby("variant")["value"].min()  # 1 only where it fit in every run
    from workloads.gnn.pipelines import in_order

    fit = [p for p in in_order(every.index) if every[p] == 1]
    out = [p for p in in_order(every.index) if every[p] != 1]
    runs = fits.run.nunique()
    lacking = [p for p in ZERO_COPY if p not in every.index]
    verdict = (
        f"{NOT_MEASURED}: no {', '.join(lacking)}" if lacking else "met" if set(ZERO_COPY) <= set(fit) else "missed"
    )
    value = f"fit: {', '.join(fit) or 'none'}; not: {', '.join(out) or 'none'}"
    return f"| {label} | {target} | {value} | – | {runs} | {verdict} |"


def target_lines(frame: pd.DataFrame) -> list[str]:
    """The targets' table, per graph and model and per CPU budget, from every part's rows (the
    budget sweeps' too) of every run; a target whose rows are missing is "not measured"."""
    frame = with_budgets(frame)
    lines = ["| graph, model | target | value (committed run) | range over runs | runs | verdict |", "|---" * 6 + "|"]
    for part, name in TARGET_PARTS.items():
        if part not in set(frame.part):
            lines.append(_missing(name, "every target", f"no {part} results"))
    for key in _groups(frame[frame.metric == "epoch_time"]):
        label, rows = _label(key), frame
        for column, value in zip(GROUP, key):
            rows = rows[rows[column] == value]
        lines += _bound_rows(label, rows[rows.budget == ALL])
        measured = [b for b in rows.budget.dropna().unique() if b != ALL]
        budgets = [*TARGET_BUDGETS] if key[0] in TARGET_PARTS else [ALL]
        budgets += sorted(b for b in measured if b not in budgets)
        unmeasured = [b for b in budgets if b not in set(rows.budget)]
        if unmeasured:  # one row for the budgets not run, the sweeps' most often
            names = ", ".join(_budget_name(b, rows.iloc[:0]) for b in unmeasured)
            lines.append(_missing(label, f"{names}: the CPU-budget targets", "not run at these budgets"))
        for budget in [b for b in budgets if b not in unmeasured]:
            lines += _cpu_rows(label, budget, rows[rows.budget == budget])
        if key[0] == "papers_full":
            lines.append(_fit_row(label, rows))
    return lines


@table("gnn_training-h200-targets", topic="gnn_training")
def targets_h200() -> Table:
    """Each target of the H200 runs, per graph and model, CPU budget and run."""
    committed, reruns = committed_and_reruns(parts=(*PARTS, *BUDGET_SWEEPS))
    frame = with_runs(load(committed, "gnn_training"), load(reruns, "gnn_training") if reruns else None)
    note = (
        "Each ratio is taken within a run (a measuring process: the committed file, or a re-run of the same code); "
        "value: the committed run's, with the baseline it is against; a target is met where every run meets it. "
        "all_in_gpu's row: its epoch over the fastest other pipeline's at all cores, and the pipelines that beat it "
        "(in how many runs). Fastest CPU baseline: per run and budget, the fastest of cpu_gather, cpu_gather_workers "
        "and pyg_neighbor_loader where it ran; without cpu_gather_workers the target is not judged. CPU budget: the "
        "cores given to a pipeline's processes (the budget sweeps' 2, 4 and 8; all cores: the dataset parts)."
    )
    return Table(target_lines(frame), [*committed, *reruns], note=note)


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


# --- where a training step's time goes (tools/gnn_step_profile.py) --------------------------------

STEP_PROFILE_FOLDER = "step_profile"  # results/<machine>/gnn_training/step_profile/<dataset>-<scale>.csv
GPU_BOUND_SHARE = 0.8  # a step whose GPU is busy this share of it or more is GPU-bound
LAUNCH_BOUND_SHARE = 0.5  # ... below this share, and idle mostly while the host issues work: launch-bound
STEP_PROFILE_NUMBERS = (
    "wall_ms",
    "batch_ms",
    "kernel_ms",
    "kernels",
    "launches",
    "gpu_busy_ms",
    "gpu_idle_ms",
    "largest_gap_ms",
    "host_waits",
    "host_wait_ms",
)


def step_profile_files(machine: str = MACHINE, scale: str = SCALE) -> list[Path]:
    """The committed step profiles of ``machine`` at ``scale``, one per graph profiled."""
    folder = REPO_ROOT / "results" / machine / "gnn_training" / STEP_PROFILE_FOLDER
    return results_in(folder, f"*-{scale}")


def read_step_profile(path: Path) -> pd.DataFrame:
    """The rows of a step profile, refused in one line without its provenance record, with rows
    edited since the record was written, or without the columns the table reads."""
    import hashlib

    from harness.errors import UserError
    from harness.results import ROWS_DIGEST, results_bytes

    record = load_provenance(path)
    if record.get(ROWS_DIGEST) != hashlib.sha256(results_bytes(path)).hexdigest():
        raise UserError(f"{path}: its rows are not those its provenance record was written with (edited since?)")
    frame = pd.read_csv(path, dtype={"note": str})
    missing = [
        c for c in ("model", "pipeline", "form", "steps", "setups_in_profile", *STEP_PROFILE_NUMBERS) if c not in frame
    ]
    if missing:
        raise UserError(f"{path}: no column {', '.join(missing)} (a profile of tools/gnn_step_profile.py has them)")
    return frame.assign(note=frame["note"].fillna("") if "note" in frame else "")


def step_bound(wall: float, busy: float, batch: float, host_wait: float) -> str:
    """What bounds a step (milliseconds: the step, the GPU's busy time, the host's time taking
    the batch and waiting for the GPU): GPU-bound where the GPU is busy GPU_BOUND_SHARE of it or
    more; else whatever kept the GPU idle for at least half that idle time: the batch, the host
    waiting for the GPU, or, with neither, the host issuing the work (launches and the Python and
    dispatch around them): launch-bound below LAUNCH_BOUND_SHARE busy, partly so above."""
    if busy >= GPU_BOUND_SHARE * wall:
        return "GPU-bound"
    idle = wall - busy
    if batch >= idle / 2:
        return "waits for its batch"
    if host_wait >= idle / 2:
        return "waits for the GPU"
    return "launch-bound" if busy < LAUNCH_BOUND_SHARE * wall else "partly launch-bound"


STEP_PROFILE_HEADER = (
    "| model | pipeline | form | step ms | batch ms | GPU busy ms | GPU idle ms (longest) | kernels | launches "
    "| host waits (ms) | warm-up s | bound |"
)


def step_profile_lines(frame: pd.DataFrame) -> list[str]:
    """One line per graph, model, pipeline and form of the profiles in ``frame`` (a ``graph``
    column names the graph where there are several)."""
    from workloads.gnn.model_forms import in_order as forms_in_order
    from workloads.gnn.pipelines import in_order

    lines = [STEP_PROFILE_HEADER, "|---" * 12 + "|"]
    pipelines = {p: i for i, p in enumerate(in_order(frame.pipeline))}
    forms = {f: i for i, f in enumerate(forms_in_order(set(frame.form)))}
    graphs = frame.graph if "graph" in frame else pd.Series([""] * len(frame))
    several = graphs.nunique() > 1
    ordered = sorted(
        zip(graphs, frame.itertuples(index=False), strict=True),
        key=lambda gr: (gr[0], gr[1].model != "sage2", gr[1].model, pipelines[gr[1].pipeline], forms[gr[1].form]),
    )
    for graph, row in ordered:
        model = row.model.upper().replace("SAGE", "SAGE ").replace("GAT", "GAT ") + (f" ({graph})" if several else "")
        where = f"| {model} | {row.pipeline} | {row.form} |"
        if row.note or not row.steps:
            lines.append(f"{where}" + " – |" * 8 + f" failed: {row.note or 'no steps profiled'} |")
            continue
        bound = step_bound(row.wall_ms, row.gpu_busy_ms, row.batch_ms, row.host_wait_ms)
        if row.setups_in_profile:
            bound += f" ({int(row.setups_in_profile)} compiles or captures in the profiled steps: not steady state)"
        warmup = f"{row.warmup_s:.1f}" if pd.notna(row.warmup_s) else "–"
        lines.append(
            f"{where} {row.wall_ms:.2f} | {row.batch_ms:.2f} | {row.gpu_busy_ms:.2f} "
            f"| {row.gpu_idle_ms:.2f} ({row.largest_gap_ms:.2f}) | {row.kernels:.0f} | {row.launches:.0f} "
            f"| {row.host_waits:.0f} ({row.host_wait_ms:.2f}) | {warmup} | {bound} |"
        )
    return lines


STEP_PROFILE_NOTE = (
    "Per training step, medians over the profiled steps in steady state (after the warm-up steps, where a form "
    "compiles or captures; warm-up s is their time): step ms, the host's time for the whole step; batch ms, of which "
    "taking the batch; GPU busy, the union in time of the kernels and copies launched during the step; GPU idle, the "
    "rest of their span (the longest gap in brackets); host waits, calls that block the host on the GPU. Bound: "
    f"GPU-bound where the GPU is busy {GPU_BOUND_SHARE:.0%} of the step or more; otherwise what most of its idle time "
    "went to: the batch, the host waiting for the GPU, or else the host issuing the work (launch-bound where the GPU "
    f"is busy under {LAUNCH_BOUND_SHARE:.0%} of the step, partly launch-bound above). Forms: eager, the model as "
    "written; compiled, torch.compile with dynamic shapes; cuda_graph, its layers replayed from CUDA graphs captured "
    "per padded subgraph size (workloads/gnn/model_forms/)."
)


def step_profile_table(machine: str, gpu: str) -> Table:
    """Where a SAGE-2 and a GAT-2 training step's time goes per pipeline and model form on ``gpu``
    (results/``machine``/), from the committed profiles of tools/gnn_step_profile.py; "not
    measured" until one is committed."""
    files = step_profile_files(machine)
    if not files:
        unmeasured = "| SAGE 2, GAT 2 | every pipeline | every form | not measured |" + " |" * 8
        return Table(
            [STEP_PROFILE_HEADER, "|---" * 12 + "|", unmeasured],
            [],
            not_measured=f"Source: none yet (`tools/gnn_step_profile.py` has not run on the {gpu}).",
        )
    frame = pd.concat(
        [read_step_profile(path).assign(graph=path.stem.rsplit("-", 1)[0]) for path in files], ignore_index=True
    )
    graphs = ", ".join(sorted(set(frame.dataset.dropna()))) if "dataset" in frame else "the graph"
    steps = "/".join(str(int(n)) for n in sorted(set(frame.steps[frame.steps > 0])))
    note = f"On {graphs}, {steps} profiled steps, on the {gpu}. {STEP_PROFILE_NOTE}"
    return Table(step_profile_lines(frame), files, note=note)


@table("gnn_training-h200-step_profile", topic="gnn_training")
def step_profile_h200() -> Table:
    return step_profile_table(MACHINE, "H200")


@table("gnn_training-h100-step_profile", topic="gnn_training")
def step_profile_h100() -> Table:
    """The same profile on an NVIDIA H100 (the H200's settings and graph, another GPU)."""
    return step_profile_table("h100", "H100")
