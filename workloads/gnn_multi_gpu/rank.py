"""One rank of a data-parallel GNN training run; started by torchrun from launch.py.

    python -m torch.distributed.run --standalone --nproc-per-node N -m workloads.gnn_multi_gpu.rank JOB.json

The job file (written by the launcher) names the cached graph, the shared feature table, what to
train and each rank's cores. A rank first pins itself to its cores (workloads/gnn_multi_gpu/
budgets.py), so its threads and loader workers stay on them. Every rank trains each (model,
pipeline) on its slice of every global batch, with DistributedDataParallel averaging the
gradients; rank 0 writes the results rows, and what each rank ran on, to the job's ``out`` file.

Within its cores a rank trains as one process of gnn_training does within a CPU budget: sampling
workers take at most half of them and ``cpu_gather_workers`` the split of loader workers and
threads that trained fastest (workloads/gnn/worker_split.py), here the split fastest on the
slowest rank, so that every rank runs the same one. Whatever ends a rank (an error, torchrun's
SIGTERM after another rank failed), its loader workers are stopped before it exits.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from harness.progress import report
from workloads.gnn.epoch import accuracy, timed_epochs
from workloads.gnn.models import build
from workloads.gnn.pipelines import PIPELINE_KINDS, ROLE, Graph, Pipeline, workers_of
from workloads.gnn.worker_split import candidate_splits, pick_split, training_threads_left
from workloads.gnn_multi_gpu import NVLS_OFF
from workloads.gnn_multi_gpu.budgets import allowed_cores, pin_to
from workloads.graphs import store
from workloads.graphs.shared import map_table


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    # Before any thread or worker starts: they inherit the cores of the thread that starts them.
    cores = job["rank_cores"][local_rank]
    pinned = pin_to(cores)
    # When another rank fails, this one gets an error from its next collective or torchrun's
    # SIGTERM: both raise, so that the finally blocks stop its loader workers. (A rank stuck in a
    # collective gets torchrun's SIGKILL later, which its workers, in its process group, get too.)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    cuda = job["device"] == "cuda"
    if cuda:
        wrong = {k: os.environ.get(k) for k, v in NVLS_OFF.items() if os.environ.get(k) != v}
        if wrong:
            sys.exit(f"error: NVLink multicast must be off in every rank's environment: {wrong}")
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        out = train_all(job, rank, world, cores, pinned)
        if rank == 0:
            Path(job["out"]).write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def train_all(job: dict, rank: int, world: int, cores: list[int], pinned: bool) -> dict:
    """Every (model, pipeline) in turn; returns (on rank 0) the rows, each rank's budget per case
    and the loader worker splits measured."""
    torch.set_num_threads(len(cores))  # no workers run yet (each pipeline sets its own threads)
    graph = Graph(store.load(job["graph_folder"]), job["device"], features=map_table(job["table"]))
    out = {"rows": [], "rank_budgets": {}, "loader_worker_splits": {}}
    try:
        for model_spec in job["models"]:
            for name in job["pipelines"]:
                rows, budgets, split = train_one(job, graph, model_spec, name, rank, world, cores, pinned)
                case = f"{name}, {model_spec['name']}{model_spec['layers']}"
                out["rows"] += rows
                out["rank_budgets"][case] = budgets
                if split is not None:
                    out["loader_worker_splits"][case] = split
    finally:
        graph.close()
    return out


def train_one(
    job: dict, graph: Graph, model_spec: dict, name: str, rank: int, world: int, cores: list[int], pinned: bool
) -> tuple[list[dict], list[dict], dict | None]:
    """Train one model fed by one pipeline on every rank; returns rank 0's rows, every rank's
    budget (cores, workers, threads) and, for the loader pipeline, the split picked."""
    budget = len(cores)
    torch.manual_seed(0)  # the same initial weights on every rank and for every pipeline
    model = build(
        model_spec["name"],
        job["feature_dim"],
        job["hidden"],
        job["classes"],
        model_spec["layers"],
        model_spec["fanouts"],
        dropout=job.get("dropout", 0.5),
    ).to(graph.device)

    def make_pipeline(workers: int, threads_per_worker: int = 1) -> Pipeline:
        return Pipeline(
            name,
            graph,
            model_spec["fanouts"],
            job["batch_size"],
            seed=job["graph_seed"],
            sampler_workers=workers,
            worker_threads=threads_per_worker,
            shard=(rank, world),
        )

    split = None
    if PIPELINE_KINDS[name].swept_worker_threads is not None:
        (workers, threads_per_worker), split = agreed_split(make_pipeline, model, budget, job, name, world)
    else:
        workers, threads_per_worker = workers_of(name, job["sampler_workers"], budget), 1
    threads = training_threads_left(budget, workers, threads_per_worker)
    torch.set_num_threads(threads)
    pipeline = make_pipeline(workers, threads_per_worker)
    try:
        rows = train_and_record(job, graph, model, pipeline, model_spec, name, rank, world, threads)
        mine = {
            "rank": rank,
            "cpu_budget": budget,
            "cores": allowed_cores(),  # read back: what the rank ran on
            "pinned": pinned,
            "sampler_workers": workers,
            "threads_per_worker": threads_per_worker if workers else None,
            "train_threads": threads,
            "worker_cores": worker_cores(pipeline),
        }
        budgets = [None] * world
        dist.all_gather_object(budgets, mine)
    finally:
        pipeline.close()  # its loader workers, also when training failed
    return rows, budgets, split


def worker_cores(pipeline: Pipeline) -> list[int] | None:
    """The cores the pipeline's running loader workers may use (all together), or None where it
    has none or affinity is unknown: inherited from the rank, never another rank's."""
    pids = pipeline.worker_pids()
    if not pids or not hasattr(os, "sched_getaffinity"):
        return None
    try:
        return sorted(set().union(*(os.sched_getaffinity(pid) for pid in pids)))
    except ProcessLookupError:  # a worker ended meanwhile (persistent workers do not, unless failing)
        return None


def agreed_split(make_pipeline, model, budget: int, job: dict, name: str, world: int) -> tuple[tuple[int, int], dict]:
    """The loader split (workers, threads per worker) every rank uses: of the candidates that fit
    the budget, the one whose slowest rank trained fastest, each rank timing its own at once."""
    threads = list(PIPELINE_KINDS[name].swept_worker_threads) or job["loader_workers"]["threads_per_worker"]
    candidates = candidate_splits(budget, job["loader_workers"]["workers"], threads)
    _, timings = pick_split(make_pipeline, model, budget, candidates, job["learning_rate"])
    every_rank = [None] * world
    dist.all_gather_object(every_rank, timings)
    slowest = {key: max(rank_timings[key] for rank_timings in every_rank) for key in timings}
    chosen = min(slowest, key=slowest.get) if slowest else f"{candidates[0][0]}x{candidates[0][1]}"
    workers, threads_per_worker = map(int, chosen.split("x"))
    split = {"workers": workers, "threads_per_worker": threads_per_worker}
    return (workers, threads_per_worker), split | {"seconds_per_step_of_slowest_rank": slowest}


def train_and_record(
    job: dict, graph: Graph, model, pipeline: Pipeline, model_spec: dict, name: str, rank: int, world: int, threads: int
) -> list[dict]:
    """Warm-up and timed epochs under DDP, then (on rank 0) the validation accuracy; returns the
    rows, reduced over the ranks (rank 0's are the ones written)."""
    cuda = job["device"] == "cuda"
    workers = pipeline.sampler_workers
    config = {
        "device": job["device"],
        "backend": "nccl" if cuda else "gloo",
        "world_size": world,
        "model": model_spec["name"],
        "layers": model_spec["layers"],
        "fanouts": "-".join(map(str, model_spec["fanouts"])),
        "batch_size": job["batch_size"],
        "hidden": job["hidden"],
        "nodes": job["nodes"],
        "edges": job["edges"],
        "feature_dim": job["feature_dim"],
        "sampler_workers": workers,
        "train_threads": threads,
    }
    rows = []

    def add(metric, value, unit, repetition=0, rank_label="all"):
        rows.append(
            dict(
                role=ROLE[name],
                variant=name,
                config=config | {"rank": rank_label},
                metric=metric,
                value=float(value),
                unit=unit,
                repetition=repetition,
                dataset=job["dataset"],
            )
        )

    ddp = DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if cuda else None)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=job["learning_rate"])

    def every_rank_done() -> None:
        # The epoch ends by reading its losses back, a wait for this rank's GPU already; the
        # synchronize keeps the time right should that change.
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()

    epoch_seconds = []
    # Timed barrier to barrier, so an epoch's time is the slowest rank's.
    for epoch in timed_epochs(
        ddp,
        optimizer,
        pipeline,
        warmup=job["warmup"],
        repeat=job["repeat"],
        device=job["device"],
        before=dist.barrier,
        after=every_rank_done,
    ):
        cpu = torch.tensor([epoch.cpu_seconds()], dtype=torch.float64, device=graph.device)
        dist.all_reduce(cpu)  # all ranks' CPU time, sampling workers included
        per_rank_bytes = [None] * world
        dist.all_gather_object(per_rank_bytes, epoch.feature_bytes)
        if epoch.index == 0:
            global_losses = torch.tensor(epoch.losses[: job["loss_steps"]], dtype=torch.float64, device=graph.device)
            dist.all_reduce(global_losses)
            for step, loss in enumerate((global_losses / world).tolist()):
                add("loss", loss, "nats", repetition=step)
        if epoch.repetition is not None:
            rep = epoch.repetition
            epoch_seconds.append(epoch.seconds)
            add("epoch_time", epoch.seconds, "s", repetition=rep)
            add("cpu_time", cpu.item(), "core-s", repetition=rep)
            if cuda and name != "all_in_gpu":
                for r, moved in enumerate(per_rank_bytes):
                    add("bandwidth", moved / epoch.seconds / 1e9, "GB/s", repetition=rep, rank_label=str(r))
    if rank == 0:
        correct = accuracy(model, pipeline)
        add("accuracy", correct, "ratio")
        if job.get("save_weights"):
            torch.save({k: v.cpu() for k, v in model.state_dict().items()}, job["save_weights"])
        report(
            f"{job['dataset']} {model_spec['name']}{model_spec['layers']} {name} x{world}: epochs "
            + " ".join(f"{s:.3f}" for s in epoch_seconds)
            + f" s; accuracy {correct:.3f}"
        )
    dist.barrier()
    return rows


if __name__ == "__main__":
    main(sys.argv[1])
