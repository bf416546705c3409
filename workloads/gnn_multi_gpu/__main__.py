"""Data-parallel GNN training at one world size (torchrun), with provenance."""

from harness.entry import main
from workloads.gnn_multi_gpu import WORLDS
from workloads.gnn_multi_gpu.schema import SCHEMA


def cli(argv=None) -> None:
    main(topic="gnn_multi_gpu", schema=SCHEMA, gpu_parts=("world4", "world8"), argv=argv, description=__doc__,
         parts={part: f"workloads.gnn_multi_gpu.parts:{part}" for part in WORLDS})


if __name__ == "__main__":
    cli()
