"""Hector's inter-operator IR: a typed operator DAG in SSA form.

Every value lives in a *domain*, which says what its rows are:

* ``node``: one row per node;
* ``edge``: one row per edge;
* ``pair``: one row per distinct (source node, relation) pair (compact materialization);
* ``weight``: a model parameter (per relation, per node type or shared), not a row set.

Edge and pair values also carry ``depends``: which of the edge's ends and type (``src``, ``dst``,
``etype``) their rows are a function of. A value that depends only on ``src`` and ``etype`` is the
same for every edge of one (source, relation) pair, which is what the compact-materialization
pass looks for.

Widths are symbols (``"in"``, ``"out"``) or integers; a weight's leading per-relation or per-type
dimension is not part of its ``shape``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.errors import UserError

DOMAINS = ("node", "edge", "pair", "weight")
ENDS = ("src", "dst", "etype")


@dataclass(frozen=True, eq=False)  # identity, not value, equality: two equal-looking ops are two ops
class Value:
    """One operator's result. ``args`` are the operator's inputs; ``attrs`` its settings as sorted
    (key, value) pairs; ``width`` the row width (for weights, ``shape`` and ``per``)."""

    op: str
    args: tuple[Value, ...]
    domain: str
    width: str | int | None = None
    depends: frozenset[str] = frozenset()
    attrs: tuple[tuple[str, object], ...] = ()
    name: str | None = None  # inputs and weights: the name the caller binds
    shape: tuple[str | int, ...] = ()  # weights only
    per: str | None = None  # weights only: "relation", "node_type" or None (shared)

    def attr(self, key: str, default=None):
        return dict(self.attrs).get(key, default)


@dataclass
class Program:
    """A model's operators in an order where every argument comes before its users."""

    name: str
    outputs: list[Value]
    values: list[Value] = field(default_factory=list)

    def __post_init__(self):
        if not self.values:
            self.values = topological(self.outputs)

    def inputs(self) -> list[Value]:
        return [v for v in self.values if v.op in ("input", "weight", "graph_data")]

    def __str__(self) -> str:
        return format_program(self)


def checked_program(program, taker: str) -> Program:
    """``program``, refused in one line where it is not a traced :class:`Program`: the @model
    function itself (its call forgotten) is the usual slip."""
    if isinstance(program, Program):
        return program
    if callable(program):
        name = getattr(program, "__name__", "the model function")
        raise UserError(f"{taker} takes a traced Program: call the @model function, {name}(), and pass what it returns")
    raise UserError(f"{taker} takes a traced Program (what a @model function returns), got {type(program).__name__}")


def topological(outputs: list[Value]) -> list[Value]:
    """Every value the outputs reach, arguments first, in first-reached order (deterministic)."""
    order, seen = [], set()

    def visit(value: Value):
        stack = [(value, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in seen:
                continue
            if expanded:
                seen.add(id(node))
                order.append(node)
                continue
            stack.append((node, True))
            stack.extend((arg, False) for arg in reversed(node.args) if id(arg) not in seen)

    for out in outputs:
        visit(out)
    return order


def format_program(program: Program) -> str:
    """One line per operator, for golden tests and for reading what a pass did, e.g.

    ``%4 = typed_matmul[by=etype](%2, %3) : edge[out] {src,etype}``."""
    names: dict[int, str] = {}
    lines = [f"program {program.name}"]
    for i, value in enumerate(program.values):
        names[id(value)] = f"%{i}"
        args = ", ".join(names[id(a)] for a in value.args)
        attrs = ",".join(f"{k}={v}" for k, v in value.attrs)
        head = value.op + (f"[{attrs}]" if attrs else "") + (f" {value.name}" if value.name else "")
        lines.append(f"  %{i} = {head}({args}) : {describe(value)}")
    lines.append("  return " + ", ".join(names[id(o)] for o in program.outputs))
    return "\n".join(lines)


def describe(value: Value) -> str:
    if value.domain == "weight":
        per = f" per {value.per}" if value.per else ""
        return f"weight[{','.join(map(str, value.shape))}]{per}"
    deps = " {" + ",".join(d for d in ENDS if d in value.depends) + "}" if value.depends else ""
    return f"{value.domain}[{value.width}]{deps}"
