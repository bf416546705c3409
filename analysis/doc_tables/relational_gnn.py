"""The relational GNN doc's tables: the fastest competitor per graph, and Hector's speed over it.

Competitors are the forms of role baseline or peer, in float32 (TF32 off); times are medians of
the timed calls of the committed files, one layer at width 64.
"""

from __future__ import annotations

import functools

from analysis.common import summarize
from analysis.doc_tables import Table, load, results_files, table

MACHINE, SCALE = "h200", "h200"
PARTS = ("knowledge_graphs", "datasets", "large_datasets", "largest_datasets")
MODELS = {"rgcn": "RGCN", "rgat": "RGAT", "hgt": "HGT"}
MODES = ("inference", "training")
HECTOR = "hector_best"


@functools.cache
def _times():
    files = results_files(MACHINE, "relational_gnn", PARTS, SCALE)
    frame = load(files, "relational_gnn")
    frame = frame[(frame.precision == "float32") & (frame.out_dim == 64)]
    times = summarize(frame, "time", ["role", "variant", "model", "mode", "dataset", "edges"])
    return times, files


def _graphs(times) -> list[str]:
    """Graphs from the smallest to the largest (by edges)."""
    return list(times.groupby("dataset")["edges"].max().sort_values().index)


def _fastest(times):
    competitors = times[times.role.isin(["baseline", "peer"])]
    best = competitors.loc[competitors.groupby(["model", "mode", "dataset"])["median"].idxmin()]
    return best.set_index(["model", "mode", "dataset"])


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _header(graphs) -> list[str]:
    return ["| model | mode | " + " | ".join(graphs) + " |", "|---|---|" + "---|" * len(graphs)]


@table("relational_gnn-h200-fastest_competitor", topic="relational_gnn")
def fastest_competitor() -> Table:
    times, files = _times()
    graphs, best = _graphs(times), _fastest(times)
    lines = _header(graphs)
    for model, label in MODELS.items():
        for mode in MODES:
            cells = [
                f"{best.loc[(model, mode, g), 'variant']} {_ms(best.loc[(model, mode, g), 'median'])}"
                if (model, mode, g) in best.index
                else "–"
                for g in graphs
            ]
            lines.append(f"| {label} | {mode} | " + " | ".join(cells) + " |")
    note = "The fastest baseline or peer per model, graph and mode: median time per call, float32, width 64."
    return Table(lines, files, note=note)


@table("relational_gnn-h200-hector_speedup", topic="relational_gnn")
def hector_speedup() -> Table:
    times, files = _times()
    graphs, best = _graphs(times), _fastest(times)
    hector = times[times.variant == HECTOR].set_index(["model", "mode", "dataset"])["median"]
    lines = _header(graphs)
    for model, label in MODELS.items():
        for mode in MODES:
            cells = [
                f"{best.loc[key, 'median'] / hector[key]:.2f}x" if key in best.index and key in hector.index else "–"
                for key in ((model, mode, g) for g in graphs)
            ]
            lines.append(f"| {label} | {mode} | " + " | ".join(cells) + " |")
    note = f"`{HECTOR}`'s speed over the fastest baseline or peer (their time over its), float32, width 64."
    return Table(lines, files, note=note)
