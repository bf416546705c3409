"""The command line shared by every workload: measure one part of a topic, write its results.

    python -m workloads.<topic> --part NAME --scale SCALE --out results/<machine>/<topic>/NAME-SCALE.csv

Each part names a function, ``"package.module:function"`` (or a module, whose ``run`` is used),
called as ``function(params, writer, *, shared, repeat, warmup, device, scratch_dir)``: it measures
and adds rows to ``writer``, and may return a dict of notes for the provenance record (for
example why a baseline was skipped). The Snakemake rules call exactly this.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import signal
from pathlib import Path
from typing import Collection, Mapping

from harness import config as suite_config
from harness import machine, provenance
from harness.errors import NeedsGpuError, UserError, exit_on_user_error
from harness.results import ResultsWriter, Schema


def main(*, topic: str, schema: Schema, parts: Mapping[str, str], gpu_parts: Collection[str],
         argv=None, description: str | None = None) -> None:
    # `kill -USR1 <pid>` prints every thread's stack: where a long run is spending its time.
    if hasattr(signal, "SIGUSR1"):
        try:
            faulthandler.register(signal.SIGUSR1, all_threads=True)
        except (OSError, ValueError):  # stderr is not a file (captured): no stack dumps then
            pass

    @exit_on_user_error
    def run() -> None:
        parser = argparse.ArgumentParser(prog=f"python -m workloads.{topic}", description=description,
                                         formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("--part", required=True, choices=sorted(parts))
        parser.add_argument("--scale", required=True)
        parser.add_argument("--out", required=True, type=Path, help="results CSV to write")
        parser.add_argument("--config", type=Path, default=suite_config.DEFAULT_CONFIG)
        parser.add_argument("--scratch-dir", type=Path, help="directory for files on disk (default: config's scratch_dir)")
        args = parser.parse_args(argv)

        cfg = suite_config.load(args.config)
        scale = suite_config.scale_params(cfg, args.scale)
        if args.out.suffix != ".csv":
            raise UserError(f"--out must name a .csv file, got {args.out}")
        gpu = machine.has_gpu()
        if args.part in gpu_parts and not gpu:
            raise NeedsGpuError(f"{topic} part '{args.part}' needs a CUDA GPU and this machine has none that torch can use")
        params = scale[topic]
        writer = ResultsWriter(schema, scale=args.scale)
        module_name, _, function_name = parts[args.part].partition(":")
        measure_part = getattr(importlib.import_module(module_name), function_name or "run")
        part_params = params.get(args.part, {})  # a topic may configure its parts only in common
        notes = measure_part(part_params, writer, shared=params, repeat=params["repeat"],
                           warmup=params["warmup"], device="cuda" if gpu else "cpu",
                           scratch_dir=args.scratch_dir or Path(cfg["scratch_dir"])) or {}
        writer.write(args.out, provenance.collect(args.scale, topic=topic, part=args.part,
                                                  parameters=part_params, **notes))
        print(f"wrote {len(writer.rows)} rows to {args.out}")

    run()
