"""The relational GNN and Hector docs' tables: the fastest competitor per graph, Hector's speed over
it (per graph, and as the headline geomean), the step captured whole, and the GEMM template alone.

Competitors are the forms of role baseline or peer, in float32 (TF32 off); times are medians of
the timed calls, one layer at width 64. A speedup is taken within one process (its median of
``hector_best`` against its fastest competitor) and given as the range over the processes that
measured the same code as the committed file (the digest of the measured code in their provenance,
or their commit): ``reruns/*/`` of other code say nothing of this code's spread and are left out
(``analysis.common.same_code_reruns``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from analysis.common import summarize
from analysis.doc_tables import Table, load, results_files, same_code_processes, table
from harness.registry import COMPETITOR_ROLES

MACHINE, SCALE, TOPIC = "h200", "h200", "relational_gnn"
PARTS = ("knowledge_graphs", "more_knowledge_graphs", "datasets", "large_datasets", "largest_datasets")
MODELS = {"rgcn": "RGCN", "rgat": "RGAT", "hgt": "HGT", "compgcn": "CompGCN"}
MODES = ("inference", "training")
HECTOR = "hector_best"  # the configuration named before timing: every headline is quoted for it
UNOPTIMIZED = "hector_unopt"  # no passes: the ablation's base
HECTOR_FLOAT32 = ("hector_unopt", "hector_compact", "hector_reorder", "hector_best")
EXACT, WIDTH = "float32", 64
KEY = ["model", "mode", "dataset"]
# The headline's graphs: the part measured in several processes with every peer (dense and compiled).
HEADLINE_PART = "datasets"
# The parts that capture the whole training step, and that mode.
GRAPHED_PARTS, GRAPHED_MODE = ("knowledge_graphs", "more_knowledge_graphs", "shapes", "datasets"), "training_graphed"
# The graphs no dataset of the suite has (the unseen-shapes target).
SHAPE_PARTS = ("shapes",)


def process_files(part: str) -> list[Path]:
    """The committed file of ``part``, then its re-runs of the same code (each its own process)."""
    return same_code_processes(MACHINE, TOPIC, part, SCALE)


def medians(files: Sequence[Path]):
    """Median time per (process, role, variant, model, mode, graph), float32 at width 64."""
    frame = load(files, TOPIC)
    frame = frame[(frame.precision == EXACT) & (frame.out_dim == WIDTH)]
    return summarize(frame, "time", ["source", "role", "variant", *KEY, "edges"])


@functools.cache
def _committed():
    files = results_files(MACHINE, TOPIC, PARTS, SCALE)
    return medians(files), files


@functools.cache
def _every_process(parts: tuple[str, ...] = PARTS):
    files = [f for part in parts for f in process_files(part)]
    return medians(files), files


def graphs_by_size(times) -> list[str]:
    return list(times.groupby("dataset")["edges"].max().sort_values().index)


def fastest_competitors(times):
    """The fastest baseline or peer per (process, model, mode, graph): its variant and median."""
    competitors = times[times.role.isin(COMPETITOR_ROLES)]
    return competitors.loc[competitors.groupby(["source", *KEY])["median"].idxmin()].set_index(["source", *KEY])


def speedups(times, variant: str = HECTOR):
    """Per (process, model, mode, graph) where both were measured: the fastest competitor's variant
    and median, ``variant``'s median, and the competitor's time over ``variant``'s."""
    best = fastest_competitors(times)
    ours = times[times.variant == variant].set_index(["source", *KEY])["median"]
    both = best.join(ours.rename("ours"), how="inner")
    both["speedup"] = both["median"] / both["ours"]
    return both


def geomean(values) -> float:
    return float(np.exp(np.log(np.asarray(values, dtype=float)).mean()))


def span(values, digits: int = 2, suffix: str = "x") -> str:
    low, high = min(values), max(values)
    if f"{low:.{digits}f}" == f"{high:.{digits}f}":
        return f"{low:.{digits}f}{suffix}"
    return f"{low:.{digits}f}–{high:.{digits}f}{suffix}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _header(graphs) -> list[str]:
    return ["| model | mode | " + " | ".join(graphs) + " |", "|---|---|" + "---|" * len(graphs)]


def _measured(frame, model: str) -> bool:
    return model in set(frame.index.get_level_values("model"))


# --- the relational GNN doc -----------------------------------------------------------------------


@table("relational_gnn-h200-fastest_competitor", topic=TOPIC)
def fastest_competitor() -> Table:
    times, files = _committed()
    graphs = graphs_by_size(times)
    best = fastest_competitors(times).droplevel("source")
    lines = _header(graphs)
    for model, label in MODELS.items():
        if not _measured(best, model):
            continue
        for mode in MODES:
            cells = [
                f"{best.loc[key, 'variant']} {_ms(best.loc[key, 'median'])}" if key in best.index else "–"
                for key in ((model, mode, g) for g in graphs)
            ]
            lines.append(f"| {label} | {mode} | " + " | ".join(cells) + " |")
    note = (
        "The fastest baseline or peer per model, graph and mode in the committed files: median time per call, "
        "float32, width 64; –: not measured."
    )
    return Table(lines, files, note=note)


@table("relational_gnn-h200-hector_speedup", topic=TOPIC)
def hector_speedup() -> Table:
    times, files = _every_process()
    graphs = graphs_by_size(times)
    found = speedups(times)
    by_key = found.groupby(KEY)["speedup"].agg(list)
    processes = found.reset_index().groupby("dataset")["source"].nunique()
    lines = _header([f"{g} ({processes.get(g, 0)})" for g in graphs])
    for model, label in MODELS.items():
        if model not in set(by_key.index.get_level_values("model")):
            continue
        for mode in MODES:
            cells = [span(by_key[key]) if key in by_key.index else "–" for key in ((model, mode, g) for g in graphs)]
            lines.append(f"| {label} | {mode} | " + " | ".join(cells) + " |")
    note = (
        f"`{HECTOR}`'s speed over the fastest baseline or peer (their time over its, both medians of one process), "
        "float32, width 64: the range over the processes that measured the graph with the same code (their number in "
        "brackets); –: not measured."
    )
    return Table(lines, files, note=note)


# --- the Hector doc -------------------------------------------------------------------------------


@table("hector-h200-headline", topic=TOPIC)
def headline() -> Table:
    """Per process, the geomean over the headline part's graphs; then its range over processes."""
    times, files = _every_process((HEADLINE_PART,))
    found = speedups(times).reset_index()
    graphs = sorted(found.dataset.unique())
    count = found.source.nunique()
    lines = [
        f"| model | training: geomean ({count} processes) | worst graph (its fastest competitor) "
        f"| inference: geomean ({count} processes) | worst graph (its fastest competitor) |",
        "|---|---|---|---|---|",
    ]
    for model, label in MODELS.items():
        cells = []
        for mode in ("training", "inference"):
            rows = found[(found.model == model) & (found["mode"] == mode)]
            if rows.empty:
                cells += ["–", "–"]
                continue
            per_process = rows.groupby("source")["dataset"].agg(set)
            short = [Path(s).parent.name for s, seen in per_process.items() if seen != set(graphs)]
            if short:
                raise ValueError(f"headline {model} {mode}: processes {short} lack some of {graphs}")
            each = rows.groupby("source")["speedup"].agg(geomean)
            by_graph = rows.groupby("dataset")
            worst = by_graph["speedup"].min().idxmin()
            peers = "/".join(f"`{v}`" for v in sorted(by_graph.get_group(worst).variant.unique()))
            cells += [span(each), f"{worst} {span(by_graph.get_group(worst).speedup)} ({peers})"]
        if cells != ["–"] * 4:
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    note = (
        f"`{HECTOR}` over the fastest baseline or peer (dense and compiled peers included), float32, width 64: each "
        f"process's geomean over {', '.join(graphs)}, given as the range over the processes; the worst graph is the "
        "one with the lowest speedup in any process, with its range over the processes."
    )
    return Table(lines, files, note=note)


@table("hector-h200-captured_step", topic=TOPIC)
def captured_step() -> Table:
    """Per graph of the captured parts: both medians (the middle process's) and the speedup's range."""
    times, files = _every_process(GRAPHED_PARTS)
    times = times[times["mode"] == GRAPHED_MODE]
    if times.empty:
        raise ValueError(f"{', '.join(map(str, files))}: no rows of mode {GRAPHED_MODE}")
    found = speedups(times).reset_index()
    graphs = [g for g in graphs_by_size(times) if g in set(found.dataset)]
    models = [m for m in MODELS if m in set(found.model)]
    processes = found.groupby("dataset")["source"].nunique()
    lines = ["| graph (processes) | " + " | ".join(MODELS[m] for m in models) + " |", "|---|" + "---|" * len(models)]
    for graph in graphs:
        cells = []
        for model in models:
            rows = found[(found.model == model) & (found.dataset == graph)]
            if rows.empty:
                cells.append("")
                continue
            peers = "/".join(f"`{v}`" for v in sorted(rows.variant.unique()))
            cells.append(
                f"{rows.ours.median() * 1e3:.3f} vs {rows['median'].median() * 1e3:.3f} ({peers}): {span(rows.speedup)}"
            )
        lines.append(f"| {graph} ({processes[graph]}) | " + " | ".join(cells) + " |")
    lines.append(_captured_geomean_row(found, models))
    host = _host_share(files, found)
    note = (
        f"Training step captured whole (`{GRAPHED_MODE}`), ms: `{HECTOR}` against the fastest captured baseline or "
        "peer, float32, width 64; times are the median over processes of each process's median, the speedup its "
        "range over the processes (in brackets, how many); a blank cell: one side was not measured (out of memory, "
        f"or not capturable); the last row: each process's geomean over the `{HEADLINE_PART}` graphs, its range over "
        f"the processes. The host's share of a step (median `cpu_time` of a replay, every process): "
        f"{host[HECTOR]} ms for `{HECTOR}`, {host['peers']} ms for the peers above."
    )
    return Table(lines, files, note=note)


def _captured_geomean_row(found, models) -> str:
    """Each process's geomean over the headline part's graphs, as the range over processes (blank for a model
    that some process did not measure on every one of them: a geomean over fewer graphs is another number)."""
    headline = found[found.source.map(lambda s: Path(s).name.startswith(f"{HEADLINE_PART}-"))]
    graphs, sources = set(headline.dataset), set(headline.source)
    cells = []
    for model in models:
        rows = headline[headline.model == model]
        seen = rows.groupby("source")["dataset"].agg(set)
        complete = set(seen.index) == sources and seen.eq(graphs).all()
        cells.append(span(rows.groupby("source")["speedup"].agg(geomean)) if len(rows) and complete else "")
    return f"| geomean over the {len(graphs)} `{HEADLINE_PART}` graphs ({len(sources)}) | " + " | ".join(cells) + " |"


def _host_share(files, found) -> dict[str, str]:
    """The range of the median ``cpu_time`` per captured step of ``HECTOR`` and of the competitors in ``found``."""
    frame = load(files, TOPIC)
    frame = frame[(frame.precision == EXACT) & (frame.out_dim == WIDTH) & (frame["mode"] == GRAPHED_MODE)]
    cpu = summarize(frame, "cpu_time", ["source", "variant", *KEY]).set_index(["source", "variant", *KEY])["median"]
    keys = [(row.source, row.model, row["mode"], row.dataset) for _, row in found.iterrows()]
    peers = [cpu[(key[0], row.variant, *key[1:])] for key, (_, row) in zip(keys, found.iterrows(), strict=True)]
    ours = [cpu[(key[0], HECTOR, *key[1:])] for key in keys]
    return {HECTOR: span([v * 1e3 for v in ours], 3, ""), "peers": span([v * 1e3 for v in peers], 3, "")}


# The GEMM template's yardstick per case: the fastest other way to multiply those segments
# (``grouped_mm`` over many segments, cuBLAS on one), and the goal it was set against, if any.
GEMM_YARDSTICK = {"am-like segments": "grouped_mm", "fb15k-like segments": "grouped_mm", "one segment": "cublas"}
GEMM_GOALS = {("am-like segments", "bfloat16"): 1.0, ("one segment", "bfloat16"): 0.7}
GEMM_PRECISIONS = {"float32": "float32", "tf32": "TF32", "bfloat16": "bf16"}
GEMM_COLUMNS = ("hector_gemm", "grouped_mm", "segment_mm", "cublas")


def _segments(shape) -> str:
    rows = f"{shape.edges / 1e6:.3g} M rows, {shape.in_dim}x{shape.out_dim}"
    return rows if shape.relations == 1 else f"{shape.relations}, {rows}"


@table("hector-h200-gemm_template", topic=TOPIC)
def gemm_template() -> Table:
    """Times of the committed process; the template's speed over its yardstick in every process of
    the same code, a goal met only where every process meets it."""
    files = process_files("gemm_template")
    frame = load(files, TOPIC)
    times = summarize(frame, "time", ["source", "dataset", "precision", "variant"])
    times = times.set_index(["dataset", "precision", "source", "variant"])["median"].sort_index()
    committed = str(files[0])
    shapes = frame.drop_duplicates("dataset").set_index("dataset")
    lines = [
        "| case | precision | template | `grouped_mm` | loop of `mm` | cuBLAS | template's speed over the yardstick |",
        "|---|---|---|---|---|---|---|",
    ]
    for precision, shown in GEMM_PRECISIONS.items():
        for case in GEMM_YARDSTICK:
            if (case, precision) not in times.index.droplevel(["source", "variant"]):
                raise ValueError(f"{files[0]}: no {precision} rows of {case!r}")
            measured = times.loc[(case, precision)]
            cells = [_ms(measured[(committed, v)]) if (committed, v) in measured.index else "" for v in GEMM_COLUMNS]
            yardstick = GEMM_YARDSTICK[case]
            by_process = measured.unstack("variant")
            ratios = list(by_process[yardstick] / by_process["hector_gemm"])
            verdict = f"{span(ratios)} `{yardstick}`"
            goal = GEMM_GOALS.get((case, precision))
            if goal is not None:
                verdict = f"**{verdict}**: {'met' if min(ratios) >= goal else 'missed'} (≥ {goal:g}x)"
            label = case if precision != "float32" else f"{case} ({_segments(shapes.loc[case])})"
            lines.append(f"| {label} | {shown} | " + " | ".join(cells) + f" | {verdict} |")
    note = (
        f"Median time per call on prepared inputs in the committed process; the last column is the yardstick's time "
        f"over the template's (`grouped_mm` on many segments, cuBLAS on one) in each of {len(files)} processes, "
        "given as their range, with the goal where one was set (met only if every process meets it)."
    )
    return Table(lines, files, note=note)


def _percent_span(values) -> str:
    low, high = min(values), max(values)
    return f"{low:.0%}" if f"{low:.0%}" == f"{high:.0%}" else f"{low:.0%}–{high:.0%}"


@table("hector-h200-ablation", topic=TOPIC)
def ablation() -> Table:
    """Hector's passes (``hector_best`` against ``hector_unopt``) and the ideal pick per graph."""
    times, files = _every_process((HEADLINE_PART,))
    ours = times[(times.role == "optimized")].pivot_table(index=["source", *KEY], columns="variant", values="median")
    if not {HECTOR, UNOPTIMIZED} <= set(ours.columns):
        raise ValueError(f"{files[0]}: the ablation needs rows of {HECTOR} and {UNOPTIMIZED}")
    ours["passes"] = ours[UNOPTIMIZED] / ours[HECTOR]
    ours["ideal"] = 1 - ours[list(HECTOR_FLOAT32)].min(axis=1) / ours[HECTOR]
    per_process = ours.groupby(["model", "mode", "source"]).agg(passes=("passes", geomean), ideal=("ideal", "mean"))
    count = per_process.reset_index().source.nunique()
    lines = [
        f"| model | mode | `{HECTOR}` over `{UNOPTIMIZED}`: geomean ({count} processes) "
        f"| time the ideal variant saves over `{HECTOR}` |",
        "|---|---|---|---|",
    ]
    for model, label in MODELS.items():
        for mode in ("training", "inference"):
            if (model, mode) in per_process.index.droplevel("source"):
                found = per_process.loc[(model, mode)]
                lines.append(f"| {label} | {mode} | {span(found.passes)} | {_percent_span(found.ideal)} |")
    note = (
        f"Float32, width 64, over {', '.join(sorted(ours.reset_index().dataset.unique()))}; each process's geomean "
        "(and mean saving), given as the range over the processes. The ideal variant is the fastest of "
        f"{', '.join(f'`{v}`' for v in HECTOR_FLOAT32)} per graph: a pick only a user who had timed them all "
        "could make."
    )
    return Table(lines, files, note=note)


@table("hector-h200-shapes", topic=TOPIC)
def unseen_shapes() -> Table:
    files = [f for part in SHAPE_PARTS for f in process_files(part)]
    times = medians(files)
    found = speedups(times)
    by_key = found.groupby(KEY)["speedup"].agg(list)
    processes = found.reset_index().groupby("dataset")["source"].nunique()
    sizes = load(files, TOPIC).drop_duplicates("dataset").set_index("dataset")
    models = [m for m in MODELS if m in set(by_key.index.get_level_values("model"))]
    lines = [
        "| shape | nodes | edges | relations | processes | mode | " + " | ".join(MODELS[m] for m in models) + " |",
        "|---|---|---|---|---|---|" + "---|" * len(models),
    ]
    for shape in graphs_by_size(times):
        size = sizes.loc[shape]
        for mode in MODES:
            cells = [span(by_key[key]) if key in by_key.index else "–" for key in ((m, mode, shape) for m in models)]
            lines.append(
                f"| {shape} | {size.nodes:,} | {size.edges:,} | {size.relations} | {processes.get(shape, 0)} "
                f"| {mode} | " + " | ".join(cells) + " |"
            )
    note = (
        f"`{HECTOR}` over the fastest baseline or peer (their time over its, both medians of one process), float32, "
        "width 64: the range over the processes that measured the same code; –: not measured."
    )
    return Table(lines, files, note=note)


@table("relational_gnn-h200-process_spread", topic=TOPIC)
def process_spread() -> Table:
    """How far one form's median moves between processes of the same code, per graph."""
    times, files = _every_process(tuple(p for p in PARTS if len(process_files(p)) > 1))
    moved = times.groupby(["variant", *KEY])["median"].agg(["min", "max", "count"])
    moved = moved[moved["count"] > 1]
    moved["ratio"] = moved["max"] / moved["min"]
    lines = [
        "| graph | processes | form x model x mode cases | median | 90th percentile | largest |",
        "|---|---|---|---|---|---|",
    ]
    by_graph = moved.groupby("dataset")
    for graph in [g for g in graphs_by_size(times) if g in by_graph.groups]:
        ratio = by_graph.get_group(graph)["ratio"]
        lines.append(
            f"| {graph} | {by_graph.get_group(graph)['count'].max()} | {len(ratio)} | {ratio.median():.2f}x "
            f"| {ratio.quantile(0.9):.2f}x | {ratio.max():.2f}x |"
        )
    note = (
        "A form's slowest median over its fastest across the processes of the same code "
        "(every form, float32, width 64)."
    )
    return Table(lines, files, note=note)
