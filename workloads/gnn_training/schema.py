"""Results format of the gnn_training topic (see harness.results for the common columns).

``dataset`` names the graph ("ogbn-products-like"); ``variant`` is the pipeline and ``role`` its
role in the registry workloads/gnn/pipelines: ``baseline`` (cpu_gather, the paper's baseline, and
cpu_gather_workers, the loader a PyG user runs; speedups are quoted against the faster of the
two at the same ``cpu_budget``), ``optimized`` (zero_copy, zero_copy_overlap, uva_sampling,
hot_cache) or ``upper_bound`` (all_in_gpu; hot_cache_oracle, the ideal static cache filled in
hindsight). Metrics: ``epoch_time`` per timed epoch, ``phase_time`` per phase of one
instrumented epoch, ``cpu_time`` per epoch, ``pcie_bytes`` per epoch, ``loss`` per step of the
first epoch, ``accuracy`` on the validation nodes (after the timed epochs and the instrumented
one); for the hot-row caches ``cache_hit_rate`` per timed epoch (the share of rows read from
GPU memory), ``cache_bytes`` (its GPU memory) and, for hot_cache only, ``cache_fill_time`` (the
sampled warm-up batches, counting and copying the rows to the GPU, before the first epoch).
On a GPU, per pipeline: ``gpu_resident_bytes`` (what it keeps in GPU memory for the run: tables,
CSR, labels, the sampler's id map, a cache; workloads/gnn/gpu_memory.py), ``peak_gpu_memory``
(torch's allocator, model and batches included) and, for each configured budget
(``gpu_memory_budget``, GiB), ``fits_gpu_budget`` (1 or 0: both within the budget). A pipeline
whose resident data exceed every budget has no rows: the notes' ``does_not_fit`` says why.

``pcie_bytes`` is the payload of the feature rows gathered (rows x row bytes) over PCIe: the
same for every pipeline that crosses it, the misses only for the caches; not the link's traffic,
which also carries ids, edges and labels, and for zero-copy reads whole 128-byte lines.
"""

from harness.results import Schema

SCHEMA = Schema(
    topic="gnn_training",
    config={
        "device": str,  # where the model trains: "cuda" or "cpu"
        "model": str,  # "sage" or "gat"
        "layers": int,
        "fanouts": str,  # e.g. "10-25", hop 1 first
        "batch_size": int,
        "hidden": int,
        "nodes": int,
        "edges": int,
        "feature_dim": int,
        "cpu_budget": int,  # cores the pipeline's processes ran on (training threads and workers)
        "sampler_workers": int,  # CPU sampling (or loader) processes (0: in the training process)
        "threads_per_worker": int,  # torch threads of each of those processes (empty without any)
        "train_threads": int,  # torch threads of the training process (the cores workers leave)
        "phase": str,  # for phase_time: "sample", "gather" (with transfer), "train"
        "gpu_memory_budget": float,  # GiB, for fits_gpu_budget
    },
    metrics={
        "cache_hit_rate": "ratio",
        "cache_bytes": "B",
        "cache_fill_time": "s",
        "gpu_resident_bytes": "B",
        "fits_gpu_budget": "bool",
    },
)
