"""CUDA code generation: each step of a plan (systems/hector/lower.py) becomes an instance of one of
the two templates in ``kernels/`` (``gemm.cu``, ``traversal.cu``), specialized by ``#define``s
written before the template's text: which operand is read how, the row-wise expression, whether
the weight is transposed. Instances are named by the hash of their text, compiled by NVRTC through
the suite's kernel machinery (systems/nvrtc.py: cached in the process and on disk) and launched
on torch's current stream. :func:`sources` lists every instance a program needs, so CI compiles
them all for sm_90 with nvcc, without a GPU.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path

import numpy as np
import torch

from systems.hector import lower
from systems.hector.ir import Program

KERNELS = Path(__file__).parent / "kernels"
OPERAND_KINDS = {"own": 0, "indexed": 1, "scalar": 2, "shared": 3}
THREADS = 256


def source_of(step) -> tuple[str, str, str]:
    """The instance of ``step``: (entry point, CUDA source, template file name)."""
    if isinstance(step, lower.Gemm):
        defines = {"GATHER_A": 1, "SCATTER_C": 1, "TRANSPOSE_B": int(step.transpose)}
        return _instance("gemm.cu", "GEMM_NAME", "segment_gemm", defines)
    if isinstance(step, lower.Outer):
        return _instance("gemm.cu", "OUTER_NAME", "segment_outer", {"GATHER_A": 1, "GATHER_G": 1})
    if isinstance(step, lower.Map | lower.Dot):
        defines = {"OPERAND_A": OPERAND_KINDS[step.a.kind], "OPERAND_B": OPERAND_KINDS[step.b.kind]}
        if isinstance(step, lower.Map):
            expression = lower.EXPRESSIONS[step.expression][0].format(slope=step.out.attr("slope"))
            defines["ROW_EXPR(a, b)"] = expression
            return _instance("traversal.cu", "MAP_NAME", "rows_map", defines)
        return _instance("traversal.cu", "DOT_NAME", "rows_dot", defines)
    if isinstance(step, lower.Scatter):
        return _instance("traversal.cu", None, "scatter_rows", {})
    if isinstance(step, lower.Softmax):
        return _instance("traversal.cu", None, "edge_softmax", {})
    raise TypeError(f"{type(step).__name__} steps run on the host")


def _instance(template: str, name_macro: str | None, base: str, defines: dict) -> tuple[str, str, str]:
    body = "".join(f"#define {k} {v}\n" for k, v in defines.items())
    digest = hashlib.sha256((template + body).encode()).hexdigest()[:10]
    name = f"{base}_{digest}" if name_macro else base
    if name_macro:
        body += f"#define {name_macro} {name}\n"
    return name, body + (KERNELS / template).read_text(), template


def sources(program: Program) -> dict[str, str]:
    """Every kernel instance ``program`` needs, by entry point."""
    found = {}
    for step in lower.lower(program).steps:
        if not isinstance(step, lower.Host):
            name, text, _ = source_of(step)
            found[name] = text
    return found


def _module(text: str):
    from systems import nvrtc

    cache = Path(os.environ.get("SUITE_HECTOR_CACHE", Path.home() / ".cache" / "data-efficient-suite" / "hector"))
    path = cache / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.cu"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(text)
        os.replace(partial, path)
    return nvrtc.load_module(path)


def run(plan: lower.Plan, graph, tensors: dict[str, torch.Tensor], widths: dict) -> list[torch.Tensor]:
    """Run ``plan`` on the GPU with the generated kernels (float32 CUDA tensors)."""
    from systems import nvrtc

    index = lower.GraphIndex(graph)
    env: dict[int, torch.Tensor] = {}
    for v in plan.program.values:
        if v.op in ("input", "weight"):
            env[id(v)] = tensors[v.name].contiguous()
    device = graph.src.device
    none = torch.zeros(1, dtype=torch.int64, device=device)  # an unused pointer argument

    def ptr(t):
        return np.uint64(t.data_ptr())

    def operand_args(o: lower.Operand):
        if o.kind == "scalar":
            symbol = o.value.attr("rsqrt") if o.value is not None else None
            number = o.scalar if symbol is None else widths[symbol] ** -0.5
            return (ptr(none), ptr(none), np.float32(number), np.int32(1))
        base = env[id(o.value)]
        width = 1 if base.dim() == 1 else base.shape[-1]
        idx = index[o.index] if o.kind == "indexed" else none
        return (ptr(base), ptr(idx), np.float32(0), np.int32(width))

    def blocks(work: int, per_block: int = THREADS) -> int:
        return max(1, min(math.ceil(work / per_block), 65535 * 4))

    for step in plan.steps:
        out = step.out
        if isinstance(step, lower.Host):
            env[id(out)] = lower.host_value(out, [env[id(a)] for a in out.args], index).contiguous()
            continue
        name, text, _ = source_of(step)
        module = _module(text)
        if isinstance(step, lower.Gemm):
            a, b = env[id(step.a.value)], env[id(step.b)]
            n = b.shape[-2] if step.transpose else b.shape[-1]
            result = torch.empty(index.rows(out.domain), n, device=device)
            types, begins, ends = index.tiles(step.order, lower.TILE_ROWS)
            if len(types) and n:
                rows_a, rows_c = index[index.positions(step.a, step.order)], index[step.order]
                args = (ptr(a), ptr(rows_a), ptr(b), ptr(result), ptr(rows_c), ptr(types), ptr(begins), ptr(ends))
                grid = (len(types), math.ceil(n / 64))
                nvrtc.launch(module, name, grid, (THREADS,), (*args, np.int32(a.shape[1]), np.int32(n)))
            env[id(out)] = result
        elif isinstance(step, lower.Outer):
            a, g = env[id(step.a.value)], env[id(step.g.value)]
            types_count = index.types(step.order.split(":")[1]) if step.order.startswith("order") else 1
            result = torch.zeros(types_count, a.shape[1], g.shape[1], device=device)
            types, begins, ends = index.tiles(step.order, lower.OUTER_ROWS)
            if len(types):
                rows_a = index[index.positions(step.a, step.order)]
                rows_g = index[index.positions(step.g, step.order)]
                args = (ptr(a), ptr(rows_a), ptr(g), ptr(rows_g), ptr(result), ptr(types), ptr(begins), ptr(ends))
                grid = (len(types), math.ceil(g.shape[1] / 64), math.ceil(a.shape[1] / 64))
                nvrtc.launch(module, name, grid, (THREADS,), (*args, np.int32(a.shape[1]), np.int32(g.shape[1])))
            env[id(out)] = result if out.per else result[0]
        elif isinstance(step, lower.Map):
            rows = index.rows(out.domain)
            a_args, b_args = operand_args(step.a), operand_args(step.b)
            width = max(a_args[3], b_args[3]) if step.expression not in lower.UNARY else a_args[3]
            result = torch.empty(rows, int(width), device=device)
            if result.numel():
                nvrtc.launch(
                    module, name, (blocks(result.numel()),), (THREADS,),
                    (*a_args, *b_args, ptr(result), np.int64(rows), np.int32(width)),
                )  # fmt: skip
            env[id(out)] = result
        elif isinstance(step, lower.Dot):
            rows = index.rows(out.domain)
            a_args, b_args = operand_args(step.a), operand_args(step.b)
            result = torch.empty(rows, 1, device=device)
            if rows:
                args = (*a_args[:3], *b_args[:3], ptr(result), np.int64(rows), np.int32(max(a_args[3], b_args[3])))
                nvrtc.launch(module, name, (blocks(rows * 32),), (THREADS,), args)
            env[id(out)] = result
        elif isinstance(step, lower.Scatter):
            source = env[id(step.source)]
            result = torch.zeros(index.count(step.count), source.shape[1], device=device)
            if source.numel():
                args = (
                    ptr(source),
                    ptr(index[step.index]),
                    ptr(result),
                    np.int64(source.shape[0]),
                    np.int32(source.shape[1]),
                )
                nvrtc.launch(module, name, (blocks(source.numel()),), (THREADS,), args)
            env[id(out)] = result[0] if step.count == "one" else result
        elif isinstance(step, lower.Softmax):
            scores = env[id(step.scores)]
            result = torch.empty_like(scores)
            if graph.num_nodes:
                args = (
                    ptr(scores),
                    ptr(index["by_dst"]),
                    ptr(index["dst_begin"]),
                    ptr(result),
                    np.int64(graph.num_nodes),
                )
                nvrtc.launch(module, name, (blocks(graph.num_nodes * 32),), (THREADS,), args)
            env[id(out)] = result
    return [env[id(o)] for o in plan.program.outputs]
