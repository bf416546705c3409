"""Passes over the inter-operator IR. Each takes a program and returns a new one that computes the
same outputs (the tests run both through the reference backend); values are never changed in
place.

* :func:`reorder_linear`: ``(rows @ W[r]) @ v`` with a shared ``v`` of a literal width (an
  attention vector) becomes ``rows @ (W[r] @ v)``: the weight product is made once per relation,
  and the per-row product is ``in x k`` wide instead of ``in x out`` then ``out x k``. In RGAT the
  target side's transform is then used by nothing else and disappears.
* :func:`compact_materialization`: an edge value that depends only on the edge's source and
  relation (``src(x) @ W[r]``, and what is computed from such values alone) is computed once per
  distinct (source, relation) pair and read per edge through the edge's pair.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from harness.errors import UserError
from systems.hector.ir import Program, Value, checked_program

# Operators whose result row i depends only on row i of their row arguments (and on weights).
ROWWISE = {"gather", "take", "matmul", "typed_matmul", "add", "sub", "mul", "dot", "leaky_relu", "gelu", "sigmoid"}
ROWWISE |= {"exp", "const", "broadcast"}
HEAVY = {"matmul", "typed_matmul"}  # worth computing per pair rather than per edge


def rewrite(program: Program, fn: Callable[[Value, dict[int, Value]], Value]) -> Program:
    """A new program: each value, rebuilt on its rewritten arguments, is passed to ``fn`` (which
    may return it or a replacement; ``fn`` also sees the mapping of earlier values)."""
    mapped: dict[int, Value] = {}
    for value in program.values:
        args = tuple(mapped[id(a)] for a in value.args)
        rebuilt = value if all(a is b for a, b in zip(args, value.args)) else dataclasses.replace(value, args=args)
        mapped[id(value)] = fn(rebuilt, mapped)
    return Program(program.name, [mapped[id(o)] for o in program.outputs])  # unused values drop out


def reorder_linear(program: Program) -> Program:
    def fn(value: Value, _) -> Value:
        if value.op != "matmul" or value.args[0].op != "typed_matmul":
            return value
        inner, v = value.args
        rows, w = inner.args
        if inner.attr("by") != "etype" or not isinstance(v.shape[1], int):
            return value
        folded = Value("weight_product", (w, v), "weight", shape=(w.shape[0], v.shape[1]), per=w.per)
        return dataclasses.replace(inner, args=(rows, folded), width=v.shape[1])

    return rewrite(program, fn)


def compact_materialization(program: Program) -> Program:
    # Keyed by the values themselves (identity: Value has eq=False), which keeps them alive for the
    # pass. Keyed by id(), a rebuilt value replaced by its ``unpair`` is freed at once, and a later
    # value can take its id and so inherit its twin: the pass would read the wrong value.
    pair_of: dict[Value, Value] = {}  # an edge value's pair-domain twin, keyed by the rebuilt edge value
    heavy: set[Value] = set()  # twins whose computation includes a matrix product

    def fn(value: Value, _) -> Value:
        if value.domain != "edge" or not value.depends <= {"src", "etype"} or value.op not in ROWWISE:
            return value
        if value.op == "gather" and value.attr("end") != "src":
            return value
        edge_args = [a for a in value.args if a.domain == "edge"]
        if not all(a in pair_of for a in edge_args):
            return value
        args = tuple(pair_of[a] if a.domain == "edge" else a for a in value.args)
        twin = dataclasses.replace(value, args=args, domain="pair")
        pair_of[value] = twin
        if value.op in HEAVY or any(pair_of[a] in heavy for a in edge_args):
            heavy.add(twin)
            # Read per edge through its pair; an edge user sees this value, and its own twin chain
            # continues from ``twin`` (registered under the replacement too).
            unpaired = Value("unpair", (twin,), "edge", value.width, value.depends)
            pair_of[unpaired] = twin
            return unpaired
        return value

    return rewrite(program, fn)


PASSES = {"reorder": reorder_linear, "compact": compact_materialization}


def check_names(names) -> None:
    """Refuses, in one line, a pass name that is not one of :data:`PASSES`."""
    for name in names:
        if not isinstance(name, str) or name not in PASSES:
            raise UserError(f"no pass {name!r}; the passes are {', '.join(PASSES)}")


def optimize(program: Program, *names: str) -> Program:
    """``program`` after the named passes, in the order given (``reorder`` before ``compact``)."""
    program = checked_program(program, "optimize")
    check_names(names)
    for name in names:
        program = PASSES[name](program)
    return program
