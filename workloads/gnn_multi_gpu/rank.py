"""One rank of a data-parallel GNN training run; started by torchrun from launch.py.

    python -m torch.distributed.run --standalone --nproc-per-node N -m workloads.gnn_multi_gpu.rank JOB.json

The job file (written by the launcher) names the cached graph, the shared feature table and what
to train. Every rank trains each (model, pipeline) on its slice of every global batch, with
DistributedDataParallel averaging the gradients; rank 0 writes the results rows to the job's
``out`` file.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from harness.progress import report
from workloads.gnn.epoch import accuracy, timed_epochs
from workloads.gnn.models import build
from workloads.gnn.pipelines import ROLE, Graph, Pipeline, training_threads, workers_of
from workloads.gnn_multi_gpu import NVLS_OFF
from workloads.graphs import store
from workloads.graphs.shared import map_table


def main(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    cuda = job["device"] == "cuda"
    if cuda:
        wrong = {k: os.environ.get(k) for k, v in NVLS_OFF.items() if os.environ.get(k) != v}
        if wrong:
            sys.exit(f"error: NVLink multicast must be off in every rank's environment: {wrong}")
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        rows = train_all(job, rank, world, local_world)
        if rank == 0:
            Path(job["out"]).write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


def train_all(job: dict, rank: int, world: int, local_world: int) -> list[dict]:
    threads = training_threads(job["sampler_workers"], processes=local_world)
    torch.set_num_threads(threads)
    graph = Graph(store.load(job["graph_folder"]), job["device"], features=map_table(job["table"]))
    rows = []
    for model_spec in job["models"]:
        for name in job["pipelines"]:
            rows += train_one(job, graph, model_spec, name, rank, world, threads)
    graph.close()
    return rows


def train_one(job: dict, graph: Graph, model_spec: dict, name: str, rank: int, world: int, threads: int) -> list[dict]:
    cuda = job["device"] == "cuda"
    workers = workers_of(name, job["sampler_workers"])
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
    ddp = DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if cuda else None)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=job["learning_rate"])
    pipeline = Pipeline(
        name,
        graph,
        model_spec["fanouts"],
        job["batch_size"],
        seed=job["graph_seed"],
        sampler_workers=workers,
        shard=(rank, world),
    )

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
    pipeline.close()
    return rows


if __name__ == "__main__":
    main(sys.argv[1])
