"""Where a Hector layer call's host time goes, on one GPU.

On the H200 Hector's profiled device time was a small part of its timed call (HGT
training on aifb-like: 1.2 of 24 ms), so the call is host-bound. This probe times one layer call
as the relational_gnn topic does (CUDA events, after warm-up), then shows where the host spends:

  1. the wall time per call and per template step, and the device time of the same calls, by
     class and by operator (Hector's kernels by entry point);
  2. cProfile of the calls, by own time: Python functions, CuPy's launch, torch's operators;
  3. torch.profiler's CPU-side table, by self CPU time: which operator or driver call costs.

    python tools/hector_host_probe.py [--dataset aifb] [--model hgt] [--variant hector_best]
        [--mode training] [--calls 20]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import torch
import torch.nn.functional as F

from harness.timing import measure
from systems.hector import lower
from systems.relgraph.graph import RelGraph
from systems.rgnn.breakdown import breakdown, operators
from systems.rgnn.forms import FORMS
from systems.rgnn.forms.hector import HectorForm, HectorLayer
from systems.rgnn.models import MODELS
from workloads.graphs import relational, store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="aifb", choices=sorted(relational.PUBLISHED))
    parser.add_argument("--model", default="hgt", choices=MODELS.names())
    parser.add_argument(
        "--variant", default="hector_best", choices=FORMS.names(), help="a form: a Hector variant or a baseline"
    )
    parser.add_argument("--mode", default="training", choices=["inference", "training"])
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("this probe times generated CUDA kernels: it needs a GPU")
    torch.backends.cuda.matmul.allow_tf32 = False

    spec = relational.dataset_spec(args.dataset, seed=0)
    arrays = store.get(relational.HeteroParams(spec, relational.PUBLISHED[args.dataset].unique_pair_ratio, seed=0))
    graph = RelGraph.from_store(arrays, len(spec.relations), "cuda", num_node_types=len(spec.node_types))
    model, form = MODELS[args.model], FORMS[args.variant]
    weights = model.make_weights(graph, args.width, args.width).to("cuda")
    x = torch.randn(graph.num_nodes, args.width, device="cuda")
    target = torch.randn(graph.num_nodes, args.width, device="cuda")
    hector = isinstance(form, HectorForm)
    layer = form.build(model, weights, graph)
    optimizer = torch.optim.Adam(weights.parameters(), lr=1e-3, fused=True)  # as the topic's parts

    def call():
        if args.mode == "inference":
            with torch.no_grad():
                return layer(x)
        optimizer.zero_grad(set_to_none=False)
        loss = F.mse_loss(layer(x), target)
        loss.backward()
        optimizer.step()
        return loss

    timed = measure(call, device="cuda", repeat=args.calls, warmup=5)
    split = breakdown(call, "cuda")
    device = sum(split.values())
    print(f"{args.model} {args.variant} {args.mode} on {args.dataset}-like ({graph.edges:,} edges), width {args.width}")
    print(f"wall {timed.median * 1e3:.3f} ms per call; device {device * 1e3:.3f} ms; by class (us):", end=" ")
    print(", ".join(f"{k} {v * 1e6:.0f}" for k, v in split.items()))
    spent = sorted(operators(call, "cuda").items(), key=lambda kv: -kv[1])
    print("device time by operator (us; Hector's kernels by entry point): ", end="")
    print(", ".join(f"{name} {seconds * 1e6:.0f}" for name, seconds in spent[:12]))
    if hector:
        forward, backward = (lower.lower(p) for p in _split(layer))
        steps = len(forward.steps) + (len(backward.steps) if args.mode == "training" else 0)
        print(f"{steps} template steps; host per step {(timed.median - device) / steps * 1e6:.0f} us")
    if args.mode == "training":
        _phases(layer, x, target, optimizer, args.calls)

    profiler = cProfile.Profile()
    torch.cuda.synchronize()
    profiler.enable()
    for _ in range(args.calls):
        call()
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    print(f"\ncProfile of {args.calls} calls, by own time:\n{text.getvalue()}")

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(args.calls):
            call()
        torch.cuda.synchronize()
    print(f"torch.profiler, CPU side, {args.calls} calls:")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


def _phases(layer, x, target, optimizer, calls: int) -> None:
    """Wall time of each phase of a training step (synchronized around each): which one the host
    time is in."""
    import statistics
    import time

    phases = {"zero_grad": [], "forward": [], "backward": [], "optimizer": []}

    def timed(name, fn):
        torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        phases[name].append(time.perf_counter() - start)
        return result

    for _ in range(calls):
        timed("zero_grad", lambda: optimizer.zero_grad(set_to_none=False))
        loss = timed("forward", lambda: F.mse_loss(layer(x), target))
        timed("backward", loss.backward)
        timed("optimizer", optimizer.step)
    print("phases (median ms): " + ", ".join(f"{k} {statistics.median(v) * 1e3:.3f}" for k, v in phases.items()))
    print(f"parameters: {sum(1 for _ in optimizer.param_groups[0]['params'])}")


def _split(layer: HectorLayer):
    from systems.hector.autodiff import split

    return split(layer.layer.program)


if __name__ == "__main__":
    main()
