"""One part of the gnn_training topic: every model and pipeline trained on one dataset, at each
CPU budget.

Readable in one sitting: build the graph, then for each (CPU budget, model, pipeline) train a few
epochs from the same initial weights on the same batches, timing each epoch (one wait per epoch,
so the pipeline overlaps as it would in real training; the loop is workloads/gnn/epoch.py), then
one more epoch with a wait at every phase boundary for the breakdown, then the validation
accuracy. A budget is the cores the pipeline's processes run on (workloads/gnn/worker_split.py):
sampling workers take at most half of it, ``cpu_gather_workers`` the split of loader workers and
threads that trained fastest on this machine (what it measured goes to the notes). With GPU memory
budgets (``gpu_memory_budget_gib``), a pipeline whose resident data exceed every budget is not run,
and one that runs is capped at the largest and recorded as fitting each budget or not
(workloads/gnn/gpu_memory.py); the notes say why each does not fit.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch

from harness.errors import UserError, WrongResult
from harness.progress import progress, report
from harness.timing import PhaseClock
from systems.pytorch_direct.dispatch import choose_for
from workloads.gnn.epoch import accuracy, timed_epochs, train_epoch
from workloads.gnn.gpu_memory import GraphSizes, allocator_cap, budgets_missed, parse_budgets, resident_bytes
from workloads.gnn.models import build
from workloads.gnn.models import check as check_model
from workloads.gnn.pipelines import (
    GPU_PIPELINES,
    PIPELINE_KINDS,
    PIPELINES,
    ROLE,
    UNAVAILABLE_PIPELINES,
    GatheredBatch,
    Graph,
    Pipeline,
    batch_number,
    workers_of,
)
from workloads.gnn.worker_split import (
    budget_cores,
    candidate_splits,
    cpu_budget,
    pick_split,
    training_threads_left,
)
from workloads.gnn_training import BUDGET_SWEEPS
from workloads.graphs.datasets import load_graph
from workloads.graphs.spec import SHORT_NAMES

# The dataset each part trains on: one per short name, papers100M-like at full size in host memory
# (its feature table generated where zero-copy reads it, never on disk), and the budget sweeps'.
_DATASET_PARTS = SHORT_NAMES | {"papers_full": SHORT_NAMES["papers"]}
DATASET_OF_PART = _DATASET_PARTS | {part: _DATASET_PARTS[graph] for part, (graph, _) in BUDGET_SWEEPS.items()}


def run_dataset(part: str, params: dict, writer, *, shared: dict, repeat: int, warmup: int, device: str, **_) -> dict:
    started = time.perf_counter()
    if "scale_factor" not in params and not params.get("published_dir"):
        raise UserError(f"part {part} has no block at this scale in config/gnn_training.yaml (its scale_factor)")
    known = set(PIPELINES) | set(UNAVAILABLE_PIPELINES)
    unknown = sorted(set(params.get("pipelines") or ()) - known)
    if unknown:  # refused before the graph is made (minutes at full size)
        raise UserError(f"part {part}: unknown pipelines {unknown}; the registry has {', '.join(PIPELINES)}")
    unknown = sorted(set(shared.get("pipeline_datasets", {})) - known)
    if unknown:
        raise UserError(f"pipeline_datasets names unknown pipelines {unknown}; the registry has {', '.join(PIPELINES)}")
    for model_spec in params.get("models", shared["models"]):  # also before the graph is made
        try:
            check_model(model_spec["name"], model_spec["layers"], model_spec["fanouts"])
        except (KeyError, TypeError, ValueError) as error:
            why = f"a model needs {error}" if isinstance(error, KeyError) else str(error)
            raise UserError(f"part {part}: {why} (model {model_spec})") from None
    spec, dataset, arrays = load_graph(DATASET_OF_PART[part], params, shared["graph_seed"])
    in_memory = bool(params.get("features_in_memory"))
    # A table generated in shared memory is used where it lies (pinned there by zero-copy).
    graph = Graph(arrays, device, features=torch.from_numpy(arrays["features"]) if in_memory else None)
    if not graph.val_idx.numel():  # the accuracy after training needs some: said before any epoch trains
        raise UserError(
            f"part {part}: the {dataset} graph ({spec.nodes:,} nodes) has no validation nodes: raise its scale_factor"
        )
    report(
        f"{dataset}: {spec.nodes:,} nodes, {spec.edges:,} edges, {spec.feature_dim} features; "
        f"ready in {time.perf_counter() - started:.1f} s"
    )
    pipelines = [p for p in PIPELINES if device == "cuda" or not PIPELINE_KINDS[p].needs_gpu]
    skipped = {} if device == "cuda" else {p: "no GPU on this machine" for p in GPU_PIPELINES}
    skipped |= UNAVAILABLE_PIPELINES  # a package they need is not installed here: why, in a line
    if params.get("pipelines"):  # this graph's own list (a large graph measures a few, in time)
        for name in [p for p in pipelines if p not in params["pipelines"]]:
            pipelines.remove(name)
            skipped[name] = f"not in the {part} part's pipelines at this scale"
    for name, parts in shared.get("pipeline_datasets", {}).items():
        if name in pipelines and part not in parts:  # kept to some datasets, for a scale's time budget
            pipelines.remove(name)
            skipped[name] = f"measured on {', '.join(parts)} only at this scale (pipeline_datasets)"
    # A budget sweep runs on its own cores; the dataset parts at each of the scale's budgets.
    budgets = [BUDGET_SWEEPS[part][1]] if part in BUDGET_SWEEPS else shared["cpu_budgets"]
    budgets = sorted({budget_cores(b) for b in budgets})
    memory_budgets = parse_budgets(shared.get("gpu_memory_budget_gib")) if device == "cuda" else []
    cap = memory_budgets[-1] if memory_budgets else None
    sizes = GraphSizes.of(graph)
    does_not_fit: dict[str, dict[str, str]] = {}  # "24 GiB" -> "all_in_gpu, sage2" -> why

    def not_fitting(budget: float, case: str, why: str) -> None:
        does_not_fit.setdefault(f"{budget:g} GiB", {})[case] = why

    cases = [(c, m, p) for c in budgets for m in params.get("models", shared["models"]) for p in pipelines]
    splits: dict[str, dict] = {}
    try:
        for cores, model_spec, name in progress(cases, desc=f"{dataset} training", total=len(cases)):
            model_name = f"{model_spec['name']}{model_spec['layers']}"
            case = f"{name}, {model_name}"
            held = resident_bytes(name, sizes, pipeline_options(name, shared, spec.nodes, warmup + repeat + 1))
            missed = budgets_missed(held, memory_budgets)
            for budget, why in missed.items():
                not_fitting(budget, case, why)
            if memory_budgets and len(missed) == len(memory_budgets):  # never run over every budget
                skipped[name] = f"does not fit any GPU memory budget: {missed[cap]}"
                report(f"{dataset} {model_name} {name}: not run, {skipped[name]}")
                continue
            try:
                with cpu_budget(cores), allocator_cap(cap, device):
                    summary, split, misfits = train_case(
                        graph, spec, dataset, model_spec, name, cores, writer, shared, repeat, warmup, device,
                        held=held, memory_budgets=memory_budgets,
                    )  # fmt: skip
            except torch.OutOfMemoryError as error:  # over the cap: recorded, and the next case runs
                under = f" under the {cap:g} GiB cap" if cap is not None else ""
                why = f"out of GPU memory{under}: {str(error).splitlines()[0]}"
                for budget in memory_budgets:
                    not_fitting(budget, case, why)
                report(f"{dataset} {model_name} {name}: {why}")
                continue
            for budget, why in misfits.items():
                not_fitting(budget, case, why)
            if split is not None:
                splits[f"{model_name} at {cores} cores"] = split
            report(f"{dataset} {model_name} {name} ({cores} cores): {summary}")
    finally:
        graph.close()
    notes = {"gpu_memory_budget_gib": memory_budgets, "does_not_fit": does_not_fit} if memory_budgets else {}
    if device == "cuda" and torch.cuda.is_available():  # the path zero-copy reads the table along, and why
        choice = choose_for(graph.features)
        notes["zero_copy_gather_path"] = {"path": choice.path, "why": choice.reason}
    return {
        "skipped_pipelines": skipped,
        "cpu_budgets": budgets,
        "loader_worker_splits": splits,
        "graph": spec.as_dict(),
        "graph_source": params.get("published_dir") or ("generated in memory" if in_memory else "generated"),
        "graph_seed": shared["graph_seed"],
    } | notes


def train_case(
    graph, spec, dataset, model_spec, name, cores, writer, shared, repeat, warmup, device, held=None, memory_budgets=()
):
    """Train one model fed by one pipeline within ``cores`` and record it; returns the summary
    line, for the loader pipeline the split it picked and what each candidate measured, and the
    GPU memory budgets it did not fit ({budget: why}, from its resident data ``held`` and its
    peak). Its rows are written only once it has trained to the end."""
    fanouts = model_spec["fanouts"]

    def make_model():
        torch.manual_seed(0)  # the same initial weights for every pipeline
        return build(
            model_spec["name"], spec.feature_dim, shared["hidden"], spec.classes, model_spec["layers"], fanouts
        ).to(device)

    def make_pipeline(workers: int, threads_per_worker: int = 1) -> Pipeline:
        return Pipeline(
            name,
            graph,
            fanouts,
            shared["batch_size"],
            seed=shared["graph_seed"],
            sampler_workers=workers,
            worker_threads=threads_per_worker,
            options=pipeline_options(name, shared, spec.nodes, warmup + repeat + 1),
        )

    model, split = make_model(), None
    swept_threads = PIPELINE_KINDS[name].swept_worker_threads
    if swept_threads is not None:
        loader = shared["loader_workers"]
        threads = list(swept_threads) or loader["threads_per_worker"]
        candidates = candidate_splits(cores, loader["workers"], threads)
        (workers, threads_per_worker), timings = pick_split(
            make_pipeline, model, cores, candidates, shared["learning_rate"]
        )
        split = {"workers": workers, "threads_per_worker": threads_per_worker, "seconds_per_step": timings}
    else:
        workers, threads_per_worker = workers_of(name, shared["sampler_workers"], cores), 1
    train_threads = training_threads_left(cores, workers, threads_per_worker)
    torch.set_num_threads(train_threads)
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
        "cpu_budget": cores,
        "sampler_workers": workers,
        "threads_per_worker": threads_per_worker if workers else None,
        "train_threads": train_threads,
    }

    rows = []

    def add(metric, value, unit, repetition=0, **extra):
        rows.append(
            dict(
                role=ROLE[name],
                variant=name,
                config=config | extra,
                metric=metric,
                value=value,
                unit=unit,
                repetition=repetition,
                dataset=dataset,
            )
        )

    pipeline = make_pipeline(workers, threads_per_worker)
    try:
        check_rows(pipeline, "before")
        for metric, (value, unit) in pipeline.setup_metrics.items():
            add(metric, value, unit)
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
        check_rows(pipeline, "after")  # one right at first and wrong later (a buffer reused too soon)
    finally:
        pipeline.close()  # its sampling workers, also when training fails
    misfits = record_gpu_memory(add, held or {}, memory_budgets) if device == "cuda" else {}
    for row in rows:
        writer.add(**row)
    return summary, split, misfits


CHECKED_BATCHES = 2  # batches whose rows are checked before and after a pipeline is timed


def check_rows(pipeline: Pipeline, when: str) -> None:
    """Refuse, in one line, a pipeline whose feature rows differ from the table's rows of the
    batch's nodes, byte for byte, as feature_gather checks a gather variant: a wrong pipeline is
    never timed. Its own gather runs on batches sampled here from the first training nodes (the
    sampler and the loader's finishing step, as its workers would; a cache it fills is read)."""
    # On a thread of its own, which ends with the check: the sampler keeps an id map of every node
    # for each thread that samples (in GPU memory where it samples on the GPU). One left on this
    # thread would stay through the timed epochs of a pipeline that samples on its prefetch thread,
    # in their GPU memory peak, and a forked loader worker would inherit it.
    device = torch.cuda.current_device() if pipeline.device.type == "cuda" else None
    with ThreadPoolExecutor(1, thread_name_prefix=f"{pipeline.name}-row-check") as thread:
        thread.submit(_check_batches, pipeline, when, device).result()
    pipeline.epoch_metrics()  # what the check's batches counted (a cache's hits) belongs to no epoch


def _check_batches(pipeline: Pipeline, when: str, device: int | None) -> None:
    if device is not None:
        torch.cuda.set_device(device)
    graph, size = pipeline.graph, pipeline.batch_size
    for index, seeds in enumerate(graph.train_idx[: CHECKED_BATCHES * size].split(size)):
        item = pipeline.training_batches.finish(pipeline.sampler.sample(seeds, batch_number(0, index)))
        x, _ = pipeline.gathered(item)
        if device is not None:
            torch.cuda.synchronize()  # a gather may run on the pipeline's side stream
        n_id = (item.subgraph if isinstance(item, GatheredBatch) else item).n_id.cpu()
        expected = graph.features[n_id]
        # The type too: torch.equal holds float16 rows equal to float32 ones of the same values.
        same = isinstance(x, torch.Tensor) and (x.shape, x.dtype) == (expected.shape, expected.dtype)
        if not (same and torch.equal(x.cpu(), expected)):
            raise WrongResult(
                f"gnn_training: pipeline '{pipeline.name}' gave feature rows that differ from the table's rows of "
                f"the batch's nodes ({when} timing); nothing of it is measured"
            )


def record_gpu_memory(add, held: dict[str, int], memory_budgets) -> dict[float, str]:
    """Record the resident data, the peak torch allocated since the case began, and whether the
    case fits each budget; returns the budgets it does not fit, with why."""
    peak = torch.cuda.max_memory_allocated()
    add("gpu_resident_bytes", float(sum(held.values())), "B")
    add("peak_gpu_memory", float(peak), "B")
    missed = budgets_missed(held, list(memory_budgets), peak)
    for budget in memory_budgets:
        add("fits_gpu_budget", float(budget not in missed), "bool", gpu_memory_budget=float(budget))
    return missed


def pipeline_options(name: str, shared: dict, nodes: int, epochs: int) -> dict:
    """The options a pipeline kind takes, from the topic's parameters."""
    cache = shared["hot_cache"]
    rows = max(1, round(cache["share"] * nodes))
    return {
        "hot_cache": {"rows": rows, "warmup_batches": cache["warmup_batches"]},
        "hot_cache_oracle": {"rows": rows, "epochs": epochs},
    }.get(name, {})


def measure_pipeline(
    model, pipeline: Pipeline, add, *, learning_rate: float, loss_steps: int, repeat: int, warmup: int, device: str
) -> str:
    """Train ``model`` fed by ``pipeline`` for warm-up + timed epochs, then one instrumented epoch
    for the phase breakdown, and record through ``add``: the first epoch's losses, each timed
    epoch's time, CPU time, feature bytes and the pipeline's own metrics, the phases and the
    validation accuracy. Returns a one-line summary."""
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    epoch_seconds = []
    for epoch in timed_epochs(model, optimizer, pipeline, warmup=warmup, repeat=repeat, device=device):
        own = pipeline.epoch_metrics()  # read after every epoch: each counts one epoch
        if epoch.index == 0:
            for step, loss in enumerate(epoch.losses[:loss_steps]):
                add("loss", loss, "nats", repetition=step)
        if epoch.repetition is not None:
            rep = epoch.repetition
            epoch_seconds.append(epoch.seconds)
            add("epoch_time", epoch.seconds, "s", repetition=rep)
            add("cpu_time", epoch.cpu_seconds(), "core-s", repetition=rep)
            if device == "cuda":
                moved = epoch.feature_bytes if pipeline.kind.crosses_pcie else 0
                add("pcie_bytes", float(moved), "B", repetition=rep)
            for metric, (value, unit) in own.items():
                add(metric, value, unit, repetition=rep)
    clock = PhaseClock(device)
    train_epoch(model, optimizer, pipeline, warmup + repeat, clock)
    pipeline.epoch_metrics()
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
