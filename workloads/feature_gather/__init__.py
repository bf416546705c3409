"""Feature gathering for sampled GNN training: PyTorch-Direct's zero-copy gather against the
CPU-gather-then-copy pipeline, an all-in-GPU upper bound, and the fixes for the translation bound.

Parts (one results file each):
``row_sizes``   feature dims x dtypes at one table size: every variant and baseline
``table_sizes`` row size x table size x index distribution (uniform, Zipf-skewed): the ablation
``batch_sizes`` rows per gather from 1e3 to 1e6
``cpu_threads`` the CPU baseline by thread count
``thread_cap``  the zero-copy gather with a cap on its threads (to overlap training)
``locality``    what bounds random reads: the same bytes spread over windows of growing size
Only ``row_sizes`` and ``cpu_threads`` have a CPU-only subset (the CPU gather, no transfer).
"""

PARTS = ("row_sizes", "table_sizes", "batch_sizes", "cpu_threads", "thread_cap", "locality")
GPU_PARTS = ("table_sizes", "batch_sizes", "thread_cap", "locality")


def parts_for(has_gpu: bool) -> tuple[str, ...]:
    return PARTS if has_gpu else tuple(p for p in PARTS if p not in GPU_PARTS)
