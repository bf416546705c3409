"""Build a GPU's dispatch table (systems/pytorch_direct/dispatch.py) from feature_gather results.

The cells are every (row size, table size) of uniform rows measured by the ``table_sizes`` part
(three row sizes, five table sizes) and the ``row_sizes`` part (fourteen row sizes, fp32 and bf16,
one table size). For each cell, every process's median bandwidth of each path's variant is
taken; the path whose median over processes is highest is chosen. The table records every
path's rate, the number of processes and the commits and dates measured, so a reader can see how
close each choice was.

    python -m workloads.feature_gather.dispatch_table results/h200/feature_gather

reads ``table_sizes-<scale>.csv`` and ``row_sizes-<scale>.csv`` there and under ``reruns/*/``
(one file per process), and writes
``systems/pytorch_direct/dispatch_tables/<gpu>.json`` for the GPU named in their provenance.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.errors import UserError
from harness.results import load, load_provenance, results_in
from systems.pytorch_direct import dispatch
from workloads.feature_gather.schema import SCHEMA

PARTS = ("table_sizes", "row_sizes")


def process_files(folder: Path) -> list[Path]:
    """The table_sizes and row_sizes results of every process in a machine's feature_gather folder."""
    files = [f for part in PARTS for where in ("", "reruns/*/") for f in results_in(folder, f"{where}{part}-*")]
    if not files:
        raise UserError(
            f"{folder}: no table_sizes-*.csv or row_sizes-*.csv (here or under reruns/*/) to build a table from"
        )
    return files


def gpu_of(files: list[Path]) -> str:
    names = set()
    for path in files:
        gpus = load_provenance(path)["machine"].get("gpus") or []
        names.update(g["name"] for g in gpus)
    if len(names) != 1:
        raise UserError(f"the results name {len(names)} GPU models ({sorted(names)}); a table is for one model")
    return names.pop()


def build(files: list[Path]) -> dict:
    frame = load(files, SCHEMA)
    variants = {v: p for p, v in dispatch.VARIANT_OF_PATH.items()}
    rates = frame[
        (frame.metric == "bandwidth") & (frame.distribution == "uniform") & frame.variant.isin(list(variants))
    ]
    per_process = rates.groupby(["row_bytes", "table_bytes", "variant", "source"])["value"].median()
    over_processes = per_process.groupby(["row_bytes", "table_bytes", "variant"]).agg(["median", "count"])
    cells = []
    for (row_bytes, table_bytes), group in over_processes.groupby(level=[0, 1]):
        medians = {variants[v]: round(float(m), 2) for (_, _, v), m in group["median"].items()}
        if set(medians) != set(dispatch.PATHS):
            missing = sorted(set(dispatch.PATHS) - set(medians))
            raise UserError(f"{row_bytes} B rows, {table_bytes} B table: no measurement of {missing}")
        cells.append(
            {
                "row_bytes": int(row_bytes),
                "table_bytes": int(table_bytes),
                "path": max(dispatch.PATHS, key=lambda p: medians[p]),
                "gbps": medians,
                "processes": int(group["count"].min()),
            }
        )
    provenance = [load_provenance(f) for f in files]
    return {
        "gpu": gpu_of(files),
        "rule": "per cell, the path with the highest median (over processes) of per-process median GB/s; "
        "uniform distinct rows",
        "built_from": [str(f) for f in files],
        "commits": sorted({p["git"]["commit"] for p in provenance}),
        "dates_utc": sorted({p["date_utc"] for p in provenance}),
        "cells": cells,
    }


def render(table: dict) -> str:
    return json.dumps(table, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a machine's feature_gather results folder")
    args = parser.parse_args(argv)
    try:
        files = process_files(args.folder)
        table = build(files)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = dispatch.table_file(table["gpu"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(table))
    for cell in table["cells"]:
        print(f"{cell['row_bytes']:>6} B rows {cell['table_bytes'] / 2**30:>6g} GiB: {cell['path']:<14} {cell['gbps']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
