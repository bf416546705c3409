"""The multi-GPU doc's tables: each pipeline's epoch, scaling and speed against the others per world size."""

from __future__ import annotations

import re

from analysis.common import summarize
from analysis.doc_tables import REPO_ROOT, Table, load, results_files, table
from harness.results import results_in, results_name
from workloads.gnn_multi_gpu.launch import PIPELINES

KEYS = ["variant", "world_size", "train_threads"]
BASELINE, BOUND = "cpu_gather", "all_in_gpu"


def _world_parts(machine: str, scale: str) -> list[str]:
    folder = REPO_ROOT / "results" / machine / "gnn_multi_gpu"
    return sorted(
        (
            m[1]
            for p in results_in(folder, f"world*-{scale}")
            if (m := re.fullmatch(rf"(world\d+)-{scale}", results_name(p)))
        ),
        key=lambda part: int(part.removeprefix("world")),
    )


def _cell(value, digits: int, suffix: str = "") -> str:
    return "" if value != value else f"{value:.{digits}f}{suffix}"  # NaN: not measured


def scaling_table(machine: str, scale: str) -> Table:
    files = results_files(machine, "gnn_multi_gpu", _world_parts(machine, scale), scale)
    frame = load(files, "gnn_multi_gpu")
    if frame.dataset.nunique() != 1 or frame.model.nunique() != 1:
        raise ValueError(f"{machine}: one table holds one dataset and model; split it by them first")
    epoch = summarize(frame, "epoch_time", KEYS).set_index(["variant", "world_size"])
    cpu = summarize(frame, "cpu_time", KEYS).set_index(["variant", "world_size"])["median"]
    per_rank = summarize(frame, "bandwidth", KEYS).set_index(["variant", "world_size"])["median"]
    seconds = epoch["median"]
    lines = [
        "| pipeline | GPUs | train threads per rank | epoch s | scaling efficiency | per-rank GB/s "
        "| CPU core-s/epoch | speed, x cpu_gather | speed, x all_in_gpu |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for variant, world in sorted(
        seconds.index,
        key=lambda key: (key[1], PIPELINES.index(key[0]) if key[0] in PIPELINES else len(PIPELINES), key[0]),
    ):
        time = seconds[(variant, world)]
        single = seconds.get((variant, 1), float("nan"))
        lines.append(
            f"| {variant} | {world} | {epoch.loc[(variant, world), 'train_threads']} | {time:.3f} "
            f"| {_cell(single / (world * time), 2)} | {_cell(per_rank.get((variant, world), float('nan')), 1)} "
            f"| {_cell(cpu.get((variant, world), float('nan')), 1)} "
            f"| {_cell(seconds.get((BASELINE, world), float('nan')) / time, 2, 'x')} "
            f"| {_cell(seconds.get((BOUND, world), float('nan')) / time, 2, 'x')} |"
        )
    dataset, model = frame.dataset.iloc[0], frame.model.iloc[0]
    layers, fanouts, batch = frame.layers.iloc[0], frame.fanouts.iloc[0], frame.batch_size.iloc[0]
    note = (
        f"{dataset}, {model} {layers} layers, fan-out {fanouts}, {batch} seeds per rank. Epoch time: median of the "
        "timed epochs; scaling efficiency T(1) / (N T(N)); per-rank GB/s over ranks and epochs; speed: the other "
        "pipeline's epoch time over this one's at the same GPU count."
    )
    return Table(lines, files, note=note)


@table("gnn_multi_gpu-h200x2", topic="gnn_multi_gpu")
def two_h200s() -> Table:
    return scaling_table("h200x2", "h200")


@table("gnn_multi_gpu-h200", topic="gnn_multi_gpu")
def one_h200() -> Table:
    return scaling_table("h200", "h200")
