"""A program as a differentiable PyTorch operator: a pair of ``torch.library`` custom ops, the
forward program and its IR backward (systems/hector/autodiff.py), tied by ``register_autograd``.

    layer = Layer(passes.optimize(models.rgat_layer(), "reorder", "compact"))
    out = layer(graph, x=x, W=W, q=q, k=k, bias=bias)     # differentiable in every tensor

The ops take the graph as an integer handle (:func:`register_graph`): a relational graph is a set
of index tensors with precomputed orders, which the ops' schema would otherwise have to list one
by one. On CUDA tensors they run the generated kernels (systems/hector/codegen.py), on any other device
the reference backend (systems/hector/reference.py).
"""

from __future__ import annotations

import hashlib
import weakref

import torch

from harness.errors import UserError
from systems.hector import codegen, lower, reference
from systems.hector.autodiff import differentiate, leaves
from systems.hector.ir import Program
from workloads.rgnn.graph import RelGraph

_graphs: weakref.WeakValueDictionary[int, RelGraph] = weakref.WeakValueDictionary()  # held by their callers
_ops: dict[str, tuple] = {}  # by op name: a program's text decides its name, so each registers once


def register_graph(graph: RelGraph) -> int:
    """A handle for ``graph`` that the ops take, valid while the caller holds the graph."""
    handle = id(graph)
    _graphs[handle] = graph
    return handle


def _graph(handle: int) -> RelGraph:
    if handle not in _graphs:
        raise UserError(f"graph handle {handle} is not registered (systems.hector.op.register_graph)")
    return _graphs[handle]


class Layer:
    """``program`` as an operator; its tensors are given by name when called."""

    def __init__(self, program: Program):
        self.program = program
        self.names = [leaf.name for leaf in leaves(program)]
        digest = hashlib.sha256(str(program).encode()).hexdigest()[:12]
        self.op_name = f"{program.name}_{digest}"
        if self.op_name not in _ops:
            _ops[self.op_name] = _define(self.op_name, program, self.names)
        self.forward_op, self.backward_op = _ops[self.op_name]

    def __call__(self, graph: RelGraph, **tensors: torch.Tensor) -> torch.Tensor:
        missing, extra = set(self.names) - set(tensors), set(tensors) - set(self.names)
        if missing or extra:
            raise UserError(
                f"{self.program.name} takes {', '.join(self.names)}"
                + (f"; missing {', '.join(sorted(missing))}" if missing else "")
                + (f"; unknown {', '.join(sorted(extra))}" if extra else "")
            )
        handle = register_graph(graph)
        return self.forward_op(handle, [tensors[name] for name in self.names])


def _fresh(t: torch.Tensor, given: list[torch.Tensor]) -> torch.Tensor:
    """A custom op's result may not alias its inputs: copy one that does."""
    return t.clone() if any(t.untyped_storage().data_ptr() == g.untyped_storage().data_ptr() for g in given) else t


def _float32(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The generated kernels are float32 (the tensor-core variant is separate): say so, not fail."""
    for name, t in tensors.items():
        if t.dtype != torch.float32:
            raise UserError(f"{name} is {t.dtype}; the generated float32 kernels take float32 tensors")
    return tensors


def _define(op_name: str, program: Program, names: list[str]):
    backward_program = differentiate(program)

    @torch.library.custom_op(f"hector::{op_name}", mutates_args=())
    def forward(graph: int, tensors: list[torch.Tensor]) -> torch.Tensor:
        (out,) = reference.run(program, _graph(graph), dict(zip(names, tensors, strict=True)))
        return _fresh(out, tensors)

    forward_plan, backward_plan = lower.lower(program), lower.lower(backward_program)

    @forward.register_kernel("cuda")
    def _(graph, tensors):
        g, bound = _graph(graph), _float32(dict(zip(names, tensors, strict=True)))
        (out,) = codegen.run(forward_plan, g, bound, reference.bind_widths(program, g, bound))
        return _fresh(out, tensors)

    @forward.register_fake
    def _(graph, tensors):
        g = _graph(graph)
        width = reference.output_width(program, g, dict(zip(names, tensors, strict=True)))
        return tensors[0].new_empty(g.num_nodes, width)

    @torch.library.custom_op(f"hector::{op_name}_backward", mutates_args=())
    def backward(graph: int, tensors: list[torch.Tensor], grad: torch.Tensor) -> list[torch.Tensor]:
        bound = dict(zip(names, tensors, strict=True)) | {"grad:0": grad}
        results = reference.run(backward_program, _graph(graph), bound)[1:]
        return [_fresh(r, [*tensors, grad]) for r in results]

    @backward.register_kernel("cuda")
    def _(graph, tensors, grad):
        g = _graph(graph)
        bound = _float32(dict(zip(names, tensors, strict=True)) | {"grad:0": grad})
        results = codegen.run(backward_plan, g, bound, reference.bind_widths(backward_program, g, bound))[1:]
        return [_fresh(r, [*tensors, grad]) for r in results]

    @backward.register_fake
    def _(graph, tensors, grad):
        return [torch.empty_like(t) for t in tensors]

    def setup_context(ctx, inputs, output):
        ctx.graph, tensors = inputs
        ctx.save_for_backward(*tensors)

    def differentiate_op(ctx, grad):
        return None, list(backward(ctx.graph, list(ctx.saved_tensors), grad.contiguous()))

    forward.register_autograd(differentiate_op, setup_context=setup_context)
    return forward, backward
