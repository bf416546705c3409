"""Part ``gemm_template`` (GPU machines only): Hector's GEMM template (systems/hector/kernels/gemm.cu)
against stock torch on equal segment shapes, as issue 14 asks: one product per relation segment of
a dataset-shaped graph (rows already in relation order, as ``grouped_mm`` takes them), and one
large segment, where cuBLAS (a plain ``torch.mm``) is the yardstick.

Each case's inputs are seeded; every variant's result is compared with the loop of per-segment
products (``segment_mm``) before any is timed. Two precisions, each a ``dtype`` of the rows:
``float32`` with TF32 off, and ``tf32`` with torch's TF32 on and the template's tensor-core
variant (inputs rounded to TF32, fp32 accumulate), checked at TF32's tolerance. The bf16 variant
is not built: recorded as skipped with that reason. Rows: ``model`` = ``gemm``, ``mode`` =
``inference``, ``edges`` = the rows multiplied, ``relations`` = the segments, ``dataset`` = the
case's name.
"""

from __future__ import annotations

import torch

from harness.errors import UserError
from harness.timing import measure
from workloads.graphs import relational
from workloads.rgnn.ops import grouped_products, segment_products


def gemm_template(params, writer, *, repeat, warmup, device, **_):
    if device != "cuda":
        raise UserError("gemm_template times CUDA kernels: it needs a GPU")

    notes = {"skipped": {"bfloat16": "the template's bf16 variant is not built (its tensor-core variant is TF32)"}}
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        for case in params["cases"]:
            for precision in ("float32", "tf32"):
                torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
                _case(case, precision, params["seed"], writer, repeat=repeat, warmup=warmup, device=device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return notes


def _case(case: dict, precision: str, seed: int, writer, *, repeat, warmup, device) -> None:
    from systems.hector import codegen

    sizes = _segment_sizes(case)
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(sum(sizes), case["in_dim"], generator=g).cuda()
    weight = torch.randn(len(sizes), case["in_dim"], case["out_dim"], generator=g).cuda()
    offsets = torch.tensor([0, *sizes]).cumsum(0).cuda()
    tensor_cores = precision == "tf32"
    variants = {
        "segment_mm": lambda: segment_products(rows, weight, offsets),
        "grouped_mm": lambda: grouped_products(rows, weight, offsets),
        "hector_gemm": lambda: codegen.segment_gemm(rows, weight, offsets, tensor_cores),
    }
    if len(sizes) == 1:
        variants["cublas"] = lambda: rows @ weight[0]
    expected = variants["segment_mm"]()
    tolerance = 1e-2 if tensor_cores else 1e-4
    for name, fn in variants.items():
        got = fn()
        if not torch.allclose(got, expected, rtol=tolerance, atol=tolerance * float(expected.abs().max())):
            worst = float((got - expected).abs().max())
            raise AssertionError(f"{name} on {case['name']} ({precision}): differs from segment_mm by {worst:.3g}")
    del expected
    config = {
        "device": device,
        "model": "gemm",
        "mode": "inference",
        "in_dim": case["in_dim"],
        "out_dim": case["out_dim"],
        "dtype": precision,
        "edges": sum(sizes),
        "relations": len(sizes),
    }
    for name, fn in variants.items():
        m = measure(fn, device=device, repeat=repeat, warmup=warmup, desc=f"{case['name']} {name} {precision}")
        role = "optimized" if name.startswith("hector") else "baseline"
        writer.add_measurement(m, role=role, variant=name, config=config, dataset=case["name"])


def _segment_sizes(case: dict) -> list[int]:
    """The rows of each segment: a dataset's relation sizes (its published shape), or ``rows``."""
    if "dataset" in case:
        spec = relational.dataset_spec(case["dataset"], seed=0)
        return [r.count for r in spec.relations]
    return [case["rows"]]
