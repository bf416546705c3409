"""Hector's layer as a new user calls it on a graph and a model of their own (CPU): RelGraphs built
from edge lists of any integer type, views, empty graphs, unused relations and isolated nodes; a
model in the language with per-edge inputs, heads, softmax, mean and max; each call checked
forward and backward against plain torch written here, in float64 at tight tolerances, and in
float16 and bfloat16 against float32. Inputs the layer cannot take are refused in one line."""

import gc

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from harness.errors import UserError
from systems.hector import op, passes
from systems.hector.lang import model
from systems.relgraph.graph import RelGraph

PASS_SETS = [(), ("reorder",), ("compact",), ("reorder", "compact")]
HEADS = 2


@model
def gated_attention(m):
    """Per-relation messages gated by edge features, two-head attention, plus a mean and a max."""
    x, attr = m.input("x", "in"), m.edge_input("attr", "d")
    W = m.weight("W", ("in", "out"), per="relation")
    source = m.src(x) @ W[m.relation]
    gate = m.sigmoid(attr @ m.weight("We", ("d", "out")))
    score = m.leaky_relu(m.dot(source * gate, m.weight("a", ("out",)), heads=HEADS), 0.2)
    return m.sum_into_dst(m.edge_softmax(score) * source) + m.mean_into_dst(source) + m.max_into_dst(m.tanh(source))


@model
def scaled_rgcn(m):
    """Graph data (norm, degrees) and constants (a literal, 1 / sqrt(in)) in the arithmetic."""
    x = m.input("x", "in")
    W = m.weight("W", ("in", "out"), per="relation")
    message = m.src(x) @ W[m.relation] * m.graph_data("norm")
    return m.sum_into_dst(message) * 0.1 + m.mean_into_src(m.dst(x) @ W[m.relation]) * m.rsqrt("in", x)


@model
def max_both_ways(m):
    """A per-relation bias added to each edge's row, its maxima into both ends."""
    e = m.edge_input("e", "w") + m.each_edge(m.weight("b", ("w",), per="relation")[m.relation])
    return m.max_into_dst(e) + m.max_into_src(e)


def scatter_max(rows: torch.Tensor, ends: torch.Tensor, nodes: int) -> torch.Tensor:
    """Each node's maximum row, 0 where it has none. Started from -inf: torch's amax with
    include_self=False still gives a share of a tied gradient to the (zero) starting value."""
    start = rows.new_full((nodes, rows.shape[1]), -torch.inf)
    top = start.scatter_reduce(0, ends.unsqueeze(1).expand_as(rows), rows, "amax")
    return torch.where(top.isinf(), torch.zeros_like(top), top)


def plain_gated_attention(g: RelGraph, x, attr, W, We, a):
    n, out = g.num_nodes, W.shape[2]
    source = torch.bmm(x[g.src].unsqueeze(1), W[g.etype]).squeeze(1)
    gate = torch.sigmoid(attr @ We)
    score = F.leaky_relu((source * gate * a).reshape(-1, HEADS, out // HEADS).sum(2), 0.2)
    top = score.new_full((n, HEADS), -torch.inf).scatter_reduce(0, g.dst[:, None].expand_as(score), score, "amax")
    exp = (score - top[g.dst]).exp()
    attention = exp / exp.new_zeros(n, HEADS).index_add(0, g.dst, exp)[g.dst]
    summed = x.new_zeros(n, out).index_add(0, g.dst, attention.repeat_interleave(out // HEADS, 1) * source)
    degree = torch.bincount(g.dst, minlength=n).clamp(min=1).to(x.dtype).unsqueeze(1)
    mean = x.new_zeros(n, out).index_add(0, g.dst, source) / degree
    return summed + mean + scatter_max(torch.tanh(source), g.dst, n)


def plain_scaled_rgcn(g: RelGraph, x, W):
    n, r = g.num_nodes, g.num_relations
    key = g.dst * r + g.etype
    count = x.new_zeros(n * r).index_add(0, key, x.new_ones(g.edges))[key].unsqueeze(1)
    forward = torch.bmm(x[g.src].unsqueeze(1), W[g.etype]).squeeze(1) / count
    backward = torch.bmm(x[g.dst].unsqueeze(1), W[g.etype]).squeeze(1)
    degree = torch.bincount(g.src, minlength=n).clamp(min=1).to(x.dtype).unsqueeze(1)
    mean = x.new_zeros(n, W.shape[2]).index_add(0, g.src, backward) / degree
    return x.new_zeros(n, W.shape[2]).index_add(0, g.dst, forward) * 0.1 + mean * x.shape[1] ** -0.5


def edges(seed: int, nodes=11, count=45, relations=5, used=3):
    """Random edges over ``nodes`` - 1 nodes (the last is isolated) and ``used`` of ``relations``
    relations, the first edges repeated (ties for a max, pairs of several edges)."""
    g = torch.Generator().manual_seed(seed)
    src, dst = (torch.randint(0, nodes - 1, (count,), generator=g) for _ in range(2))
    etype = torch.randint(0, used, (count,), generator=g)
    return [torch.cat([t, t[:8]]) for t in (src, dst, etype)], nodes, relations


def attention_tensors(g: RelGraph, dtype=torch.float64, seed=1, width=(5, 6, 3)):
    i, o, d = width
    gen = torch.Generator().manual_seed(seed)
    shapes = {"x": (g.num_nodes, i), "attr": (g.edges, d), "W": (g.num_relations, i, o), "We": (d, o), "a": (o,)}
    return {k: torch.randn(s, generator=gen, dtype=torch.float64).to(dtype).requires_grad_() for k, s in shapes.items()}


def assert_matches(layer, plain, g, tensors, tol, upstream_seed=9):
    out, want = layer(g, **tensors), plain(g, **tensors)
    assert out.dtype == want.dtype
    torch.testing.assert_close(out, want, rtol=tol, atol=tol)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(upstream_seed), dtype=out.dtype)
    got = torch.autograd.grad(out, list(tensors.values()), upstream)
    expected = torch.autograd.grad(want, list(tensors.values()), upstream)
    for name, a, b in zip(tensors, got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda s, name=name: f"{name}: {s}")


@pytest.mark.parametrize("applied", PASS_SETS, ids=lambda p: "+".join(p) or "none")
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-11), (torch.float32, 2e-5)])
def test_a_users_attention_layer_matches_plain_torch_forward_and_backward(applied, dtype, tol):
    (src, dst, etype), nodes, relations = edges(seed=0)
    g = RelGraph.build(src, dst, etype, nodes, relations)
    layer = op.Layer(passes.optimize(gated_attention(), *applied))
    assert_matches(layer, plain_gated_attention, g, attention_tensors(g, dtype), tol)


def id_forms(src, dst, etype):
    """The same edge lists as int32 and uint8 numpy arrays, strided and offset views, and lists."""
    wide = torch.stack([src, dst, etype]).repeat_interleave(2, 1)  # every id twice: [::2] is a strided view
    yield "int32", (src.int(), dst.int(), etype.int())
    yield "numpy", (src.numpy().astype(np.uint8), dst.numpy().astype(np.int16), etype.numpy())
    yield "views", (wide[0, ::2], wide[1, 1::2], wide.T[::2, 2])
    yield "lists", (src.tolist(), dst.tolist(), etype.tolist())


@pytest.mark.parametrize("form", ["int32", "numpy", "views", "lists"])
def test_ids_of_any_integer_type_or_layout_build_the_same_graph_and_layer(form):
    (src, dst, etype), nodes, relations = edges(seed=2)
    ids = dict(id_forms(src, dst, etype))[form]
    g = RelGraph.build(*ids, nodes, relations)
    assert g.src.dtype == torch.int64 and torch.equal(g.src, src) and torch.equal(g.etype, etype)
    assert_matches(op.Layer(gated_attention()), plain_gated_attention, g, attention_tensors(g), 1e-11)


def test_a_float64_call_is_exact_to_float64_where_the_model_reads_graph_data_and_constants():
    """norm, degrees, literals and 1 / sqrt(width) in float64, not rounded to float32 first."""
    (src, dst, etype), nodes, relations = edges(seed=3)
    g = RelGraph.build(src, dst, etype, nodes, relations)
    gen = torch.Generator().manual_seed(4)
    tensors = {
        "x": torch.randn(nodes, 5, generator=gen, dtype=torch.float64).requires_grad_(),
        "W": torch.randn(relations, 5, 4, generator=gen, dtype=torch.float64).requires_grad_(),
    }
    for applied in PASS_SETS:
        assert_matches(op.Layer(passes.optimize(scaled_rgcn(), *applied)), plain_scaled_rgcn, g, tensors, 1e-13)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_tensors_give_results_and_gradients_of_their_type_close_to_float32(dtype):
    (src, dst, etype), nodes, relations = edges(seed=5)
    g = RelGraph.build(src, dst, etype, nodes, relations)
    tensors = attention_tensors(g, dtype)
    wide = {k: v.detach().float().requires_grad_() for k, v in tensors.items()}
    out = op.Layer(gated_attention())(g, **tensors)
    want = plain_gated_attention(g, **wide)
    assert out.dtype == dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    torch.testing.assert_close(out.float(), want, rtol=tol, atol=tol * want.abs().max().item())
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(6))
    got = torch.autograd.grad(out, list(tensors.values()), upstream.to(dtype))
    expected = torch.autograd.grad(want, list(wide.values()), upstream)
    for name, a, b in zip(tensors, got, expected, strict=True):
        assert a.dtype == dtype, name
        torch.testing.assert_close(a.float(), b, rtol=tol, atol=tol * b.abs().max().item(), msg=name)


@model
def bounded_squash(m):
    """sigmoid(3x) + x through an exponential that leaves float16's range at x = 5 (e^15 > 65504)."""
    x = m.input("x", "in")
    e = m.exp(x * 3.0)
    return e / (1.0 + e) + x


def test_a_float16_layer_saves_what_float16_cannot_hold_in_float32_so_its_gradients_stay_finite():
    """The forward's result fits float16; a value saved for the backward (e^15) does not: rounded
    to float16 it was inf, and the gradient NaN."""
    graph = RelGraph.build([0, 1], [1, 2], [0, 0], num_nodes=3, num_relations=1)
    layer = op.Layer(bounded_squash())
    x = torch.tensor([[5.0], [0.25], [-6.0]], dtype=torch.float64)
    wide = x.clone().requires_grad_()
    want = torch.autograd.grad(layer(graph, x=wide).sum(), wide)[0]
    narrow = x.half().requires_grad_()
    out = layer(graph, x=narrow)
    got = torch.autograd.grad(out.sum(), narrow)[0]
    assert out.dtype == got.dtype == torch.float16 and torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=4e-3, atol=4e-3)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
def test_tensors_that_are_not_floating_point_are_refused_naming_the_type(dtype):
    (src, dst, etype), nodes, relations = edges(seed=6)
    g = RelGraph.build(src, dst, etype, nodes, relations)
    tensors = {k: (v.detach() * 4).to(dtype) for k, v in attention_tensors(g).items()}
    with pytest.raises(UserError, match=f"floating-point tensors, got {str(dtype).removeprefix('torch.')}"):
        op.Layer(gated_attention())(g, **tensors)


def test_a_tensor_or_graph_of_another_kind_is_refused_naming_the_argument():
    (src, dst, etype), nodes, relations = edges(seed=7)
    g = RelGraph.build(src, dst, etype, nodes, relations)
    tensors = {k: v.detach() for k, v in attention_tensors(g).items()}
    layer = op.Layer(gated_attention())
    with pytest.raises(TypeError, match="a must be a torch.Tensor, got ndarray"):
        layer(g, **tensors | {"a": tensors["a"].numpy()})
    with pytest.raises(TypeError, match="W must be a torch.Tensor, got list"):
        layer(g, **tensors | {"W": tensors["W"].tolist()})
    with pytest.raises(TypeError, match="graph must be a RelGraph"):
        layer((src, dst, etype), **tensors)
    # By keyword, the graph is the graph (it was "missing 1 required positional argument: 'graph'").
    assert torch.equal(layer(graph=g, **tensors), layer(g, **tensors))
    for args in ((), (g, g)):
        with pytest.raises(
            TypeError, match=r"takes the graph, then its tensors by name: layer\(graph, x=\.\.\., \.\.\.\)$"
        ):
            layer(*args, **tensors)


def test_a_program_of_two_outputs_is_refused_when_the_layer_is_made():
    @model
    def two_ways(m):
        x = m.input("x", "in")
        W = m.weight("W", ("in", "out"), per="relation")
        return m.sum_into_dst(m.src(x) @ W[m.relation]), m.sum_into_src(m.dst(x) @ W[m.relation])

    with pytest.raises(UserError, match="one output; two_ways returns 2"):
        op.Layer(two_ways())


def test_a_gradient_of_the_gradient_is_refused_on_both_routes_and_first_order_stays_right():
    """create_graph=True: the first-order gradients are still right, and differentiating them
    again raises instead of returning a second derivative that misses the backward's own terms."""
    (src, dst, etype), nodes, relations = edges(seed=8)
    g = RelGraph.build(src, dst, etype, nodes, relations)
    layer = op.Layer(gated_attention())
    tensors = attention_tensors(g)
    want = torch.autograd.grad(plain_gated_attention(g, **tensors).square().sum(), tensors["x"])[0]
    given = [tensors[n] for n in layer.names]
    for route in (lambda: layer(g, **tensors), lambda: layer.forward_op(op.register_graph(g), given)[0]):
        dx = torch.autograd.grad(route().square().sum(), tensors["x"], create_graph=True)[0]
        torch.testing.assert_close(dx, want, rtol=1e-11, atol=1e-11)
        with pytest.raises(UserError, match="differentiable once"):
            torch.autograd.grad(dx.square().sum() + tensors["W"].sum(), tensors["W"])


def test_a_graph_the_caller_drops_before_the_backward_is_kept_for_it():
    """A step that builds its (sampled) graph, runs the layer and returns the loss: the graph is
    gone from the caller by the backward."""
    (src, dst, etype), nodes, relations = edges(seed=10)
    tensors = attention_tensors(RelGraph.build(src, dst, etype, nodes, relations))
    layer = op.Layer(gated_attention())

    def loss():
        return layer(RelGraph.build(src, dst, etype, nodes, relations), **tensors).square().sum()

    got = loss()
    gc.collect()
    got = torch.autograd.grad(got, list(tensors.values()))
    want = plain_gated_attention(RelGraph.build(src, dst, etype, nodes, relations), **tensors).square().sum()
    for a, b in zip(got, torch.autograd.grad(want, list(tensors.values())), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("nodes, relations", [(6, 3), (6, 0), (0, 2)])
def test_a_graph_without_edges_gives_zeros_and_zero_gradients(nodes, relations):
    g = RelGraph.build([], [], [], nodes, relations)
    for applied in PASS_SETS:
        tensors = attention_tensors(g)
        out = op.Layer(passes.optimize(gated_attention(), *applied))(g, **tensors)
        assert out.shape == (nodes, 6) and not out.any()
        (out.sum() + sum(t.sum() for t in tensors.values())).backward()  # every leaf gets a gradient of ones
        for name, t in tensors.items():
            assert torch.equal(t.grad, torch.ones_like(t)), name


def test_a_max_over_tied_edges_splits_the_gradient_evenly_between_them():
    (src, dst, etype), nodes, relations = edges(seed=11)
    g = RelGraph.build(src, dst, etype, nodes, relations)
    gen = torch.Generator().manual_seed(12)
    e = torch.randn(g.edges, 4, generator=gen, dtype=torch.float64).relu().requires_grad_()  # ties at 0
    b = torch.zeros(relations, 4, dtype=torch.float64, requires_grad=True)
    out = op.Layer(max_both_ways())(g, e=e, b=b)
    rows = e + b[g.etype]
    want = scatter_max(rows, g.dst, nodes) + scatter_max(rows, g.src, nodes)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    upstream = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    for a, w in zip(torch.autograd.grad(out, [e, b], upstream), torch.autograd.grad(want, [e, b], upstream)):
        torch.testing.assert_close(a, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_the_ops_pass_torch_opcheck(dtype):
    (src, dst, etype), nodes, relations = edges(seed=13)
    g = RelGraph.build(src, dst, etype, nodes, relations)
    layer = op.Layer(passes.optimize(gated_attention(), "reorder", "compact"))
    handle, tensors = op.register_graph(g), attention_tensors(g, dtype)
    given = [tensors[n] for n in layer.names]
    torch.library.opcheck(layer.forward_op, (handle, given))
    torch.library.opcheck(layer.inference_op, (handle, [t.detach() for t in given]))
    out, *saved = layer.forward_op(handle, [t.detach() for t in given])
    torch.library.opcheck(layer.backward_op, (handle, [t.detach() for t in given], torch.randn_like(out), saved))


def column_major(t: torch.Tensor) -> torch.Tensor:
    """The same values with the last two dimensions' strides swapped (a transposed layout)."""
    if t.dim() < 2:
        return t
    return t.detach().transpose(-1, -2).contiguous().transpose(-1, -2).requires_grad_(t.requires_grad)


def test_transposed_tensors_give_the_contiguous_results_the_fake_implementations_promise():
    """torch.compile plans memory by the fake implementations: a result whose strides differ from
    the fake's (the reference's arithmetic would pass a transposed input's layout on) fails under
    inductor. opcheck compares the real and fake results' strides, for the three ops."""
    (src, dst, etype), nodes, relations = edges(seed=17)
    g = RelGraph.build(src, dst, etype, nodes, relations)
    layer = op.Layer(passes.optimize(gated_attention(), "reorder", "compact"))
    handle, tensors = op.register_graph(g), attention_tensors(g, torch.float64)
    given = [column_major(tensors[n]) for n in layer.names]
    assert any(not t.is_contiguous() for t in given)
    torch.library.opcheck(layer.forward_op, (handle, given))
    torch.library.opcheck(layer.inference_op, (handle, [t.detach() for t in given]))
    out, *saved = layer.forward_op(handle, [t.detach() for t in given])
    gradient = column_major(torch.randn_like(out))
    torch.library.opcheck(layer.backward_op, (handle, [t.detach() for t in given], gradient, saved))
    for result in (out, *layer.backward_op(handle, [t.detach() for t in given], gradient, saved)):
        assert result.is_contiguous()


@pytest.mark.parametrize("model_name", ["gated_attention", "scaled_rgcn"])
def test_features_of_no_columns_are_refused_in_one_line(model_name):
    """A width of 0 would divide by zero (heads over it, rsqrt of it) or compute nothing."""
    (src, dst, etype), nodes, relations = edges(seed=19)
    g = RelGraph.build(src, dst, etype, nodes, relations)
    tensors = attention_tensors(g, torch.float64, width=(0, 6, 3))
    tensors["W"] = torch.randn(relations, 0, 6 if model_name == "gated_attention" else 0, dtype=torch.float64)
    layer = op.Layer({"gated_attention": gated_attention, "scaled_rgcn": scaled_rgcn}[model_name]())
    with pytest.raises(UserError, match=r"width '\w+' is 0; every width must be at least 1"):
        layer(g, **{n: tensors[n] for n in layer.names})


def test_a_relation_typed_product_of_node_values_is_refused_while_tracing():
    """A node has no relation: ``x @ W[m.relation]`` on node rows would multiply node i by the weight
    of edge i's relation (a number where there are as many edges as nodes, an IndexError elsewhere)."""
    from systems.hector.lang import ModelError

    def node_rows(m):
        x = m.input("x", "in")
        return m.sum_into_dst(m.src(x @ m.weight("W", ("in", "out"), per="relation")[m.relation]))

    with pytest.raises(ModelError, match=r"W\[m.relation\] applies to edge values"):
        model(node_rows)()


@pytest.mark.parametrize("name", ["grad:0", "saved:0", "x y", ""])
def test_a_name_that_is_not_an_identifier_is_refused_while_tracing(name):
    """Tensors are passed by name: "grad:0" and "saved:0" are the operator's own (a layer given its
    own x under that name got another tensor's gradient), and a name with a space cannot be a keyword."""
    from systems.hector.lang import ModelError

    def squared(m):
        x = m.input(name, "in")
        return x * x

    with pytest.raises(ModelError, match="is not a Python identifier"):
        model(squared)()


def test_a_graph_keeps_its_ids_when_the_callers_buffers_change():
    """RelGraph.build copies the ids (tensor, numpy or list): editing the caller's edge buffer
    afterwards, as a loop reusing it for the next batch would, changes neither the graph nor its
    layer's result."""
    rng = np.random.default_rng(7)
    edges = torch.from_numpy(rng.integers(0, 9, size=(2, 29)))
    etype = np.asarray(rng.integers(0, 3, size=29))
    graph = RelGraph.build(edges[0], edges[1][::1], etype, num_nodes=9, num_relations=3)
    x, W = torch.randn(9, 4, dtype=torch.float64), torch.randn(3, 4, 5, dtype=torch.float64)
    layer = op.Layer(scatter_model())
    before = layer(graph, x=x, W=W).clone()
    src0, dst0, etype0 = edges[0].clone(), edges[1].clone(), etype.copy()
    edges.random_(0, 9)  # the caller's buffers, reused
    etype[:] = rng.integers(0, 3, size=29)
    assert torch.equal(graph.src.cpu(), src0) and torch.equal(graph.dst.cpu(), dst0)
    assert torch.equal(graph.etype.cpu(), torch.from_numpy(etype0))
    torch.testing.assert_close(layer(graph, x=x, W=W), before, rtol=0, atol=0)


@model
def scatter_model(m):
    x = m.input("x", "in")
    return m.sum_into_dst(m.src(x) @ m.weight("W", ("in", "out"), per="relation")[m.relation] * m.graph_data("norm"))


def test_numpy_numbers_are_constants_and_a_bool_is_refused_in_arithmetic():
    """A numpy scalar (np.float32(2), np.int64(3)) is a number like 2.0 or 3; True in arithmetic
    is a mistake (Python would read it as 1), refused while tracing."""
    from systems.hector.lang import ModelError

    def scaled(factor):
        def program(m):
            x = m.input("x", "in")
            return m.sum_into_dst(m.src(x) * factor)

        program.__name__ = "scaled"
        return model(program)()

    graph = RelGraph.build([0, 1, 2, 2], [1, 2, 0, 0], [0, 0, 0, 0], num_nodes=3, num_relations=1)
    x = torch.randn(3, 4, dtype=torch.float64)
    plain = op.Layer(scaled(2.0))(graph, x=x)
    for factor in (np.float32(2.0), np.int64(2)):
        torch.testing.assert_close(op.Layer(scaled(factor))(graph, x=x), plain, rtol=0, atol=0)
    for factor in (True, np.bool_(False)):
        with pytest.raises(ModelError, match="cannot use a bool"):
            scaled(factor)


def test_a_constant_that_is_not_finite_is_refused_while_tracing_and_one_past_float32_when_called_in_it():
    """inf, nan and an int past a float's range are refused where they are written; 1e300 is a
    float64 layer's constant, refused in one line when the layer is called in a type computed in
    float32 (torch.full failed nine frames deep in the reference)."""
    from systems.hector.lang import ModelError

    def scaled(factor, op_name="mul"):
        def program(m):
            rows = m.src(m.input("x", "in"))
            return m.sum_into_dst(rows * factor if op_name == "mul" else rows - factor)

        program.__name__ = "scaled"
        return model(program)()

    for factor, shown in (
        (float("inf"), "float inf"),
        (np.float64("nan"), r"float64 np.float64\(nan\)"),
        (10**400, "int 1000"),
    ):
        with pytest.raises(ModelError, match=f"^mul's constant must be a finite number, got {shown}"):
            scaled(factor)
    with pytest.raises(ModelError, match="^sub's constant must be a finite number, got float -inf$"):
        scaled(-float("inf"), "sub")
    with pytest.raises(ModelError, match="^leaky_relu's slope must be a finite float32 number, got int 1000"):
        model(lambda m: m.leaky_relu(m.input("x", "in"), 10**400))()

    graph = RelGraph.build([0, 1, 2, 2], [1, 2, 0, 0], [0, 0, 0, 0], num_nodes=3, num_relations=1)
    layer = op.Layer(scaled(-1e300))
    x = torch.rand(3, 4, dtype=torch.float64, requires_grad=True)
    out = layer(graph, x=x)
    torch.testing.assert_close(out, torch.zeros_like(out).index_add(0, graph.dst, x[graph.src] * -1e300))
    torch.testing.assert_close(
        torch.autograd.grad(out.sum(), x)[0], torch.full_like(x, -1e300) * torch.tensor([[1], [1], [2]])
    )
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        with pytest.raises(UserError) as refused:
            layer(graph, x=x.detach().to(dtype))
        assert str(refused.value) == (
            f"scaled: the constant -1e+300 is past the range of float32, in which {str(dtype)[6:]} tensors are "
            "computed (float64 tensors take it)"
        )


def test_features_that_are_not_dense_are_refused_naming_them():
    """Sparse or nested tensors: one line naming the tensor, not a NotImplementedError from torch
    (aten::as_strided on SparseCPU) with the dispatcher's table."""
    (src, dst, etype), nodes, relations = edges(seed=7)
    g = RelGraph.build(src, dst, etype, nodes, relations)
    tensors = {k: v.detach() for k, v in attention_tensors(g).items()}
    layer = op.Layer(gated_attention())
    x, W = tensors["x"], tensors["W"]
    for name, given, kind in (
        ("x", x.to_sparse(), "a torch.sparse_coo"),
        ("W", W.to_sparse(), "a torch.sparse_coo"),
        ("x", torch.nested.nested_tensor([x[:4], x[4:]], layout=torch.jagged), "a nested"),
    ):
        with pytest.raises(UserError, match=f"^gated_attention: {name} must be a dense tensor, got {kind} tensor$"):
            layer(g, **tensors | {name: given})


def test_torch_func_transforms_are_refused_in_one_line_and_functionalize_runs():
    """grad and vjp failed in torch (the autograd.Function has no setup_context), vmap had no
    batching rule, and jvp gave zero tangents: each is refused, pointing to torch.autograd."""
    (src, dst, etype), nodes, relations = edges(seed=7)
    g = RelGraph.build(src, dst, etype, nodes, relations)
    tensors = {k: v.detach() for k, v in attention_tensors(g).items()}
    layer = op.Layer(gated_attention())

    def f(x):
        return layer(g, **tensors | {"x": x})

    x = tensors["x"]
    transforms = {
        "grad": lambda: torch.func.grad(lambda x: f(x).sum())(x),
        "vjp": lambda: torch.func.vjp(f, x),
        "jacrev": lambda: torch.func.jacrev(f)(x),
        "vmap": lambda: torch.vmap(f)(torch.stack([x, x])),
        "jvp": lambda: torch.func.jvp(f, (x,), (torch.ones_like(x),)),
        "jacfwd": lambda: torch.func.jacfwd(f)(x),
    }
    for name, transform in transforms.items():
        with pytest.raises(UserError) as refused:
            transform()
        assert str(refused.value) == (
            "gated_attention: Hector's layers do not support torch.func transforms (grad, vjp, jvp, jacrev, jacfwd, "
            "vmap): differentiate with torch.autograd (loss.backward(), torch.autograd.grad)"
        ), name
    torch.testing.assert_close(torch.func.functionalize(f)(x), f(x), rtol=0, atol=0)


@model
def shifted(m):
    """A shared vector added to every edge's row and to every node's result."""
    x, b = m.input("x", "in"), m.weight("b", ("in",))
    return m.sum_into_dst(m.src(x) + b) + b


def plain_shifted(g: RelGraph, x, b):
    return x.new_zeros(g.num_nodes, x.shape[1]).index_add(0, g.dst, x[g.src] + b) + b


@model
def shared_attention(m):
    """One attention vector in two dot products (source and target side), relation-typed values."""
    x, a = m.input("x", "in"), m.weight("a", ("out",))
    W = m.weight("W", ("in", "out"), per="relation")
    source, target = m.src(x) @ W[m.relation], m.dst(x) @ W[m.relation]
    score = m.leaky_relu(m.dot(source, a) + m.dot(target, a), 0.2)
    return m.sum_into_dst(m.edge_softmax(score) * source)


def plain_shared_attention(g: RelGraph, x, a, W):
    n = g.num_nodes
    source = torch.bmm(x[g.src].unsqueeze(1), W[g.etype]).squeeze(1)
    target = torch.bmm(x[g.dst].unsqueeze(1), W[g.etype]).squeeze(1)
    score = F.leaky_relu(source @ a + target @ a, 0.2)
    top = score.new_full((n,), -torch.inf).scatter_reduce(0, g.dst, score, "amax")
    exp = (score - top[g.dst]).exp()
    attention = exp / exp.new_zeros(n).index_add(0, g.dst, exp)[g.dst]
    return x.new_zeros(n, W.shape[2]).index_add(0, g.dst, attention.unsqueeze(1) * source)


@pytest.mark.parametrize("applied", PASS_SETS, ids=lambda p: "+".join(p) or "none")
def test_a_shared_vector_used_twice_gets_the_sum_of_both_uses_gradients(applied):
    """A shared vector's gradient is the sum of its parts, vectors of its one shape: added as they
    are (the reference once broadcast them as rows, which a vector has no second dimension for)."""
    (src, dst, etype), nodes, relations = edges(seed=11)
    g = RelGraph.build(src, dst, etype, nodes, relations)
    gen = torch.Generator().manual_seed(12)

    def given(**shapes):
        return {k: torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_() for k, s in shapes.items()}

    assert_matches(op.Layer(passes.optimize(shifted(), *applied)), plain_shifted, g, given(x=(nodes, 4), b=(4,)), 1e-12)
    tensors = given(x=(nodes, 5), a=(6,), W=(relations, 5, 6))
    assert_matches(op.Layer(passes.optimize(shared_attention(), *applied)), plain_shared_attention, g, tensors, 1e-12)


def test_a_model_named_by_a_lambda_a_partial_or_a_non_ascii_name_is_a_layer():
    """The op's name is made from the model's: one that is no ASCII identifier (``<lambda>``,
    ``café``) or a callable with no ``__name__`` (``functools.partial``) still names an op, and
    two programs of one name (two partials) get two ops, each computing its own."""
    import functools

    def café(m):
        return m.sum_into_dst(m.src(m.input("x", "in")))

    def scaled(m, factor):
        return m.sum_into_dst(m.src(m.input("x", "in"))) * factor

    g = RelGraph.build([0, 1, 2, 2], [1, 2, 0, 1], [0, 0, 0, 0], num_nodes=3, num_relations=1)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    summed = torch.zeros(3, 4, dtype=torch.float64).index_add(0, g.dst, x[g.src])
    cases = [
        (café, "café", 1.0),
        (lambda m: m.sum_into_dst(m.src(m.input("x", "in"))) * 2.0, "<lambda>", 2.0),
        (functools.partial(scaled, factor=3.0), "scaled", 3.0),
        (functools.partial(scaled, factor=4.0), "scaled", 4.0),
    ]
    names = set()
    for fn, name, factor in cases:
        layer = op.Layer(model(fn)())
        assert layer.program.name == name and layer.op_name.isidentifier() and layer.op_name.isascii()
        names.add(layer.op_name)
        out = layer(g, x=x)
        torch.testing.assert_close(out, summed * factor, rtol=1e-15, atol=1e-15)
        (grad,) = torch.autograd.grad(out.sum(), x)
        torch.testing.assert_close(grad, torch.bincount(g.src, minlength=3)[:, None].double().expand(3, 4) * factor)
    assert len(names) == len(cases)


@model
def scaled_bias(m):
    """A value made of 1 / sqrt(in) and a shared vector alone: a row per node."""
    return m.rsqrt("in", m.input("x", "in")) + m.weight("b", ("in",))


@model
def rsqrt_rows(m):
    """1 / sqrt(in) per node and per edge, read where real rows are needed: gathered, summed,
    averaged, maximized and normalized by an edge softmax."""
    x, b = m.input("x", "in"), m.weight("b", ("in",))
    per_node, per_edge = m.rsqrt("in", x), m.rsqrt("in", m.src(x))
    gathered = m.sum_into_dst(m.src(per_node) * m.src(x))
    counted = m.sum_into_dst(per_edge) + m.mean_into_src(per_edge) + m.max_into_dst(per_edge)
    return m.sum_into_dst(m.edge_softmax(per_edge) * m.dst(x)) + gathered + counted * x + b


def plain_scaled_bias(g: RelGraph, x, b):
    return x.new_full((g.num_nodes, 1), x.shape[1] ** -0.5) + b


def plain_rsqrt_rows(g: RelGraph, x, b):
    n, s = g.num_nodes, x.shape[1] ** -0.5
    column = x.new_full((g.edges, 1), s)
    into_dst = torch.bincount(g.dst, minlength=n).to(x.dtype).unsqueeze(1)  # a target's edges: softmax of equals
    out_degree = torch.bincount(g.src, minlength=n).clamp(min=1).to(x.dtype).unsqueeze(1)
    gathered = x.new_zeros(n, x.shape[1]).index_add(0, g.dst, s * x[g.src])
    counted = into_dst * s + x.new_zeros(n, 1).index_add(0, g.src, column) / out_degree
    counted = counted + scatter_max(column, g.dst, n)
    attended = x.new_zeros(n, x.shape[1]).index_add(0, g.dst, x[g.dst] / into_dst[g.dst])
    return attended + gathered + counted * x + b


@pytest.mark.parametrize("applied", PASS_SETS, ids=lambda p: "+".join(p) or "none")
@pytest.mark.parametrize(
    "program, plain", [(scaled_bias, plain_scaled_bias), (rsqrt_rows, plain_rsqrt_rows)], ids=["alone", "as_rows"]
)
def test_a_value_made_of_rsqrt_has_a_row_per_node_or_edge_of_its_like(program, plain, applied):
    """m.rsqrt(width, like) is one row per row of like's domain: returned with a bias it is
    [nodes, in] (it was one row, silently), and gathered, summed, averaged, maximized or softmaxed
    it is what plain torch computes (it failed inside torch)."""
    (src, dst, etype), nodes, relations = edges(seed=14)
    g = RelGraph.build(src, dst, etype, nodes, relations)
    gen = torch.Generator().manual_seed(15)
    x = torch.randn(nodes, 5, generator=gen, dtype=torch.float64).requires_grad_()
    b = torch.randn(5, generator=gen, dtype=torch.float64).requires_grad_()
    layer = op.Layer(passes.optimize(program(), *applied))
    tensors = {name: {"x": x, "b": b}[name] for name in layer.names}  # scaled_bias reads no x
    assert_matches(layer, lambda g, **t: plain(g, x, t["b"]), g, tensors, 1e-12)
    assert layer(g, **tensors).shape == (nodes, 5)


def test_a_tensor_off_the_graphs_device_is_refused_naming_it_and_both_devices():
    """Features, weights or an edge input on another device than the graph's: one line, not a
    result on that device (a meta x with CPU weights gave a meta tensor)."""
    (src, dst, etype), nodes, relations = edges(seed=16)
    g = RelGraph.build(src, dst, etype, nodes, relations)
    layer = op.Layer(gated_attention())
    for training in (False, True):
        tensors = {k: v.detach().requires_grad_(training) for k, v in attention_tensors(g).items()}
        for name in ("x", "W", "attr"):
            moved = tensors | {name: tensors[name].detach().to("meta")}
            with pytest.raises(UserError, match=f"^gated_attention: {name} is on meta, the graph on cpu: "):
                layer(g, **moved)


@pytest.mark.parametrize("applied", PASS_SETS, ids=lambda p: "+".join(p) or "none")
def test_features_of_another_width_than_the_layers_are_refused_naming_the_features_and_both_widths(applied):
    """The weights are the layer: features of another width are what a mismatch names, with their
    width and the layer's (it named the weight whose width disagreed with the features)."""
    (src, dst, etype), nodes, relations = edges(seed=23)
    g = RelGraph.build(src, dst, etype, nodes, relations)
    layer = op.Layer(passes.optimize(gated_attention(), *applied))
    tensors = attention_tensors(g, torch.float32, width=(5, 6, 3))
    wide_x = torch.randn(nodes, 7, generator=torch.Generator().manual_seed(3))
    for grad in (True, False):  # the training op and the inference op
        with torch.set_grad_enabled(grad), pytest.raises(UserError) as refused:
            layer(g, **tensors | {"x": wide_x})
        assert str(refused.value) == f"input x: [{nodes} nodes, 5] wanted (width 'in' is 5 in W), got ({nodes}, 7)"
    # An edge input is named the same way, by its own width symbol.
    with pytest.raises(UserError, match=rf"^input attr: \[{g.edges} edges, 3\] wanted \(width 'd' is 3 in We\), got"):
        layer(g, **tensors | {"attr": torch.randn(g.edges, 2)})


@pytest.mark.parametrize("model_name", ["rgcn", "rgat", "hgt"])
def test_hectors_forms_name_the_features_width_and_the_layers_when_they_differ(model_name):
    from systems.rgnn.forms import FORMS
    from systems.rgnn.models import MODELS

    (src, dst, etype), nodes, relations = edges(seed=29)
    g = RelGraph.build(src, dst, etype, nodes, relations)
    weights = MODELS[model_name].make_weights(g, 8, 8, seed=4)
    width = "out" if model_name == "hgt" else "in"  # HGT's program reads x at the width of its output
    for form in ("hector_unopt", "hector_best"):
        layer = FORMS[form].build(MODELS[model_name], weights, g)
        with pytest.raises(
            UserError, match=rf"^input x: \[{nodes} nodes, 8\] wanted \(width '{width}' is 8 in \w+\), "
        ):
            layer(torch.randn(nodes, 5, generator=torch.Generator().manual_seed(6)).requires_grad_())


def built(seed: int) -> RelGraph:
    (src, dst, etype), nodes, relations = edges(seed)
    return RelGraph.build(src, dst, etype, nodes, relations)


@pytest.mark.parametrize("edited", ["src", "dst", "etype", "node_type"])
def test_a_graph_edited_in_place_after_it_was_built_is_refused_not_half_read(edited):
    """Norm and the cached indices kept the old edges while a typed product read the new etype: a
    layer's output moved by up to 1.16 from the rebuilt graph's, without a word."""
    g = built(seed=4)
    layer = op.Layer(passes.optimize(gated_attention(), "compact"))
    tensors = attention_tensors(g)
    layer(g, **tensors)
    with torch.no_grad():
        getattr(g, edited)[0] = getattr(g, edited)[0]  # any in-place write counts: the ids may now differ
    with pytest.raises(UserError, match=rf"^the graph's {edited} changed in place after RelGraph.build"):
        layer(g, **tensors)


def test_a_graph_is_equal_to_itself_only_and_copies_stay_usable():
    import copy

    g = built(seed=4)
    assert g == g and g != built(seed=4) and len({g, g}) == 1  # == compared tensors, and raised
    copied = copy.deepcopy(g)
    layer, tensors = op.Layer(gated_attention()), attention_tensors(g)
    assert torch.equal(layer(copied, **tensors), layer(g, **tensors))


def test_no_node_types_without_node_type_names_the_count_not_ids_nobody_gave():
    with pytest.raises(UserError, match=r"^num_node_types is 0 for a graph of 3 nodes: without node_type every node"):
        RelGraph.build([0], [1], [0], num_nodes=3, num_relations=1, num_node_types=0)
    assert RelGraph.build([], [], [], num_nodes=0, num_relations=1, num_node_types=0).num_node_types == 0


class Net(torch.nn.Module):
    """A user's module holding a layer."""

    def __init__(self):
        super().__init__()
        self.layer = op.Layer(passes.optimize(gated_attention(), "compact"), tensor_cores=True)


def test_a_module_holding_a_layer_is_saved_and_loaded_whole():
    """torch.save of a module that holds a Layer failed on its registered ops (not pickleable)."""
    import io

    buffer = io.BytesIO()
    torch.save(Net(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert loaded.layer.op_name == Net().layer.op_name and loaded.layer.tensor_cores
    g = built(seed=4)
    tensors = attention_tensors(g)
    assert torch.equal(loaded.layer(g, **tensors), Net().layer(g, **tensors))


@pytest.mark.parametrize("how", ["deepcopy", "copy", "pickle", "torch.save"])
def test_an_edited_graph_cannot_be_copied_into_one_that_passes_as_built(how):
    """A copy counted its ids' versions afresh: an edited graph, deep-copied or pickled, was accepted
    and read its stale norm in float32 (2.0) while float64 recomputed it (1.0)."""
    import copy
    import io
    import pickle

    def copied(g):
        if how == "deepcopy":
            return copy.deepcopy(g)
        if how == "copy":
            return copy.copy(g)
        if how == "pickle":
            return pickle.loads(pickle.dumps(g))
        buffer = io.BytesIO()
        torch.save(g, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=False)

    g = built(seed=4)
    layer, tensors = op.Layer(gated_attention()), attention_tensors(g)
    assert torch.equal(layer(copied(g), **tensors), layer(g, **tensors))  # an unedited copy stays usable
    with torch.no_grad():
        g.etype[:] = 0
    with pytest.raises(UserError, match=r"^the graph's etype changed in place after RelGraph.build"):
        copied(g)


@model
def branches_on_a_traced_value(m):
    x, y = m.input("x", "in"), m.input("y", "in")
    return x if m.dot(y, y) else y


@model
def compares_traced_values(m):
    x, y = m.input("x", "in"), m.input("y", "in")
    return x + y if x == y else x - y


def test_python_control_flow_on_a_traced_value_is_refused_not_traced_one_way():
    """`if e:` was always true and `x == y` always false: one branch was traced for every row, and
    an input used only in the condition vanished from the layer."""
    from systems.hector.lang import ModelError

    with pytest.raises(ModelError, match="^a traced value has no truth value"):
        branches_on_a_traced_value()
    with pytest.raises(ModelError, match=r"^the language has no comparisons \(==, <, ...\)"):
        compares_traced_values()


@model
def doubled(m):
    return m.input("x", "in") * 2


def test_the_model_function_itself_or_another_object_is_refused_where_a_program_is_wanted():
    with pytest.raises(UserError, match=r"^Layer takes a traced Program: call the @model function, doubled\(\), and"):
        op.Layer(doubled)
    with pytest.raises(UserError, match=r"^optimize takes a traced Program: call the @model function, doubled\(\)"):
        passes.optimize(doubled, "reorder")
    with pytest.raises(
        UserError, match=r"^Layer takes a traced Program \(what a @model function returns\), got NoneType"
    ):
        op.Layer(None)
    with pytest.raises(UserError, match=r"^Layer: tensor_cores must be True or False, got 'yes'"):
        op.Layer(doubled(), tensor_cores="yes")


def test_the_ops_called_with_too_few_or_too_many_tensors_say_what_they_take():
    g = built(seed=4)
    layer, tensors = op.Layer(gated_attention()), attention_tensors(g)
    handle = op.register_graph(g)
    given = [tensors[name] for name in layer.names]
    for wrong in (given[:1], given + given[:1]):
        with pytest.raises(UserError, match=rf"takes {len(given)} tensors \(x, W, attr, We, a\), got {len(wrong)}$"):
            layer.inference_op(handle, wrong)
        with pytest.raises(UserError, match=rf"takes {len(given)} tensors"):
            layer.forward_op(handle, wrong)


MISUSED = [
    (lambda m, x, W, b: m.src(x) * m.relation, r"m.relation and m.node_type only index a weight"),
    (
        lambda m, x, W, b: m.sum_into_dst(b[m.relation]),
        r"sum_into_dst takes an edge value, got weight b\[m.relation\] \(a weight indexed by m.relation is no edge",
    ),
    (lambda m, x, W, b: m.src(x) @ W[m.relation] + m.dst(x) @ W[m.node_type], r"^weight W is per relation, not per"),
    (lambda m, x, W, b: m.src(x) + x, r"^add of an edge value and a node value: both must be rows of one kind"),
]


@pytest.mark.parametrize("body, message", MISUSED)
def test_a_misused_relation_index_or_mixed_rows_are_named_as_the_user_wrote_them(body, message):
    from systems.hector.lang import ModelError

    def write(m):
        x = m.input("x", "in")
        return body(m, x, m.weight("W", ("in", "in"), per="relation"), m.weight("b", ("in",), per="relation"))

    write.__name__ = "written"
    with pytest.raises(ModelError, match=message):
        model(write)()
