"""The training loop, and one part of the workload: every model and pipeline on one dataset.

Readable in one sitting: build the graph, then for each (model, pipeline) train a few epochs
from the same initial weights on the same batches, timing each epoch (one wait per epoch, so
the pipeline overlaps as it would in real training), then one more epoch with a wait at every
phase boundary for the breakdown, then the validation accuracy.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.nn import functional as F

from harness import resources
from harness.progress import progress, report
from harness.timing import PhaseClock, wall_clock
from workloads.gnn_training import DATASET_OF
from workloads.gnn_training.models import build
from workloads.gnn_training.pipelines import GPU_PIPELINES, PIPELINES, Graph, Pipeline, training_threads, workers_of
from workloads.graphs import store
from workloads.graphs.generate import GeneratorParams
from workloads.graphs.published import import_published
from workloads.graphs.spec import DATASETS, GraphSpec

SYSTEM = {"cpu_gather": "baseline", "zero_copy": "pytorch_direct", "zero_copy_overlap": "pytorch_direct",
          "uva_sampling": "uva", "all_in_gpu": "upper_bound"}


def train_epoch(model, optimizer, pipeline: Pipeline, epoch: int, clock: PhaseClock | None = None) -> tuple[list[float], int]:
    """One epoch; returns the losses (one wait, at the end) and the feature bytes gathered."""
    model.train()
    pipeline.clock = clock
    losses, gathered = [], 0
    batches = pipeline.batches(epoch)
    try:
        for batch in batches:
            with clock.phase("train") if clock is not None else nullcontext():
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(batch.x, batch.edge_index)[: batch.batch_size], batch.y)
                loss.backward()
                optimizer.step()
            losses.append(loss.detach())
            gathered += batch.feature_bytes
    finally:
        batches.close()  # on an error too: stops a prefetch thread at once
        pipeline.clock = None
    return [float(loss) for loss in losses], gathered


@torch.no_grad()
def accuracy(model, pipeline: Pipeline) -> float:
    model.eval()
    correct = total = 0
    for batch in pipeline.batches(epoch=0, seeds=pipeline.graph.val_idx):
        predicted = model(batch.x, batch.edge_index)[: batch.batch_size].argmax(1)
        correct += int((predicted == batch.y).sum())
        total += batch.batch_size
    return correct / max(total, 1)


def load_graph(part: str, params: dict, graph_seed: int) -> tuple[GraphSpec, str, dict]:
    """The dataset's spec, its label in the results, and its arrays: generated with the dataset's
    statistics at ``scale_factor``, or the real dataset imported from ``published_dir``."""
    spec, label, folder = cached_graph(part, params, graph_seed)
    return spec, label, store.load(folder)


def cached_graph(part: str, params: dict, graph_seed: int) -> tuple[GraphSpec, str, Path]:
    """As :func:`load_graph`, with the graph's folder in the store (generated or imported first)."""
    name = DATASET_OF[part]
    if params.get("published_dir"):
        folder = import_published(name, Path(params["published_dir"]).expanduser())
        arrays = store.load(folder)
        nodes = arrays["labels"].shape[0]
        spec = GraphSpec(name, nodes, arrays["indices"].shape[0], arrays["features"].shape[1],
                         int(arrays["labels"].max()) + 1, arrays["train_idx"].shape[0] / nodes,
                         arrays["val_idx"].shape[0] / nodes)
        return spec, name, folder
    spec = DATASETS[name].scaled(params["scale_factor"])
    generator = GeneratorParams(spec, seed=graph_seed)
    store.get(generator)
    return spec, f"{name}-like", store.folder_for(generator)


def run_dataset(part: str, params: dict, writer, *, shared: dict, repeat: int, warmup: int, device: str, **_) -> dict:
    started = time.perf_counter()
    spec, dataset, arrays = load_graph(part, params, shared["graph_seed"])
    graph = Graph(arrays, device)
    report(f"{dataset}: {spec.nodes:,} nodes, {spec.edges:,} edges, {spec.feature_dim} features; "
           f"ready in {time.perf_counter() - started:.1f} s")
    threads = training_threads(shared["sampler_workers"])
    torch.set_num_threads(threads)
    pipelines = [p for p in PIPELINES if device == "cuda" or p not in GPU_PIPELINES]
    skipped = {} if device == "cuda" else {p: "no GPU on this machine" for p in GPU_PIPELINES}
    cases = [(m, p) for m in params.get("models", shared["models"]) for p in pipelines]
    try:
        for model_spec, name in progress(cases, desc=f"{dataset} training", total=len(cases)):
            fanouts = model_spec["fanouts"]
            config = {"device": device, "model": model_spec["name"], "layers": model_spec["layers"],
                      "fanouts": "-".join(map(str, fanouts)), "batch_size": shared["batch_size"],
                      "hidden": shared["hidden"], "nodes": spec.nodes, "edges": spec.edges,
                      "feature_dim": spec.feature_dim, "sampler_workers": workers_of(name, shared["sampler_workers"]),
                      "train_threads": threads}

            def add(metric, value, unit, repetition=0, **extra):
                writer.add(system=SYSTEM[name], variant=name, config=config | extra, metric=metric, value=value,
                           unit=unit, repetition=repetition, dataset=dataset)

            torch.manual_seed(0)  # the same initial weights for every pipeline
            model = build(model_spec["name"], spec.feature_dim, shared["hidden"], spec.classes,
                          model_spec["layers"], fanouts).to(device)
            pipeline = Pipeline(name, graph, fanouts, shared["batch_size"], seed=shared["graph_seed"],
                                sampler_workers=shared["sampler_workers"])
            try:
                summary = measure_pipeline(model, pipeline, add, learning_rate=shared["learning_rate"],
                                           loss_steps=shared["loss_steps"], repeat=repeat, warmup=warmup, device=device)
            finally:
                pipeline.close()  # its sampling workers, also when training fails
            report(f"{dataset} {model_spec['name']}{model_spec['layers']} {name}: {summary}")
    finally:
        graph.close()
    return {"skipped_pipelines": skipped, "graph": spec.as_dict(), "graph_source": params.get("published_dir") or "generated",
            "graph_seed": shared["graph_seed"]}


def measure_pipeline(model, pipeline: Pipeline, add, *, learning_rate: float, loss_steps: int, repeat: int,
                     warmup: int, device: str) -> str:
    """Train ``model`` fed by ``pipeline`` for warm-up + timed epochs, then one instrumented epoch
    for the phase breakdown, and record through ``add``: the first epoch's losses, each timed
    epoch's time, CPU time and feature bytes, the phases and the validation accuracy. Returns a
    one-line summary."""
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    epoch_seconds = []
    for epoch in range(warmup + repeat):
        # Sampling workers are child processes (persistent, still running): count them too.
        cpu_before = resources.cpu_core_seconds(include_children=True)
        result = {}
        seconds = wall_clock(lambda: result.update(out=train_epoch(model, optimizer, pipeline, epoch)), device)
        losses, gathered = result["out"]
        if epoch == 0:
            for step, loss in enumerate(losses[:loss_steps]):
                add("loss", loss, "nats", repetition=step)
        if epoch >= warmup:
            rep = epoch - warmup
            epoch_seconds.append(seconds)
            add("epoch_time", seconds, "s", repetition=rep)
            add("cpu_time", resources.cpu_core_seconds(include_children=True) - cpu_before, "core-s", repetition=rep)
            if device == "cuda":
                add("pcie_bytes", float(0 if pipeline.name == "all_in_gpu" else gathered), "B", repetition=rep)
    clock = PhaseClock(device)
    train_epoch(model, optimizer, pipeline, warmup + repeat, clock)
    for phase, seconds in clock.totals.items():
        add("phase_time", seconds, "s", phase=phase)
    correct = accuracy(model, pipeline)
    add("accuracy", correct, "ratio")
    return ("epochs " + " ".join(f"{s:.3f}" for s in epoch_seconds) + " s; phases "
            + " ".join(f"{k} {v:.3f}" for k, v in clock.totals.items()) + f" s; accuracy {correct:.3f}")
