"""The GNN model forms (workloads/gnn/model_forms/): each trains the model's own parameters and
gives the eager model's loss and gradients within float tolerance, on random subgraphs of odd
sizes (self-loops and repeated edges included). On the CPU: the compiled form under inductor, and
the CUDA-graph form's padding (the computation it captures); on a GPU: both as timed."""

import pytest
import torch
from torch.nn import functional as F

from harness.errors import UserError
from workloads.gnn.model_forms import MODEL_FORMS, FormFailed, in_form, in_order, setups
from workloads.gnn.model_forms.compiled import CompiledModel
from workloads.gnn.model_forms.cuda_graph import ALIGN, PAD_NODES, GraphedModel, bucket, pad_into, padded_shape
from workloads.gnn.models import build

FEATURES, HIDDEN, CLASSES, SEEDS = 13, 16, 5, 11
# Float32 sums in another order (inductor fuses and reorders them): a gradient may move by this
# share of its largest magnitude, the loss by this share of itself.
TOLERANCE = 1e-5
# Subgraphs of odd sizes (nodes, edges): a compile or a padding that assumed one size fails here.
SIZES = ((37, 101), (53, 211), (41, 97))


def subgraph(nodes: int, edges: int, seed: int, device: str = "cpu"):
    """Features, edges (a few self-loops and repeated edges among them) and the seeds' labels of a
    random sampled subgraph: its first SEEDS nodes are the seeds."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(nodes, FEATURES, generator=generator)
    edge_index = torch.randint(0, nodes, (2, edges), generator=generator)
    edge_index[1, :5] = edge_index[0, :5]  # self-loops
    edge_index[:, 5:9] = edge_index[:, 9:13]  # repeated edges
    y = torch.randint(0, CLASSES, (SEEDS,), generator=generator)
    return x.to(device), edge_index.to(device), y.to(device)


def loss_and_grads(model, parameters, x, edge_index, y, seed: int):
    torch.manual_seed(seed)  # the same dropout draws for every form that draws as eager does
    loss = F.cross_entropy(model(x, edge_index)[:SEEDS], y)
    return loss.detach(), torch.autograd.grad(loss, parameters)


def assert_same(got, expected, what: str):
    (loss, grads), (eager_loss, eager_grads) = got, expected
    torch.testing.assert_close(loss, eager_loss, rtol=TOLERANCE, atol=0, msg=f"{what}: loss")
    for i, (grad, eager) in enumerate(zip(grads, eager_grads, strict=True)):
        scale = float(eager.abs().max())
        assert scale > 0, f"{what}: parameter {i} has no gradient to compare"
        torch.testing.assert_close(grad, eager, rtol=0, atol=TOLERANCE * scale, msg=f"{what}: gradient {i}")


# --- the registry --------------------------------------------------------------------------------


def test_the_forms_are_registered_and_refused_in_one_line_where_they_cannot_run():
    assert in_order(MODEL_FORMS.names()) == ["eager", "compiled", "cuda_graph"]
    assert MODEL_FORMS["eager"].role == "baseline" and MODEL_FORMS["cuda_graph"].needs_gpu
    model = build("sage", FEATURES, HIDDEN, CLASSES, 2, [3, 5])
    assert in_form(model, "eager") is model and setups(model) == 0
    wrapped = in_form(model, "compiled")
    assert isinstance(wrapped, CompiledModel) and setups(wrapped) == 0  # compiles at its first call
    assert list(wrapped.parameters()) == list(model.parameters())
    assert list(wrapped.state_dict()) == [f"model.{key}" for key in model.state_dict()]
    with pytest.raises(UserError, match="unknown model form 'graphs'; one of .*cuda_graph"):
        in_form(model, "graphs")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match=r"^model form cuda_graph needs a CUDA GPU \(the model is on cpu\)$"):
            in_form(model, "cuda_graph")


# --- GAT's self-loops, once for all its layers ---------------------------------------------------


def test_gat_adds_its_self_loops_once_and_computes_what_stock_gatconv_layers_do():
    """GAT removes the subgraph's self-loops and adds one per node once per forward, its layers
    built without their own: the numbers are bit for bit those of PyG's GATConv doing it in each
    layer, forward and backward."""
    from torch_geometric.nn import GATConv

    torch.manual_seed(3)
    model = build("gat", FEATURES, HIDDEN, CLASSES, 2, [3, 5], dropout=0.0)
    stock = torch.nn.ModuleList([GATConv(FEATURES, HIDDEN // 4, heads=4), GATConv(HIDDEN, CLASSES, heads=1)])
    stock.load_state_dict(model.convs.state_dict())
    for seed, (nodes, edges) in enumerate(SIZES):
        x, edge_index, _ = subgraph(nodes, edges, seed)
        prepared = model.edges_for_layers(edge_index, nodes)
        loops = prepared[:, prepared[0] == prepared[1]]
        assert sorted(loops[0].tolist()) == list(range(nodes))  # one self-loop per node, no other
        assert prepared.size(1) == int((edge_index[0] != edge_index[1]).sum()) + nodes
        ours = model(x, edge_index)
        theirs = stock[1](F.elu(stock[0](x, edge_index)), edge_index)
        assert torch.equal(ours, theirs)
        weights = torch.randn_like(ours)
        mine = torch.autograd.grad((ours * weights).sum(), list(model.parameters()))
        reference = torch.autograd.grad((theirs * weights).sum(), list(stock.parameters()))
        assert all(torch.equal(a, b) for a, b in zip(mine, reference, strict=True))


# --- the CUDA-graph form's padding ---------------------------------------------------------------


def test_buckets_hold_each_size_with_little_padding_and_few_of_them_serve_a_spread_of_sizes():
    generator = torch.Generator().manual_seed(0)
    sizes = torch.randint(1, 3_000_000, (2000,), generator=generator).tolist()
    for size in [*sizes, 1, 31, 32, 33, 1023, 1024, 1025]:
        padded = bucket(size)
        assert padded >= size and padded % ALIGN == 0 and bucket(padded) == padded
        assert padded <= max(ALIGN, size * 2 ** (1 / 4) + ALIGN), size
    assert [bucket(s) for s in sorted(sizes)] == sorted(bucket(s) for s in sizes)  # monotone
    # Batches within 10% of one another (a sampled epoch's) fall in at most two buckets.
    typical = torch.randint(240_000, 264_000, (500,), generator=generator).tolist()
    assert len({bucket(s) for s in typical}) <= 2


def test_padding_is_zero_rows_and_self_loops_spread_over_padding_nodes_only():
    x, edge_index, _ = subgraph(41, 97, seed=1)
    nodes, edges = padded_shape(41, 97)
    assert nodes >= 41 + PAD_NODES and edges >= 97
    padded_x, padded_edges = torch.full((nodes, FEATURES), 7.0), torch.full((2, edges), -1)  # stale values
    pad_into(x, edge_index, padded_x, padded_edges)
    assert torch.equal(padded_x[:41], x) and not padded_x[41:].any()
    assert torch.equal(padded_edges[:, :97], edge_index)
    padding = padded_edges[:, 97:]
    assert torch.equal(padding[0], padding[1]) and int(padding.min()) >= 41 and int(padding.max()) < nodes
    counts = torch.bincount(padding[0], minlength=nodes)[41:]
    assert int(counts.max()) - int(counts.min()) <= 1  # spread evenly: no one node takes every atomic add


def test_input_features_that_need_a_gradient_are_refused_by_the_graphed_form():
    """The captured backward gives the parameters' gradients only: an upstream embedding would
    silently stop training."""
    model = build("sage", FEATURES, HIDDEN, CLASSES, 2, [3, 5], dropout=0.0)
    x, edge_index, _ = subgraph(*SIZES[0], seed=3)
    with pytest.raises(FormFailed, match="input features require a gradient"):
        GraphedModel(model)(x.requires_grad_(), edge_index)


@pytest.mark.parametrize("name", ["sage", "gat"])
def test_the_padded_layers_give_the_eager_models_loss_and_gradients(name):
    """What the CUDA-graph form captures, run uncaptured on the CPU: the subgraph padded to its
    bucket, the layers, the real nodes' rows. Without dropout (padding draws masks of another
    shape), in training mode."""
    torch.manual_seed(7)
    model = build(name, FEATURES, HIDDEN, CLASSES, 2, [3, 5], dropout=0.0)
    padded = GraphedModel(model)
    parameters = list(model.parameters())
    for seed, (nodes, edges) in enumerate(SIZES):
        x, edge_index, y = subgraph(nodes, edges, seed)
        got = loss_and_grads(padded, parameters, x, edge_index, y, seed)
        assert_same(got, loss_and_grads(model, parameters, x, edge_index, y, seed), f"{name} padded, {nodes} nodes")
    padded.eval()  # evaluation runs the model itself, unpadded
    x, edge_index, _ = subgraph(*SIZES[0], seed=9)
    with torch.no_grad():
        assert torch.equal(padded(x, edge_index), model(x, edge_index))


class _StandInGraph:
    """A captured graph's replay, as a Python function (the autograd node does not know the difference)."""

    def __init__(self, run):
        self.replay = run


@pytest.mark.parametrize("zeroed", [False, True], ids=["accumulated", "zero_grad(set_to_none=False)"])
def test_gradients_kept_over_steps_survive_the_next_forward_replay_of_the_same_bucket(zeroed):
    """The replay node's gradients, kept as .grad over two steps of one bucket, are those of the
    two steps: the forward replay in between may write the memory of the bucket's gradient
    buffers (its pool's memory that the forward's capture freed and the backward's took), and here
    it does, with stale values."""
    from workloads.gnn.model_forms.cuda_graph import _Captured

    generator = torch.Generator().manual_seed(4)
    x, weights = torch.randn(6, 3, generator=generator), torch.randn(6, 3, generator=generator)
    parameter = torch.randn(3, generator=generator).requires_grad_()
    output, grad_output, grad = torch.empty(6, 3), torch.empty(6, 3), torch.empty(3)

    def forward():
        output.copy_(x * parameter.detach())
        grad.fill_(1e6)  # the forward's temporaries where the backward's capture put the gradient

    def backward():
        grad.copy_((grad_output * x).sum(0))

    captured = _Captured(
        x, None, (parameter,), _StandInGraph(forward), _StandInGraph(backward), output, grad_output, (grad,)
    )
    optimizer = torch.optim.SGD([parameter], lr=0.0)
    (captured()[:4] * weights[:4]).sum().backward()  # step 1: .grad was None
    if zeroed:
        optimizer.zero_grad(set_to_none=False)
    (captured()[:4] * weights[:4]).sum().backward()  # step 2: of the same bucket, .grad kept
    expected = (weights[:4] * x[:4]).sum(0) * (1 if zeroed else 2)
    torch.testing.assert_close(parameter.grad, expected)


# --- the compiled form, under inductor on the CPU ------------------------------------------------


@pytest.mark.parametrize("name", ["sage", "gat"])
def test_the_compiled_model_gives_the_eager_models_loss_and_gradients_and_compiles_once(name):
    """Inductor (on the CPU: C++ it compiles here) with dynamic shapes, dropout on: with inductor
    drawing its random numbers as eager does (fallback_random), the loss and every gradient agree
    within TOLERANCE on each subgraph, and the first compile serves every size."""
    import torch._inductor.config as inductor

    torch._dynamo.reset()
    torch.manual_seed(5)
    model = build(name, FEATURES, HIDDEN, CLASSES, 2, [3, 5], dropout=0.5)
    parameters = list(model.parameters())
    with inductor.patch(fallback_random=True):
        compiled = in_form(model, "compiled")
        counts = []
        for seed, (nodes, edges) in enumerate(SIZES):
            x, edge_index, y = subgraph(nodes, edges, seed)
            got = loss_and_grads(compiled, parameters, x, edge_index, y, seed)
            counts.append(setups(compiled))
            expected = loss_and_grads(model, parameters, x, edge_index, y, seed)
            assert_same(got, expected, f"{name} compiled, {nodes} nodes")
    assert counts[0] >= 1 and counts == [counts[0]] * len(SIZES), counts  # no recompile for a new size


def test_a_model_that_does_not_compile_is_refused_in_one_line_naming_why():
    def failing(graph_module, inputs):
        raise RuntimeError("no code for this graph")

    torch._dynamo.reset()
    model = build("sage", FEATURES, HIDDEN, CLASSES, 2, [3, 5])
    x, edge_index, _ = subgraph(*SIZES[0], seed=0)
    with pytest.raises(FormFailed) as refused:
        CompiledModel(model, backend=failing)(x, edge_index)
    message = str(refused.value)
    assert message.startswith("compiled: GraphSAGE does not compile: ") and "\n" not in message
    assert message.endswith("RuntimeError: no code for this graph")


# --- on a GPU: as timed ---------------------------------------------------------------------------


def gpu_batches(count: int = 8):
    """Subgraphs of sizes that meet a few buckets, some twice (a replay of a captured one)."""
    generator = torch.Generator().manual_seed(11)
    nodes = torch.randint(900, 2600, (count,), generator=generator).tolist()
    return [subgraph(n, 5 * n + 3, seed, device="cuda") for seed, n in enumerate(nodes + nodes[:3])]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sage", "gat"])
@pytest.mark.parametrize("form", ["compiled", "cuda_graph"])
def test_on_the_gpu_a_form_trains_as_the_eager_model_does(name, form, monkeypatch):
    """Adam steps from the same weights, without dropout, TF32 off: every step's loss and the
    weights after them agree with eager's; gradients kept over steps (zero_grad(set_to_none=False))
    are added to, never overwritten by a replay."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    torch._dynamo.reset()
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(build(name, FEATURES, HIDDEN, CLASSES, 2, [3, 5], dropout=0.0).cuda())
    eager, other = models
    wrapped = in_form(other, form)
    optimizers = [torch.optim.Adam(m.parameters(), lr=0.01) for m in (eager, other)]
    for step, (x, edge_index, y) in enumerate(gpu_batches()):
        losses = []
        for model, optimizer in zip((eager, wrapped), optimizers, strict=True):
            optimizer.zero_grad(set_to_none=step % 2 == 0)
            loss = F.cross_entropy(model(x, edge_index)[:SEEDS], y)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=0, msg=f"step {step}")
    for mine, reference in zip(other.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(mine, reference, rtol=1e-4, atol=1e-5)
    if form == "cuda_graph":
        shapes = {
            padded_shape(x.size(0), wrapped.model.edges_for_layers(e, x.size(0)).size(1)) for x, e, _ in gpu_batches()
        }
        assert setups(wrapped) == len(shapes) == len(wrapped.buckets) and len(shapes) > 1


@pytest.mark.gpu
def test_on_the_gpu_a_cuda_graph_form_past_its_buckets_is_refused_in_one_line():
    model = build("sage", FEATURES, HIDDEN, CLASSES, 2, [3, 5]).cuda()
    wrapped = GraphedModel(model, max_buckets=1)
    (x, edge_index, _), *_ = gpu_batches()
    wrapped(x, edge_index)
    bigger = subgraph(4 * x.size(0), 4 * edge_index.size(1), seed=1, device="cuda")
    with pytest.raises(FormFailed, match=r"past max_buckets=1 \(captured: \d+x\d+\)") as refused:
        wrapped(*bigger[:2])
    assert "\n" not in str(refused.value)


@pytest.mark.gpu
def test_on_the_gpu_a_profiled_cuda_graph_step_launches_fewer_kernels_than_eager(tmp_path):
    """The step profile of tools/gnn_step_profile.py, fed by a real pipeline: after the warm-up
    (where the buckets are captured), a replayed step launches fewer kernels than an eager one."""
    from dataclasses import replace

    from tools.gnn_step_profile import STEP_PREFIX, profile_steps, table_row
    from workloads.gnn.pipelines import Graph, Pipeline
    from workloads.graphs import store
    from workloads.graphs.generate import GeneratorParams
    from workloads.graphs.spec import DATASETS

    spec = replace(DATASETS["ogbn-products"].scaled(0.001), train_fraction=0.6)
    graph = Graph(store.get(GeneratorParams(spec, seed=2), root=tmp_path), "cuda")
    rows = {}
    try:
        for form in ("eager", "cuda_graph"):
            torch.manual_seed(0)
            model = build("sage", spec.feature_dim, 32, spec.classes, 2, [10, 10]).cuda()
            optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
            pipeline = Pipeline("all_in_gpu", graph, [10, 10], 64, seed=1)
            try:
                profiled = profile_steps(in_form(model, form), optimizer, pipeline, steps=3, warmup=12)
            finally:
                pipeline.close()
            rows[form] = table_row(profiled.events, [f"{STEP_PREFIX}{i}" for i in range(3)], form=form)
    finally:
        graph.close()
    assert 0 < rows["cuda_graph"]["launches"] < rows["eager"]["launches"], rows
