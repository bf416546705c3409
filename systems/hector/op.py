"""A program as a differentiable PyTorch operator: ``torch.library`` ops for the forward program
and its IR backward (systems/hector/autodiff.py), tied by ``register_autograd``, and an inference
op for calls that need no gradient.

    layer = Layer(passes.optimize(rgat_layer(), "reorder", "compact"))  # systems/rgnn/models/rgat.py
    out = layer(graph, x=x, W=W, q=q, k=k, bias=bias)     # differentiable in every tensor

The ops take the graph as an integer handle (:func:`register_graph`): a relational graph is a set
of index tensors with precomputed orders, which the ops' schema would otherwise have to list one
by one. On CUDA tensors they run the generated kernels (systems/hector/codegen.py), on any other device
the reference backend (systems/hector/reference.py). ``Layer(program, tensor_cores=True)`` is the
labelled TF32 variant: its products run on tensor cores (inputs rounded to TF32, fp32
accumulate); off CUDA it is the reference, which computes in the tensors' type as without it.

A call's tensors (features, weights, the gradient) hold one type: float32, or bfloat16, which the
generated kernels store in bf16 and compute in float32 (systems/hector/codegen.py), and which the
reference computes in float32 on the bf16 values; the results are in the tensors' type. Mixed
types are refused in one line naming the tensors of each. Off CUDA the reference also takes
float64 (computed in float64) and float16 (computed as bf16 is; the values saved for the backward
stay float32: see ``saved_types``). A layer is differentiable once:
differentiating its gradients is refused.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from collections.abc import Callable

import torch

from harness.errors import UserError
from systems.hector import codegen, cuda_graphs, lower, reference
from systems.hector.autodiff import leaves, split
from systems.hector.ir import Program, checked_program
from systems.relgraph.graph import RelGraph

_graphs: weakref.WeakValueDictionary[int, RelGraph] = weakref.WeakValueDictionary()  # held by their callers
_ops: dict[str, _Ops] = {}  # by op name: a program's text decides its name, so each registers once
_FLOAT32_MAX = torch.finfo(torch.float32).max


# Under torch.compile the registration runs once, while tracing, and the handle is a constant of
# the compiled code (which is specialized on the graph object, so the two cannot part).
@torch.compiler.assume_constant_result
def register_graph(graph: RelGraph) -> int:
    """A handle for ``graph`` that the ops take, valid while the caller holds the graph."""
    handle = id(graph)
    if handle not in _graphs:
        _graphs[handle] = graph
        # The pairs are counted now, outside any fake-tensor tracing: the ops' shapes need it.
        lower.GraphIndex.of(graph)["pair_src"]
    return handle


def _graph(handle: int) -> RelGraph:
    if handle not in _graphs:
        raise UserError(f"graph handle {handle} is not registered (systems.hector.op.register_graph)")
    return _graphs[handle]


class Layer:
    """``program`` as an operator; its tensors are given by name when called."""

    def __init__(self, program: Program, tensor_cores: bool = False):
        program = checked_program(program, "Layer")
        if not isinstance(tensor_cores, bool):
            raise UserError(f"Layer: tensor_cores must be True or False, got {tensor_cores!r}")
        if len(program.outputs) != 1:  # the ops return one output and take one output's gradient
            raise UserError(f"a Layer runs a program of one output; {program.name} returns {len(program.outputs)}")
        self.program, self.tensor_cores = program, tensor_cores
        self.names = [leaf.name for leaf in leaves(program)]
        digest = hashlib.sha256(str(program).encode()).hexdigest()[:12]
        self.op_name = f"{_identifier(program.name)}_{digest}" + ("_tf32" if tensor_cores else "")
        if self.op_name not in _ops:
            _ops[self.op_name] = _define(self.op_name, program, self.names, tensor_cores)
        self.ops = _ops[self.op_name]
        self.forward_op, self.backward_op, self.inference_op = self.ops.forward, self.ops.backward, self.ops.inference
        # The constant of largest magnitude: past float32's range, a layer runs in float64 only.
        numbers = [v.attr("value", 0.0) for v in program.values if v.op == "const"]
        self.largest_constant = max(numbers, key=abs, default=0.0)

    def __reduce__(self):
        # Its registered ops do not pickle; the program does, and the same layer is made from it
        # (torch.save of a module that holds one, copy.deepcopy).
        return type(self), (self.program, self.tensor_cores)

    def __call__(self, /, *graph_given: RelGraph, **tensors: torch.Tensor) -> torch.Tensor:
        # The graph is positional (a model's leaf may be named "graph"); given by keyword, it is
        # taken as the graph where no leaf has that name, not reported missing.
        if not graph_given and "graph" in tensors and "graph" not in self.names:
            graph_given = (tensors.pop("graph"),)
        if len(graph_given) != 1:
            raise TypeError(f"{self.program.name} takes the graph, then its tensors by name: layer(graph, x=..., ...)")
        (graph,) = graph_given
        missing, extra = set(self.names) - set(tensors), set(tensors) - set(self.names)
        if missing or extra:
            raise UserError(
                f"{self.program.name} takes {', '.join(self.names)}"
                + (f"; missing {', '.join(sorted(missing))}" if missing else "")
                + (
                    f"; it does not read {', '.join(sorted(extra))} (misspelled, or declared but unused)"
                    if extra
                    else ""
                )
            )
        if not isinstance(graph, RelGraph):
            raise TypeError(
                f"{self.program.name}: graph must be a RelGraph (RelGraph.build), not {type(graph).__name__}"
            )
        # Once per call, here (GraphIndex.of, reached several times a call, trusts it): every path
        # reads what build derived from the edges, and the cached indices describe them as built.
        graph.check_unchanged()
        given = [tensors[name] for name in self.names]
        for name, t in zip(self.names, given, strict=True):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{self.program.name}: {name} must be a torch.Tensor, got {type(t).__name__}")
            # The ops index and multiply its values. (A meta tensor is refused below: off the graph's device.)
            if t.layout != torch.strided or t.is_nested:
                kind = "a nested" if t.is_nested else f"a {t.layout}"
                raise UserError(f"{self.program.name}: {name} must be a dense tensor, got {kind} tensor")
            # The ops dispatch on the tensors' device and index them with the graph's: one tensor
            # elsewhere (a meta x with CPU weights) would pick the wrong backend, or fail in torch.
            if t.device != graph.src.device:
                raise UserError(
                    f"{self.program.name}: {name} is on {t.device}, the graph on {graph.src.device}: "
                    "give every tensor on the graph's device"
                )
        dtype = given[0].dtype if given else torch.float32
        if abs(self.largest_constant) > _FLOAT32_MAX and dtype != torch.float64:
            raise UserError(
                f"{self.program.name}: the constant {self.largest_constant:g} is past the range of float32, "
                f"in which {_short(dtype)} tensors are computed (float64 tensors take it)"
            )
        if not torch.compiler.is_compiling() and _under_func_transform():
            raise UserError(
                f"{self.program.name}: Hector's layers do not support torch.func transforms (grad, vjp, jvp, "
                "jacrev, jacfwd, vmap): differentiate with torch.autograd (loss.backward(), torch.autograd.grad)"
            )
        handle = register_graph(graph)
        if torch.is_grad_enabled() and any(t.requires_grad for t in given):
            if torch.compiler.is_compiling():
                return self.forward_op(handle, given)[0]
            return _Training.apply(self.ops, handle, *given)
        return self.inference_op(handle, given)[0]


def _under_func_transform() -> bool:
    """Whether the call is inside a torch.func transform other than functionalize (which runs the
    ops as they are). Under grad or vjp the ops' autograd functions fail in torch, vmap has no
    batching rule for them, and jvp's tangents would come back as zeros."""
    if torch._C._functorch.maybe_current_level() is None:  # the common case costs one query
        return False
    try:  # torch's interpreter stack has no public API: where it moves, refuse every transform
        from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
    except ImportError:
        return True
    functionalize = torch._C._functorch.TransformType.Functionalize
    return any(level.key() != functionalize for level in retrieve_all_functorch_interpreters())


def _identifier(name: str) -> str:
    """``name`` as torch's schema parser takes an op name (ASCII letters, digits and _, not led by a
    digit): a model may be named ``<lambda>`` or ``café``. The digest after it keeps names apart."""
    return re.sub(r"\W|^(?=\d)", "_", name, flags=re.ASCII)


def _distinct(results: list[torch.Tensor], given: list[torch.Tensor]) -> list[torch.Tensor]:
    """A custom op's results may alias neither its inputs nor each other: copy those that do. Each
    is also contiguous, as the fake implementations say (torch.compile plans its memory by them):
    the reference's arithmetic would otherwise hand a transposed input's strides on to a result."""
    seen = {g.untyped_storage().data_ptr() for g in given if g.numel()}
    out = []
    for t in results:
        if t.numel() and t.untyped_storage().data_ptr() in seen:
            t = t.clone(memory_format=torch.contiguous_format)
        t = t.contiguous()
        seen.add(t.untyped_storage().data_ptr())
        out.append(t)
    return out


def element_type(tensors: dict[str, torch.Tensor], tensor_cores: bool = False, generated: bool = True) -> torch.dtype:
    """The one element type of a call's named tensors; refused in one line where they mix types,
    where the TF32 variant is given bf16, or where the generated kernels (``generated``) do not
    take the type (they take float32 and bfloat16; the reference takes any floating type)."""
    by_type: dict[torch.dtype, list[str]] = {}
    for name, t in tensors.items():
        by_type.setdefault(t.dtype, []).append(name)
    if len(by_type) > 1:
        fewest_first = sorted(by_type.items(), key=lambda item: len(item[1]))  # the odd ones out first
        listed = "; ".join(f"{', '.join(names)} {_short(dtype)}" for dtype, names in fewest_first)
        raise UserError(f"Hector takes tensors of one type (features and weights alike), got {listed}")
    dtype = next(iter(by_type), torch.float32)
    if not dtype.is_floating_point:  # an integer layer would come back in float32 (the graph's data is)
        raise UserError(f"Hector takes floating-point tensors, got {_short(dtype)} ones ({', '.join(by_type[dtype])})")
    if tensor_cores and dtype == torch.bfloat16:
        raise UserError("the TF32 variant multiplies float32 tensors, got bfloat16 ones (the plain layer takes them)")
    if generated and dtype not in codegen.ELEMENT_TYPES:
        raise UserError(f"the generated kernels take float32 or bfloat16 tensors, got {_short(dtype)}")
    return dtype


def _called_with(bound: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The caller's tensors and the gradient of a bound call, without the values the forward saved
    (float32 in a float16 call: see ``saved_types``)."""
    return {name: t for name, t in bound.items() if not name.startswith("saved:")}


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_lib = torch.library.Library("hector", "FRAGMENT")  # every program's ops, defined once each


class _Ops:
    """A program's three ops (``torch.ops.hector.<name>``, ``<name>_backward``, ``<name>_inference``)."""

    def __init__(self, forward, backward, inference):
        self.forward, self.backward, self.inference = forward, backward, inference

    def gradients(self, graph: int, tensors, grad: torch.Tensor | None, saved, output_shape) -> list[torch.Tensor]:
        grad = grad.contiguous() if grad is not None else tensors[0].new_zeros(output_shape)
        if not torch.is_grad_enabled():
            return self.backward(graph, list(tensors), grad, list(saved))
        # A backward that builds a graph (create_graph=True): the backward op has no derivative of
        # its own, and torch would differentiate through it as if it had, giving wrong second
        # derivatives. Its gradients are computed as constants and refuse to be differentiated.
        with torch.no_grad():
            grads = self.backward(graph, list(tensors), grad, list(saved))
        if not any(t.requires_grad for t in (*tensors, *saved, grad)):
            return grads
        return list(_FirstOrderOnly.apply(len(grads), *grads, *tensors, *saved, grad))


class _FirstOrderOnly(torch.autograd.Function):
    """The first ``count`` tensors (gradients) as they are, tied to the rest (what they were
    computed from), so that differentiating them by any of those is refused in one line."""

    @staticmethod
    def forward(ctx, count: int, *tensors: torch.Tensor):
        return tuple(g.clone() for g in tensors[:count])

    @staticmethod
    def backward(ctx, *_):
        raise UserError("Hector's layers are differentiable once: a gradient of their gradients is not computed")


class _Training(torch.autograd.Function):
    """The forward op and the backward op as one autograd node. The forward op's registered
    autograd formula ties the same two ops for callers of ``torch.ops.hector`` and for
    ``torch.compile``; an eager call takes this direct route, which skips the dispatcher's Python
    wrapping of that formula (on small graphs a call's host time is what a step costs)."""

    @staticmethod
    def forward(ctx, ops: _Ops, graph: int, *tensors: torch.Tensor) -> torch.Tensor:
        output, *saved = ops.forward(graph, list(tensors))
        ctx.ops, ctx.graph, ctx.count, ctx.output_shape = ops, graph, len(tensors), output.shape
        ctx.graph_object = _graph(graph)  # the handle is valid while the graph lives: until the backward
        ctx.save_for_backward(*tensors, *saved)
        return output

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        kept = ctx.saved_tensors
        grads = ctx.ops.gradients(ctx.graph, kept[: ctx.count], grad, kept[ctx.count :], ctx.output_shape)
        return None, None, *grads


def _outside_autocast(device_type: str, run: Callable) -> Callable:
    """``run`` with the caller's autocast turned off: the op computes in its inputs' type, as its
    kernels do. Under autocast the torch arithmetic of the CPU backend (and the host steps of a
    plan) would otherwise run in bfloat16 and save values of mixed types for the backward."""

    def without(*args):
        if not torch.is_autocast_enabled(device_type):  # the common case costs one query
            return run(*args)
        with torch.autocast(device_type, enabled=False):
            return run(*args)

    return without


def _define(op_name: str, program: Program, names: list[str], tensor_cores: bool) -> _Ops:
    """Three ops: the forward returns the output and the forward values the backward op reads, so
    a training step computes the forward once (autodiff.split); the inference op runs the
    program as written and returns only the output. Each has the reference backend for every
    device, the generated kernels for CUDA, and a fake implementation for tracing."""
    forward_program, backward_program = split(program)
    plans = {id(p): lower.lower(p) for p in (program, forward_program, backward_program)}

    def bind(tensors, grad=None, saved=()):
        if len(tensors) != len(names):  # torch.ops.hector callers pass the list themselves
            raise UserError(f"{op_name} takes {len(names)} tensors ({', '.join(names)}), got {len(tensors)}")
        bound = dict(zip(names, tensors, strict=True)) | {f"saved:{i}": t for i, t in enumerate(saved)}
        return bound if grad is None else bound | {"grad:0": grad}

    def on_cpu(prog, graph, bound, given):
        dtype = element_type(_called_with(bound), tensor_cores, generated=False)
        if dtype in (torch.bfloat16, torch.float16):
            # float32 arithmetic on the 16-bit values, the results rounded to their type (the graph's
            # float32 data would otherwise promote a float16 layer's results to float32)
            wide = reference.run(prog, _graph(graph), {name: t.float() for name, t in bound.items()})
            types = saved_types(prog, dtype, len(wide))
            return _distinct([t.to(to) for t, to in zip(wide, types, strict=True)], given)
        return _distinct(reference.run(prog, _graph(graph), bound), given)

    def saved_types(prog, dtype, count: int) -> list[torch.dtype]:
        """The types of ``prog``'s results on ``dtype`` tensors: the tensors' type, except for the
        values the training forward saves for the backward on float16 ones, kept in float32: float16's
        range (65504) does not hold every value a backward reads (an exponential in attention), and a
        saved inf would make the gradients NaN where the output is finite."""
        wide = prog is forward_program and dtype == torch.float16
        return [dtype] + [torch.float32 if wide else dtype] * (count - 1)

    def on_gpu(prog, graph, bound, given):
        g = _graph(graph)

        def widths() -> dict:  # the types checked where the launches are worked out (a replay's key holds them)
            element_type(bound, tensor_cores)
            return reference.bind_widths(prog, g, bound)

        return _distinct(cuda_graphs.run(plans[id(prog)], g, bound, widths, tensor_cores), given)

    def fake_outputs(prog, graph, tensors):
        g = _graph(graph)
        widths = reference.bind_widths(program, g, bind(tensors))
        rows = {"node": g.num_nodes, "edge": g.edges}
        shapes = []
        for value in prog.outputs:
            count = rows[value.domain] if value.domain in rows else len(lower.GraphIndex.of(g)["pair_src"])
            shapes.append((count, value.width if isinstance(value.width, int) else widths[value.width]))
        types = saved_types(prog, tensors[0].dtype, len(shapes))
        return [tensors[0].new_empty(shape, dtype=to) for shape, to in zip(shapes, types, strict=True)]

    def define(name: str, schema: str, run, fake):
        """``run(backend, graph, *args)`` on every device, the kernels on CUDA; returns the op."""
        _lib.define(f"{name}{schema}")
        _lib.impl(name, _outside_autocast("cpu", lambda *args: run(on_cpu, *args)), "CompositeExplicitAutograd")
        _lib.impl(name, _outside_autocast("cuda", lambda *args: run(on_gpu, *args)), "CUDA")
        torch.library.register_fake(f"hector::{name}", fake, lib=_lib)
        return getattr(torch.ops.hector, name).default

    def program_op(name: str, prog: Program):
        """``prog`` as an op of the graph and the named tensors (the forward and the inference op)."""
        return define(
            name,
            "(int graph, Tensor[] tensors) -> Tensor[]",
            lambda backend, graph, tensors: backend(prog, graph, bind(tensors), tensors),
            lambda graph, tensors: fake_outputs(prog, graph, tensors),
        )

    forward, inference = program_op(op_name, forward_program), program_op(f"{op_name}_inference", program)
    backward = define(
        f"{op_name}_backward",
        "(int graph, Tensor[] tensors, Tensor grad, Tensor[] saved) -> Tensor[]",
        lambda backend, graph, tensors, grad, saved: backend(
            backward_program, graph, bind(tensors, grad, saved), [*tensors, grad, *saved]
        ),
        lambda graph, tensors, grad, saved: [
            torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors
        ],
    )
    ops = _Ops(forward, backward, inference)

    def setup_context(ctx, inputs, output):
        ctx.graph, tensors = inputs
        ctx.graph_object = _graph(ctx.graph)  # the handle is valid while the graph lives: until the backward
        ctx.count, ctx.output_shape = len(tensors), output[0].shape
        ctx.save_for_backward(*tensors, *output[1:])

    def differentiate(ctx, grads):
        kept = ctx.saved_tensors
        return None, ops.gradients(ctx.graph, kept[: ctx.count], grads[0], kept[ctx.count :], ctx.output_shape)

    torch.library.register_autograd(f"hector::{op_name}", differentiate, setup_context=setup_context, lib=_lib)
    return ops
