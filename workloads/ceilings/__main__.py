"""Measure one ceilings probe and write its results file with provenance (see harness.entry)."""

from harness.entry import main
from workloads.ceilings import GPU_PROBES, PROBES
from workloads.ceilings.schema import SCHEMA

MODULES = {"pcie_copy": "pcie", "uva_read": "uva", "hbm_copy": "hbm", "matmul": "matmul",
           "disk": "disk", "host_memcpy": "host_memcpy"}
assert set(MODULES) == set(PROBES)


def cli(argv=None) -> None:
    main(topic="ceilings", schema=SCHEMA, gpu_parts=GPU_PROBES, argv=argv, description=__doc__,
         parts={probe: f"workloads.ceilings.{module}" for probe, module in MODULES.items()})


if __name__ == "__main__":
    cli()
