"""Part ``gemm_template`` (GPU machines only): Hector's GEMM template (systems/hector/kernels/gemm.cu)
against stock torch on equal segment shapes, as issue 14 asks: one product per relation segment of
a dataset-shaped graph (rows already in relation order, as ``grouped_mm`` takes them), and one
large segment, where cuBLAS (a plain ``torch.mm``) is the yardstick.

Each case's inputs are seeded; every variant's result is compared with the loop of per-segment
products (``segment_mm``) before any is timed. float32 with TF32 off; the tensor-core variant
(bf16 in, fp32 accumulate) is not built, so bf16 is recorded as skipped with that reason.
Rows: ``model`` = ``gemm``, ``mode`` = ``inference``, ``edges`` = the rows multiplied, ``relations`` =
the segments, ``dataset`` = the case's name.
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
    from systems.hector import codegen

    notes = {"skipped": {"bfloat16": "the template's tensor-core variant (bf16 in, fp32 accumulate) is not built yet"}}
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for case in params["cases"]:
            sizes = _segment_sizes(case)
            g = torch.Generator().manual_seed(params["seed"])
            rows = torch.randn(sum(sizes), case["in_dim"], generator=g).cuda()
            weight = torch.randn(len(sizes), case["in_dim"], case["out_dim"], generator=g).cuda()
            offsets = torch.tensor([0, *sizes]).cumsum(0).cuda()
            variants = {
                "segment_mm": lambda: segment_products(rows, weight, offsets),
                "grouped_mm": lambda: grouped_products(rows, weight, offsets),
                "hector_gemm": lambda: codegen.segment_gemm(rows, weight, offsets),
            }
            if len(sizes) == 1:
                variants["cublas"] = lambda: rows @ weight[0]
            expected = variants["segment_mm"]()
            for name, fn in variants.items():
                got = fn()
                if not torch.allclose(got, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max())):
                    worst = float((got - expected).abs().max())
                    raise AssertionError(f"{name} on {case['name']}: differs from segment_mm by {worst:.3g}")
            del expected
            config = {
                "device": device,
                "model": "gemm",
                "mode": "inference",
                "in_dim": case["in_dim"],
                "out_dim": case["out_dim"],
                "dtype": "float32",
                "edges": sum(sizes),
                "relations": len(sizes),
            }
            for name, fn in variants.items():
                m = measure(fn, device=device, repeat=repeat, warmup=warmup, desc=f"{case['name']} {name}")
                role = "optimized" if name.startswith("hector") else "baseline"
                writer.add_measurement(m, role=role, variant=name, config=config, dataset=case["name"])
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return notes


def _segment_sizes(case: dict) -> list[int]:
    """The rows of each segment: a dataset's relation sizes (its published shape), or ``rows``."""
    if "dataset" in case:
        spec = relational.dataset_spec(case["dataset"], seed=0)
        return [r.count for r in spec.relations]
    return [case["rows"]]
