"""NVIDIA WholeGraph's gather from its own host-mapped copy of the table (``wholegraph``), a peer
library; where ``pylibwholegraph`` does not import or cannot make its communicator, the part
records why (systems/pytorch_direct/wholegraph.py has the details)."""

from __future__ import annotations

from systems.pytorch_direct import wholegraph
from systems.pytorch_direct.gather_variants import Batch, GatherVariant, register


def make(b: Batch, *, table_copy: wholegraph.WholeGraphTable | None = None):
    return wholegraph.make_wholegraph(b, table_copy)


def describe() -> str:
    return (
        f"pylibwholegraph {wholegraph.version()}, host-mapped '{wholegraph.MEMORY_TYPE}' table "
        f"in location '{wholegraph.MEMORY_LOCATION}'"
    )


register(
    GatherVariant(
        "wholegraph",
        "peer",
        label="WholeGraph",
        needs_gpu=True,
        packages=("pylibwholegraph",),
        make=make,
        family="WholeGraph",
        table_copy=wholegraph.WholeGraphTable,
        check_runtime=wholegraph.available,
        describe=describe,
        notes="NVIDIA WholeGraph's wholememory gather from its own host-mapped copy of the table",
    )
)
