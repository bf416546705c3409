"""Results format of the ceilings topic (see harness.results for the common columns)."""

from harness.results import Schema

SCHEMA = Schema(
    topic="ceilings",
    config={
        "device": str,  # where the work runs: "cuda" or "cpu"
        "host_memory": str,  # "pinned" or "pageable" (host side of a PCIe copy or read)
        "size_bytes": int,  # bytes per transfer / copy / file
        "table_bytes": int,  # size of the table that zero-copy reads pick rows from
        "granularity_bytes": int,  # bytes per row read (one contiguous request stream)
        "rows": int,  # rows read per call
        "block_bytes": int,  # bytes per I/O request (disk)
        "threads": int,  # host threads issuing the work
        "matrix_dim": int,  # n of an n x n x n matrix product
    },
)
