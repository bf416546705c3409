"""Where one minibatch's time goes in a GNN pipeline: each step of preparing a batch, timed with
a device synchronisation around it (so steps do not overlap), as medians over batches.

    python tools/profile_gnn_batch.py [--dataset products] [--scale-factor 1.0] [--batches 40]
        [--workers 0 8]

The steps are those the pipelines take (workloads/gnn/pipelines: cpu_gather.py, zero_copy.py):
the next sampled subgraph (in the training process, or the wait for a loader worker's), then
``cpu_gather``'s pinned staging, ``index_select`` and copy, or ``zero_copy``'s id check, id copy
and gather from the table pinned in place (along the path UnifiedTensor picked for it, and the
same on the ids sorted), then the edges and the seeds' labels to the GPU.

A diagnostic, not a benchmark: the synchronisations remove the overlap that real epochs have.
tools/gnn_step_profile.py profiles whole training steps as they run, overlap included. GPU only;
the graph is generated into the store (data/graphs/) on first use, after the checks.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from harness import machine
from harness.errors import UserError, exit_on_user_error
from workloads.gnn.pipelines import Graph, Pipeline, training_threads
from workloads.graphs import store
from workloads.graphs.generate import GeneratorParams
from workloads.graphs.spec import DATASETS, SHORT_NAMES

PIPELINES = ("cpu_gather", "zero_copy")


def timed(steps: dict, name: str, work):
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = work()
    torch.cuda.synchronize()
    steps.setdefault(name, []).append(time.perf_counter() - start)
    return result


def profile(pipeline, batches: int) -> dict:
    """Median milliseconds of each step over the first ``batches`` batches of epoch 0."""
    features = pipeline.graph.features
    steps: dict = {}
    items = pipeline._items(0, None)  # the sampling step's hand-over: one SampledSubgraph per batch
    try:
        for _ in range(min(batches, len(pipeline.seeds(0)))):
            sub = timed(steps, "next subgraph", lambda: next(items))
            if pipeline.name == "cpu_gather":
                staging = timed(
                    steps,
                    "pinned staging alloc",
                    lambda: torch.empty((sub.n_id.numel(), features.shape[1]), dtype=features.dtype, pin_memory=True),
                )
                timed(steps, "cpu index_select", lambda: torch.index_select(features, 0, sub.n_id, out=staging))
                timed(steps, "copy to gpu", lambda: staging.to("cuda", non_blocking=True))
            elif pipeline.name == "zero_copy":
                timed(steps, "id range check", lambda: (int(sub.n_id.min()), int(sub.n_id.max())))
                pinned = timed(steps, "pin ids", lambda: sub.n_id.pin_memory())
                n_id = timed(steps, "ids to gpu", lambda: pinned.to("cuda", non_blocking=True))
                x = torch.empty((n_id.numel(), features.shape[1]), dtype=features.dtype, device="cuda")
                path = pipeline.table.path
                timed(steps, f"gather ({path})", lambda: pipeline.table.launch_into(n_id, x, max_threads=0))
                n_sorted = n_id.sort().values
                timed(
                    steps,
                    f"gather ({path}), sorted ids",
                    lambda: pipeline.table.launch_into(n_sorted, x, max_threads=0),
                )
            timed(steps, "edge_index to gpu", lambda: pipeline._to_device(sub.edge_index))
            timed(steps, "labels to gpu", lambda: pipeline._to_device(pipeline.labels[sub.n_id[: sub.batch_size]]))
    finally:
        items.close()  # stops the loader workers where the epoch was left unfinished
    return {name: statistics.median(values) * 1e3 for name, values in steps.items()}


@exit_on_user_error
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="products", choices=sorted(SHORT_NAMES))
    parser.add_argument("--scale-factor", type=float, default=1.0, help="share of the dataset's nodes, in (0, 1]")
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 8], help="sampling workers, one run each")
    args = parser.parse_args()
    if not 0 < args.scale_factor <= 1:
        raise UserError(f"--scale-factor must be in (0, 1], got {args.scale_factor}")
    if args.batches < 1 or min(args.workers) < 0:
        raise UserError("--batches must be at least 1 and --workers at least 0")
    # Before the graph is generated (minutes, gigabytes at full scale): nothing here runs without a GPU.
    machine.require_gpu(
        "tools/profile_gnn_batch.py", "it times batches fed to one", cupy_for="for zero_copy's table's device address"
    )
    spec = DATASETS[SHORT_NAMES[args.dataset]].scaled(args.scale_factor)
    graph = Graph(store.get(GeneratorParams(spec)), "cuda")
    try:
        for workers in args.workers:
            torch.set_num_threads(training_threads(workers))
            for name in PIPELINES:
                pipeline = Pipeline(name, graph, [10, 25], 1024, seed=0, sampler_workers=workers)
                try:
                    for step, ms in profile(pipeline, args.batches).items():
                        print(
                            f"{name:10s} workers={workers:2d} threads={torch.get_num_threads():2d}  "
                            f"{step:34s} {ms:8.2f} ms",
                            flush=True,
                        )
                finally:
                    pipeline.close()
    finally:
        graph.close()


if __name__ == "__main__":
    main()
