"""The model language: a relational GNN layer is a short Python function over symbolic values,
traced once into the IR (systems/hector/ir.py).

    @model
    def rgcn(m):
        x = m.input("x", "in")
        W = m.weight("W", ("in", "out"), per="relation")
        message = m.src(x) @ W[m.relation] * m.graph_data("norm")
        return x @ m.weight("root", ("in", "out")) + m.weight("bias", ("out",)) + m.sum_into_dst(message)

``m.src(x)`` / ``m.dst(x)`` are a node value seen from each edge's source or target;
``W[m.relation]`` / ``W[m.node_type]`` pick each row's weight by its relation or node type; ``@``
multiplies by a weight; ``+ - * /`` are elementwise; ``m.edge_softmax`` normalizes edge scores
over each target's incoming edges; ``m.sum_into_dst``, ``m.mean_into_dst`` and ``m.max_into_dst``
(and ``_into_src``, over each node's outgoing edges) reduce edge rows into nodes (a node with no
such edges gets 0). ``m.edge_input`` is a per-edge tensor the caller gives, like the graph's own
``m.graph_data("norm")``.

Heads: an operand of width H broadcasts over a wider one head by head, as H blocks of W / H
columns (width 1 is the one-head case), so ``m.edge_softmax(m.dot(q, k, heads=H)) * v`` weighs
each head's block of ``v`` by its own score, and the heads' outputs are concatenated. W must be a
multiple of H, checked when the widths are bound.

Mistakes (a width that does not match, an edge value added to a node value) are refused while
tracing, naming the operator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from harness.arguments import real_number, whole_number
from harness.errors import UserError
from systems.hector.ir import Program, Value

# What a RelGraph provides: per edge, 1 / its (target, relation)'s edge count; per node, its
# incoming and outgoing edge counts, counted as at least 1 (the divisor of a mean: 0 over no edges).
GRAPH_DATA = {
    "norm": ("edge", 1, frozenset({"dst", "etype"})),
    "in_degree": ("node", 1, frozenset()),
    "out_degree": ("node", 1, frozenset()),
}
ALL_ENDS = frozenset({"src", "dst", "etype"})


class ModelError(UserError):
    """A model program that cannot mean anything (widths, domains, unknown names)."""


@dataclass(frozen=True)
class _Index:
    by: str  # "etype" or "node_type"


@dataclass(frozen=True)
class Selected:
    """``weight[m.relation]`` or ``weight[m.node_type]``: one weight per row, by its type."""

    weight: Value
    by: str


class Expr:
    """A traced value; arithmetic on it records operators."""

    def __init__(self, builder: Builder, value: Value):
        self.builder, self.value = builder, value

    def __matmul__(self, other):
        return self.builder._matmul(self, other)

    def __add__(self, other):
        return self.builder._binary("add", self, other)

    __radd__ = __add__

    def __sub__(self, other):
        return self.builder._binary("sub", self, other)

    def __rsub__(self, other):
        return self.builder._binary("sub", other, self)

    def __mul__(self, other):
        return self.builder._binary("mul", self, other)

    __rmul__ = __mul__

    def __truediv__(self, other):
        return self.builder._binary("div", self, other)

    def __rtruediv__(self, other):
        return self.builder._binary("div", other, self)

    def __neg__(self):
        return self.builder._binary("sub", 0.0, self)

    def __pow__(self, other):
        raise ModelError("the language has no power: write x * x, or m.exp / m.tanh / m.sigmoid")

    # A model is traced once, not run per row: a Python branch on a traced value would fix one
    # branch at trace time for every row, and == would compare the tracer's objects.
    def __bool__(self):
        raise ModelError(
            "a traced value has no truth value: a model is traced once, so Python's if/and/or/not cannot "
            "branch per row (use m.max_into_dst, m.leaky_relu or arithmetic instead)"
        )

    def _compare(self, other):
        raise ModelError("the language has no comparisons (==, <, ...): a traced value is not a number")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _compare
    __hash__ = object.__hash__

    def __getitem__(self, index):
        if self.value.domain != "weight" or not isinstance(index, _Index):
            raise ModelError("only a weight can be indexed, and only by m.relation or m.node_type")
        wanted = {"etype": "relation", "node_type": "node_type"}[index.by]
        if self.value.per != wanted:
            raise ModelError(f"weight {self.value.name} is per {self.value.per}, not per {wanted}")
        return Selected(self.value, index.by)


class Builder:
    """What a model function receives as ``m``."""

    relation = _Index("etype")
    node_type = _Index("node_type")

    def __init__(self):
        self._names: dict[str, Value] = {}

    # Leaves
    def input(self, name: str, width) -> Expr:
        width = _width(f"input {name}", width)
        return Expr(self, self._leaf(Value("input", (), "node", width, name=name)))

    def edge_input(self, name: str, width) -> Expr:
        """A per-edge tensor given by the caller ([edges, width], rows in the graph's edge order).
        Its rows may differ between edges of one (source, relation), so it is never compacted."""
        width = _width(f"edge input {name}", width)
        return Expr(self, self._leaf(Value("input", (), "edge", width, ALL_ENDS, name=name)))

    def weight(self, name: str, shape: tuple, per: str | None = None) -> Expr:
        if per not in (None, "relation", "node_type"):
            raise ModelError(f"weight {name}: per must be 'relation', 'node_type' or None, not {per!r}")
        if not isinstance(shape, tuple | list) or len(shape) not in (1, 2):
            raise ModelError(f"weight {name}: a vector or a matrix per row type, got shape {shape}")
        shape = tuple(_width(f"weight {name}", w) for w in shape)
        return Expr(self, self._leaf(Value("weight", (), "weight", name=name, shape=shape, per=per)))

    def graph_data(self, name: str) -> Expr:
        if name not in GRAPH_DATA:
            raise ModelError(f"no graph data {name!r}; known: {', '.join(GRAPH_DATA)}")
        known = self._names.get(name)
        if known is not None and known.op == "graph_data":  # one leaf per name: each mean reads it
            return Expr(self, known)
        domain, width, depends = GRAPH_DATA[name]
        return Expr(self, self._leaf(Value("graph_data", (), domain, width, depends, name=name)))

    # Moving between domains
    def src(self, x: Expr) -> Expr:
        return self._gather(x, "src")

    def dst(self, x: Expr) -> Expr:
        return self._gather(x, "dst")

    def sum_into_dst(self, e: Expr) -> Expr:
        """Each node's incoming edges' rows, summed."""
        return self._reduce(e, "sum", "dst")

    def mean_into_dst(self, e: Expr) -> Expr:
        """Each node's incoming edges' rows, averaged (0 where it has none)."""
        return self._reduce(e, "mean", "dst")

    def max_into_dst(self, e: Expr) -> Expr:
        """Each node's incoming edges' rows, their maximum column by column (0 where it has none).
        Its gradient goes to the edges that reach the maximum, split evenly where several do."""
        return self._reduce(e, "max", "dst")

    def sum_into_src(self, e: Expr) -> Expr:
        """Each node's outgoing edges' rows, summed."""
        return self._reduce(e, "sum", "src")

    def mean_into_src(self, e: Expr) -> Expr:
        return self._reduce(e, "mean", "src")

    def max_into_src(self, e: Expr) -> Expr:
        return self._reduce(e, "max", "src")

    def edge_softmax(self, score: Expr) -> Expr:
        """Each column of the scores (one per head) normalized over each target's incoming edges."""
        self._need(score, "edge", "edge_softmax")
        if not isinstance(score.value.width, int):
            raise ModelError(f"edge_softmax takes a score per head (a literal width), got width {score.value.width}")
        return self._op("edge_softmax", (score.value,), "edge", score.value.width, ALL_ENDS)

    def each_edge(self, w: Selected) -> Expr:
        """A per-relation vector weight as one row per edge (``w`` is ``W[m.relation]``)."""
        if not isinstance(w, Selected) or w.by != "etype" or len(w.weight.shape) != 1:
            raise ModelError("each_edge takes a per-relation vector weight indexed by m.relation")
        return self._op("take", (w.weight,), "edge", w.weight.shape[0], {"etype"}, (("by", "etype"),))

    def each_node(self, w: Selected) -> Expr:
        """A per-node-type vector weight as one row per node (``w`` is ``W[m.node_type]``)."""
        if not isinstance(w, Selected) or w.by != "node_type" or len(w.weight.shape) != 1:
            raise ModelError("each_node takes a per-node-type vector weight indexed by m.node_type")
        return self._op("take", (w.weight,), "node", w.weight.shape[0], (), (("by", "node_type"),))

    def rsqrt(self, width, like: Expr) -> Expr:
        """``1 / sqrt(width)`` (a width symbol, known when the model runs) in ``like``'s domain."""
        if not isinstance(width, str):  # a number's 1 / sqrt is a literal: write it as one
            raise ModelError(f"rsqrt takes a width's name (such as 'in'), got {_shown(width)}")
        if not isinstance(like, Expr) or like.value.domain == "weight":
            raise ModelError(f"rsqrt's like takes rows (a node, edge or pair value), got {_shown(like)}")
        return self._op("const", (), like.value.domain, 1, (), (("rsqrt", width),))

    # Rows
    def dot(self, a: Expr, b, heads: int = 1) -> Expr:
        """The row-wise dot product of two values of one domain and width (``b`` may be a shared
        or per-type vector weight); with ``heads``, one per head: the dot of each of the ``heads``
        blocks of columns, a value of width ``heads``."""
        if not isinstance(a, Expr) or a.value.domain == "weight":
            raise ModelError("dot takes rows (node, edge or pair values) first")
        if (heads := whole_number(given := heads, at_least=1)) is None:
            raise ModelError(f"dot's heads must be a positive integer, got {given!r}")
        b = self._as_rows(b, a, "dot")
        self._same(a, b, "dot")
        if a.value.width != b.value.width:
            raise ModelError(f"dot of widths {a.value.width} and {b.value.width}")
        if isinstance(a.value.width, int) and a.value.width % heads:  # a named width is checked when bound
            raise ModelError(
                f"dot with heads={heads} of width {a.value.width}: the width must be a multiple of the heads "
                "(heads are blocks of equal width)"
            )
        attrs = (("heads", heads),) if heads > 1 else ()
        return self._op("dot", (a.value, b.value), a.value.domain, heads, a.value.depends | b.value.depends, attrs)

    def leaky_relu(self, e: Expr, slope: float) -> Expr:
        number = _real(slope)
        if number is None or abs(number) > float(np.finfo(np.float32).max):
            # the kernels compute in float32: 1e300 would become inf there (the reference refuses it)
            raise ModelError(f"leaky_relu's slope must be a finite float32 number, got {_shown(slope)}")
        return self._unary("leaky_relu", e, (("slope", number),))

    def gelu(self, e: Expr) -> Expr:
        return self._unary("gelu", e)

    def sigmoid(self, e: Expr) -> Expr:
        return self._unary("sigmoid", e)

    def exp(self, e: Expr) -> Expr:
        return self._unary("exp", e)

    def tanh(self, e: Expr) -> Expr:
        return self._unary("tanh", e)

    # Helpers
    def _leaf(self, value: Value) -> Value:
        if not (isinstance(value.name, str) and value.name.isidentifier()):
            # tensors are passed by name, as keywords; names like "grad:0" are the operator's own
            raise ModelError(f"the name {value.name!r} is not a Python identifier: tensors are passed by name")
        known = self._names.get(value.name)
        if known is not None and "graph_data" in (known.op, value.op):  # a mean reads its graph data by name
            mine = value if value.op != "graph_data" else known
            raise ModelError(
                f"the name {value.name!r} is reserved for graph data ({', '.join(GRAPH_DATA)}): "
                f"name the {mine.op} otherwise"
            )
        if known is not None:
            raise ModelError(f"the name {value.name!r} is used twice")
        self._names[value.name] = value
        return value

    def _op(self, op, args, domain, width, depends=frozenset(), attrs=()) -> Expr:
        return Expr(self, Value(op, tuple(args), domain, width, frozenset(depends), tuple(attrs)))

    def _need(self, e, domain, what):
        if not isinstance(e, Expr) or e.value.domain != domain:
            hint = ""
            if isinstance(e, Selected) and domain == "edge":
                hint = (
                    " (a weight indexed by m.relation is no edge rows: m.each_edge makes a vector's rows, @ multiplies)"
                )
            raise ModelError(f"{what} takes {_a(domain)} value, got {_shown(e)}{hint}")

    def _same(self, a, b, what):
        if a.value.domain != b.value.domain:
            raise ModelError(
                f"{what} of {_a(a.value.domain)} value and {_a(b.value.domain)} value: both must be rows of one "
                "kind (m.src / m.dst bring node rows to the edges; a weight indexed by m.node_type gives node rows)"
            )

    def _reduce(self, e: Expr, how: str, end: str) -> Expr:
        """Edge rows reduced into nodes by ``end``: a sum; a mean is the sum over the node's edge
        count (graph data); a max is its own operator (``max_into_dst`` / ``max_into_src``)."""
        self._need(e, "edge", f"{how}_into_{end}")
        if how == "max":
            return self._op(f"max_into_{end}", (e.value,), "node", e.value.width)
        total = self._op(f"sum_into_{end}", (e.value,), "node", e.value.width)
        if how == "sum":
            return total
        count = self.graph_data("in_degree" if end == "dst" else "out_degree")
        return self._binary("div", total, count)

    def _gather(self, x: Expr, end: str) -> Expr:
        self._need(x, "node", f"m.{end}")
        return self._op("gather", (x.value,), "edge", x.value.width, {end}, (("end", end),))

    def _unary(self, op, e: Expr, attrs=()) -> Expr:
        if not isinstance(e, Expr):
            raise ModelError(f"{op} takes rows (a node, edge or pair value), got {_shown(e)}")
        if e.value.domain == "weight":
            raise ModelError(f"{op} of a weight: apply it to rows")
        return self._op(op, (e.value,), e.value.domain, e.value.width, e.value.depends, attrs)

    def _as_rows(self, operand, like: Expr, what: str) -> Expr:
        """An operand of ``what``, an elementwise op, as rows of ``like``'s domain."""
        if isinstance(operand, bool | np.bool_):  # an int to Python, surely a mistake in arithmetic
            raise ModelError(f"cannot use a bool ({operand}) in a model's arithmetic: write 1.0 or 0.0")
        if isinstance(operand, int | float | np.integer | np.floating):  # numpy scalars are numbers too
            if _real(operand) is None:  # inf or nan would run, and turn every row it touches to inf or nan
                raise ModelError(f"{what}'s constant must be a finite number, got {_shown(operand)}")
            # One past float32's range is refused when a layer is called in float32 (op.Layer): it
            # fits a float64 one.
            return self._op("const", (), like.value.domain, 1, frozenset(), (("value", _real(operand)),))
        if isinstance(operand, Selected):
            if len(operand.weight.shape) != 1:  # named here: each_edge/each_node are not what the user wrote
                by = "m.node_type" if operand.by == "node_type" else "m.relation"
                raise ModelError(
                    f"{what} takes a vector weight per type, but {operand.weight.name}[{by}] is a matrix (a matrix "
                    "multiplies rows with @)"
                )
            return self.each_node(operand) if operand.by == "node_type" else self.each_edge(operand)
        if isinstance(operand, Expr) and operand.value.domain == "weight":
            w = operand.value
            if w.per is not None or len(w.shape) != 1:
                raise ModelError(f"weight {w.name} in elementwise arithmetic must be a shared vector")
            return self._op("broadcast", (w,), like.value.domain, w.shape[0])
        if isinstance(operand, Expr):
            return operand
        if isinstance(operand, _Index):
            raise ModelError(f"{what}: m.relation and m.node_type only index a weight (as W[m.relation])")
        raise ModelError(f"cannot use {_shown(operand)} in a model's arithmetic")

    def _binary(self, op, a, b) -> Expr:
        like = a if isinstance(a, Expr) and a.value.domain != "weight" else b
        if not isinstance(like, Expr) or like.value.domain == "weight":
            raise ModelError(f"{op} needs at least one operand that is rows (node, edge or pair values)")
        a, b = self._as_rows(a, like, op), self._as_rows(b, like, op)
        self._same(a, b, op)
        width = broadcast_width(a.value.width, b.value.width)
        if width is None:
            raise ModelError(
                f"{op} of widths {a.value.width} and {b.value.width} (a literal width broadcasts over a "
                "width it divides, head by head; two named widths must be the same)"
            )
        return self._op(op, (a.value, b.value), a.value.domain, width, a.value.depends | b.value.depends)

    def _matmul(self, e: Expr, w) -> Expr:
        if isinstance(w, Selected):
            weight, by = w.weight, w.by
        elif isinstance(w, Expr) and w.value.domain == "weight" and w.value.per is None:
            weight, by = w.value, None
        else:
            raise ModelError("@ multiplies rows by a weight: W, W[m.relation] or W[m.node_type]")
        if len(weight.shape) != 2:
            raise ModelError(f"@ by weight {weight.name} of shape {weight.shape}: a matrix is needed")
        if e.value.domain == "weight":
            raise ModelError("@ of two weights: multiply rows by a weight")
        if e.value.width != weight.shape[0]:
            raise ModelError(f"@ of width {e.value.width} by weight {weight.name} of shape {weight.shape}")
        if by == "node_type" and e.value.domain != "node":
            raise ModelError(f"{weight.name}[m.node_type] applies to node values; gather after the product")
        if by == "etype" and e.value.domain == "node":
            raise ModelError(
                f"{weight.name}[m.relation] applies to edge values (m.src(x), m.dst(x)): a node has no relation"
            )
        if by is None:
            return self._op("matmul", (e.value, weight), e.value.domain, weight.shape[1], e.value.depends)
        depends = e.value.depends | ({"etype"} if by == "etype" else set())
        return self._op("typed_matmul", (e.value, weight), e.value.domain, weight.shape[1], depends, (("by", by),))


def _width(what: str, width) -> int | str:
    """A declared width: a name (a symbol bound when the model runs, such as 'in') or a positive
    whole number (a literal, checked against the tensors); anything else is refused here, where
    it was written, not as an error of a later operator."""
    if isinstance(width, str) and width.isidentifier():
        return width
    if isinstance(width, int | np.integer) and not isinstance(width, bool | np.bool_) and width > 0:
        return int(width)
    raise ModelError(f"{what}: a width is a name (such as 'in') or a positive whole number, got {_shown(width)}")


def _real(number) -> float | None:
    """``number`` as real_number takes it, where an int past a float's range is no number either
    (float() raises on it)."""
    try:
        return real_number(number)
    except OverflowError:
        return None


def _shown(arg) -> str:
    """An argument as a refusal names it: a weight by its name, anything else by its repr."""
    if isinstance(arg, Selected):
        return f"weight {arg.weight.name}[m.{'relation' if arg.by == 'etype' else 'node_type'}]"
    if isinstance(arg, Expr):
        return f"weight {arg.value.name}" if arg.value.domain == "weight" else f"{_a(arg.value.domain)} value"
    return f"{type(arg).__name__} {arg!r}"[:80]


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def broadcast_width(wa, wb):
    """The width of an elementwise operator's result, or None if the operands do not broadcast:
    equal widths; a literal width (a head count) over a named one (checked to divide it when the
    widths are bound) or over a literal multiple of it."""
    if wa == wb:
        return wa
    if isinstance(wa, int) and isinstance(wb, int):
        small, large = min(wa, wb), max(wa, wb)
        return large if small and large % small == 0 else None
    if isinstance(wa, int) or isinstance(wb, int):
        return wb if isinstance(wa, int) else wa
    return None


def _check_rsqrt_widths(program: Program, builder: Builder) -> None:
    """``m.rsqrt(width)`` names a width some input or weight the model uses declares: its size is
    known only from the tensors given for them, and a leaf the outputs do not reach is not given
    (the layer refuses it as unused)."""
    used = set()
    for leaf in program.inputs():
        used.update(w for w in (leaf.width, *leaf.shape) if isinstance(w, str))
    for value in program.values:
        width = value.attr("rsqrt")
        if isinstance(width, str) and width not in used:
            known = ", ".join(sorted(used)) or "none"
            unused = [n for n, leaf in builder._names.items() if width in (leaf.width, *leaf.shape)]
            hint = (
                f"; {', '.join(unused)} declares it but no output reads it (a value used only as rsqrt's like "
                "gives the rows, not the width)"
                if unused
                else ""
            )
            raise ModelError(
                f"rsqrt of width {width!r}: no input or weight the model uses has that width (widths: {known}){hint}"
            )


def model(fn: Callable) -> Callable[[], Program]:
    """Trace ``fn(m)`` into a :class:`Program` named after it; calling the result traces anew, so
    each caller gets a program of its own to run passes on."""

    name = _name_of(fn)

    def trace() -> Program:
        builder = Builder()
        out = fn(builder)
        outputs = out if isinstance(out, tuple) else (out,)
        for o in outputs:
            if not isinstance(o, Expr) or o.value.domain != "node":
                raise ModelError(f"{name} must return node values")
        program = Program(name, [o.value for o in outputs])
        _check_rsqrt_widths(program, builder)
        return program

    trace.__name__ = name
    trace.__doc__ = fn.__doc__
    return trace


def _name_of(fn: Callable) -> str:
    """A model function's name; a callable without ``__name__`` (a ``functools.partial``, an
    object with ``__call__``) is named after the function it wraps, or its class."""
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "func", None), "__name__", None)
    return name if isinstance(name, str) and name else type(fn).__name__
