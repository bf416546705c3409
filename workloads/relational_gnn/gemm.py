"""Part ``gemm_template`` (GPU machines only): Hector's GEMM template (systems/hector/kernels/gemm.cu)
against stock torch on equal segment shapes: one product per relation segment of
a dataset-shaped graph (rows already in relation order, as ``grouped_mm`` takes them), and one
large segment, where cuBLAS (a plain ``torch.mm``) is the yardstick.

Each case's inputs are seeded; every variant's result is compared with float32 per-segment
products before any is timed. Three precisions (a row's ``precision``): ``float32`` with
TF32 off; ``tf32`` with torch's TF32 on and the template's TF32 variant (inputs rounded to TF32,
fp32 accumulate), checked at TF32's tolerance; ``bfloat16``: bf16 rows, weights and results for
every variant (torch's defaults for bf16 products; the template's bf16 variant multiplies on bf16
tensor cores and accumulates in fp32), checked against the float32 products of the same bf16 inputs.

What is timed is one call on prepared inputs, as a model step makes it: the template's tile list
(:class:`systems.hector.codegen.Segments`, once per graph in the model path) and ``grouped_mm``'s
``offs`` are made once, outside the timing; the loop of products (``segment_mm``) reads its
segment sizes back on every call, as the models' form does. Rows: ``model`` = ``gemm``,
``mode`` = ``inference``, ``edges`` = the rows multiplied, ``relations`` = the segments,
``dataset`` = the case's name, ``form`` = the variant, ``dtype`` = the operands' element type.
"""

from __future__ import annotations

import torch

from harness.errors import UserError
from harness.timing import measure
from systems.relgraph.ops import grouped_products, segment_products
from workloads.graphs import relational


def gemm_template(params, writer, *, repeat, warmup, device, **_):
    if device != "cuda":
        raise UserError("gemm_template times CUDA kernels: it needs a GPU")

    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        for case in params["cases"]:
            for precision in PRECISIONS:  # each case sets TF32 for its reference and then its precision
                _case(case, precision, params["seed"], writer, repeat=repeat, warmup=warmup, device=device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return {}


PRECISIONS = ("float32", "tf32", "bfloat16")
# What each variant is in the comparison: the template, and stock torch's ways to the same products.
ROLES = {"segment_mm": "baseline", "grouped_mm": "baseline", "hector_gemm": "optimized", "cublas": "baseline"}
# Each precision's check against the float32 products: TF32 rounds the inputs to 10 mantissa bits,
# bf16 the results to 8; float32 only sums in another order.
TOLERANCE = {"float32": 1e-4, "tf32": 1e-2, "bfloat16": 1e-2}


def _case(case: dict, precision: str, seed: int, writer, *, repeat, warmup, device) -> None:
    from systems.hector import codegen

    sizes = _segment_sizes(case)
    g = torch.Generator().manual_seed(seed)
    dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    rows = torch.randn(sum(sizes), case["in_dim"], generator=g).to(device, dtype)
    weight = torch.randn(len(sizes), case["in_dim"], case["out_dim"], generator=g).to(device, dtype)
    offsets = torch.tensor([0, *sizes]).cumsum(0).to(device)
    segments = codegen.Segments.of(offsets, rows.shape[0], device)
    tensor_cores = precision != "float32"
    variants = {
        "segment_mm": lambda: segment_products(rows, weight, offsets),
        "grouped_mm": _grouped(rows, weight, offsets),
        "hector_gemm": lambda: codegen.segment_gemm(rows, weight, segments, tensor_cores),
    }
    if len(sizes) == 1:
        variants["cublas"] = lambda: rows @ weight[0]
    torch.backends.cuda.matmul.allow_tf32 = False  # the yardstick: float32 products of these inputs
    expected = segment_products(rows.float(), weight.float(), offsets)
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    tolerance = TOLERANCE[precision]
    for name, fn in variants.items():
        got = fn()
        if got.dtype != dtype or not torch.allclose(
            got.float(), expected, rtol=tolerance, atol=tolerance * float(expected.abs().max())
        ):
            worst = float((got.float() - expected).abs().max())
            raise AssertionError(
                f"{name} on {case['name']} ({precision}): a {got.dtype} result {worst:.3g} from the float32 products"
            )
    del expected, got
    config = {
        "device": device,
        "model": "gemm",
        "mode": "inference",
        "in_dim": case["in_dim"],
        "out_dim": case["out_dim"],
        "precision": precision,
        "dtype": "bfloat16" if precision == "bfloat16" else "float32",
        "edges": sum(sizes),
        "relations": len(sizes),
    }
    for name, fn in variants.items():
        m = measure(fn, device=device, repeat=repeat, warmup=warmup, desc=f"{case['name']} {name} {precision}")
        row = config | {"form": name}
        writer.add_measurement(m, role=ROLES[name], variant=name, config=row, dataset=case["name"])


def _grouped(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor):
    """``grouped_mm`` as a user calls it on prepared inputs: its ``offs`` made once."""
    ends = offsets[1:].to(torch.int32)
    return lambda: grouped_products(rows, weight, offsets, ends)


def _segment_sizes(case: dict) -> list[int]:
    """The rows of each segment: a dataset's relation sizes (its published shape), or ``rows``."""
    if "dataset" in case:
        spec = relational.dataset_spec(case["dataset"], seed=0)
        return [r.count for r in spec.relations]
    return [case["rows"]]
