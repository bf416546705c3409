"""``cuda_graph``: the model's layers captured as CUDA graphs, one pair (forward, backward) per
bucketed subgraph size, and replayed: one launch each way for the whole model.

A CUDA graph replays its kernels with the shapes and addresses they were captured with, and a
sampled subgraph changes size at every batch. So each subgraph is padded up to a bucket: its node
count (plus at least :data:`PAD_NODES`) and its edge count each to the next size of a ladder of
:data:`STEPS_PER_DOUBLING` sizes per doubling, so that a few buckets serve an epoch and a batch is
padded by about a fifth at most from ~10k nodes up (a quarter on a batch of ~1k nodes, where
the 64 padding nodes count). Padding cannot change what a real node computes: padding nodes have
zero features and only padding edges, each a self-loop of a padding node (spread over them, so no
one node takes every padding edge's atomic add), so a real node's incoming edges are its own;
the caller's loss reads real nodes only, so padding rows get zero gradient and give none to the
parameters.

What is captured: the model's ``forward_layers``, forward and backward to its parameters, as two
graphs replayed by one autograd node (what ``torch.cuda.make_graphed_callables`` does, captured
here in thread-local mode so that a pipeline's prefetch thread may go on working meanwhile). Its
``edges_for_layers`` (GAT's self-loops, a mask that waits for the GPU) runs eagerly before, then
the copies into the bucket's static inputs; the loss, the optimizer and the pipeline stay eager.
A model without that split (a user's) is captured whole, its edges as given.

Each bucket keeps its static inputs, its graphs and their memory pool (activations at its size).
A batch of a new bucket captures it first (three warm-up passes, then the capture): ``setups``
counts them. Past ``max_buckets`` a new size is refused in one line rather than filling the GPU.
The returned output is a view of the bucket's static output: use it (the loss, its backward)
before the next call of the same bucket, as a training step does. Evaluation (``eval()`` or no
gradients) runs the model eagerly, unpadded.

On a CPU the module runs the same padded computation without capturing (what the tests compare
with the eager model); the registered form needs a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from systems.current_gpu import refuse_other_gpus
from workloads.gnn.model_forms import MODEL_FORMS, FormFailed, ModelForm, RunsModel

STEPS_PER_DOUBLING = 4  # bucket sizes per doubling: padding of at most 2^(1/4) - 1, 19%
ALIGN = 32  # bucket sizes are multiples of this
PAD_NODES = 64  # at least this many padding nodes, over which the padding edges spread
MAX_BUCKETS = 12


def _rung(k: int) -> int:
    """The k-th size of the ladder: 2^(k / STEPS_PER_DOUBLING) rounded up to a multiple of ALIGN."""
    return -(-math.ceil(2 ** (k / STEPS_PER_DOUBLING)) // ALIGN) * ALIGN


def bucket(size: int) -> int:
    """The smallest size of the ladder (:func:`_rung`) that holds ``size``: a bucket is its own."""
    if size < 0:
        raise ValueError(f"a size is at least 0, got {size}")
    # From a rung below the size (log2 in floats can be off by a rung), up to the first that holds it.
    k = max(0, math.floor(STEPS_PER_DOUBLING * math.log2(max(size, 1))) - 1)
    while _rung(k) < size:
        k += 1
    return _rung(k)


def padded_shape(nodes: int, edges: int) -> tuple[int, int]:
    """The bucket (nodes, edges) of a subgraph of ``nodes`` nodes and ``edges`` edges."""
    return bucket(nodes + PAD_NODES), bucket(edges)


def pad_into(x: torch.Tensor, edges: torch.Tensor, padded_x: torch.Tensor, padded_edges: torch.Tensor) -> None:
    """Write ``x`` and ``edges`` into the first rows and columns of the padded tensors; the rest
    become padding: zero features, and each padding edge a self-loop of a padding node, in turn."""
    nodes, count = x.size(0), edges.size(1)
    padding_nodes = padded_x.size(0) - nodes
    padded_x[:nodes].copy_(x)
    padded_x[nodes:].zero_()
    padded_edges[:, :count].copy_(edges)
    if padded_edges.size(1) > count:
        loops = torch.arange(padded_edges.size(1) - count, device=edges.device, dtype=edges.dtype)
        padded_edges[:, count:] = (loops % padding_nodes + nodes).expand(2, -1)


def _edges_for_layers(model: nn.Module, edge_index: torch.Tensor, nodes: int) -> torch.Tensor:
    prepare = getattr(model, "edges_for_layers", None)
    return prepare(edge_index, nodes) if callable(prepare) else edge_index


def _forward_layers(model: nn.Module):
    layers = getattr(model, "forward_layers", None)
    return layers if callable(layers) else model.forward


WARMUP_PASSES = 3  # forward and backward on a side stream before capturing: lazy state made outside it


class _Replay(torch.autograd.Function):
    """One bucket's graphs as an autograd node: forward replays the forward graph; backward puts
    the incoming gradient where the backward graph reads it and replays that graph."""

    @staticmethod
    def forward(ctx, captured: _Captured, *parameters: torch.Tensor) -> torch.Tensor:
        ctx.captured = captured
        captured.forward_graph.replay()
        return captured.output.detach()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        captured = ctx.captured
        captured.grad_output.copy_(grad)
        captured.backward_graph.replay()
        # Copies, not the bucket's buffers: autograd keeps a returned gradient as the parameter's
        # .grad itself where .grad is None, and the buffers lie in the bucket's memory pool, which
        # the next forward replay of the bucket may write (memory its capture freed, and the
        # backward's capture then took for them). A .grad kept over steps (zero_grad(
        # set_to_none=False), gradients accumulated over batches) would be overwritten there.
        return (None, *(g.clone() if g is not None else None for g in captured.grads))


@dataclass
class _Captured:
    """One bucket: the static inputs its graphs read, the graphs, and what they write."""

    x: torch.Tensor
    edges: torch.Tensor
    parameters: tuple[torch.Tensor, ...]
    forward_graph: torch.cuda.CUDAGraph
    backward_graph: torch.cuda.CUDAGraph
    output: torch.Tensor
    grad_output: torch.Tensor  # the backward graph reads the output's gradient here
    grads: tuple[torch.Tensor | None, ...]  # ... and writes the parameters' gradients here

    def __call__(self) -> torch.Tensor:
        return _Replay.apply(self, *self.parameters)


def capture_layers(layers, parameters: tuple[torch.Tensor, ...], x: torch.Tensor, edges: torch.Tensor) -> _Captured:
    """``layers(x, edges)`` and its backward to ``parameters`` captured as two CUDA graphs on one
    memory pool, after warm-up passes on a side stream. Captured in thread-local mode: a
    pipeline's prefetch thread may go on launching its own work (and pinning memory) meanwhile."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_PASSES):
            out = layers(x, edges)
            torch.autograd.grad(out, parameters, torch.ones_like(out), allow_unused=True)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    pool = torch.cuda.graph_pool_handle()
    forward_graph, backward_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    capturing = forward_graph
    try:
        with torch.cuda.graph(forward_graph, pool=pool, capture_error_mode="thread_local"):
            output = layers(x, edges)
        grad_output = torch.empty_like(output)
        capturing = backward_graph
        with torch.cuda.graph(backward_graph, pool=pool, capture_error_mode="thread_local"):
            grads = torch.autograd.grad(output, parameters, grad_output, allow_unused=True)
    except Exception:
        # What a failed capture leaves in torch's allocator and random-number generator is undone
        # as harness/graphed_step.py does for a captured step, so the process can go on eagerly.
        from harness.graphed_step import _end_random_number_capture, release_failed_capture

        # The exception's traceback holds this frame while it lives (the caller's FormFailed keeps
        # it as its context): drop the frame's tensors in the failed pool so that it can be freed.
        out = output = grad_output = grads = None  # noqa: F841
        release_failed_capture(capturing, pool)
        del forward_graph, backward_graph, capturing
        torch.cuda.synchronize()
        _end_random_number_capture()
        torch.cuda.empty_cache()
        raise
    return _Captured(x, edges, parameters, forward_graph, backward_graph, output, grad_output, grads)


class GraphedModel(RunsModel):
    """``model`` with its layers replayed from CUDA graphs captured per bucket (see the module's
    docstring); called as the model is, training its parameters."""

    def __init__(self, model: nn.Module, max_buckets: int = MAX_BUCKETS):
        super().__init__()
        self.model = model
        self.max_buckets = max_buckets
        self._buckets: dict[tuple[int, int], _Captured] = {}

    @property
    def setups(self) -> int:
        return len(self._buckets)

    @property
    def buckets(self) -> list[tuple[int, int]]:
        """The (nodes, edges) sizes captured so far."""
        return list(self._buckets)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        if not (self.training and torch.is_grad_enabled()):
            return self.model(x, edge_index)
        nodes = x.size(0)
        edges = _edges_for_layers(self.model, edge_index, nodes)
        shape = padded_shape(nodes, edges.size(1))
        if x.requires_grad:  # the captured backward gives the parameters' gradients only
            raise FormFailed(
                f"cuda_graph: {type(self.model).__name__}'s input features require a gradient, which the captured "
                "layers would not give: train an upstream embedding with the eager or compiled form"
            )
        if x.device.type != "cuda":  # the padded computation itself, uncaptured
            padded_x, padded_edges = x.new_empty((shape[0], *x.shape[1:])), edges.new_empty((2, shape[1]))
            pad_into(x, edges, padded_x, padded_edges)
            return _forward_layers(self.model)(padded_x, padded_edges)[:nodes]
        # A capture on the current GPU of work on another would record nothing: each replay a no-op.
        refuse_other_gpus(x=x, edge_index=edge_index)
        found = self._buckets.get(shape)
        if found is None:
            found = self._capture(shape, x, edges)
        else:
            pad_into(x, edges, found.x, found.edges)
        return found()[:nodes]

    def _capture(self, shape: tuple[int, int], x: torch.Tensor, edges: torch.Tensor) -> _Captured:
        name = type(self.model).__name__
        if len(self._buckets) >= self.max_buckets:
            sizes = ", ".join(f"{n}x{e}" for n, e in self._buckets)
            raise FormFailed(
                f"cuda_graph: {name} met a {len(self._buckets) + 1}th subgraph size ({shape[0]} nodes, {shape[1]} "
                f"edges) past max_buckets={self.max_buckets} (captured: {sizes}); give it a larger max_buckets"
            )
        static_x = x.new_empty((shape[0], *x.shape[1:]))
        static_edges = edges.new_empty((2, shape[1]))
        pad_into(x, edges, static_x, static_edges)  # the warm-up passes and the capture run on this batch
        parameters = tuple(p for p in self.model.parameters() if p.requires_grad)
        try:
            captured = capture_layers(_forward_layers(self.model), parameters, static_x, static_edges)
        except torch.cuda.OutOfMemoryError:
            raise  # a size, not a refusal: the caller records it as it would eagerly
        except Exception as err:  # torch's and the driver's errors alike: a wait for the GPU, an op it cannot hold
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise FormFailed(
                f"cuda_graph: {name}'s layers could not be captured at {shape[0]} nodes, {shape[1]} edges: "
                f"{type(err).__name__}: {first}"
            ) from None
        self._buckets[shape] = captured
        return captured


MODEL_FORMS.register(
    ModelForm(
        "cuda_graph",
        "peer",
        label="CUDA graphs",
        needs_gpu=True,
        wrap=GraphedModel,
        notes="the layers' forward and backward captured as CUDA graphs per bucketed subgraph size, and replayed",
    )
)
