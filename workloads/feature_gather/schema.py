"""Results format of the feature_gather topic (see harness.results for the common columns).

``variant`` names the gather variant and ``role`` is its entry's (systems/pytorch_direct/
gather_variants): ``baseline`` (what the paper compares against: pageable, the CPU gathers),
``peer`` (what a user picks today: stock torch on the CUDA alias, WholeGraph), ``optimized``
(the suite's zero-copy paths) or ``upper_bound`` (all_in_gpu).
Metric ``bandwidth`` counts the bytes delivered to the GPU (rows requested x row size);
``pcie_bytes`` counts the bytes that crossed PCIe (rows served from a GPU cache do not).
"""

from harness.results import Schema

SCHEMA = Schema(
    topic="feature_gather",
    config={
        "device": str,  # "cuda" (gather into GPU memory) or "cpu" (CPU gather only)
        "dtype": str,  # "fp32" or "bf16"
        "dim": int,  # features per row
        "row_bytes": int,
        "table_bytes": int,
        "batch_rows": int,  # rows per gather
        "distribution": str,  # "uniform" or "zipf<exponent>" (distinct rows either way)
        "threads": int,  # CPU threads of the CPU gather
        "max_threads": int,  # GPU thread cap of the zero-copy gather (0: fill the GPU)
        "cache_bytes": int,  # GPU memory holding the hottest rows
        "window_bytes": int,  # locality: rows come from windows of this size...
        "windows": int,  # ...this many of them, spread over the table
        "split_fraction": float,  # share of rows gathered by the CPU in the split variant
        "chunk_rows": int,  # rows per chunk of cpu_gather_pipelined
        "path": str,  # the path the `default` variant took (systems/pytorch_direct/dispatch.py)
    },
)
