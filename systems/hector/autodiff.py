"""Automatic differentiation at the IR level: a program's backward pass as more IR, so that the
same passes and code generators serve forward and backward.

:func:`differentiate` returns one program whose outputs are the forward outputs followed by the
gradient of every input and weight, in :func:`leaves` order (zeros for a leaf nothing depends
on). The gradient of output i is a node input named ``grad:<i>``. Its backward values refer to
forward values directly; :func:`split` cuts it into the forward and backward programs a training
step runs, deciding what the forward keeps for the backward.

Each operator's adjoint is written with IR operators (the backward-only ones run in the reference
backend's ``_evaluate_backward`` and lower to the same templates as the rest):

* a gather's adjoint is a sum into the gathered-from rows (``sum_into_src``, ``sum_into_dst``,
  ``sum_into_pair``);
* a typed product's is the transposed typed product (``typed_matmul`` with ``transpose``) for the
  rows and a per-type outer product (``typed_outer``) for the weight;
* edge softmax's is ``y * (g - sum_into_dst(g * y)[dst])``, in ordinary operators;
* a max into nodes sends each node's gradient to the edges whose entry equals the node's maximum,
  split evenly between them where several do (as torch's ``scatter_reduce(..., "amax")``):
  ``equal(e, max[end]) * (g / sum_into_end(equal(e, max[end])))[end]``;
* the gradient of an operand broadcast head by head is summed over each head's block of columns
  (``head_sum``; ``row_sum`` for width 1).
"""

from __future__ import annotations

from dataclasses import replace

from systems.hector.ir import Program, Value, topological


def differentiate(program: Program) -> Program:
    adjoints: dict[int, list[Value]] = {}

    def add_adjoint(target: Value, g: Value) -> None:
        if target.op in ("const", "graph_data"):
            return
        adjoints.setdefault(id(target), []).append(g)

    seeds = []
    for i, out in enumerate(program.outputs):
        seed = Value("input", (), out.domain, out.width, name=f"grad:{i}")
        seeds.append(seed)
        add_adjoint(out, seed)
    for value in reversed(program.values):
        if id(value) not in adjoints or value.op in ("input", "weight"):
            continue
        g = _total(adjoints[id(value)])
        for arg, contribution in _adjoint(value, g):
            add_adjoint(arg, contribution)
    grads = []
    for leaf in program.inputs():
        if leaf.op == "graph_data":
            continue
        found = adjoints.get(id(leaf))
        grads.append(_total(found) if found else Value("zeros_like", (leaf,), leaf.domain, leaf.width, per=leaf.per))
    return Program(program.name + "_backward", [*program.outputs, *grads])


# Forward values a backward program recomputes rather than keeps: reading rows in place or a
# constant costs nothing, and keeping a gather would materialize it.
RECOMPUTED = {"input", "weight", "graph_data", "const", "gather", "unpair", "take", "broadcast"}


def split(program: Program) -> tuple[Program, Program]:
    """Forward and backward as two programs, as a training step runs them:

    * forward: the outputs, then every forward value the backward pass reads (``saved``), so the
      backward pass does not compute the forward again;
    * backward: inputs by name (the forward's leaves, ``grad:<i>``, and ``saved:<j>`` for the j-th
      saved value); outputs the leaves' gradients, in :func:`leaves` order.
    """
    combined = differentiate(program)
    forward_ids = {id(v) for v in program.values}
    grads = combined.outputs[len(program.outputs) :]
    saved, seen = [], set()

    def need(value: Value) -> None:  # a forward value the backward pass reads
        if id(value) in seen:
            return
        seen.add(id(value))
        if value.op in RECOMPUTED or value.domain == "weight":  # weight algebra is cheap to redo
            for arg in value.args:
                need(arg)
        else:
            saved.append(value)

    for value in topological(grads):
        if id(value) not in forward_ids:
            for arg in value.args:
                if id(arg) in forward_ids:
                    need(arg)
    kept = {id(v): Value("input", (), v.domain, v.width, v.depends, name=f"saved:{i}") for i, v in enumerate(saved)}
    mapped: dict[int, Value] = {}
    for value in topological(grads):
        if id(value) in kept:
            mapped[id(value)] = kept[id(value)]
            continue
        args = tuple(mapped[id(a)] for a in value.args)
        mapped[id(value)] = value if all(a is b for a, b in zip(args, value.args)) else replace(value, args=args)
    forward = Program(program.name + "_forward", [*program.outputs, *saved])
    return forward, Program(program.name + "_backward", [mapped[id(g)] for g in grads])


def leaves(program: Program) -> list[Value]:
    """The inputs and weights whose gradients :func:`differentiate` returns, in its order."""
    return [v for v in program.inputs() if v.op != "graph_data"]


def _total(parts: list[Value]) -> Value:
    total = parts[0]
    for part in parts[1:]:
        total = Value("add", (total, part), total.domain, total.width, total.depends | part.depends)
    return total


def _rows(op: str, args: tuple[Value, ...], like: Value, width=None, attrs=()) -> Value:
    depends = frozenset().union(*(a.depends for a in args if a.domain == like.domain))
    return Value(op, args, like.domain, like.width if width is None else width, depends, tuple(attrs))


def _fit(g: Value, arg: Value) -> Value:
    """The adjoint ``g`` of a broadcast operand: summed over the width it was broadcast to (over
    each head's block, for an operand of one column per head)."""
    if arg.width == 1 and g.width != 1:
        return _rows("row_sum", (g,), g, width=1)
    if arg.width != g.width:
        return _rows("head_sum", (g,), g, width=arg.width)
    return g


def _adjoint(v: Value, g: Value) -> list[tuple[Value, Value]]:
    op, args = v.op, v.args
    if op == "broadcast":  # a shared vector added to every row
        return [(args[0], Value("sum_rows", (g,), "weight", shape=args[0].shape))]
    if op == "take":
        w = args[0]
        by = v.attr("by")
        return [(w, Value("sum_by_type", (g,), "weight", attrs=(("by", by),), shape=w.shape, per=w.per))]
    if op == "gather":
        end = v.attr("end")
        op_back = "sum_into_src" if end == "src" else "sum_into_dst"
        return [(args[0], Value(op_back, (g,), "node", g.width))]
    if op == "unpair":
        return [(args[0], Value("sum_into_pair", (g,), "pair", g.width, args[0].depends))]
    if op in ("sum_into_dst", "sum_into_src") and args[0].domain == "edge":
        return [(args[0], _gather(g, op.rsplit("_", 1)[1]))]
    if op in ("max_into_dst", "max_into_src"):
        end = op.rsplit("_", 1)[1]
        edges = args[0]
        at_max = _rows("equal", (edges, _gather(v, end)), edges)
        count = Value(f"sum_into_{end}", (at_max,), "node", v.width)
        share = Value("div", (g, count), "node", v.width)
        return [(edges, _rows("mul", (at_max, _gather(share, end)), edges))]
    if op == "typed_matmul":
        rows, w = args
        by = v.attr("by")
        d_rows = Value("typed_matmul", (g, w), v.domain, rows.width, v.depends, (("by", by), ("transpose", True)))
        d_w = Value("typed_outer", (rows, g), "weight", attrs=(("by", by),), shape=w.shape, per=w.per)
        return [(rows, d_rows), (w, d_w)]
    if op == "matmul":
        rows, w = args
        d_rows = Value("matmul", (g, w), v.domain, rows.width, v.depends, (("transpose", True),))
        return [(rows, d_rows), (w, Value("outer", (rows, g), "weight", shape=w.shape))]
    if op == "weight_product":
        w, vec = args
        return [
            (w, Value("weight_product_grad_w", (g, vec), "weight", shape=w.shape, per=w.per)),
            (vec, Value("weight_product_grad_v", (w, g), "weight", shape=vec.shape)),
        ]
    if op == "add":
        return [(a, _fit(g, a)) for a in args]
    if op == "sub":
        a, b = args
        negative = _rows("mul", (g, _const(g, -1.0)), g)
        return [(a, _fit(g, a)), (b, _fit(negative, b))]
    if op == "div":  # a / b: g / b, and -g a / b^2 = -(g v) / b
        a, b = args
        negative = _rows("mul", (_rows("div", (_rows("mul", (g, v), g), b), g, width=v.width), _const(g, -1.0)), g)
        return [(a, _fit(_rows("div", (g, b), g, width=v.width), a)), (b, _fit(negative, b))]
    if op == "mul":
        a, b = args
        return [
            (a, _fit(_rows("mul", (g, b), g, width=v.width), a)),
            (b, _fit(_rows("mul", (g, a), g, width=v.width), b)),
        ]
    if op == "dot":
        a, b = args
        return [(a, _rows("mul", (g, b), g, width=a.width)), (b, _rows("mul", (g, a), g, width=b.width))]
    if op == "leaky_relu":
        return [(args[0], _rows("leaky_relu_grad", (args[0], g), g, attrs=v.attrs))]
    if op == "gelu":
        return [(args[0], _rows("gelu_grad", (args[0], g), g))]
    if op == "sigmoid":  # y (1 - y) g
        one_minus = _rows("sub", (_const(v, 1.0), v), v)
        return [(args[0], _rows("mul", (_rows("mul", (v, one_minus), v), g), g))]
    if op == "exp":
        return [(args[0], _rows("mul", (v, g), g))]
    if op == "tanh":  # (1 - y^2) g
        one_minus = _rows("sub", (_const(v, 1.0), _rows("mul", (v, v), v)), v)
        return [(args[0], _rows("mul", (one_minus, g), g))]
    if op == "edge_softmax":  # y * (g - sum over the target's edges of g * y), head by head
        weighted = _rows("mul", (g, v), g)
        total = Value("sum_into_dst", (weighted,), "node", v.width)
        back = _gather(total, "dst")
        return [(args[0], _rows("mul", (v, _rows("sub", (g, back), g)), g))]
    raise NotImplementedError(f"no adjoint for operator {op!r}")


def _gather(node_rows: Value, end: str) -> Value:
    """A node value read by each edge at its ``end``."""
    return Value("gather", (node_rows,), "edge", node_rows.width, frozenset({end}), (("end", end),))


def _const(like: Value, number: float) -> Value:
    return Value("const", (), like.domain, 1, attrs=(("value", number),))
