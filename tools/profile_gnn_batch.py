"""Where one minibatch's time goes in a GNN pipeline: each step of preparing a batch, timed with
a device synchronisation around it (so steps do not overlap), as medians over batches.

    python tools/profile_gnn_batch.py [--dataset products] [--scale-factor 1.0] [--batches 40]

A diagnostic, not a benchmark: the synchronisations remove the overlap that real epochs have.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from systems.pytorch_direct.ops import launch_gather
from workloads.gnn.pipelines import Graph, Pipeline, training_threads
from workloads.graphs import store
from workloads.graphs.generate import GeneratorParams
from workloads.graphs.spec import DATASETS, SHORT_NAMES


def timed(steps: dict, name: str, work):
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = work()
    torch.cuda.synchronize()
    steps.setdefault(name, []).append(time.perf_counter() - start)
    return result


def profile(pipeline: Pipeline, batches: int) -> dict:
    features = pipeline.graph.features
    steps: dict = {}
    subgraphs = pipeline._subgraphs(0, None)
    for _ in range(batches):
        sub = timed(steps, "next subgraph", lambda: next(subgraphs))
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
            timed(steps, "zero-copy gather kernel", lambda: launch_gather(features, n_id, x, check=False))
            n_sorted = n_id.sort().values
            timed(steps, "same kernel, sorted ids", lambda: launch_gather(features, n_sorted, x, check=False))
        timed(steps, "edge_index to gpu", lambda: sub.edge_index.to("cuda", non_blocking=True))
    return {name: statistics.median(values) * 1e3 for name, values in steps.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="products", choices=sorted(SHORT_NAMES))
    parser.add_argument("--scale-factor", type=float, default=1.0)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 8])
    args = parser.parse_args()
    spec = DATASETS[SHORT_NAMES[args.dataset]].scaled(args.scale_factor)
    graph = Graph(store.get(GeneratorParams(spec)), "cuda")
    for workers in args.workers:
        torch.set_num_threads(training_threads(workers))
        for name in ("cpu_gather", "zero_copy"):
            pipeline = Pipeline(name, graph, [10, 25], 1024, seed=0, sampler_workers=workers)
            for step, ms in profile(pipeline, args.batches).items():
                print(
                    f"{name:10s} workers={workers:2d} threads={torch.get_num_threads():2d}  {step:26s} {ms:8.2f} ms",
                    flush=True,
                )
            pipeline.close()
    graph.close()


if __name__ == "__main__":
    main()
