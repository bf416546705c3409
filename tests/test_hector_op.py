"""Hector's operator as a caller uses it: a call that needs no gradient runs the inference op
(no values kept for a backward), and on a GPU the replayed plans run as CUDA graphs that give
what the direct launches give, even when the caller holds a result across calls, changes the
weights in place, or applies the layer twice before one backward."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from systems.hector import cuda_graphs, op, passes
from systems.relgraph.graph import RelGraph
from systems.rgnn.models import MODELS

MODEL_NAMES = [m.name for m in MODELS if m.program is not None]


def random_graph(seed: int, nodes=23, edges=97, relations=7, types=3, device="cpu") -> RelGraph:
    """Random typed edges: each relation joins one source type to one target type (as HGT's do)."""
    g = torch.Generator().manual_seed(seed)
    node_type = (torch.arange(nodes) % types)[torch.randperm(nodes, generator=g)]  # every type present
    members = [torch.nonzero(node_type == t).flatten() for t in range(types)]
    ends = torch.randint(0, types, (relations, 2), generator=g)  # each relation's source and target type
    etype = torch.randint(0, relations, (edges,), generator=g)

    def pick(end: int) -> torch.Tensor:
        kinds = ends[etype, end]
        return torch.stack([members[k][torch.randint(0, len(members[k]), (), generator=g)] for k in kinds.tolist()])

    return RelGraph.build(pick(0), pick(1), etype, nodes, relations, device, node_type=node_type, num_node_types=types)


class OpLog(TorchDispatchMode):
    """The operators a call dispatches, by name."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def hector_layer(name: str, graph: RelGraph, width=8, device="cpu"):
    model = MODELS[name]
    weights = model.make_weights(graph, width, width, seed=1).to(device)
    layer = op.Layer(passes.optimize(model.program(), "reorder", "compact"))
    return model, weights, lambda x: layer(graph, x=x, **model.bind(weights)), layer


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_a_call_without_gradients_runs_the_inference_op_and_gives_the_training_output(name):
    graph = random_graph(seed=2)
    model, weights, run, layer = hector_layer(name, graph)
    x = torch.randn(graph.num_nodes, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), OpLog() as log:
        inferred = run(x)
    assert any(n.endswith("_inference.default") for n in log.names), log.names
    assert not any(n == f"hector.{layer.op_name}.default" for n in log.names)
    with OpLog() as log:
        trained = run(x)  # the weights require gradients: the training forward
    assert any(n == f"hector.{layer.op_name}.default" for n in log.names), log.names
    assert trained.grad_fn is not None and inferred.grad_fn is None
    torch.testing.assert_close(inferred, trained.detach(), rtol=1e-5, atol=1e-5)
    reference = model.layers[model.reference](weights, graph)
    with torch.no_grad():
        torch.testing.assert_close(inferred, reference(x), rtol=1e-4, atol=1e-4)


def test_inference_mode_and_tensors_without_gradients_take_the_inference_op_too():
    graph = random_graph(seed=4)
    model, weights, run, layer = hector_layer("rgat", graph)
    x = torch.randn(graph.num_nodes, 8)
    with torch.inference_mode(), OpLog() as log:
        run(x)
    assert any(n.endswith("_inference.default") for n in log.names)
    weights.requires_grad_(False)
    with OpLog() as log:
        out = run(x)
    assert any(n.endswith("_inference.default") for n in log.names) and out.grad_fn is None


def test_the_inference_op_passes_torchs_operator_checks():
    graph = random_graph(seed=5, nodes=9, edges=21, relations=3)
    model, weights, run, layer = hector_layer("rgat", graph)
    tensors = {"x": torch.randn(graph.num_nodes, 8)} | model.bind(weights)
    given = [tensors[n].detach() for n in layer.names]
    torch.library.opcheck(layer.inference_op, (op.register_graph(graph), given))


def test_the_training_ops_pass_torchs_operator_checks_autograd_included():
    graph = random_graph(seed=5, nodes=9, edges=21, relations=3)
    model, weights, run, layer = hector_layer("hgt", graph)
    tensors = {"x": torch.randn(graph.num_nodes, 8)} | model.bind(weights)
    given = [tensors[n].detach().requires_grad_() for n in layer.names]
    torch.library.opcheck(layer.forward_op, (op.register_graph(graph), given))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_an_eager_call_and_the_ops_registered_autograd_give_the_same_gradients(name):
    """An eager call takes a direct autograd route; ``torch.ops.hector`` callers and compiled
    code take the forward op's registered formula. Both must differentiate alike."""
    graph = random_graph(seed=10)
    model, weights, run, layer = hector_layer(name, graph)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(graph.num_nodes, 8, generator=g).requires_grad_()
    upstream = torch.randn(graph.num_nodes, 8, generator=g)
    leaves = [x, *weights.parameters()]
    tensors = {"x": x} | model.bind(weights)
    given = [tensors[n] for n in layer.names]
    eager = layer(graph, **tensors)
    eager_grads = torch.autograd.grad(eager, leaves, upstream)
    registered = layer.forward_op(op.register_graph(graph), given)[0]
    assert registered.grad_fn is not None and type(registered.grad_fn) is not type(eager.grad_fn)
    registered_grads = torch.autograd.grad(registered, leaves, upstream)
    torch.testing.assert_close(registered, eager, rtol=0, atol=0)
    for i, (a, b) in enumerate(zip(eager_grads, registered_grads, strict=True)):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"leaf {i}")
    reference = model.layers[model.reference](weights, graph)
    want = torch.autograd.grad(reference(x), leaves, upstream)
    for i, (a, b) in enumerate(zip(eager_grads, want, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=f"leaf {i}")


def test_a_compiled_caller_traces_the_ops_and_trains_alike_on_each_graph_it_is_given():
    graphs = [random_graph(seed=12), random_graph(seed=14)]  # same sizes: only the handle tells them apart
    model, weights, _, layer = hector_layer("rgat", graphs[0])
    x = torch.randn(graphs[0].num_nodes, 8, generator=torch.Generator().manual_seed(13))
    torch._dynamo.reset()
    compiled = torch.compile(lambda g, x: layer(g, x=x, **model.bind(weights)), backend="aot_eager", fullgraph=True)
    for graph in graphs:
        out = compiled(graph, x)
        grads = torch.autograd.grad(out.square().sum(), list(weights.parameters()))
        want_out = layer(graph, x=x, **model.bind(weights))
        want = torch.autograd.grad(want_out.square().sum(), list(weights.parameters()))
        torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
        for a, b in zip(grads, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _step(run, x, weights, target):
    weights.zero_grad(set_to_none=True)
    out = run(x)
    ((out - target) ** 2).mean().backward()
    return out.detach().clone(), {n: p.grad.clone() for n, p in weights.named_parameters()}


@pytest.mark.gpu
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_cuda_graph_replays_give_what_direct_launches_give(name, monkeypatch):
    graph = random_graph(seed=6, nodes=301, edges=2003, relations=11, device="cuda")
    model, weights, run, layer = hector_layer(name, graph, width=16, device="cuda")
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(graph.num_nodes, 16, generator=g).cuda() for _ in range(4)]
    target = torch.randn(graph.num_nodes, 16, generator=g).cuda()
    replayed = [_step(run, x, weights, target) for x in xs]  # the third call on is replayed
    assert cuda_graphs.captured(graph) >= 2  # the forward and the backward plan
    with torch.no_grad():
        held = run(xs[0])  # a result held across the next calls
        inferred = [run(x) for x in xs]
    monkeypatch.setattr(cuda_graphs, "COPY_LIMIT_BYTES", 0)
    direct_graph = random_graph(seed=6, nodes=301, edges=2003, relations=11, device="cuda")
    _, direct_weights, direct_run, _ = hector_layer(name, direct_graph, width=16, device="cuda")
    direct = [_step(direct_run, x, direct_weights, target) for x in xs]
    assert cuda_graphs.captured(direct_graph) == 0
    for (out, grads), (want, want_grads) in zip(replayed, direct, strict=True):
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        for key in want_grads:
            torch.testing.assert_close(grads[key], want_grads[key], rtol=1e-4, atol=1e-5, msg=key)
    with torch.no_grad():
        torch.testing.assert_close(held, direct_run(xs[0]), rtol=1e-5, atol=1e-5)
        for x, out in zip(xs, inferred, strict=True):
            torch.testing.assert_close(out, direct_run(x), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_the_memory_captures_keep_for_their_intermediate_values_is_counted(monkeypatch):
    """A capture's intermediate values stay reserved in its private pool between replays, where
    ``memory_allocated`` does not see them: the topic's intermediate memory adds them."""
    graph = random_graph(seed=15, nodes=301, edges=2003, relations=11, device="cuda")
    model, weights, run, layer = hector_layer("hgt", graph, width=16, device="cuda")
    x = torch.randn(graph.num_nodes, 16, device="cuda")
    run(x).sum().backward()  # recorded, not yet captured
    assert cuda_graphs.held_bytes(graph) == 0
    for _ in range(2):
        run(x).sum().backward()
    assert cuda_graphs.captured(graph) >= 2
    assert 0 < cuda_graphs.held_bytes(graph) < 64 << 20
    monkeypatch.setattr(cuda_graphs, "COPY_LIMIT_BYTES", 0)
    direct = random_graph(seed=15, nodes=301, edges=2003, relations=11, device="cuda")
    _, _, direct_run, _ = hector_layer("hgt", direct, width=16, device="cuda")
    for _ in range(3):
        direct_run(x).sum().backward()
    assert cuda_graphs.captured(direct) == 0 and cuda_graphs.held_bytes(direct) == 0


@pytest.mark.gpu
def test_replays_of_strided_and_offset_features_give_what_contiguous_ones_give():
    graph = random_graph(seed=16, nodes=157, edges=907, relations=7, device="cuda")
    model, weights, run, layer = hector_layer("rgat", graph, width=16, device="cuda")
    g = torch.Generator().manual_seed(17)
    wide = torch.randn(graph.num_nodes, 32, generator=g).cuda()
    views = {
        "strided": wide[:, ::2],  # every other column
        "offset": torch.randn(graph.num_nodes * 16 + 5, generator=g).cuda()[5:].view(graph.num_nodes, 16),
        "transposed": torch.randn(16, graph.num_nodes, generator=g).cuda().t(),
    }
    for name, x in views.items():
        for _ in range(3):  # captured by the third call
            got = run(x)
        torch.testing.assert_close(got, run(x.contiguous()), rtol=1e-5, atol=1e-5, msg=name)
        grad_view = torch.autograd.grad(run(x.requires_grad_()).square().sum(), x)[0]
        dense = x.detach().contiguous().requires_grad_()
        torch.testing.assert_close(grad_view, torch.autograd.grad(run(dense).square().sum(), dense)[0], msg=name)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_a_graph_without_edges_gives_what_the_reference_gives(name, device):
    graph = RelGraph.build([], [], [], 9, 3, device, node_type=torch.arange(9) % 3, num_node_types=3)
    model, weights, run, layer = hector_layer(name, graph, width=8, device=device)
    x = torch.randn(9, 8, generator=torch.Generator().manual_seed(18)).to(device)
    reference = model.layers[model.reference](weights, graph)
    for _ in range(3):
        out = run(x)
    torch.testing.assert_close(out, reference(x), rtol=1e-5, atol=1e-5)
    out.sum().backward()  # the backward runs on no edges too


@pytest.mark.gpu
def test_a_replayed_layer_sees_weights_changed_in_place_and_two_uses_before_one_backward():
    graph = random_graph(seed=8, nodes=211, edges=1501, relations=9, device="cuda")
    model, weights, run, layer = hector_layer("rgat", graph, width=16, device="cuda")
    g = torch.Generator().manual_seed(9)
    x1, x2 = (torch.randn(graph.num_nodes, 16, generator=g).cuda() for _ in range(2))
    for _ in range(3):  # captured by now
        run(x1).sum().backward()
    assert cuda_graphs.captured(graph) >= 2
    with torch.no_grad():
        for p in weights.parameters():
            p.mul_(1.5).add_(0.01)
    weights.zero_grad(set_to_none=True)
    (run(x1) * 2 + run(x2)).sum().backward()  # two forwards' saved values live at once
    grads = {n: p.grad.clone() for n, p in weights.named_parameters()}
    cpu_graph = RelGraph.build(
        graph.src,
        graph.dst,
        graph.etype,
        graph.num_nodes,
        graph.num_relations,
        node_type=graph.node_type,
        num_node_types=graph.num_node_types,
    )
    cpu_weights = MODELS["rgat"].make_weights(cpu_graph, 16, 16).to("cpu")
    cpu_weights.load_state_dict({k: v.cpu() for k, v in weights.state_dict().items()})
    reference = MODELS["rgat"].layers["segment_mm"](cpu_weights, cpu_graph)
    (reference(x1.cpu()) * 2 + reference(x2.cpu())).sum().backward()
    for n, p in cpu_weights.named_parameters():
        torch.testing.assert_close(grads[n].cpu(), p.grad, rtol=1e-3, atol=1e-4, msg=n)


def test_a_plan_is_captured_only_where_its_copies_and_per_edge_values_are_small():
    graph = random_graph(seed=10, nodes=50, edges=300)
    small = {"x": torch.randn(50, 8), "W": torch.randn(7, 8, 8)}
    results = [torch.randn(50, 8), torch.randn(300, 8)]
    copies = sum(t.nbytes for t in (*small.values(), *results))
    assert cuda_graphs._bytes_at_stake(graph, small, results) == max(copies, 300 * 8 * 4)
    wide = {"x": torch.randn(50, 4096)}
    assert cuda_graphs._bytes_at_stake(graph, wide, []) == 300 * 4096 * 4  # per-edge values at the widest width
