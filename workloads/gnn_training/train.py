"""One part of the gnn_training topic: every model and pipeline trained on one dataset.

Readable in one sitting: build the graph, then for each (model, pipeline) train a few epochs
from the same initial weights on the same batches, timing each epoch (one wait per epoch, so
the pipeline overlaps as it would in real training; the loop is workloads/gnn/epoch.py), then
one more epoch with a wait at every phase boundary for the breakdown, then the validation
accuracy.
"""

from __future__ import annotations

import time

import torch

from harness.progress import progress, report
from harness.timing import PhaseClock
from workloads.gnn.epoch import accuracy, timed_epochs, train_epoch
from workloads.gnn.models import build
from workloads.gnn.pipelines import GPU_PIPELINES, PIPELINES, ROLE, Graph, Pipeline, training_threads, workers_of
from workloads.graphs.datasets import load_graph
from workloads.graphs.spec import SHORT_NAMES


def run_dataset(part: str, params: dict, writer, *, shared: dict, repeat: int, warmup: int, device: str, **_) -> dict:
    started = time.perf_counter()
    spec, dataset, arrays = load_graph(SHORT_NAMES[part], params, shared["graph_seed"])
    graph = Graph(arrays, device)
    report(
        f"{dataset}: {spec.nodes:,} nodes, {spec.edges:,} edges, {spec.feature_dim} features; "
        f"ready in {time.perf_counter() - started:.1f} s"
    )
    threads = training_threads(shared["sampler_workers"])
    torch.set_num_threads(threads)
    pipelines = [p for p in PIPELINES if device == "cuda" or p not in GPU_PIPELINES]
    skipped = {} if device == "cuda" else {p: "no GPU on this machine" for p in GPU_PIPELINES}
    cases = [(m, p) for m in params.get("models", shared["models"]) for p in pipelines]
    try:
        for model_spec, name in progress(cases, desc=f"{dataset} training", total=len(cases)):
            fanouts = model_spec["fanouts"]
            config = {
                "device": device,
                "model": model_spec["name"],
                "layers": model_spec["layers"],
                "fanouts": "-".join(map(str, fanouts)),
                "batch_size": shared["batch_size"],
                "hidden": shared["hidden"],
                "nodes": spec.nodes,
                "edges": spec.edges,
                "feature_dim": spec.feature_dim,
                "sampler_workers": workers_of(name, shared["sampler_workers"]),
                "train_threads": threads,
            }

            def add(metric, value, unit, repetition=0, **extra):
                writer.add(
                    role=ROLE[name],
                    variant=name,
                    config=config | extra,
                    metric=metric,
                    value=value,
                    unit=unit,
                    repetition=repetition,
                    dataset=dataset,
                )

            torch.manual_seed(0)  # the same initial weights for every pipeline
            model = build(
                model_spec["name"], spec.feature_dim, shared["hidden"], spec.classes, model_spec["layers"], fanouts
            ).to(device)
            pipeline = Pipeline(
                name,
                graph,
                fanouts,
                shared["batch_size"],
                seed=shared["graph_seed"],
                sampler_workers=shared["sampler_workers"],
            )
            try:
                summary = measure_pipeline(
                    model,
                    pipeline,
                    add,
                    learning_rate=shared["learning_rate"],
                    loss_steps=shared["loss_steps"],
                    repeat=repeat,
                    warmup=warmup,
                    device=device,
                )
            finally:
                pipeline.close()  # its sampling workers, also when training fails
            report(f"{dataset} {model_spec['name']}{model_spec['layers']} {name}: {summary}")
    finally:
        graph.close()
    return {
        "skipped_pipelines": skipped,
        "graph": spec.as_dict(),
        "graph_source": params.get("published_dir") or "generated",
        "graph_seed": shared["graph_seed"],
    }


def measure_pipeline(
    model, pipeline: Pipeline, add, *, learning_rate: float, loss_steps: int, repeat: int, warmup: int, device: str
) -> str:
    """Train ``model`` fed by ``pipeline`` for warm-up + timed epochs, then one instrumented epoch
    for the phase breakdown, and record through ``add``: the first epoch's losses, each timed
    epoch's time, CPU time and feature bytes, the phases and the validation accuracy. Returns a
    one-line summary."""
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    epoch_seconds = []
    for epoch in timed_epochs(model, optimizer, pipeline, warmup=warmup, repeat=repeat, device=device):
        if epoch.index == 0:
            for step, loss in enumerate(epoch.losses[:loss_steps]):
                add("loss", loss, "nats", repetition=step)
        if epoch.repetition is not None:
            rep = epoch.repetition
            epoch_seconds.append(epoch.seconds)
            add("epoch_time", epoch.seconds, "s", repetition=rep)
            add("cpu_time", epoch.cpu_seconds(), "core-s", repetition=rep)
            if device == "cuda":
                add(
                    "pcie_bytes",
                    float(0 if pipeline.name == "all_in_gpu" else epoch.feature_bytes),
                    "B",
                    repetition=rep,
                )
    clock = PhaseClock(device)
    train_epoch(model, optimizer, pipeline, warmup + repeat, clock)
    for phase, seconds in clock.totals.items():
        add("phase_time", seconds, "s", phase=phase)
    correct = accuracy(model, pipeline)
    add("accuracy", correct, "ratio")
    return (
        "epochs "
        + " ".join(f"{s:.3f}" for s in epoch_seconds)
        + " s; phases "
        + " ".join(f"{k} {v:.3f}" for k, v in clock.totals.items())
        + f" s; accuracy {correct:.3f}"
    )
