"""Lowering: a program (forward, or forward and backward from autodiff.py) to a plan of template
instances, the steps a backend runs in order.

* :class:`Gemm` and :class:`Outer`: the GEMM template (kernels/gemm.cu) for every typed or shared
  product and every weight gradient, scheduled per type segment: rows in a sorted-position order
  where each relation (or node type) is contiguous, cut into tiles that never span two types.
  An operand that is a gather (``src(x)``, a pair's source, an edge's pair) is read through an
  index list, never copied.
* :class:`Map`, :class:`Dot`, :class:`Scatter`, :class:`Softmax`, :class:`Max`: the traversal
  template (kernels/traversal.cu) for row-wise arithmetic, row dot products (one per head), sums
  into nodes or pairs (destination-parallel: each target's rows summed in chunks of
  :data:`SUM_ROWS`, one atomic per chunk), edge softmax over each target's incoming edges (one
  per head), and maxima of each node's incoming or outgoing edges' rows. Gathers, a weight taken
  per relation or type, shared vectors and constants are again read in place, as operands. An
  operand narrower than the step's rows is read head by head: column c of a width-W step reads
  column c / (W / w) of a width-w operand (0 for width 1).
* :class:`Fused`: a chain of row-wise operators whose intermediate rows have no other reader,
  evaluated as one expression per row and column (:func:`fuse_row_chains`): one launch, and the
  intermediate rows are never stored.
* :class:`Host`: weight algebra on the parameters (``W[r] @ q`` and its gradients, [relations,
  in, out] at most, and a shared vector's gradient, the sum of its rows: rows read in place are
  stored for it first) and graph data, with torch.

:func:`emulate` runs a plan with torch following each template's definition tile by tile and row
by row: what the CUDA kernels must compute, checked against the reference backend on any machine.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from systems.hector.ir import Program, Value
from systems.relgraph.graph import RelGraph, segment_offsets

TILE_ROWS = 64  # the GEMM template's rows per tile (kernels/gemm.cu TILE_M)
OUTER_ROWS = 512  # positions per weight-gradient tile: each tile adds to its type's gradient once
SUM_ROWS = 32  # rows per chunk of a sum into targets: at most 32, one row id per lane (kernels/traversal.cu)

# Row-wise operators of the traversal template: CUDA expression of (a, b) and its torch twin.
EXPRESSIONS = {
    "copy": ("(a)", lambda a, b, v: a),
    "add": ("((a) + (b))", lambda a, b, v: a + b),
    "sub": ("((a) - (b))", lambda a, b, v: a - b),
    "mul": ("((a) * (b))", lambda a, b, v: a * b),
    "div": ("((a) / (b))", lambda a, b, v: a / b),
    "equal": ("((a) == (b) ? 1.0f : 0.0f)", lambda a, b, v: (a == b).to(a.dtype)),
    "exp": ("expf(a)", lambda a, b, v: torch.exp(a)),
    "tanh": ("tanhf(a)", lambda a, b, v: torch.tanh(a)),
    "sigmoid": ("(1.0f / (1.0f + expf(-(a))))", lambda a, b, v: torch.sigmoid(a)),
    "gelu": ("(0.5f * (a) * (1.0f + erff((a) * 0.70710678118654752f)))", lambda a, b, v: F.gelu(a)),
    "leaky_relu": (
        "((a) > 0.0f ? (a) : (a) * {slope}f)",
        lambda a, b, v: torch.where(a > 0, a, a * v.attr("slope")),
    ),
    "leaky_relu_grad": (
        "((a) > 0.0f ? (b) : (b) * {slope}f)",
        lambda a, b, v: torch.where(a > 0, b, b * v.attr("slope")),
    ),
    "gelu_grad": (
        "((b) * (0.5f * (1.0f + erff((a) * 0.70710678118654752f))"
        " + (a) * expf(-0.5f * (a) * (a)) * 0.39894228040143268f))",
        lambda a, b, v: (
            b * (0.5 * (1 + torch.erf(a * 0.5**0.5)) + a * torch.exp(-0.5 * a * a) * (2 * torch.pi) ** -0.5)
        ),
    ),
}
UNARY = {"copy", "exp", "tanh", "sigmoid", "gelu", "leaky_relu"}


@dataclass(frozen=True)
class Operand:
    """How a traversal or GEMM step reads a value: ``own`` row i of ``value``; ``indexed`` row
    ``index[i]`` of ``value``; ``scalar``; ``shared``: row 0 of a vector ``value`` for every i."""

    kind: str
    value: Value | None = None
    index: str | None = None
    scalar: float = 0.0


@dataclass(frozen=True)
class Gemm:
    out: Value
    a: Operand  # own or indexed rows
    b: Value  # the weight: [types, K, N] per type, [K, N] shared
    order: str  # the sorted-position order's name (GraphIndex)
    transpose: bool


@dataclass(frozen=True)
class Outer:
    out: Value  # [types, K, N] or [K, N]
    a: Operand
    g: Operand
    order: str


@dataclass(frozen=True)
class Map:
    out: Value
    expression: str  # a key of EXPRESSIONS
    a: Operand
    b: Operand


@dataclass(frozen=True)
class Dot:
    """Per row, the dot of a and b over each of ``heads`` blocks of columns: ``out`` is [rows, heads]."""

    out: Value
    a: Operand
    b: Operand
    heads: int = 1


@dataclass(frozen=True)
class Scatter:
    out: Value
    source: Value
    index: str
    count: str  # the rows summed into: "node", "pair", or a per-type weight's ("etype", "node_type")


@dataclass(frozen=True)
class ScatterMap:
    """A :class:`Map` whose only user is a sum into targets, fused: the rows are summed as they are
    computed and never stored (for RGCN's normalized messages, RGAT's and HGT's weighted values:
    an [edges, out] tensor less)."""

    out: Value
    mapped: Value  # the map's own value (its attributes: a slope)
    expression: str
    a: Operand
    b: Operand
    index: str
    count: str


@dataclass(frozen=True)
class Softmax:
    out: Value  # as wide as the scores: one softmax per column (head)
    scores: Value


@dataclass(frozen=True)
class Max:
    """Each node's maximum, column by column, of the rows of its edges by ``end`` ("dst": its
    incoming edges, "src": its outgoing ones), 0 where it has none."""

    out: Value
    source: Value
    end: str


@dataclass(frozen=True)
class Node:
    """One row-wise operator of a :class:`Fused` chain: ``expression`` (a key of EXPRESSIONS) of
    its arguments, each an operand read in place or another node; ``mapped`` the operator's own
    value (its attributes: a slope)."""

    expression: str
    mapped: Value
    args: tuple  # of Operand | Node: one for a unary operator, two otherwise


@dataclass(frozen=True)
class Fused:
    """A chain of row-wise operators as one traversal kernel: ``out`` = ``root`` at every row and
    column, or with ``index`` its rows summed into ``count``'s rows (as :class:`ScatterMap`)."""

    out: Value
    root: Node
    index: str | None = None
    count: str | None = None

    def leaves(self) -> list[Operand]:
        """The operands the chain reads, depth first: the kernel's arguments, in order."""
        found = []

        def walk(node):
            for arg in node.args:
                walk(arg) if isinstance(arg, Node) else found.append(arg)

        walk(self.root)
        return found


@dataclass(frozen=True)
class Host:
    out: Value


@dataclass
class Plan:
    program: Program
    steps: list = field(default_factory=list)

    @functools.cached_property
    def given(self) -> list[Value]:
        """The values a run is given: the program's inputs and weights (once, not per run)."""
        return [v for v in self.program.values if v.op in ("input", "weight")]

    def __str__(self) -> str:
        return "\n".join(describe_step(s) for s in self.steps)


def describe_step(step) -> str:
    kind = type(step).__name__.lower()
    out = step.out
    detail = {
        "gemm": lambda: f"order={step.order} transpose={step.transpose} a={_op(step.a)}",
        "outer": lambda: f"order={step.order} a={_op(step.a)} g={_op(step.g)}",
        "map": lambda: f"{step.expression}({_op(step.a)}, {_op(step.b)})",
        "dot": lambda: f"({_op(step.a)}, {_op(step.b)})" + (f" heads={step.heads}" if step.heads > 1 else ""),
        "max": lambda: f"over each node's edges by {step.end}",
        "scatter": lambda: f"by {step.index} into {step.count}",
        "scattermap": lambda: f"{step.expression}({_op(step.a)}, {_op(step.b)}) by {step.index} into {step.count}",
        "fused": lambda: _tree(step.root) + (f" by {step.index} into {step.count}" if step.index else ""),
        "softmax": lambda: "over each target's edges",
        "host": lambda: out.op,
    }[kind]()
    return f"{kind:8s} {out.op} -> {out.domain}[{out.width}]: {detail}"


def _tree(node: Node) -> str:
    return f"{node.expression}({', '.join(_tree(a) if isinstance(a, Node) else _op(a) for a in node.args)})"


def _op(o: Operand) -> str:
    return {"own": "own", "indexed": f"[{o.index}]", "scalar": f"{o.scalar:g}", "shared": "shared"}[o.kind]


INDEXED = ("gather", "unpair", "take")  # read in place by their users, never copied
# Sums of rows into targets' rows, which a Map can feed: into nodes, pairs, or (a per-type weight's
# gradient) into the types, where an atomic per row would queue millions of adds on a few entries.
SCATTERS = ("sum_into_dst", "sum_into_src", "sum_into_pair", "sum_by_type")


def lower(program: Program, fuse: bool = True) -> Plan:
    """``program``'s plan; with ``fuse``, chains of row-wise operators become :class:`Fused` steps."""
    plan = Plan(program)
    materialized: dict[int, Value] = {}  # a virtual value copied for a user that needs it dense
    users: dict[int, list[Value]] = {}
    for v in program.values:
        for a in v.args:
            users.setdefault(id(a), []).append(v)
    outputs = {id(o) for o in program.outputs}
    deferred: dict[int, Map] = {}  # maps summed straight into targets by their one user (ScatterMap)

    def operand(v: Value) -> Operand:
        """How a step reads ``v``: a value read in place is read through its (dense) base."""
        if v.op == "gather":
            end = v.attr("end")
            return Operand("indexed", dense(v.args[0]), "pair_src" if v.domain == "pair" else end)
        if v.op == "unpair":
            return Operand("indexed", dense(v.args[0]), "pair_of_edge")
        if v.op == "take":
            return Operand("indexed", dense(v.args[0]), type_index(v.attr("by"), v.domain))
        if v.op == "const":
            return Operand("scalar", v, scalar=v.attr("value", 0.0))  # rsqrt: resolved when run
        if v.op == "broadcast":
            return Operand("shared", dense(v.args[0]))
        return Operand("own", v)

    def dense(v: Value) -> Value:
        if v.op not in (*INDEXED, "const", "broadcast"):
            return v
        if id(v) not in materialized:
            plan.steps.append(Map(v, "copy", operand(v), Operand("scalar")))
            materialized[id(v)] = v
        return v

    def add_map(v: Value, expression: str, a: Operand, b: Operand) -> None:
        """A row-wise map's step, or none where its one user reads it as it is computed: a sum of
        its rows into targets (a :class:`ScatterMap`), or row sums of a product (a :class:`Dot`)."""
        sole = users.get(id(v), [])
        if len(sole) == 1 and id(v) not in outputs and v.domain != "weight":
            whole_rows = all(o.kind == "scalar" or o.value.width == v.width for o in (a, b))
            row_sums = ("row_sum", "head_sum")
            if sole[0].op in SCATTERS or (sole[0].op in row_sums and expression == "mul" and whole_rows):
                deferred[id(v)] = Map(v, expression, a, b)
                return
        plan.steps.append(Map(v, expression, a, b))

    for v in program.values:
        op = v.op
        if op in ("input", "weight", *INDEXED, "const", "broadcast"):
            continue
        generated_weight_op = op in ("typed_outer", "outer", *SCATTERS)  # a weight's gradient the kernels sum
        if op in ("graph_data", "zeros_like") or (v.domain == "weight" and not generated_weight_op):
            # Weight algebra (a sum of gradient parts, W[r] @ q, ...) in torch, on stored values: a
            # shared vector's gradient (sum_rows) may read rows that are read in place (a gather of
            # the output's gradient, for a bias added per edge), which a host step has no index for.
            for arg in v.args:
                dense(arg)
            plan.steps.append(Host(v))
        elif op == "typed_matmul" and _narrow(v):
            # A product by per-type weights of one column (RGAT's folded attention vectors): a dot
            # of each row with its type's column, not a 64-wide GEMM tile for one useful column;
            # its data gradient, each row's scalar times its type's column.
            rows, w = v.args
            column = Operand("indexed", dense(w), type_index(v.attr("by"), v.domain))
            if v.attr("transpose"):
                add_map(v, "mul", operand(rows), column)
            else:
                plan.steps.append(Dot(v, operand(rows), column))
        elif op in ("typed_matmul", "matmul"):
            by = v.attr("by")
            order = f"order:{by}:{v.domain}" if by else f"identity:{v.domain}"
            a = operand(v.args[0])
            if a.kind not in ("own", "indexed"):
                a = Operand("own", dense(v.args[0]))
            plan.steps.append(Gemm(v, a, dense(v.args[1]), order, bool(v.attr("transpose"))))
        elif op == "typed_outer" and v.args[1].width == 1:
            # The gradient of per-type weights of one column (RGAT's folded attention vectors): per
            # type, its rows times their scalar, summed into the type's row, not a 64 x 64 tile for
            # one useful column.
            rows, g = v.args
            by = v.attr("by")
            plan.steps.append(ScatterMap(v, v, "mul", operand(rows), operand(g), type_index(by, rows.domain), by))
        elif op in ("typed_outer", "outer"):
            rows, g = v.args
            by = v.attr("by")
            order = f"order:{by}:{rows.domain}" if by else f"identity:{rows.domain}"
            a, gop = operand(rows), operand(g)
            a = a if a.kind in ("own", "indexed") else Operand("own", dense(rows))
            gop = gop if gop.kind in ("own", "indexed") else Operand("own", dense(g))
            plan.steps.append(Outer(v, a, gop, order))
        elif op in EXPRESSIONS:
            a = operand(v.args[0])
            b = operand(v.args[1]) if len(v.args) > 1 else Operand("scalar")
            add_map(v, op, a, b)
        elif op in ("row_sum", "head_sum") and id(v.args[0]) in deferred:
            # row sums of a product (per head): a dot, the product never stored
            product = deferred[id(v.args[0])]
            plan.steps.append(Dot(v, product.a, product.b, heads_of(v)))
        elif op in ("dot", "row_sum", "head_sum"):
            b = operand(v.args[1]) if op == "dot" else Operand("scalar", scalar=1.0)
            plan.steps.append(Dot(v, operand(v.args[0]), b, heads_of(v)))
        elif op in SCATTERS:
            source = v.args[0] if id(v.args[0]) in deferred else dense(v.args[0])
            index, count = {
                "sum_into_dst": ("dst", "node"),
                "sum_into_src": ("pair_src" if source.domain == "pair" else "src", "node"),
                "sum_into_pair": ("pair_of_edge", "pair"),
                "sum_by_type": (type_index(v.attr("by"), source.domain), v.attr("by")),
            }[op]
            fused = deferred.get(id(source))
            if fused is not None:
                plan.steps.append(ScatterMap(v, fused.out, fused.expression, fused.a, fused.b, index, count))
            else:
                plan.steps.append(Scatter(v, source, index, count))
        elif op == "edge_softmax":
            plan.steps.append(Softmax(v, dense(v.args[0])))
        elif op in ("max_into_dst", "max_into_src"):
            plan.steps.append(Max(v, dense(v.args[0]), op.rsplit("_", 1)[1]))
        else:
            raise NotImplementedError(f"no template for operator {op!r}")
    for out in program.outputs:
        dense(out)
    return fuse_row_chains(plan) if fuse else plan


# The most operators one fused kernel evaluates per element: a model written as a long loop of
# row-wise operators is cut into kernels of at most this many (each storing its rows for the
# next), so that a kernel's expression, its arguments and the compiler's work stay bounded.
MAX_FUSED_OPERATORS = 32


def fuse_row_chains(plan: Plan) -> Plan:
    """Each row-wise map whose rows have exactly one reader, a later map or map-into-sum that
    reads its own row i, and that is not an output, is folded into that reader: the chain becomes
    one :class:`Fused` step, evaluated per row and column without storing the intermediate rows,
    of at most :data:`MAX_FUSED_OPERATORS` operators. (Broadcasting composes: an operator of width
    w has operands of width w, 1, or a head count dividing w, so reading each operand at its own
    column of the chain's output column c, c / (W / w) for width w, is what the unfused steps
    read: nested blocks of equal division.)"""
    outputs = {id(o) for o in plan.program.outputs}
    readers: dict[int, list] = {}  # value id -> (step, how) for every read of it by a step
    for step in plan.steps:
        for value, how in _reads(step):
            readers.setdefault(id(value), []).append((step, how))

    def folds(step) -> bool:
        if not isinstance(step, Map) or id(step.out) in outputs:
            return False
        reads = readers.get(id(step.out), [])
        return len(reads) == 1 and isinstance(reads[0][0], Map | ScatterMap) and reads[0][1] == "own"

    pending: dict[int, Node] = {}  # folded maps, by their value, until their reader comes
    operators: dict[int, int] = {}  # a pending node's operators, itself and those folded into it
    steps = []
    for step in plan.steps:
        if not isinstance(step, Map | ScatterMap):
            steps.append(step)
            continue
        unary = step.expression in UNARY
        args = tuple(
            pending.pop(id(o.value)) if o.kind == "own" and id(o.value) in pending else o
            for o in ((step.a,) if unary else (step.a, step.b))
        )
        node = Node(step.expression, step.out if isinstance(step, Map) else step.mapped, args)
        size = 1 + sum(operators.pop(id(a), 0) for a in args)
        if folds(step) and size < MAX_FUSED_OPERATORS:
            pending[id(step.out)] = node
            operators[id(node)] = size
        elif not any(isinstance(a, Node) for a in args):
            steps.append(step)  # nothing folded into it: the plain template
        elif isinstance(step, Map):
            steps.append(Fused(step.out, node))
        else:
            steps.append(Fused(step.out, node, step.index, step.count))
    assert not pending, "a folded map's reader was not found"
    plan.steps = steps
    return plan


def _reads(step) -> list[tuple[Value, str]]:
    """The values ``step`` reads, each with how: an operand's kind, or ``whole``."""
    if isinstance(step, Host):
        return [(a, "whole") for a in step.out.args]
    found = []
    for name in ("a", "b", "g"):
        o = getattr(step, name, None)
        if isinstance(o, Operand) and o.value is not None:
            found.append((o.value, o.kind))
        elif isinstance(o, Value):  # a GEMM's weight
            found.append((o, "whole"))
    for name in ("source", "scores"):  # Scatter's and Max's rows, Softmax's scores
        if getattr(step, name, None) is not None:
            found.append((getattr(step, name), "whole"))
    return found


def heads_of(v: Value) -> int:
    """A dot's or a head sum's heads: the (literal) width of its result."""
    if not isinstance(v.width, int):
        raise AssertionError(f"{v.op} of width {v.width}: a dot's width is its literal head count")
    return v.width


def _narrow(v: Value) -> bool:
    """A typed product whose weights have one column (the product's width, or for the transposed
    product its input's)."""
    one_column = v.args[0].width if v.attr("transpose") else v.width
    return one_column == 1


def shaped(out: Value, summed: torch.Tensor) -> torch.Tensor:
    """A sum into targets as ``out`` is shaped: a narrow weight gradient's [types, K] rows are
    its weight's [types, K, 1]."""
    return summed.unsqueeze(-1) if out.op == "typed_outer" else summed


def type_index(by: str, domain: str) -> str:
    if by == "node_type":
        return "node_type"
    return "pair_etype" if domain == "pair" else "etype"


class GraphIndex:
    """The index arrays and tile schedules a plan reads, made once per graph (on its device):
    :meth:`of` keeps them while the graph lives, so repeated calls on one graph reuse them."""

    _live: dict[int, GraphIndex] = {}

    @classmethod
    def of(cls, graph: RelGraph) -> GraphIndex:
        found = cls._live.get(id(graph))
        if found is None or found.graph is not graph:
            found = cls._live[id(graph)] = cls(graph)
            weakref.finalize(graph, cls._live.pop, id(graph), None)  # gone with its graph
        return found

    def __init__(self, graph: RelGraph):
        self._graph = weakref.ref(graph)  # not a strong reference: the cache must not keep graphs alive
        self._cache: dict[str, torch.Tensor] = {}
        self._pairs = None
        self.replays: dict[tuple, object] = {}  # codegen's recorded launches on this graph, by plan and shapes

    @property
    def graph(self) -> RelGraph:
        return self._graph()

    def rows(self, domain: str) -> int:
        if domain in ("etype", "node_type"):  # a per-type weight's rows
            return self.types(domain)
        return {"node": self.graph.num_nodes, "edge": self.graph.edges, "pair": len(self["pair_src"])}[domain]

    def types(self, by: str) -> int:
        return self.graph.num_node_types if by == "node_type" else self.graph.num_relations

    def data(self, name: str) -> torch.Tensor:
        """The graph data ``name`` (:func:`graph_data`), made once: a degree count reads its size
        back to the host, which a replayed or captured plan must not do every call."""
        key = f"data:{name}"
        if key not in self._cache:
            self._cache[key] = graph_data(self.graph, name).contiguous()
        return self._cache[key]

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._cache:
            self._cache[name] = self._make(name)
        return self._cache[name]

    def _make(self, name: str) -> torch.Tensor:
        g = self.graph
        if name in ("src", "dst", "etype", "node_type"):
            return getattr(g, name)
        if name in ("pair_src", "pair_etype", "pair_of_edge"):
            keys = g.src * max(g.num_relations, 1) + g.etype
            unique, of_edge = torch.unique(keys, return_inverse=True)
            self._cache["pair_of_edge"] = of_edge
            self._cache["pair_src"] = unique // max(g.num_relations, 1)
            self._cache["pair_etype"] = unique % max(g.num_relations, 1)
            return self._cache[name]
        if name.startswith("identity:"):
            return torch.arange(self.rows(name.split(":")[1]), device=g.src.device)
        if name.startswith("order:"):
            _, by, domain = name.split(":")
            return torch.sort(self[type_index(by, domain)], stable=True).indices
        if name in ("by_dst", "by_src"):  # edges ordered by target (source), stable
            return torch.sort(getattr(g, name[3:]), stable=True).indices
        if name in ("dst_begin", "src_begin"):  # each node's first position in that order
            return segment_offsets(getattr(g, name[:3]), g.num_nodes)
        if "@" in name:  # an index read through an order: index[order]
            index, order = name.split("@", 1)
            return self[index].index_select(0, self[order])
        raise KeyError(name)

    def tiles(self, order: str, rows_per_tile: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per tile of ``order``: its type (int32), first and one-past-last positions (int64)."""
        key = f"tiles:{order}:{rows_per_tile}"
        if key not in self._cache:
            kind, *rest = order.split(":")
            device = self.graph.src.device
            if kind == "identity":
                rows = self.rows(rest[0])
                offsets = torch.tensor([0, rows], device=device)
            else:
                by, domain = rest
                rows = self.rows(domain)
                offsets = segment_offsets(self[type_index(by, domain)], self.types(by))
            self._cache[key] = tile_schedule(offsets, rows, rows_per_tile)
        return self._cache[key]

    def chunks(self, index: str, targets: str) -> tuple[torch.Tensor, ...]:
        """A sum of rows into ``targets``' rows by ``index``, destination-parallel: the row ids sorted
        by target (stable), and per chunk of at most :data:`SUM_ROWS` of them with one target, that
        target (int32) and the chunk's first and one-past-last sorted positions (int64)."""
        key = f"chunks:{index}:{targets}"
        if key not in self._cache:
            of_row = self[index]
            order = torch.sort(of_row, stable=True).indices
            offsets = segment_offsets(of_row, self.rows(targets))
            self._cache[key] = (order, *tile_schedule(offsets, len(of_row), SUM_ROWS))
        return self._cache[key]

    def positions(self, operand: Operand, order: str) -> str:
        """The index list that reads ``operand``'s rows at each sorted position of ``order``."""
        return order if operand.kind == "own" else f"{operand.index}@{order}"


def tile_schedule(offsets: torch.Tensor, rows: int, rows_per_tile: int) -> tuple[torch.Tensor, ...]:
    """Segments ``offsets[t] : offsets[t + 1]`` (one per type, in type order, ``rows`` in all) cut
    into tiles of at most ``rows_per_tile``: each tile's type (int32), first and one-past-last
    position (int64). Computed where ``offsets`` lives, without reading it back: the tile count is
    bounded by ceil(rows / rows_per_tile) + types, and the tiles past the last segment's are empty
    (first = end = 0), which the kernels skip."""
    types = offsets.numel() - 1
    count = -(-rows // rows_per_tile) + types if rows else 0
    tiles_of = (offsets.diff() + rows_per_tile - 1) // rows_per_tile
    tiles_before = tiles_of.cumsum(0)  # inclusive: tiles of types 0..t
    tile = torch.arange(count, device=offsets.device)
    of_tile = torch.searchsorted(tiles_before, tile, right=True)
    past = of_tile >= types
    t = of_tile.clamp(max=max(types - 1, 0))
    first = offsets[t] + (tile - tiles_before[t] + tiles_of[t]) * rows_per_tile
    end = torch.minimum(first + rows_per_tile, offsets[t + 1])
    return t.to(torch.int32), first.masked_fill(past, 0), end.masked_fill(past, 0)


def graph_data(graph: RelGraph, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The graph data a program reads (systems/hector/lang.py GRAPH_DATA), as [rows, 1] of ``dtype``
    (float32, or float64 for a float64 run: float32 reciprocals would cost it half its digits)."""
    if name == "norm":
        return graph.norm_as(dtype).unsqueeze(1)
    if name in ("in_degree", "out_degree"):  # at least 1: a mean over no edges is 0 / 1
        ends = graph.dst if name == "in_degree" else graph.src
        return torch.bincount(ends, minlength=graph.num_nodes).clamp(min=1).to(dtype).unsqueeze(1)
    raise KeyError(name)


def blocks(t: torch.Tensor, width: int) -> torch.Tensor:
    """An operand's rows at ``width`` columns as the templates read them: as they are at their own
    width or width 1 (torch broadcasts that), each head's column repeated over its block otherwise."""
    own = t.shape[1]
    return t if own in (1, width) else t.repeat_interleave(width // own, 1)


def host_value(v: Value, args: list[torch.Tensor], index: GraphIndex) -> torch.Tensor:
    """A :class:`Host` step's result."""
    if v.op == "graph_data":
        return index.data(v.name)
    if v.op == "weight_product":
        return args[0] @ args[1]
    if v.op == "weight_product_grad_w":
        return args[0] @ args[1].T
    if v.op == "weight_product_grad_v":
        return (args[0].transpose(-1, -2) @ args[1]).sum(0)
    if v.op == "zeros_like":
        return torch.zeros_like(args[0])
    if v.op == "add":  # gradient parts of one weight
        return args[0] + args[1]
    if v.op == "sum_rows":  # a shared vector's gradient
        return args[0].sum(0)
    raise NotImplementedError(v.op)


def emulate(plan: Plan, graph: RelGraph, tensors: dict[str, torch.Tensor], widths: dict) -> list[torch.Tensor]:
    """Run ``plan`` with torch, each step as its template defines it (see the module)."""
    index = GraphIndex(graph)
    env: dict[int, torch.Tensor] = {}
    for v in plan.program.values:
        if v.op in ("input", "weight"):
            env[id(v)] = tensors[v.name]
    # Scalar constants in the tensors' own type and place: torch.full's default (float32) would
    # round a float64 emulation's constants.
    like = next((t for t in tensors.values() if t.is_floating_point()), torch.empty(0))

    def read(o: Operand, rows: int) -> torch.Tensor:
        if o.kind == "scalar":
            number = (
                o.scalar if o.value is None or o.value.attr("rsqrt") is None else widths[o.value.attr("rsqrt")] ** -0.5
            )
            return torch.full((rows, 1), float(number), dtype=like.dtype, device=like.device)
        base = env[id(o.value)]
        base = base.unsqueeze(1) if base.dim() == 1 else base.flatten(1)  # [types, in, 1]: rows of in
        if o.kind == "shared":
            return base.reshape(1, -1).expand(rows, -1)
        return base if o.kind == "own" else base.index_select(0, index[o.index])

    for step in plan.steps:
        out = step.out
        if isinstance(step, Host):
            env[id(out)] = host_value(out, [env[id(a)] for a in out.args], index)
        elif isinstance(step, Gemm):
            a, b = env[id(step.a.value)], env[id(step.b)]
            b = b if b.dim() == 3 else b.unsqueeze(0)
            b = b.transpose(1, 2) if step.transpose else b
            rows_a = index[index.positions(step.a, step.order)]
            rows_c = index[step.order]
            result = a.new_empty(index.rows(out.domain), b.shape[2])
            for t, begin, end in zip(*(x.tolist() for x in index.tiles(step.order, TILE_ROWS)), strict=True):
                result[rows_c[begin:end]] = a[rows_a[begin:end]] @ b[t]
            env[id(out)] = result
        elif isinstance(step, Outer):
            a, g = env[id(step.a.value)], env[id(step.g.value)]
            rows_a, rows_g = index[index.positions(step.a, step.order)], index[index.positions(step.g, step.order)]
            types = index.types(step.order.split(":")[1]) if step.order.startswith("order") else 1
            result = a.new_zeros(types, a.shape[1], g.shape[1])
            for t, begin, end in zip(*(x.tolist() for x in index.tiles(step.order, OUTER_ROWS)), strict=True):
                result[t] += a[rows_a[begin:end]].T @ g[rows_g[begin:end]]
            env[id(out)] = result if out.per else result[0]
        elif isinstance(step, Map):
            rows = index.rows(out.domain)
            env[id(out)] = expression(step.expression, [read(step.a, rows), read(step.b, rows)], out)
        elif isinstance(step, Dot):
            rows = index.rows(out.domain)
            product = read(step.a, rows) * read(step.b, rows)
            env[id(out)] = product.reshape(rows, step.heads, product.shape[1] // step.heads).sum(2)
        elif isinstance(step, Scatter):
            source = env[id(step.source)]
            result = source.new_zeros(index.rows(step.count), source.shape[1])
            env[id(out)] = result.index_add(0, index[step.index], source)
        elif isinstance(step, ScatterMap):
            rows = len(index[step.index])
            values = expression(step.expression, [read(step.a, rows), read(step.b, rows)], step.mapped)
            result = values.new_zeros(index.rows(step.count), values.shape[1])
            env[id(out)] = shaped(out, result.index_add(0, index[step.index], values))
        elif isinstance(step, Fused):
            rows = len(index[step.index]) if step.index else index.rows(out.domain)

            def evaluate(node, rows=rows):
                args = [evaluate(a) if isinstance(a, Node) else read(a, rows) for a in node.args]
                return expression(node.expression, args, node.mapped)

            values = evaluate(step.root)
            if step.index:
                result = values.new_zeros(index.rows(step.count), values.shape[1])
                values = shaped(out, result.index_add(0, index[step.index], values))
            env[id(out)] = values
        elif isinstance(step, Softmax):
            scores, by_dst, begin = env[id(step.scores)], index["by_dst"], index["dst_begin"].tolist()
            result = torch.empty_like(scores)
            for v in range(graph.num_nodes):
                edges = by_dst[begin[v] : begin[v + 1]]
                if len(edges):
                    result[edges] = torch.softmax(scores[edges], 0)  # each column on its own
            env[id(out)] = result
        elif isinstance(step, Max):
            source, order, begin = env[id(step.source)], index[f"by_{step.end}"], index[f"{step.end}_begin"].tolist()
            result = source.new_zeros(graph.num_nodes, source.shape[1])
            for v in range(graph.num_nodes):
                edges = order[begin[v] : begin[v + 1]]
                if len(edges):
                    result[v] = source[edges].amax(0)
            env[id(out)] = result
    return [env[id(o)] for o in plan.program.outputs]


def expression(name: str, args: list[torch.Tensor], mapped: Value) -> torch.Tensor:
    """A row-wise operator's torch twin on its operands, each read head by head at the widest's width."""
    width = max(a.shape[1] for a in args)
    args = [blocks(a, width) for a in args]
    return EXPRESSIONS[name][1](args[0], args[-1], mapped)
