"""CUDA code generation: each step of a plan (systems/hector/lower.py) becomes an instance of one of
the two templates in ``kernels/`` (``gemm.cu``, ``traversal.cu``), specialized by ``#define``s
written before the template's text: which operand is read how, the row-wise expression, whether
the weight is transposed. Instances are named by the hash of their text, compiled by NVRTC through
the suite's kernel machinery (systems/nvrtc.py: cached in the process and on disk) and launched
on torch's current stream. :func:`sources` lists every instance a program needs, so CI compiles
them all for sm_90 with nvcc, without a GPU.

A plan runs on float32 tensors, or on bfloat16 ones (:data:`ELEMENT_TYPES`). In bf16 every row
is stored as a bf16 and computed in float32: the products on bf16 tensor cores (the GEMM
template's BF16 variant, fp32 accumulate), the traversal template's arithmetic, softmax and
sums in float (its BF16 variant). Sums into targets and weight gradients add into float32
buffers; such a sum is rounded to bf16 once, when whole, where a kernel reads it, and otherwise
kept in float32 until the plan's results are rounded to the tensors' type: a weight's gradient
parts are added in float32. Host weight algebra computes in float32 likewise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import math
import os
import re
from pathlib import Path

import numpy as np
import torch

from systems import nvrtc
from systems.hector import lower
from systems.hector.ir import Program, Value

KERNELS = Path(__file__).parent / "kernels"
OPERAND_KINDS = {"own": 0, "indexed": 1, "scalar": 2, "shared": 3}
THREADS = 256
ELEMENT_TYPES = (torch.float32, torch.bfloat16)  # what a plan's tensors may hold (one type per run)


@dataclasses.dataclass(frozen=True)
class GemmShape:
    """A GEMM instance's tile (rows x columns, each 64 or 128), whether it moves rows in 16-byte
    pieces (quads of float32s in one load; 8 bf16s by one cp.async), whether it multiplies on
    tensor cores (the labelled TF32 variant: inputs rounded to TF32, fp32 accumulate), and whether
    its rows and weights are bf16 (the template alone, on bf16 tensor cores: bf16 in, fp32
    accumulate, bf16 out)."""

    rows: int = 64
    columns: int = 64
    vec4: bool = False
    tensor_cores: bool = False
    bf16: bool = False

    def __post_init__(self):
        if self.bf16 and not self.tensor_cores:
            raise ValueError("the bf16 variant multiplies on tensor cores")

    def shared_bytes(self, transpose_b: bool = False) -> int:
        """The dynamic shared memory a launch passes: the bf16 variant's pipeline stages of A's and
        B's tiles (k = 32 each, rows padded by 8), which its results reuse; as gemm.cu's POOL
        computes it. 0 for the float32 variants, whose arrays are static."""
        if not self.bf16:
            return 0
        stages = 3 if self.columns == 64 else 4
        a_stage = self.rows * (32 + 8)
        b_stage = self.columns * (32 + 8) if transpose_b else 32 * (self.columns + 8)
        return 2 * max(stages * (a_stage + b_stage), self.rows * (self.columns + 8))

    def defines(self) -> dict:
        shape = {"TILE_M": self.rows, "TILE_N": self.columns, "VEC4": int(self.vec4)}
        return shape | ({"TENSOR_CORES": 1} if self.tensor_cores else {}) | ({"BF16": 1} if self.bf16 else {})


# What gemm_shape picks from (CI compiles each; the bf16 ones through segment_gemm_source).
GEMM_SHAPES = [GemmShape(m, m, v, tc) for m in (64, 128) for v in (False, True) for tc in (False, True)]
BF16_SHAPES = [GemmShape(128, n, v, True, True) for n in (64, 128) for v in (False, True)]
OUTER_SHAPES = [GemmShape(vec4=v) for v in (False, True)]  # the weight gradients': 64 x 64, fp32


def gemm_shape(k: int, n: int, *tensors: torch.Tensor, tensor_cores: bool = False, bf16: bool = False) -> GemmShape:
    """The tile for a product with k inputs and n outputs per row: 128 x 128 where n passes 64
    (twice the work per shared-memory read), else 64 x 64 (less padding in short segments); quads
    moved in one load where every row starts aligned to one. The bf16 variant's tiles are 128 rows
    high (a block keeps twice the bytes of A in flight, and reads its weight for twice the rows),
    with 64 or 128 columns as n asks, and move 16-byte pieces where :func:`pieces_fit`."""
    if bf16:
        return GemmShape(128, 128 if n > 64 else 64, pieces_fit(k, n, *tensors), True, True)
    size = 128 if n > 64 else 64
    return GemmShape(size, size, quads_fit(k, n, *tensors), tensor_cores, bf16)


def quads_fit(k: int, n: int, *tensors: torch.Tensor) -> bool:
    """Whether rows of k and of n entries can move as quads (a float4, or four bf16s in 8 bytes):
    whole quads, and every row aligned to a quad (the tensors 16-byte aligned, so rows of a
    multiple of 4 entries are)."""
    return k % 4 == 0 and n % 4 == 0 and all(t.data_ptr() % 16 == 0 for t in tensors)


def pieces_fit(k: int, n: int, *tensors: torch.Tensor) -> bool:
    """Whether rows of k and of n bf16s can move in 16-byte pieces of 8 (cp.async copies 16
    aligned bytes, and the results are stored so): whole pieces, and every row aligned to one (the
    tensors 16-byte aligned, so rows of a multiple of 8 bf16s are, and so is each type's weight).
    Otherwise the bf16 variant reads and writes entry by entry."""
    return k % 8 == 0 and n % 8 == 0 and all(t.data_ptr() % 16 == 0 for t in tensors)


@functools.lru_cache(maxsize=4096)  # steps hash by identity of their values: one lookup per launch
def source_of(step, shape: GemmShape = GemmShape(), bf16: bool = False) -> tuple[str, str, str]:
    """The instance of ``step`` (a GEMM's in ``shape``, whose ``bf16`` says its element type; the
    others' is ``bf16``): (entry point, CUDA source, template file)."""
    if isinstance(step, lower.Gemm):
        defines = {"GATHER_A": 1, "SCATTER_C": 1, "TRANSPOSE_B": int(step.transpose), **shape.defines()}
        return _instance("gemm.cu", "GEMM_NAME", "segment_gemm", defines)
    # The traversal template's (and the weight gradients') bf16 variant: bf16 rows, float32 sums.
    element = {"BF16": 1} if bf16 else {}
    if isinstance(step, lower.Outer):
        defines = {"GATHER_A": 1, "GATHER_G": 1, "VEC4": int(shape.vec4), "OUTER_ROWS": lower.OUTER_ROWS}
        return _instance("gemm.cu", "OUTER_NAME", "segment_outer", defines | ({"OUTER_BF16": 1} if bf16 else {}))
    if isinstance(step, lower.Map | lower.Dot | lower.ScatterMap):
        defines = element | {"OPERAND_A": OPERAND_KINDS[step.a.kind], "OPERAND_B": OPERAND_KINDS[step.b.kind]}
        if isinstance(step, lower.Dot):
            return _instance("traversal.cu", "DOT_NAME", "rows_dot", defines)
        mapped = step.mapped if isinstance(step, lower.ScatterMap) else step.out
        slope = mapped.attr("slope")
        literal = repr(float(slope)) if slope is not None else ""  # 0 -> "0.0", so "0.0f" is a float literal
        defines["ROW_EXPR(a, b)"] = lower.EXPRESSIONS[step.expression][0].format(slope=literal)
        if isinstance(step, lower.ScatterMap):
            return _instance("traversal.cu", "SCATTER_MAP_NAME", "scatter_map", defines)
        return _instance("traversal.cu", "MAP_NAME", "rows_map", defines)
    if isinstance(step, lower.Fused):
        leaves = step.leaves()
        params = ", ".join(
            f"const element* __restrict__ t{k}, const long long* __restrict__ x{k}, float s{k}, int w{k}"
            for k in range(len(leaves))
        )
        defines = element | {
            "FUSED_CHAIN": fused_chain(step.root),  # for readers (and the tests' kernel model)
            "FUSED_PARAMS": params,
            "FUSED_VALUE(i, c)": fused_expression(step.root, iter(range(len(leaves)))),
        }
        if step.index:
            return _instance("traversal.cu", "FUSED_SCATTER_MAP_NAME", "fused_scatter_map", defines)
        return _instance("traversal.cu", "FUSED_MAP_NAME", "fused_map", defines)
    # Named by their entry point alone: one instance per element type, the bf16 one in its own module.
    if isinstance(step, lower.Scatter):
        return _instance("traversal.cu", None, "scatter_rows", element)
    if isinstance(step, lower.Softmax):
        return _instance("traversal.cu", None, "edge_softmax", element)
    if isinstance(step, lower.Max):
        return _instance("traversal.cu", None, "max_rows", element)
    raise TypeError(f"{type(step).__name__} steps run on the host")


def fused_expression(node: lower.Node, numbers) -> str:
    """The CUDA expression of a fused chain: a lambda called in place that names each leaf and each
    operator's value once (``const float vK``), leaf k read as ``operand(kind, t_k, x_k, s_k, i,
    c, w_k, width)`` at the kernel's output width (``numbers`` hands out k). Named, not nested: a
    template that reads its operand several times (leaky_relu three, gelu two) would otherwise
    paste the whole chain below it as often, and the source grow exponentially with the depth."""
    lines: list[str] = []

    def value(text: str) -> str:
        lines.append(f"const float v{len(lines)} = {text};")
        return f"v{len(lines) - 1}"

    def emit(node: lower.Node) -> str:
        args = []
        for arg in node.args:
            if isinstance(arg, lower.Node):
                args.append(emit(arg))
            else:
                k = next(numbers)
                args.append(value(f"operand({OPERAND_KINDS[arg.kind]}, t{k}, x{k}, s{k}, i, c, w{k}, width)"))
        slope = node.mapped.attr("slope")
        template = lower.EXPRESSIONS[node.expression][0].format(slope=repr(float(slope)) if slope is not None else "")
        by_name = {"a": args[0], "b": args[-1]}
        return value(re.sub(r"\b[ab]\b", lambda m: by_name[m.group(0)], template))

    root = emit(node)
    return f"([&] {{ {' '.join(lines)} return {root}; }}())"


def fused_chain(node: lower.Node) -> str:
    """The chain in prefix form, one token per operator (``leaky_relu@0.2`` with its slope) and
    ``#kind`` per leaf: what the kernel computes, in a form a test can evaluate."""
    slope = node.mapped.attr("slope")
    name = node.expression if slope is None else f"{node.expression}@{float(slope)!r}"
    parts = [fused_chain(a) if isinstance(a, lower.Node) else f"#{OPERAND_KINDS[a.kind]}" for a in node.args]
    return f"{name}({','.join(parts)})"


def _instance(template: str, name_macro: str | None, base: str, defines: dict) -> tuple[str, str, str]:
    body = "".join(f"#define {k} {v}\n" for k, v in defines.items())
    digest = hashlib.sha256((template + body).encode()).hexdigest()[:10]
    name = f"{base}_{digest}" if name_macro else base
    if name_macro:
        body += f"#define {name_macro} {name}\n"
    return name, body + _template(template), template


@functools.cache
def _template(name: str) -> str:
    return (KERNELS / name).read_text()


def sources(program: Program, bf16: bool = False) -> dict[str, str]:
    """Every kernel instance ``program`` needs on float32 tensors, or with ``bf16`` on bf16 ones,
    by entry point (a bf16 instance whose entry point has no hash in its name: ``<name>_bf16``)."""
    found = {}
    for step in lower.lower(program).steps:
        if not isinstance(step, lower.Host):
            gemms = BF16_SHAPES if bf16 else GEMM_SHAPES
            shapes = {lower.Gemm: gemms, lower.Outer: OUTER_SHAPES}.get(type(step), [GemmShape()])
            for shape in shapes:
                name, text, _ = source_of(step, shape, bf16)
                found[name + ("_bf16" if bf16 and name in _UNHASHED else "")] = text
    return found


_UNHASHED = ("scatter_rows", "edge_softmax", "max_rows")


@functools.cache  # written and hashed once per shape, not on every call of segment_gemm
def segment_gemm_source(shape: GemmShape) -> tuple[str, str]:
    """The standalone template's instance (rows read and written in place): (entry point, source)."""
    defines = {"GATHER_A": 0, "SCATTER_C": 0, "TRANSPOSE_B": 0, **shape.defines()}
    return _instance("gemm.cu", "GEMM_NAME", "segment_gemm", defines)[:2]


_modules: dict[str, object] = {}
_kernels: dict[tuple[int, GemmShape, bool], tuple[object, object]] = {}


def kernel_of(step, shape: GemmShape = GemmShape(), bf16: bool = False, shared: int = 0, device=None):
    """The compiled kernel of ``step`` in ``shape`` (in bf16 for ``bf16``), made once per step:
    writing and hashing an instance's text cost tens of microseconds, which a plan's every launch
    would pay. ``shared``: the dynamic shared memory its launches on ``device`` pass
    (:func:`allow_shared`)."""
    found = _kernels.get((id(step), shape, bf16))
    if found is None:
        name, text, _ = source_of(step, shape, bf16)
        module = _module(text)
        found = _kernels[(id(step), shape, bf16)] = (step, nvrtc.function(module, name), module, name)  # step kept
    if shared:
        allow_shared(found[2], found[3], shared, device)
    return found[1]


def _module(text: str):
    """The compiled module of an instance's text (kept per process; NVRTC's binaries also on disk)."""
    if text in _modules:
        return _modules[text]

    cache = Path(os.environ.get("SUITE_HECTOR_CACHE", Path.home() / ".cache" / "data-efficient-suite" / "hector"))
    path = cache / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.cu"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(text)
        os.replace(partial, path)
    module = _modules[text] = nvrtc.load_module(path)
    return module


def run(
    plan: lower.Plan, graph, tensors: dict[str, torch.Tensor], widths: dict, tensor_cores: bool = False
) -> list[torch.Tensor]:
    """Run ``plan`` on the GPU with the generated kernels (CUDA tensors, all float32 or all bf16:
    the results in their type); with ``tensor_cores`` float32 products (not the weight
    gradients' outer products) in TF32. bf16 products are always on tensor cores.

    The first call for a graph and the given tensors' shapes works every step out (tiles, widths,
    tile shape, grid, arguments) and records it as a :class:`_Replay`; later calls only allocate
    each step's result, put the tensors' pointers into the recorded arguments and launch. On the
    small graphs the working-out cost several times the kernels' own time."""
    index = lower.GraphIndex.of(graph)
    given = {}
    storage = tensors[plan.given[0].name].dtype if plan.given else torch.float32
    for v in plan.given:
        t = tensors[v.name]
        if t.dtype != storage or storage not in ELEMENT_TYPES or t.device != graph.src.device:
            raise ValueError(
                f"{v.name}: {storage} (float32 or bfloat16, as every tensor) on {graph.src.device} wanted, "
                f"got {t.dtype} on {t.device}"
            )
        given[id(v)] = t.contiguous()
    # What the working-out reads besides the graph: shapes, widths, precision, and whether each row
    # starts 16-byte aligned (float4 moves); results are fresh allocations, always aligned.
    key = (id(plan), tensor_cores, storage, frozenset(widths.items()))
    key += tuple((tuple(t.shape), t.data_ptr() % 16 == 0) for t in given.values())
    recorded = index.replays.get(key)
    on_device = torch.cuda.device(graph.src.device) if graph.src.is_cuda else contextlib.nullcontext()
    with on_device, nvrtc.on_torch_stream() if graph.src.is_cuda else contextlib.nullcontext():
        if recorded is not None and recorded.plan is plan:
            env = recorded.run(given, index)
        else:
            runner = _Runner(plan, graph, widths, index, tensor_cores, storage)
            runner.env.update(given)
            ranged = _profiling()
            for step in plan.steps:
                with _range(step, ranged):
                    runner.env[id(step.out)] = runner.step(step)
            env = runner.env
            # None (a step could not be recorded: aliased inputs) is tried again next call, so a
            # later call on distinct tensors of the same shapes still gets a record.
            index.replays[key] = _Replay(plan, runner.recorded, runner.unused) if runner.recorded else None
    return [env[id(o)].to(storage) for o in plan.program.outputs]  # float32 sums rounded once, in bf16


def _range(step, ranged: bool):
    """Under the profiler each step is a range named per template (hector::gemm, hector::map, ...):
    the host time per step shows in the profiler's tables, and the breakdown counts the bytes a
    step allocates for its kind (systems/rgnn/breakdown.py). Otherwise no range: each is two
    dispatched operators, which add up over a plan's steps."""
    return torch.profiler.record_function(range_name(step)) if ranged else contextlib.nullcontext()


@dataclasses.dataclass
class _Launch:
    """One recorded step: its result's allocation, its launch (None where there was nothing to
    compute) with the argument list, whose tensor pointers ``slots`` name by position: the env
    key of the value, or None for the step's own result."""

    step: object
    shape: tuple[int, ...]
    zero: bool
    view: tuple[int, ...] | None  # the result as the step returns it (a reshaped view), or None
    dtype: torch.dtype = torch.float32  # the allocation's
    rounded: torch.dtype | None = None  # a float32 sum as the plan keeps it (bf16 where a kernel reads it)
    shared: int = 0  # the launch's dynamic shared memory
    kernel: object = None
    grid: tuple[int, ...] = ()
    arguments: tuple = ()
    slots: tuple[tuple[int, int | None], ...] = ()


@dataclasses.dataclass
class _Host:
    """A recorded host step, with the type its value is kept in."""

    step: lower.Host
    dtype: torch.dtype


def host_value(out, args: list[torch.Tensor], index: lower.GraphIndex, dtype: torch.dtype) -> torch.Tensor:
    """A :class:`lower.Host` step's value computed in float32 (bf16 arguments widened: weight
    algebra and gradient sums in float32), kept as ``dtype``."""
    return lower.host_value(out, [a.float() for a in args], index).to(dtype).contiguous()


@dataclasses.dataclass
class _Replay:
    """A plan's steps on one graph as :class:`_Runner` worked them out, to launch again."""

    plan: lower.Plan  # kept: ids stay unique, and a key is checked against it
    steps: list
    unused: torch.Tensor  # the recorded arguments point at it

    def run(self, given: dict[int, torch.Tensor], index: lower.GraphIndex) -> dict[int, torch.Tensor]:
        env = dict(given)
        device, ranged = self.unused.device, _profiling()
        for r in self.steps:
            with _range(r.step, ranged):
                if isinstance(r, _Host):
                    env[id(r.step.out)] = host_value(r.step.out, [env[id(a)] for a in r.step.out.args], index, r.dtype)
                    continue
                result = (torch.zeros if r.zero else torch.empty)(r.shape, device=device, dtype=r.dtype)
                if r.kernel is not None:
                    arguments = list(r.arguments)
                    for position, value in r.slots:
                        arguments[position] = _ptr(result if value is None else env[value])
                    r.kernel(r.grid, (THREADS,), tuple(arguments), shared_mem=r.shared)
                result = result if r.view is None else result.view(r.view)
                env[id(r.step.out)] = result if r.rounded is None else result.to(r.rounded)
        return env


def _read_by_kernels(plan: lower.Plan) -> frozenset[int]:
    """The ids of the values some kernel of ``plan`` reads: its operands (a fused chain's leaves),
    a GEMM's weight, the rows a sum, softmax or maximum reads."""
    found = set()
    for step in plan.steps:
        if isinstance(step, lower.Host):
            continue
        operands = step.leaves() if isinstance(step, lower.Fused) else [getattr(step, n, None) for n in ("a", "b", "g")]
        found |= {id(o.value) for o in operands if isinstance(o, lower.Operand) and o.value is not None}
        found |= {id(v) for v in (getattr(step, n, None) for n in ("b", "source", "scores")) if isinstance(v, Value)}
    return frozenset(found)


def range_name(step) -> str:
    """The profiler range of a step: ``hector::`` and its kind (a fused chain summed into targets
    is ``fusedscatter``), which systems/rgnn/breakdown.py classes."""
    kind = type(step).__name__.lower()
    return f"hector::{kind}scatter" if isinstance(step, lower.Fused) and step.index else f"hector::{kind}"


def _profiling() -> bool:
    enabled = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None)
    return enabled() if enabled is not None else True  # unknown: keep the ranges


def _ptr(t: torch.Tensor):
    return np.uint64(t.data_ptr())


def _blocks(work: int) -> int:
    return max(1, min(math.ceil(work / THREADS), 65535 * 4))  # grid-stride loops cover the rest


class _Runner:
    """One plan's run: its values by id, the graph's index arrays, and a launch per step, each
    also recorded (:class:`_Launch`) for :class:`_Replay`."""

    def __init__(
        self,
        plan: lower.Plan,
        graph,
        widths: dict,
        index: lower.GraphIndex,
        tensor_cores: bool = False,
        storage: torch.dtype = torch.float32,
    ):
        self.graph, self.widths, self.index, self.tensor_cores = graph, widths, index, tensor_cores
        self.storage, self.bf16 = storage, storage == torch.bfloat16
        self.read_by_kernels = _read_by_kernels(plan)
        self.env: dict[int, torch.Tensor] = {}
        self.device = graph.src.device
        self.unused = torch.zeros(1, dtype=torch.int64, device=self.device)  # an unused pointer argument
        self.recorded: list | None = []  # None once a step could not be recorded: no replay then

    def alloc(self, *shape: int, zero: bool = False, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A step's result (each step allocates exactly one), in the rows' type unless ``dtype``."""
        dtype = dtype or self.storage
        result = (torch.zeros if zero else torch.empty)(shape, device=self.device, dtype=dtype)
        self.allocated.append((shape, zero, dtype, result))
        return result

    def kept_as(self, v) -> torch.dtype:
        """The type a float32 sum or host value is kept in: the rows' where a kernel reads it (bf16
        kernels read bf16 rows), else float32 until the plan's results are rounded."""
        return self.storage if id(v) in self.read_by_kernels else torch.float32

    def step(self, step) -> torch.Tensor:
        if isinstance(step, lower.Host):
            kept = self.kept_as(step.out)
            if self.recorded is not None:
                self.recorded.append(_Host(step, kept))
            return host_value(step.out, [self.env[id(a)] for a in step.out.args], self.index, kept)
        self.allocated, launched = [], []

        def launch(grid, args, shape: GemmShape = GemmShape(), shared: int = 0):
            kernel = kernel_of(step, shape, self.bf16, shared, self.device)
            kernel(grid, (THREADS,), args, shared_mem=shared)  # on the stream run() entered
            launched.append((kernel, grid, args, shared))

        out = getattr(self, type(step).__name__.lower())(step, launch)
        rounded = self.kept_as(step.out) if out.dtype != self.kept_as(step.out) else None
        if self.recorded is not None:
            recorded = self.record(step, out, launched, rounded)
            if recorded is None:
                self.recorded = None
            else:
                self.recorded.append(recorded)
        return out if rounded is None else out.to(rounded)

    def record(self, step, out: torch.Tensor, launched: list, rounded: torch.dtype | None) -> _Launch | None:
        """The step as :class:`_Replay` launches it again, or None where its arguments cannot be
        told apart by pointer (two live values at one address: a caller's aliased tensors)."""
        if len(self.allocated) != 1 or len(launched) > 1:
            return None
        shape, zero, dtype, result = self.allocated[0]
        if out.data_ptr() != result.data_ptr() or not out.is_contiguous():
            return None
        view = None if out is result else tuple(out.shape)
        found = _Launch(step, shape, zero, view, dtype, rounded)
        if not launched:
            return found
        found.kernel, found.grid, found.arguments, found.shared = launched[0]
        owners: dict[int, list] = {}
        for key, value in self.env.items():
            if value.numel():
                owners.setdefault(value.data_ptr(), []).append(key)
        if result.numel():
            owners.setdefault(result.data_ptr(), []).append(None)
        slots = []
        for position, argument in enumerate(found.arguments):
            if isinstance(argument, np.uint64) and int(argument) in owners:  # pointers only: other types are sizes
                keys = owners[int(argument)]
                if len(keys) > 1:
                    return None
                slots.append((position, keys[0]))
        found.slots = tuple(slots)
        return found

    def operand(self, o: lower.Operand) -> tuple:
        """A traversal operand's (pointer, index pointer, scalar, width) arguments."""
        if o.kind == "scalar":
            symbol = o.value.attr("rsqrt") if o.value is not None else None
            number = o.scalar if symbol is None else self.widths[symbol] ** -0.5
            return (_ptr(self.unused), _ptr(self.unused), np.float32(number), np.int32(1))
        base = self.env[id(o.value)]
        if base.dtype != self.storage:  # _read_by_kernels keeps what a kernel reads in the rows' type
            raise AssertionError(f"a {base.dtype} operand in a plan of {self.storage} rows")
        # A shared vector is one row of all its entries; an indexed 1-d table has rows of one.
        # A row's width: a shared vector is one row; a table [rows], [rows, w] or [types, in, 1].
        width = base.numel() if o.kind == "shared" else math.prod(base.shape[1:])
        idx = self.index[o.index] if o.kind == "indexed" else self.unused
        return (_ptr(base), _ptr(idx), np.float32(0), np.int32(width))

    def gemm(self, step: lower.Gemm, launch) -> torch.Tensor:
        a, b = self.env[id(step.a.value)], self.env[id(step.b)]
        if a.dtype != self.storage or b.dtype != self.storage:
            raise AssertionError(f"a product of {a.dtype} by {b.dtype} in a plan of {self.storage} rows")
        n = b.shape[-2] if step.transpose else b.shape[-1]
        result = self.alloc(self.index.rows(step.out.domain), n)
        shape = gemm_shape(a.shape[1], n, a, b, result, tensor_cores=self.tensor_cores, bf16=self.bf16)
        types, begins, ends = self.index.tiles(step.order, shape.rows)
        if len(types) and n:
            rows_a, rows_c = self.index[self.index.positions(step.a, step.order)], self.index[step.order]
            pointers = (a, rows_a, b, result, rows_c, types, begins, ends)
            grid = (len(types), math.ceil(n / shape.columns))
            args = (*map(_ptr, pointers), np.int32(a.shape[1]), np.int32(n))
            launch(grid, args, shape, shape.shared_bytes(step.transpose))
        return result

    def outer(self, step: lower.Outer, launch) -> torch.Tensor:
        a, g = self.env[id(step.a.value)], self.env[id(step.g.value)]
        count = self.index.types(step.order.split(":")[1]) if step.order.startswith("order") else 1
        result = self.alloc(count, a.shape[1], g.shape[1], zero=True, dtype=torch.float32)  # summed in float32
        types, begins, ends = self.index.tiles(step.order, lower.OUTER_ROWS)
        if len(types) and a.shape[1] and g.shape[1]:
            rows_a = self.index[self.index.positions(step.a, step.order)]
            rows_g = self.index[self.index.positions(step.g, step.order)]
            pointers = (a, rows_a, g, rows_g, result, types, begins, ends)
            grid = (len(types), math.ceil(g.shape[1] / 64), math.ceil(a.shape[1] / 64))
            shape = GemmShape(vec4=quads_fit(a.shape[1], g.shape[1], a, g))
            launch(grid, (*map(_ptr, pointers), np.int32(a.shape[1]), np.int32(g.shape[1])), shape)
        return result if step.out.per else result[0]

    def map(self, step: lower.Map, launch) -> torch.Tensor:
        rows = self.index.rows(step.out.domain)
        a, b = self.operand(step.a), self.operand(step.b)
        width = int(a[3] if step.expression in lower.UNARY else max(a[3], b[3]))
        result = self.alloc(rows, width)
        if result.numel():
            launch((_blocks(result.numel()),), (*a, *b, _ptr(result), np.int64(rows), np.int32(width)))
        return result

    def dot(self, step: lower.Dot, launch) -> torch.Tensor:
        rows = self.index.rows(step.out.domain)
        a, b = self.operand(step.a), self.operand(step.b)
        if step.a.kind != "scalar" and step.b.kind != "scalar" and a[3] != b[3]:
            raise AssertionError(f"rows_dot of widths {a[3]} and {b[3]}: the language makes them equal")
        width = int(max(a[3], b[3]))
        if width % step.heads:
            raise ValueError(f"a dot of width {width} in {step.heads} heads: the width must be a multiple")
        result = self.alloc(rows, step.heads)
        if rows:
            args = (*a[:3], *b[:3], _ptr(result), np.int64(rows), np.int32(width), np.int32(step.heads))
            launch((_blocks(rows * step.heads * 32),), args)
        return result

    def fused(self, step: lower.Fused, launch) -> torch.Tensor:
        leaves = [self.operand(o) for o in step.leaves()]
        width = int(max(leaf[3] for leaf in leaves))
        operands = [a for leaf in leaves for a in leaf]
        if step.index:
            return self.sum_into_targets(step, width, operands, launch)
        rows = self.index.rows(step.out.domain)
        result = self.alloc(rows, width)
        if rows and width:
            launch((_blocks(rows * width),), (*operands, _ptr(result), np.int64(rows), np.int32(width)))
        return result

    def scatter(self, step: lower.Scatter, launch) -> torch.Tensor:
        source = self.env[id(step.source)]
        return self.sum_into_targets(step, source.shape[1], [_ptr(source)], launch)

    def scattermap(self, step: lower.ScatterMap, launch) -> torch.Tensor:
        a, b = self.operand(step.a), self.operand(step.b)
        width = int(a[3] if step.expression in lower.UNARY else max(a[3], b[3]))
        return self.sum_into_targets(step, width, [*a, *b], launch)

    def sum_into_targets(self, step, width: int, operands: list, launch) -> torch.Tensor:
        """A step's rows summed into ``step.count``'s rows by ``step.index``: the kernel reads
        ``operands``, then the rows' destination-parallel chunks (kernels/traversal.cu)."""
        result = self.alloc(self.index.rows(step.count), width, zero=True, dtype=torch.float32)  # summed in float32
        order, targets, begins, ends = self.index.chunks(step.index, step.count)
        if len(targets) and width:
            chunks = (_ptr(order), _ptr(targets), _ptr(begins), _ptr(ends), _ptr(result))
            launch((_blocks(len(targets) * 32),), (*operands, *chunks, np.int64(len(targets)), np.int32(width)))
        return lower.shaped(step.out, result)

    def softmax(self, step: lower.Softmax, launch) -> torch.Tensor:
        scores = self.env[id(step.scores)]
        result = self.alloc(*scores.shape)
        nodes, width = self.graph.num_nodes, scores.shape[1]
        if nodes and width:
            pointers = (scores, self.index["by_dst"], self.index["dst_begin"], result)
            launch((_blocks(nodes * width * 32),), (*map(_ptr, pointers), np.int64(nodes), np.int32(width)))
        return result

    def max(self, step: lower.Max, launch) -> torch.Tensor:
        source = self.env[id(step.source)]
        nodes, width = self.graph.num_nodes, source.shape[1]
        result = self.alloc(nodes, width)
        if nodes and width:
            pointers = (source, self.index[f"by_{step.end}"], self.index[f"{step.end}_begin"], result)
            launch((_blocks(nodes * width),), (*map(_ptr, pointers), np.int64(nodes), np.int32(width)))
        return result


@dataclasses.dataclass(frozen=True, eq=False)
class Segments:
    """Rows in type order (type t at ``offsets[t]:offsets[t + 1]``), checked and cut into tiles
    once (of 64 and of 128 rows unless ``heights`` says), as the model path does once per graph
    (lower.GraphIndex): a call of :func:`segment_gemm` on them then only allocates its result and
    launches one kernel. Made by :meth:`of`, which checks the offsets."""

    offsets: torch.Tensor
    rows: int
    tiles: dict  # rows per tile -> lower.tile_schedule
    unused: torch.Tensor  # the index-list arguments: rows are read and written in place

    @classmethod
    def of(cls, offsets: torch.Tensor, rows: int, device, heights=(64, 128)) -> Segments:
        offsets = torch.as_tensor(offsets).to(device)  # the tile list is built where the rows live
        if offsets.dim() != 1 or not offsets.numel() or offsets.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"offsets must be a 1-d integer tensor of types + 1 entries, got {tuple(offsets.shape)}")
        offsets = offsets.long()
        if bool((offsets[0] != 0) | (offsets[-1] != rows) | (offsets.diff() < 0).any()):  # one sync
            raise ValueError("offsets must rise from 0 to the number of rows")
        tiles = {m: lower.tile_schedule(offsets, rows, m) for m in heights}
        return cls(offsets, rows, tiles, torch.zeros(1, dtype=torch.int64, device=device))


def segment_gemm(
    rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor | Segments, tensor_cores: bool = False
) -> torch.Tensor:
    """The GEMM template alone: ``rows[offsets[t]:offsets[t+1]] @ weight[t]`` for every type t, rows
    already in type order (what ``grouped_mm`` computes), on CUDA tensors, given ``offsets`` or
    their :class:`Segments`. float32 rows and weights: exact float32, or with ``tensor_cores``
    the TF32 variant. bfloat16 ones (``tensor_cores`` required): the bf16 variant (bf16 tensor
    cores, fp32 accumulate), a bf16 result rounded once.
    For the template's benchmark against stock torch on equal segment shapes."""
    if rows.dtype != weight.dtype or rows.dtype not in (torch.float32, torch.bfloat16) or not rows.is_cuda:
        raise ValueError(
            f"segment_gemm takes float32 or bfloat16 CUDA tensors, got {rows.dtype} and {weight.dtype} on {rows.device}"
        )
    bf16 = rows.dtype == torch.bfloat16
    if bf16 and not tensor_cores:
        raise ValueError("the bf16 variant multiplies on tensor cores: pass tensor_cores=True")
    if weight.device != rows.device:
        raise ValueError(f"rows on {rows.device}, weight on {weight.device}: one device wanted")
    if weight.dim() != 3 or weight.shape[1] != rows.shape[1]:
        raise ValueError(f"rows {tuple(rows.shape)} and weight {tuple(weight.shape)} do not fit")
    rows, weight = rows.contiguous(), weight.contiguous()
    n = weight.shape[2]
    out = torch.empty(rows.shape[0], n, device=rows.device, dtype=rows.dtype)
    shape = gemm_shape(rows.shape[1], n, rows, weight, out, tensor_cores=tensor_cores, bf16=bf16)
    if isinstance(offsets, Segments):
        layout = offsets
        if layout.offsets.device != rows.device or layout.rows != rows.shape[0]:
            raise ValueError(
                f"the segments cover {layout.rows} rows on {layout.offsets.device}, "
                f"not {rows.shape[0]} on {rows.device}"
            )
    else:
        layout = Segments.of(offsets, rows.shape[0], rows.device, heights=(shape.rows,))
    if layout.offsets.shape != (weight.shape[0] + 1,):
        raise ValueError(f"weight {tuple(weight.shape)} and offsets {tuple(layout.offsets.shape)} do not fit")
    schedule = layout.tiles[shape.rows]
    name, text = segment_gemm_source(shape)
    if len(schedule[0]) and n:
        pointers = (rows, layout.unused, weight, out, layout.unused, *schedule)
        grid = (len(schedule[0]), math.ceil(n / shape.columns))
        args = (*map(_ptr, pointers), np.int32(rows.shape[1]), np.int32(n))
        module, shared = _module(text), shape.shared_bytes()
        if shared:
            allow_shared(module, name, shared, rows.device)
        nvrtc.launch(module, name, grid, (THREADS,), args, shared)
    return out


_shared_allowed: set[tuple[str, int, str]] = set()


def allow_shared(module, name: str, size: int, device) -> None:
    """Lets kernel ``name`` take ``size`` bytes of dynamic shared memory (past 48 KB a kernel must
    be allowed to, once per device)."""
    key = (name, size, str(device))
    if key not in _shared_allowed:
        nvrtc.function(module, name).max_dynamic_shared_size_bytes = size
        _shared_allowed.add(key)
