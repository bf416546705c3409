"""matmul: dense n x n x n matrix-product rate (2 n^3 FLOP) in fp32, TF32 (GPU only) and bf16."""

from __future__ import annotations

import torch

from harness.progress import progress
from harness.timing import measure

# Relative error against a float64 reference that each precision must stay under.
TOLERANCE = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 3e-2}
DTYPE = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}


def run(params: dict, writer, *, repeat: int, warmup: int, device: str, **_) -> None:
    n = params["dim"]
    precisions = ["fp32", "tf32", "bf16"] if device == "cuda" else ["fp32", "bf16"]
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    generator = torch.Generator(device=device).manual_seed(3)
    try:
        for precision in progress(precisions, desc="matmul"):
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            a = torch.randn(n, n, device=device, generator=generator).to(DTYPE[precision])
            b = torch.randn(n, n, device=device, generator=generator).to(DTYPE[precision])
            c = a @ b
            ref = a[:64].double() @ b.double()
            err = ((c[:64].double() - ref).norm() / ref.norm()).item()
            if not err < TOLERANCE[precision]:
                raise RuntimeError(f"matmul {precision}: relative error {err:.2e} exceeds {TOLERANCE[precision]:.0e}")
            m = measure(lambda: torch.mm(a, b, out=c), device=device, repeat=repeat, warmup=warmup)
            writer.add_measurement(
                m, role="probe", variant=precision, flops=2 * n**3, config={"device": device, "matrix_dim": n}
            )
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32_before
