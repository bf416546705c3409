"""Where a GNN training step's time goes: the PyTorch profiler over a few steps of SAGE-2 and
GAT-2 (fan-outs 10, 25) fed by each pipeline and run in each model form (eager, torch.compile,
CUDA graphs: workloads/gnn/model_forms/), in steady state (the pipeline's own prefetching and
workers running as in an epoch), summarised per step and written as a CSV, one row per pipeline,
model and form (medians over the profiled steps):

  wall_ms          host time of the step: taking the batch, forward, backward, optimizer step
  batch_ms         of which taking the batch from the pipeline (waiting for it, if it is not ready)
  kernel_ms        GPU time of the kernels launched during the step (any thread, any stream)
  kernels          how many; launches counts the launch calls (kernels of other libraries that
                   the profiler sees only on the GPU side make the two differ, and a CUDA
                   graph's replay is one launch of many kernels)
  memcpy_ms        copies and fills launched during the step, and their count
  gpu_busy_ms      the union of that GPU work in time (streams running side by side count once)
  gpu_idle_ms      the step's GPU span (first start to last end) less gpu_busy_ms: where the
                   GPU waited for the host; largest_gap_ms is the longest such wait
  host_waits       calls that block the host on the GPU (synchronisations, blocking copies),
                   and host_wait_ms their time
  warmup_s         the warm-up steps before the profiled ones, in seconds: a form's compile or
                   captures happen there
  setups_in_profile  compiles or captures during the profiled steps (0 in steady state: a row
                   with more is no steady-state step)
  note             why a form gave no numbers (it could not compile or capture the model)

    python tools/gnn_step_profile.py [--scale h200] [--dataset products] [--steps 5]
        [--pipelines all_in_gpu uva_sampling zero_copy_overlap zero_copy cpu_gather]
        [--forms eager compiled cuda_graph] [--out CSV]

GPU only. Hidden size, batch size, learning rate and sampling workers come from the
gnn_training config at ``--scale``; the graph is the one that scale's part trains on (cached).
With ``--out`` a provenance record is written beside the CSV (``<name>.provenance.json``: where,
when and with what code it was measured, and the rows' digest), so that a committed profile
becomes the table of docs/gnn_training.md (``python -m analysis.doc_tables``).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UserError, exit_on_user_error

LAUNCHES = {
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cudaLaunchCooperativeKernel",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaGraphLaunch",  # a CUDA graph's replay: one launch call for all its kernels
    "cuGraphLaunch",
}
HOST_WAITS = {
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",  # the blocking copy (cudaMemcpyAsync is not)
    "cuStreamSynchronize",
    "cuCtxSynchronize",
    "cuEventSynchronize",
}
HOST_SIDE = {"cuda_runtime", "cuda_driver"}
KERNEL, COPIES = "kernel", {"gpu_memcpy", "gpu_memset"}
STEP_PREFIX = "gnn step "
BATCH_PREFIX = "gnn batch "  # inside a step: taking its batch from the pipeline
MODELS = ({"name": "sage", "layers": 2, "fanouts": [10, 25]}, {"name": "gat", "layers": 2, "fanouts": [10, 25]})
COLUMNS = (
    "dataset",
    "model",
    "pipeline",
    "form",
    "steps",
    "wall_ms",
    "batch_ms",
    "kernel_ms",
    "kernels",
    "launches",
    "memcpy_ms",
    "memcpys",
    "gpu_busy_ms",
    "gpu_idle_ms",
    "largest_gap_ms",
    "host_waits",
    "host_wait_ms",
    "warmup_s",
    "setups_in_profile",
    "note",
)


def _union_and_gaps(intervals: list[tuple[float, float]]) -> tuple[float, float, float]:
    """(covered time, span, longest uncovered stretch inside the span) of [start, end) intervals."""
    if not intervals:
        return 0.0, 0.0, 0.0
    intervals = sorted(intervals)
    covered, longest_gap = 0.0, 0.0
    start, end = intervals[0]
    for s, e in intervals[1:]:
        if s > end:
            covered += end - start
            longest_gap = max(longest_gap, s - end)
            start, end = s, e
        else:
            end = max(end, e)
    covered += end - start
    return covered, max(e for _, e in intervals) - intervals[0][0], longest_gap


def _ns(microseconds: float) -> int:
    return round(microseconds * 1e3)


def summarize_step(events: list[dict], step: str) -> dict[str, float]:
    """One step's numbers (milliseconds and counts) from a Chrome trace's events (``traceEvents``
    of ``torch.profiler``'s export): the step is the annotation named ``step``; host calls count
    when they start inside it, GPU work when the call that launched it does (by correlation id);
    the batch's time is that of the annotations named ``BATCH_PREFIX...`` that start inside it."""
    annotations = [e for e in events if e.get("cat") == "user_annotation"]
    marks = [e for e in annotations if e.get("name") == step]
    if len(marks) != 1:
        raise ValueError(f"the trace has {len(marks)} annotations named {step!r}, not one")
    begin, end = marks[0]["ts"], marks[0]["ts"] + marks[0]["dur"]
    batch = [e for e in annotations if e.get("name", "").startswith(BATCH_PREFIX) and begin <= e["ts"] < end]
    host = [e for e in events if e.get("cat") in HOST_SIDE and begin <= e["ts"] < end]
    launched = {e.get("args", {}).get("correlation") for e in host} - {None}
    gpu = [
        e
        for e in events
        if (e.get("cat") == KERNEL or e.get("cat") in COPIES) and e.get("args", {}).get("correlation") in launched
    ]
    kernels = [e for e in gpu if e["cat"] == KERNEL]
    copies = [e for e in gpu if e["cat"] in COPIES]
    waits = [e for e in host if e["name"] in HOST_WAITS]
    # In whole nanoseconds (the trace's resolution): float microseconds since the epoch round
    # differently in a start + duration than in a duration, so the union could exceed the sum.
    busy, span, largest_gap = (
        t / 1e3 for t in _union_and_gaps([(_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in gpu])
    )
    return {
        "wall_ms": (end - begin) / 1e3,
        "batch_ms": sum(_ns(e["dur"]) for e in batch) / 1e6,
        "kernel_ms": sum(_ns(e["dur"]) for e in kernels) / 1e6,
        "kernels": len(kernels),
        "launches": sum(e["name"] in LAUNCHES for e in host),
        "memcpy_ms": sum(_ns(e["dur"]) for e in copies) / 1e6,
        "memcpys": len(copies),
        "gpu_busy_ms": busy / 1e3,
        "gpu_idle_ms": (span - busy) / 1e3,
        "largest_gap_ms": largest_gap / 1e3,
        "host_waits": len(waits),
        "host_wait_ms": sum(e["dur"] for e in waits) / 1e3,
    }


def table_row(events: list[dict], steps: list[str], **labels) -> dict:
    """The CSV row of one pipeline, model and form: ``labels``, then each number's median over
    ``steps``."""
    per_step = [summarize_step(events, step) for step in steps]
    medians = {k: round(statistics.median(s[k] for s in per_step), 4) for k in per_step[0]}
    return {**labels, "steps": len(steps), **medians}


def write_table(rows: list[dict], out) -> None:
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)


def write_with_record(rows: list[dict], path: Path, record: dict) -> None:
    """The CSV at ``path`` and its provenance record beside it, with the rows' digest, written as
    the results writer writes a part's (record first, each through a temporary file), so that a
    CSV lies there only beside its own record."""
    # harness.results' writer of a pair of files (the harness's own run writer takes schema rows).
    from harness.results import ROWS_DIGEST, provenance_path, write_both

    text = io.StringIO()
    write_table(rows, text)
    data = text.getvalue()
    record = record | {ROWS_DIGEST: hashlib.sha256(data.encode()).hexdigest()}
    write_both(provenance_path(path), json.dumps(record, indent=2, sort_keys=True) + "\n", path, data)


@dataclass(frozen=True)
class Profiled:
    events: list[dict]  # the trace's events
    warmup_seconds: float  # the warm-up steps, compiles and captures included
    setups_in_profile: int  # compiles or captures the model's form made during the profiled steps


def profile_steps(model, optimizer, pipeline, steps: int, warmup: int) -> Profiled:
    """Train ``warmup`` steps, then profile ``steps`` more, each under its own annotation (and its
    batch's under one inside it). Nothing waits between steps (as in an epoch), only after the
    last. ``model`` may be a model in a form (workloads/gnn/model_forms/), whose compiles and
    captures are counted."""
    import torch
    from torch.nn import functional as F
    from torch.profiler import ProfilerActivity, profile, record_function

    from workloads.gnn.model_forms import setups

    batches = pipeline.batches(epoch=0)
    step_number = iter(range(warmup + steps))

    def train_step():
        with record_function(f"{BATCH_PREFIX}{next(step_number)}"):
            batch = next(batches)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(batch.x, batch.edge_index)[: batch.batch_size], batch.y)
        loss.backward()
        optimizer.step()

    try:
        model.train()
        started = time.perf_counter()
        for _ in range(warmup):
            train_step()
        torch.cuda.synchronize()
        warmup_seconds = time.perf_counter() - started
        before = setups(model)
        # Two profiles in one process, the second of CUDA graphs (the eager form's, then the
        # cuda_graph form's), crashed in the second profile's stop on an H100 with CUDA 13. torch
        # notes the same crash after CUPTI's teardown and, for its own CUDA graphs, keeps CUPTI
        # attached between profiles (TEARDOWN_CUPTI=0, torch/profiler/profiler.py): so do we.
        # A user's own setting is left as it is.
        os.environ.setdefault("TEARDOWN_CUPTI", "0")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(steps):
                with record_function(f"{STEP_PREFIX}{i}"):
                    train_step()
            torch.cuda.synchronize()
            batches.close()  # the prefetch thread launches no kernel while the profiler stops
    finally:
        batches.close()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    return Profiled(events, round(warmup_seconds, 3), setups(model) - before)


def cache_options(name: str, nodes: int) -> dict | None:
    rows = max(1, nodes // 10)  # the share the config's hot_cache keeps
    options = {"hot_cache": {"rows": rows, "warmup_batches": 16}, "hot_cache_oracle": {"rows": rows, "epochs": 1}}
    return options.get(name)


@exit_on_user_error
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", default="h200")
    parser.add_argument("--dataset", default="products", choices=["reddit", "products", "papers"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument(
        "--pipelines", nargs="+", default=["all_in_gpu", "uva_sampling", "zero_copy_overlap", "zero_copy", "cpu_gather"]
    )
    parser.add_argument("--forms", nargs="+", help="model forms to profile (default: every one registered)")
    parser.add_argument(
        "--out", type=Path, help="the CSV to write, with its provenance record (default: standard output)"
    )
    args = parser.parse_args()

    from workloads.gnn.model_forms import MODEL_FORMS, in_order

    forms = in_order(args.forms or MODEL_FORMS.names())
    unknown = [form for form in forms if form not in MODEL_FORMS]
    if unknown:  # before the GPU check: a typo is refused on any machine
        raise UserError(f"unknown model forms {unknown}; they are {list(in_order(MODEL_FORMS.names()))}")

    from harness import machine

    machine.require_gpu("tools/gnn_step_profile.py", "it profiles GPU training")  # before the graph is loaded

    import torch

    from harness import config as suite_config
    from harness.provenance import collect
    from workloads.gnn.model_forms import FormFailed, in_form
    from workloads.gnn.models import build
    from workloads.gnn.pipelines import PIPELINES, Graph, Pipeline, training_threads, workers_of
    from workloads.graphs.datasets import load_graph
    from workloads.graphs.spec import SHORT_NAMES

    unknown = set(args.pipelines) - set(PIPELINES)
    if unknown:
        raise UserError(f"unknown pipelines {sorted(unknown)}; they are {list(PIPELINES)}")
    if args.steps < 1 or args.warmup < 0:
        raise UserError("--steps must be at least 1 and --warmup at least 0")
    shared = suite_config.topic_params(suite_config.load(), "gnn_training", args.scale)
    if args.dataset not in shared:
        raise UserError(f"config/gnn_training.yaml trains on no {args.dataset} graph at scale '{args.scale}'")
    params = shared[args.dataset]
    spec, dataset, arrays = load_graph(SHORT_NAMES[args.dataset], params, shared["graph_seed"])
    graph = Graph(arrays, "cuda")
    rows = []
    try:
        for model_spec in MODELS:
            for name in args.pipelines:
                for form in forms:
                    workers = workers_of(name, shared["sampler_workers"])
                    torch.set_num_threads(training_threads(workers))
                    torch._dynamo.reset()  # one compiled model at a time: dynamo's caches hold at most 8 versions
                    torch.manual_seed(0)
                    model = build(
                        model_spec["name"], spec.feature_dim, shared["hidden"], spec.classes, 2, model_spec["fanouts"]
                    ).cuda()
                    optimizer = torch.optim.Adam(model.parameters(), lr=shared["learning_rate"])
                    pipeline = Pipeline(
                        name,
                        graph,
                        model_spec["fanouts"],
                        shared["batch_size"],
                        seed=shared["graph_seed"],
                        sampler_workers=workers,
                        options=cache_options(name, spec.nodes),
                    )
                    labels = {"dataset": dataset, "model": f"{model_spec['name']}2", "pipeline": name, "form": form}
                    try:
                        profiled = profile_steps(in_form(model, form), optimizer, pipeline, args.steps, args.warmup)
                    except FormFailed as failed:  # recorded, and the next form runs
                        row = {**labels, "steps": 0, "note": str(failed)}
                    else:
                        steps = [f"{STEP_PREFIX}{i}" for i in range(args.steps)]
                        row = table_row(profiled.events, steps, **labels) | {
                            "warmup_s": profiled.warmup_seconds,
                            "setups_in_profile": profiled.setups_in_profile,
                        }
                    finally:
                        pipeline.close()
                        del model, optimizer
                        torch.cuda.empty_cache()
                    rows.append(row)
                    print(", ".join(f"{k} {v}" for k, v in row.items()), file=sys.stderr, flush=True)
    finally:
        graph.close()
    if args.out is None:
        write_table(rows, sys.stdout)
    else:
        record = collect(
            args.scale,
            topic="gnn_training",
            tool="tools/gnn_step_profile.py",
            profile={"dataset": dataset, "steps": args.steps, "warmup": args.warmup, "forms": forms},
        )
        write_with_record(rows, args.out, record)


if __name__ == "__main__":
    main()
