"""Train every model with every pipeline on one dataset and write the results with provenance."""

from harness.entry import main
from workloads.gnn_training import PARTS
from workloads.gnn_training.schema import SCHEMA


def cli(argv=None) -> None:
    main(topic="gnn_training", schema=SCHEMA, gpu_parts=(), argv=argv, description=__doc__,
         parts={part: f"workloads.gnn_training.parts:{part}" for part in PARTS})

if __name__ == "__main__":
    cli()
