"""A CPU model of Hector's CUDA kernels, driven by the real launch arguments.

``install(monkeypatch)`` replaces the NVRTC launch with :func:`launch`, which evaluates each kernel
literally from its argument list: flat pointers (looked up among the tensors the runner passed),
scalars of the exact numpy types the kernel's parameters take, the ``#define``s of the instance's
source, and the grid. So ``codegen.run`` runs end to end on a machine without a GPU, and a wrong
argument order, type, width or pointer gives a wrong result or a recorded problem. What it cannot
check is the CUDA itself (races, barriers, shuffles): the GPU tests do.
"""

from __future__ import annotations

import contextlib
import functools
import re

import numpy as np
import torch

from systems import nvrtc
from systems.hector import codegen, lower

# Each entry point's parameters: f* float*, l* long long*, i* int*, int, ll (long long), float;
# an instance with BF16 takes bfloat16s (b*) where the template says element* (a traversal
# kernel's every row pointer but a sum's float32 target; A, B and C of the GEMM), one with
# OUTER_BF16 for A and G. bf16 rows are widened to float32 as they are read, and results rounded to
# bf16 (to nearest, ties to even, as torch converts) as they are written.
SIGNATURES = {
    "segment_gemm": "f* l* f* f* l* i* l* l* int int",
    "segment_outer": "f* l* f* l* f* i* l* l* int int",
    "rows_map": "f* l* float int f* l* float int f* ll int",
    "rows_dot": "f* l* float f* l* float f* ll int int",
    "scatter_map": "f* l* float int f* l* float int l* i* l* l* f* ll int",
    "scatter_rows": "f* l* i* l* l* f* ll int",
    "edge_softmax": "f* l* l* f* ll int",
    "max_rows": "f* l* l* f* ll int",
}
SCALARS = {"int": np.int32, "ll": np.int64, "float": np.float32}
POINTEES = {"f*": torch.float32, "l*": torch.int64, "i*": torch.int32, "b*": torch.bfloat16}


class KernelModel:
    def __init__(self):
        self.tensors: dict[int, torch.Tensor] = {}
        self.problems: list[str] = []
        self.element = "f*"  # the running instance's rows: f* or b*

    def pointer(self, t: torch.Tensor):
        self.tensors[t.data_ptr()] = t
        return np.uint64(t.data_ptr())

    def flat(self, pointer, kind: str, where: str) -> torch.Tensor:
        t = self.tensors[int(pointer)]
        if not t.is_contiguous():
            self.problems.append(f"{where}: a tensor that is not contiguous")
        if t.numel() and t.dtype != POINTEES[kind]:
            self.problems.append(f"{where}: a {t.dtype} pointer for {kind}")
        return t.view(-1)

    def read(self, t: torch.Tensor, index, where: str) -> torch.Tensor:
        index = torch.as_tensor(index, dtype=torch.int64)
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= t.numel()):
            self.problems.append(f"{where}: read {int(index.max())} out of {t.numel()}")
            index = index.clamp(0, max(t.numel() - 1, 0))
        return t[index]

    def operand(self, kind, args, first, i, c, where, width=None, out_width=None) -> torch.Tensor:
        """An operand's values at rows i, columns c of ``out_width`` (the launch's last argument
        unless given), from its (pointer, index, scalar[, width]) args: column c / (out_width /
        width) of its own, one per head's block (0 for width 1)."""
        pointer, index, scalar = args[first : first + 3]
        width = int(args[first + 3]) if width is None else width
        out_width = int(args[-1]) if out_width is None else out_width
        if width not in (1, out_width) and (width > out_width or out_width % width):
            self.problems.append(f"{where}: an operand of width {width} under an output of width {out_width}")
        if kind == 2:
            return torch.full(i.shape, float(scalar))
        table = self.flat(pointer, self.element, where)
        row = {0: i, 1: lambda: self.read(self.flat(index, "l*", where), i, where + " index"), 3: torch.zeros_like(i)}[
            kind
        ]
        row = row() if callable(row) else row
        return self.read(table, row * width + c // (out_width // width), where).float()

    def launch(self, module, name, grid, block, args, shared_mem=0) -> None:
        text, base = module, re.sub(r"_[0-9a-f]{10}$", "", name)
        defined = {}
        for key, value in re.findall(r"^#define (\w+) (\S+)$", text, re.M):
            defined.setdefault(key, value)  # the instance's own, not the template's defaults after them
        if base in ("fused_map", "fused_scatter_map"):  # four arguments per leaf operand of the chain
            tail = "l* i* l* l* f* ll int" if base == "fused_scatter_map" else "f* ll int"
            signature = ("f* l* float int " * defined["FUSED_CHAIN"].count("#") + tail).split()
        else:
            signature = SIGNATURES[base].split()
        bf16 = int(defined.get("BF16", 0))
        self.element = "b*" if bf16 else "f*"
        if bf16 and base == "segment_gemm":  # A, B and C (the first, third and fourth) are element*
            signature = [("b*" if k in (0, 2, 3) else kind) for k, kind in enumerate(signature)]
        elif bf16:  # every row but a sum's target (its last float*), which adds in float32
            summed = len(signature) - 1 - signature[::-1].index("f*") if "scatter" in base else None
            signature = [("b*" if kind == "f*" and k != summed else kind) for k, kind in enumerate(signature)]
        if int(defined.get("OUTER_BF16", 0)):
            signature = [("b*" if k in (0, 2) else kind) for k, kind in enumerate(signature)]
        if len(args) != len(signature):
            self.problems.append(f"{name}: {len(args)} arguments for {len(signature)} parameters")
            return
        for arg, kind in zip(args, signature, strict=True):
            if type(arg) is not (np.uint64 if kind.endswith("*") else SCALARS[kind]):
                self.problems.append(f"{name}: a {type(arg).__name__} argument for {kind}")
        if any(g <= 0 for g in grid) or any(g > 65535 for g in grid[1:]):
            self.problems.append(f"{name}: grid {grid}")
        kinds = int(defined.get("OPERAND_A", 0)), int(defined.get("OPERAND_B", 0))
        getattr(self, base)(name, text, defined, kinds, grid, args)

    def _expression(self, text):
        written = re.search(r"^#define ROW_EXPR\(a, b\) (.*)$", text, re.M).group(1)
        for template, fn in lower.EXPRESSIONS.values():
            pattern = re.escape(template).replace(re.escape("{slope}"), r"(?P<slope>[-0-9.e]+)")
            found = re.fullmatch(pattern, written)
            if found:
                slope = float(found.group("slope")) if "slope" in found.groupdict() else None
                attrs = type("Attrs", (), {"attr": lambda self, key, default=None: slope})()
                return lambda a, b: fn(a, b, attrs)
        raise ValueError(f"no expression reads {written}")

    def _mapped(self, name, text, kinds, args, i, c):
        """ROW_EXPR of the two operands at rows i, columns c."""
        a, b = self.operand(kinds[0], args, 0, i, c, name + " a"), self.operand(kinds[1], args, 4, i, c, name + " b")
        return self._expression(text)(a, b)

    def rows_map(self, name, text, defined, kinds, grid, args):
        rows, width = int(args[-2]), int(args[-1])
        e = torch.arange(rows * width)
        out = self.flat(args[8], self.element, name + " out")
        if rows * width > out.numel():
            self.problems.append(f"{name}: out holds {out.numel()}, {rows * width} written")
        out[e] = self._mapped(name, text, kinds, args, e // width, e % width).to(out.dtype)

    def scatter_map(self, name, text, defined, kinds, grid, args):
        self._sum_into_targets(name, args[8:], lambda i, c: self._mapped(name, text, kinds, args, i, c))

    def _sum_into_targets(self, name, args, value):
        """The chunked sum into targets from its arguments (order, chunk target, first, end, out,
        chunks, width): each chunk's rows order[first:end] summed into its target's row."""
        order, targets, begins, ends = (self.flat(a, kind, name) for a, kind in zip(args, ("l*", "i*", "l*", "l*")))
        out, chunks, width = self.flat(args[4], "f*", name + " out"), int(args[5]), int(args[6])
        lengths = (ends[:chunks] - begins[:chunks]).clamp(min=0)
        if lengths.numel() and int(lengths.max()) > lower.SUM_ROWS:
            self.problems.append(f"{name}: a chunk of {int(lengths.max())} rows")
        chunk = torch.repeat_interleave(torch.arange(chunks), lengths)
        positions = begins[chunk] + torch.arange(len(chunk)) - (lengths.cumsum(0) - lengths)[chunk]
        rows = self.read(order, positions, name + " order")
        i, c = rows.repeat_interleave(width), torch.arange(width).repeat(len(rows))
        target = targets[chunk].long().repeat_interleave(width) * width + c
        if target.numel() and (int(target.max()) >= out.numel() or int(target.min()) < 0):
            self.problems.append(f"{name}: a write outside out")
            return
        out.index_add_(0, target, value(i, c))

    def _chain(self, name, defined, args, i, c):
        """FUSED_CHAIN evaluated at rows i, columns c, leaf j read from the four arguments at 4j, as
        the kernel reads them."""
        tokens = re.findall(r"[\w.@-]+|[(),#]", defined["FUSED_CHAIN"])
        leaf = iter(range(len(tokens)))

        def parse(at):  # -> (values, next position)
            if tokens[at] == "#":
                j = next(leaf)
                return self.operand(int(tokens[at + 1]), args, 4 * j, i, c, f"{name} leaf {j}"), at + 2
            expression, _, slope = tokens[at].partition("@")
            values, at = [], at + 2  # past "name("
            while tokens[at] != ")":
                value, at = parse(at + (tokens[at] == ","))
                values.append(value)
            attrs = type("Attrs", (), {"attr": lambda self, key, default=None: float(slope) if slope else None})()
            return lower.EXPRESSIONS[expression][1](values[0], values[-1], attrs), at + 1

        return parse(0)[0]

    def fused_map(self, name, text, defined, kinds, grid, args):
        rows, width = int(args[-2]), int(args[-1])
        e = torch.arange(rows * width)
        out = self.flat(args[-3], self.element, name + " out")
        if rows * width > out.numel():
            self.problems.append(f"{name}: out holds {out.numel()}, {rows * width} written")
        out[e] = self._chain(name, defined, args, e // width, e % width).to(out.dtype)

    def fused_scatter_map(self, name, text, defined, kinds, grid, args):
        self._sum_into_targets(name, args[-7:], lambda i, c: self._chain(name, defined, args, i, c))

    def rows_dot(self, name, text, defined, kinds, grid, args):
        rows, width, heads = int(args[-3]), int(args[-2]), int(args[-1])
        if width % heads:
            self.problems.append(f"{name}: width {width} in {heads} heads")
            return
        i, c = torch.arange(rows).repeat_interleave(width), torch.arange(width).repeat(rows)
        a = self.operand(kinds[0], args, 0, i, c, name + " a", width, width)
        b = self.operand(kinds[1], args, 3, i, c, name + " b", width, width)
        out = self.flat(args[6], self.element, name + " out")
        out[: rows * heads] = (a * b).reshape(rows * heads, width // heads).sum(1).to(out.dtype)

    def scatter_rows(self, name, text, defined, kinds, grid, args):
        source, width = self.flat(args[0], self.element, name), int(args[-1])
        self._sum_into_targets(name, args[1:], lambda i, c: self.read(source, i * width + c, name).float())

    def edge_softmax(self, name, text, defined, kinds, grid, args):
        kinds = (self.element, "l*", "l*", self.element)
        scores, by_dst, begin, out = (self.flat(args[k], kind, name) for k, kind in enumerate(kinds))
        width = int(args[5])
        for v in range(int(args[4])):
            edges = by_dst[int(begin[v]) : int(begin[v + 1])]
            if len(edges):
                entries = (edges[:, None] * width + torch.arange(width)).reshape(-1)
                values = self.read(scores, entries, name).float().reshape(-1, width)
                out[entries] = torch.softmax(values, 0).reshape(-1).to(out.dtype)

    def max_rows(self, name, text, defined, kinds, grid, args):
        kinds = (self.element, "l*", "l*", self.element)
        source, order, begin, out = (self.flat(args[k], kind, name) for k, kind in enumerate(kinds))
        nodes, width = int(args[4]), int(args[5])
        if nodes * width > out.numel():
            self.problems.append(f"{name}: out holds {out.numel()}, {nodes * width} written")
            return
        for v in range(nodes):
            edges = self.read(order, torch.arange(int(begin[v]), int(begin[v + 1])), name + " order")
            if len(edges):
                entries = (edges[:, None] * width + torch.arange(width)).reshape(-1)
                out[v * width : (v + 1) * width] = self.read(source, entries, name).reshape(-1, width).amax(0)
            else:
                out[v * width : (v + 1) * width] = 0.0

    def segment_gemm(self, name, text, defined, kinds, grid, args):
        element = "b*" if int(defined.get("BF16", 0)) else "f*"
        pointees = [element, "l*", element, element, "l*", "i*", "l*", "l*"]
        a, a_rows, b, c, c_rows, types, begins, ends = (self.flat(args[k], p, name) for k, p in enumerate(pointees))
        k_dim, n_dim = int(args[8]), int(args[9])
        gather, scatter, transpose, accumulate = (
            int(defined.get(key, 0)) for key in ("GATHER_A", "SCATTER_C", "TRANSPOSE_B", "ACCUMULATE")
        )
        tile_m, tile_n = int(defined.get("TILE_M", 64)), int(defined.get("TILE_N", 64))
        if grid != (len(types), -(-n_dim // tile_n)):
            self.problems.append(f"{name}: grid {grid}")
        if int(defined.get("VEC4", 0)) and (k_dim % 4 or n_dim % 4 or any(int(args[k]) % 16 for k in (0, 2, 3))):
            self.problems.append(f"{name}: float4 access to rows that are not 16-byte aligned")
        kk, nn = torch.meshgrid(torch.arange(k_dim), torch.arange(n_dim), indexing="ij")
        for tile in range(grid[0]):
            t, positions = int(types[tile]), torch.arange(int(begins[tile]), int(ends[tile]))
            if len(positions) > tile_m:
                self.problems.append(f"{name}: a tile of {len(positions)} rows for an instance of {tile_m}")
            rows = self.read(a_rows, positions, name + " a_rows") if gather else positions
            left = self.read(a, (rows[:, None] * k_dim + torch.arange(k_dim)).reshape(-1), name + " A")
            right = self.read(
                b, (t * k_dim * n_dim + (nn * k_dim + kk if transpose else kk * n_dim + nn)).reshape(-1), name
            )
            if element == "b*":  # widened exactly; products in float32, rounded to bf16 as they are written
                left, right = left.float(), right.float()
            elif int(defined.get("TENSOR_CORES", 0)):  # both inputs rounded to TF32, as cvt.rna.tf32 does
                left, right = to_tf32(left), to_tf32(right)
            product = (left.reshape(-1, k_dim) @ right.reshape(k_dim, n_dim)).to(c.dtype)
            rows = self.read(c_rows, positions, name + " c_rows") if scatter else positions
            target = (rows[:, None] * n_dim + torch.arange(n_dim)).reshape(-1)
            if target.numel() and int(target.max()) >= c.numel():
                self.problems.append(f"{name}: a write outside C")
            if accumulate:
                c.index_add_(0, target, product.reshape(-1))
            else:
                c[target] = product.reshape(-1)

    def segment_outer(self, name, text, defined, kinds, grid, args):
        element = "b*" if int(defined.get("OUTER_BF16", 0)) else "f*"
        kinds = [element, "l*", element, "l*", "f*", "i*", "l*", "l*"]
        a, a_rows, g, g_rows, d, types, begins, ends = (self.flat(args[k], kind, name) for k, kind in enumerate(kinds))
        k_dim, n_dim = int(args[8]), int(args[9])
        if grid != (len(types), -(-n_dim // 64), -(-k_dim // 64)):
            self.problems.append(f"{name}: grid {grid}")
        if int(defined.get("VEC4", 0)) and (k_dim % 4 or n_dim % 4 or any(int(args[k]) % 16 for k in (0, 2))):
            self.problems.append(f"{name}: float4 access to rows that are not 16-byte aligned")
        for tile in range(grid[0]):
            t, positions = int(types[tile]), torch.arange(int(begins[tile]), int(ends[tile]))
            if len(positions) > int(defined["OUTER_ROWS"]):  # its row ids would overrun shared memory
                self.problems.append(f"{name}: a tile of {len(positions)} positions, {defined['OUTER_ROWS']} at most")
            ra = self.read(a_rows, positions, name) if int(defined.get("GATHER_A", 0)) else positions
            rg = self.read(g_rows, positions, name) if int(defined.get("GATHER_G", 0)) else positions
            left = self.read(a, (ra[:, None] * k_dim + torch.arange(k_dim)).reshape(-1), name).reshape(-1, k_dim)
            right = self.read(g, (rg[:, None] * n_dim + torch.arange(n_dim)).reshape(-1), name).reshape(-1, n_dim)
            target = t * k_dim * n_dim + torch.arange(k_dim * n_dim)
            if target.numel() and int(target.max()) >= d.numel():
                self.problems.append(f"{name}: a write outside D")
            d.index_add_(0, target, (left.float().T @ right.float()).reshape(-1))


def to_tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 rounded to TF32's 10 mantissa bits, to nearest with ties away from zero."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def install(monkeypatch) -> KernelModel:
    """Route codegen's launches to a fresh model (for one test)."""
    model = KernelModel()
    monkeypatch.setattr(nvrtc, "launch", model.launch)
    monkeypatch.setattr(nvrtc, "function", lambda module, name: functools.partial(model.launch, module, name))
    monkeypatch.setattr(nvrtc, "on_torch_stream", contextlib.nullcontext)
    monkeypatch.setattr(codegen, "_kernels", {})  # none compiled for another model or the GPU
    monkeypatch.setattr(codegen, "_module", lambda text: text)
    monkeypatch.setattr(codegen, "_ptr", model.pointer)
    return model
