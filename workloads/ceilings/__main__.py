"""Measure one ceilings probe and write its results file with provenance.

    python -m workloads.ceilings --probe uva_read --scale h200 --out results/h200/ceilings/uva_read-h200.csv

The Snakemake rules call exactly this; it also runs on its own (a GPU box without Snakemake).
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from harness import config as suite_config
from harness import machine, provenance
from harness.errors import NeedsGpuError, UserError, exit_on_user_error
from harness.results import ResultsWriter
from workloads.ceilings import GPU_PROBES, PROBES
from workloads.ceilings.schema import SCHEMA

MODULES = {"pcie_copy": "pcie", "uva_read": "uva", "hbm_copy": "hbm", "matmul": "matmul",
           "disk": "disk", "host_memcpy": "host_memcpy"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probe", required=True, choices=PROBES)
    parser.add_argument("--scale", required=True)
    parser.add_argument("--out", required=True, type=Path, help="results CSV to write")
    parser.add_argument("--config", type=Path, default=suite_config.DEFAULT_CONFIG)
    parser.add_argument("--scratch-dir", type=Path, help="directory for the disk probe (default: config's scratch_dir)")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None) -> None:
    args = parse_args(argv)
    cfg = suite_config.load(args.config)
    scale = suite_config.scale_params(cfg, args.scale)
    if args.out.suffix != ".csv":
        raise UserError(f"--out must name a .csv file, got {args.out}")

    import torch  # after the cheap checks, so bad arguments fail fast

    gpu = machine.has_gpu() and torch.cuda.is_available()
    if args.probe in GPU_PROBES and not gpu:
        raise NeedsGpuError(f"probe '{args.probe}' needs a CUDA GPU and torch sees none on this machine")
    params = scale["ceilings"]
    scratch_dir = args.scratch_dir or Path(cfg["scratch_dir"])
    writer = ResultsWriter(SCHEMA, scale=args.scale)
    module = importlib.import_module(f"workloads.ceilings.{MODULES[args.probe]}")
    module.run(params[args.probe], writer, repeat=params["repeat"], warmup=params["warmup"],
               device="cuda" if gpu else "cpu", scratch_dir=scratch_dir)
    notes = {}
    if args.probe == "disk":
        from workloads.ceilings.disk import counters_note

        notes["disk_byte_counters"] = counters_note(scratch_dir)
        notes["scratch_dir"] = str(scratch_dir.resolve())
    writer.write(args.out, provenance.collect(args.scale, topic="ceilings", probe=args.probe,
                                               parameters=params[args.probe], **notes))
    print(f"wrote {len(writer.rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
