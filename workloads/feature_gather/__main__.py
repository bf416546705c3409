"""Measure one part of the feature_gather topic and write its results with provenance."""

from harness.entry import main
from workloads.feature_gather import GPU_PARTS, PARTS
from workloads.feature_gather.schema import SCHEMA


def cli(argv=None) -> None:
    main(topic="feature_gather", schema=SCHEMA, gpu_parts=GPU_PARTS, argv=argv, description=__doc__,
         parts={part: f"workloads.feature_gather.parts:{part}" for part in PARTS})


if __name__ == "__main__":
    cli()
