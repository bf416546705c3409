"""Feature gathering for sampled GNN training: PyTorch-Direct's zero-copy gather against the
CPU-gather-then-copy pipeline, an all-in-GPU upper bound, and the fixes for the translation bound.

Parts (one results file each; the functions are in parts.py), each measuring the gather
variants its config names (entries of systems/pytorch_direct/gather_variants; sweep.py):
``row_sizes``   feature dims x dtypes at one table size: every variant and baseline
``table_sizes`` row size x table size x index distribution (uniform, Zipf-skewed): the ablation
``batch_sizes`` rows per gather from 1e3 to 1e6
``cpu_threads`` the variants that gather on CPU threads, by thread count
``thread_cap``  the variants that take a cap on their GPU threads (to overlap training), by cap,
                and the peers (no cap)
``locality``    what bounds random reads: the same bytes spread over windows of growing size
Only ``row_sizes`` and ``cpu_threads`` run without a GPU (the variants that need none: the CPU
gather, no transfer). The figure also shows the same machine's ceilings (pinned copy, zero-copy
read rates).
"""

from harness.topic import Part, Topic
from workloads.feature_gather.schema import SCHEMA

TOPIC = Topic(
    name="feature_gather",
    title="PyTorch-Direct feature gathering",
    technique="pytorch_direct",
    schema=SCHEMA,
    parts=(
        Part("row_sizes"),
        Part("table_sizes", cpu=False),
        Part("batch_sizes", cpu=False),
        Part("cpu_threads"),
        Part("thread_cap", cpu=False),
        Part("locality", cpu=False),
    ),
    reads=("ceilings",),
)
