"""What the model language grew: per-edge inputs, mean and max aggregation into either end, heads
(a head count broadcast over a wider row, per-head dots and softmaxes), tanh and division; and
CompGCN, a model written only in the language.

Each feature is a small program checked in the reference backend against a float64 definition in
plain torch written here (forward), its IR backward against torch's autograd through that
definition, and the layer (forward program plus IR backward as one torch op) by gradcheck. Its
plan is checked against the reference as the templates define it (``lower.emulate``) and as the
launches' arguments drive a CPU model of the kernels; its kernels compile for sm_90, and on a GPU
compute the reference."""

import os
import re
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F
from test_hector_codegen import assert_gpu_matches_cpu, close
from test_hector_ir import PASS_SETS, awkward_graph, edgeless_graph, typed_graph

from systems.hector import autodiff, codegen, lower, op, passes, reference
from systems.hector.lang import ModelError, model
from systems.relgraph.graph import RelGraph
from systems.rgnn.forms import forms_of
from systems.rgnn.models import MODELS

HEADS = 3


@model
def edge_featured(m):
    """Messages gated by a per-edge feature vector and scaled by a per-edge scalar."""
    x, attr, scale = m.input("x", "in"), m.edge_input("edge_attr", "d"), m.edge_input("edge_scale", 1)
    gate = m.sigmoid(attr @ m.weight("We", ("d", "out")))
    return m.sum_into_dst(m.src(x) @ m.weight("W", ("in", "out"), per="relation")[m.relation] * gate * scale)


def reduced(how: str, end: str):
    """tanh of each edge's transformed far end, reduced into ``end`` by ``how``."""

    def body(m):
        x = m.input("x", "in")
        far = m.src(x) if end == "dst" else m.dst(x)
        rows = m.tanh(far @ m.weight("W", ("in", "out"), per="relation")[m.relation])
        return getattr(m, f"{how}_into_{end}")(rows) + x @ m.weight("root", ("in", "out"))

    body.__name__ = f"{how}_into_{end}"
    return model(body)


@model
def multihead_rgat(m):
    """RGAT with HEADS heads, concatenated: each head's block of ``out`` attends on its own."""
    x = m.input("x", "in")
    W = m.weight("W", ("in", "out"), per="relation")
    source, target = m.src(x) @ W[m.relation], m.dst(x) @ W[m.relation]
    q, k = m.weight("q", ("out",)), m.weight("k", ("out",))
    score = m.leaky_relu(m.dot(target, q, heads=HEADS) + m.dot(source, k, heads=HEADS), 0.2)
    return m.weight("bias", ("out",)) + m.sum_into_dst(m.edge_softmax(score) * source)


@model
def rational(m):
    """tanh and division, both operands rows, a width-1 denominator and a number over rows."""
    x, y = m.input("x", "in"), m.input("y", "in")
    messages = m.tanh(m.src(x)) / (2 + m.exp(m.dst(y)))
    bounded = x / (1.5 + m.dot(y, y))
    return m.sum_into_dst(messages) + bounded - 1 / (2 + m.tanh(y))


# Each program: the float64 definition in plain torch, and its tensors' shapes.
def _mean_into(rows, ends, nodes):
    total = torch.zeros(nodes, rows.shape[1], dtype=rows.dtype).index_add(0, ends, rows)
    return total / torch.bincount(ends, minlength=nodes).clamp(min=1).unsqueeze(1).to(rows.dtype)


def _max_into(rows, ends, nodes):
    where = ends.unsqueeze(1).expand(-1, rows.shape[1])
    return torch.zeros(nodes, rows.shape[1], dtype=rows.dtype).scatter_reduce(
        0, where, rows, "amax", include_self=False
    )


def _typed(rows, weight, etype):
    return torch.einsum("ei,eio->eo", rows, weight[etype])


def _softmax_by_target(scores, dst, nodes):
    """Each column over each target's incoming edges, target by target."""
    out = torch.zeros_like(scores)
    for v in range(nodes):
        edges = torch.nonzero(dst == v).flatten()
        if len(edges):
            out[edges] = scores[edges].softmax(0)
    return out


def define(name, graph, t):
    src, dst, etype, nodes = graph.src, graph.dst, graph.etype, graph.num_nodes
    if name == "edge_featured":
        gate = torch.sigmoid(t["edge_attr"] @ t["We"])
        rows = _typed(t["x"][src], t["W"], etype) * gate * t["edge_scale"]
        return torch.zeros(nodes, rows.shape[1], dtype=rows.dtype).index_add(0, dst, rows)
    if name == "multihead_rgat":
        source, target = _typed(t["x"][src], t["W"], etype), _typed(t["x"][dst], t["W"], etype)
        edges, width = source.shape
        heads = lambda rows, v: (rows * v).reshape(edges, HEADS, width // HEADS).sum(2)  # noqa: E731
        alpha = _softmax_by_target(F.leaky_relu(heads(target, t["q"]) + heads(source, t["k"]), 0.2), dst, nodes)
        weighted = (alpha.repeat_interleave(width // HEADS, 1) * source).reshape(edges, width)
        return t["bias"] + torch.zeros(nodes, width, dtype=source.dtype).index_add(0, dst, weighted)
    if name == "rational":
        x, y = t["x"], t["y"]
        messages = torch.tanh(x[src]) / (2 + torch.exp(y[dst]))
        total = torch.zeros_like(x).index_add(0, dst, messages)
        return total + x / (1.5 + (y * y).sum(1, keepdim=True)) - 1 / (2 + torch.tanh(y))
    how, _, end = name.split("_")
    far, ends = (src, dst) if end == "dst" else (dst, src)
    rows = torch.tanh(_typed(t["x"][far], t["W"], etype))
    reduce = {"sum": lambda r, e, n: torch.zeros(n, r.shape[1], dtype=r.dtype).index_add(0, e, r)}
    reduce |= {"mean": _mean_into, "max": _max_into}
    return reduce[how](rows, ends, nodes) + t["x"] @ t["root"]


PROGRAMS = {"edge_featured": edge_featured, "multihead_rgat": multihead_rgat, "rational": rational}
PROGRAMS |= {f"{how}_into_{end}": reduced(how, end) for how in ("sum", "mean", "max") for end in ("dst", "src")}
REPRESENTATIVE = ["edge_featured", "multihead_rgat", "rational", "mean_into_src", "max_into_dst"]


def tensors_for(name, graph, dtype=torch.float64, seed=0, width=5, out=2 * HEADS):
    """Random tensors of odd widths (heads: 3 blocks of 2 columns)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    nodes, edges, relations = graph.num_nodes, graph.edges, graph.num_relations
    t = {"x": rand(nodes, width), "W": rand(relations, width, out, scale=0.5)}
    if name == "edge_featured":
        t |= {"edge_attr": rand(edges, 3), "edge_scale": rand(edges, 1), "We": rand(3, out)}
    elif name == "multihead_rgat":
        t |= {"q": rand(out), "k": rand(out), "bias": rand(out)}
    elif name == "rational":
        t = {"x": rand(nodes, width), "y": rand(nodes, width)}
    else:
        t["root"] = rand(width, out)
    return t


def small_graph(seed=1):
    """Odd sizes, duplicate edges (ties for a max), a relation with no edges, isolated nodes."""
    g = torch.Generator().manual_seed(seed)
    nodes, relations, edges = 11, 4, 29
    src, dst = torch.randint(0, nodes - 2, (2, edges), generator=g)
    etype = torch.randint(0, relations - 1, (edges,), generator=g)
    src, dst, etype = (torch.cat([t, t[:4]]) for t in (src, dst, etype))
    return typed_graph(src, dst, etype, nodes, relations, seed=seed)


@pytest.mark.parametrize(
    "name", [n if n in REPRESENTATIVE else pytest.param(n, marks=pytest.mark.full) for n in PROGRAMS]
)
def test_each_feature_matches_its_float64_definition_forward_and_backward(name):
    graph = awkward_graph(seed=3)
    tensors = {k: v.requires_grad_() for k, v in tensors_for(name, graph).items()}
    expected = define(name, graph, tensors)
    seed = torch.randn(expected.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    program = PROGRAMS[name]()
    leaves = autodiff.leaves(program)
    want = torch.autograd.grad(expected, [tensors[leaf.name] for leaf in leaves], seed)
    plain = {k: v.detach() for k, v in tensors.items()}
    for applied in PASS_SETS:
        optimized = passes.optimize(PROGRAMS[name](), *applied)
        (out,) = reference.run(optimized, graph, plain)
        torch.testing.assert_close(out, expected.detach(), rtol=1e-12, atol=1e-12, msg=str(applied))
        got = reference.run(autodiff.differentiate(optimized), graph, plain | {"grad:0": seed})
        for leaf, have, w in zip(leaves, got[1:], want, strict=True):
            assert w.abs().sum() > 0, leaf.name
            torch.testing.assert_close(have, w, rtol=1e-10, atol=1e-12, msg=f"{leaf.name} {applied}")


@pytest.mark.parametrize(
    "name", [n if n in REPRESENTATIVE else pytest.param(n, marks=pytest.mark.full) for n in PROGRAMS]
)
def test_each_feature_as_a_layer_passes_gradcheck(name):
    """The forward program and the IR backward as one differentiable op, against finite differences."""
    graph = small_graph()
    layer = op.Layer(passes.optimize(PROGRAMS[name](), "reorder", "compact"))
    tensors = tensors_for(name, graph, width=3)
    inputs = tuple(tensors[n].requires_grad_() for n in layer.names)
    assert torch.autograd.gradcheck(lambda *ts: layer(graph, **dict(zip(layer.names, ts, strict=True))), inputs)


def test_a_max_splits_its_gradient_evenly_between_tied_edges():
    """Three edges into node 0, two of them at the maximum in column 0: each of those gets half of
    node 0's gradient there, the third none; in column 1 one edge has it all."""

    @model
    def max_of_edges(m):
        return m.max_into_dst(m.src(m.input("x", "in")))

    graph = RelGraph.build([1, 2, 3], [0, 0, 0], [0, 0, 0], 4, 1)
    x = torch.tensor([[0.0, 0.0], [5.0, 1.0], [5.0, 2.0], [-1.0, 7.0]], dtype=torch.float64)
    grad = torch.tensor([[1.0, 1.0], [3.0, 3.0], [3.0, 3.0], [3.0, 3.0]], dtype=torch.float64)
    out, dx = reference.run(autodiff.differentiate(max_of_edges()), graph, {"x": x, "grad:0": grad})
    assert out.tolist() == [[5.0, 7.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]  # no incoming edge: 0
    assert dx.tolist() == [[0.0, 0.0], [0.5, 0.0], [0.5, 0.0], [0.0, 1.0]]
    plan = lower.lower(autodiff.differentiate(max_of_edges()))
    emulated = lower.emulate(plan, graph, {"x": x.float(), "grad:0": grad.float()}, {"in": 2})
    assert emulated[1].tolist() == dx.tolist()


@pytest.mark.parametrize(
    "name, fusion",
    [
        (n, f) if n in REPRESENTATIVE and f == "fused" else pytest.param(n, f, marks=pytest.mark.full)
        for n in PROGRAMS
        for f in ("fused", "unfused")
    ],
)
def test_the_plans_compute_the_reference_as_the_templates_define_it(name, fusion):
    graph = awkward_graph(seed=2)
    tensors = tensors_for(name, graph, torch.float32, seed=1)
    for applied in PASS_SETS:
        program = autodiff.differentiate(passes.optimize(PROGRAMS[name](), *applied))
        given = tensors | {"grad:0": torch.randn(graph.num_nodes, 2 * HEADS if name != "rational" else 5)}
        expected = reference.run(program, graph, given)
        plan = lower.lower(program, fusion == "fused")
        got = lower.emulate(plan, graph, given, reference.bind_widths(program, graph, given))
        for have, want in zip(got, expected, strict=True):
            close(have, want)


@pytest.mark.parametrize(
    "name", [n if n in REPRESENTATIVE else pytest.param(n, marks=pytest.mark.full) for n in PROGRAMS]
)
def test_the_launches_compute_the_reference_on_a_cpu_model_of_the_kernels(name, monkeypatch):
    """codegen.run's argument lists (the new ones: a dot per head, softmax per column, max_rows)
    evaluated by the literal CPU model of each kernel, forward and backward, graph with no edges too."""
    from hector_kernel_model import install

    model_of_kernels = install(monkeypatch)
    for graph in (small_graph(), edgeless_graph()):
        tensors = tensors_for(name, graph, torch.float32, seed=2)
        program = autodiff.differentiate(passes.optimize(PROGRAMS[name](), "reorder", "compact"))
        tensors["grad:0"] = torch.randn(graph.num_nodes, 2 * HEADS if name != "rational" else 5)
        expected = reference.run(program, graph, tensors)
        got = codegen.run(lower.lower(program), graph, tensors, reference.bind_widths(program, graph, tensors))
        assert not model_of_kernels.problems, model_of_kernels.problems[:3]
        for have, want in zip(got, expected, strict=True):
            close(have, want)


def test_new_step_kinds_compile_for_sm90(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        if os.environ.get("CI"):
            pytest.fail("nvcc is not on PATH; CI must compile every generated kernel")
        pytest.skip("nvcc is not on PATH")
    instances = {}
    for name in REPRESENTATIVE + ["compgcn"]:
        program = MODELS[name].program() if name == "compgcn" else PROGRAMS[name]()
        for part in (program, *autodiff.split(passes.optimize(program, "reorder", "compact"))):
            for fuse in (True, False):
                for step in lower.lower(part, fuse).steps:
                    if not isinstance(step, lower.Host):
                        entry, text, _ = codegen.source_of(step)
                        instances[entry] = text
    # Each instance holds the whole template: the plain one (max_rows, the per-head rows_dot and
    # edge_softmax), and one instance per new operator in its #defines (the first by name).
    chosen = {"max_rows": instances["max_rows"]}
    for marker in ("tanhf(", ") / (", "== ("):
        having = sorted(e for e, text in instances.items() if marker in "".join(re.findall("^#define .*$", text, re.M)))
        assert having, marker
        chosen[having[0]] = instances[having[0]]
    failed = []
    for entry, text in sorted(chosen.items()):
        source = tmp_path / f"{entry}.cu"
        source.write_text(text)
        flags = ["-arch=sm_90", "--cubin", "-std=c++17", "-Werror", "all-warnings"]
        result = subprocess.run(
            [nvcc, *flags, "-o", str(tmp_path / f"{entry}.cubin"), str(source)], capture_output=True, text=True
        )
        if result.returncode:
            failed.append((entry, result.stderr))
    assert not failed, failed[0]


def test_bad_uses_of_the_new_features_are_refused_by_name():
    def trace(body):
        return model(body)()

    with pytest.raises(ModelError, match="max_into_dst takes an edge value, got a node value"):
        trace(lambda m: m.max_into_dst(m.input("x", "in")))
    with pytest.raises(ModelError, match="dot's heads must be a positive integer, got 0"):
        trace(lambda m: m.dot(m.input("x", "in"), m.input("y", "in"), heads=0))
    with pytest.raises(ModelError, match="edge_softmax takes a score per head"):
        trace(lambda m: m.sum_into_dst(m.edge_softmax(m.src(m.input("x", "in")))))
    # Literal widths are known while tracing: a head count that does not divide one is refused then.
    with pytest.raises(ModelError, match=r"^dot with heads=2 of width 5: the width must be a multiple of the heads"):
        trace(lambda m: m.dot(m.input("x", 5), m.input("y", 5), heads=2))
    trace(lambda m: m.dot(m.input("x", 6), m.input("y", 6), heads=2))  # a multiple: traced
    with pytest.raises(ModelError, match="div of widths 2 and 3"):
        trace(lambda m: m.input("x", 2) / m.input("y", 3))
    with pytest.raises(ModelError, match="the name 'e' is used twice"):
        trace(lambda m: m.sum_into_dst(m.edge_input("e", 1) * m.edge_input("e", 1)))
    graph = small_graph()
    tensors = tensors_for("multihead_rgat", graph, out=7)  # 7 columns in 3 heads
    with pytest.raises(reference.BindingError, match="is 7 here, not a multiple of 3"):
        reference.run(multihead_rgat(), graph, tensors)
    with pytest.raises(reference.BindingError, match=r"input edge_scale: \[33 edges, width\] wanted"):
        reference.run(edge_featured(), graph, tensors_for("edge_featured", graph) | {"edge_scale": torch.ones(5, 1)})


def test_edge_inputs_are_never_compacted_and_heads_concatenate():
    optimized = passes.optimize(edge_featured(), "reorder", "compact")
    assert not any(v.domain == "pair" and "edge_attr" in str(v.name) for v in optimized.values)
    products = [v for v in optimized.values if v.op == "typed_matmul"]
    assert [v.domain for v in products] == ["pair"]  # the source transform still is
    (softmax,) = [v for v in multihead_rgat().values if v.op == "edge_softmax"]
    assert softmax.width == HEADS and multihead_rgat().outputs[0].width == "out"


# CompGCN: the model written only in the language, against its plain-torch form.
def odd_graph(seed):
    g = torch.Generator().manual_seed(seed)
    nodes, relations, edges = 23 + seed, 5, 97 + 2 * seed
    src, dst = torch.randint(0, nodes - 3, (2, edges), generator=g)  # the last 3 nodes: isolated
    etype = torch.randint(0, relations - 1, (edges,), generator=g)  # the last relation: no edges
    index_dtype = torch.int32 if seed % 2 else torch.int64
    return typed_graph(src.to(index_dtype), dst.to(index_dtype), etype.to(index_dtype), nodes, relations, seed=seed)


def test_compgcn_joins_the_comparison_with_every_hector_variant():
    names = [f.name for f in forms_of(MODELS["compgcn"])]
    assert names[0] == MODELS["compgcn"].reference == "per_edge"
    assert {"hector_unopt", "hector_compact", "hector_reorder", "hector_best"} <= set(names)
    ops = {v.op for v in MODELS["compgcn"].program().values}
    assert {"sum_into_src", "div", "tanh", "graph_data"} <= ops  # means into both ends, tanh


@pytest.mark.parametrize(
    "dtype, applied, seed",
    [
        (torch.float64, ("reorder", "compact"), 0),
        (torch.float32, (), 1),
        *(
            pytest.param(d, a, s, marks=pytest.mark.full)
            for d in (torch.float64, torch.float32)
            for a in PASS_SETS
            for s in (2, 3)
        ),
    ],
)
def test_compgcn_in_the_language_matches_its_plain_torch_form(dtype, applied, seed):
    """Outputs and the gradients of the features and of every weight, both directions of edges."""
    compgcn = MODELS["compgcn"]
    graph = odd_graph(seed)
    layer = op.Layer(passes.optimize(compgcn.program(), *applied))
    results = []
    for runner in ("plain", "hector"):
        weights = compgcn.make_weights(graph, 7, 9, seed=seed).to(dtype)
        x = torch.randn(graph.num_nodes, 7, generator=torch.Generator().manual_seed(seed), dtype=dtype).requires_grad_()
        if runner == "plain":
            out = compgcn.layers["per_edge"](weights, graph)(x)
        else:
            out = layer(graph, x=x, **compgcn.bind(weights))
        projection = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=dtype)
        (out * projection).sum().backward()
        results.append((out.detach(), {"x": x.grad} | {n: p.grad for n, p in weights.named_parameters()}))
    (want, want_grads), (have, grads) = results
    tolerance = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(have, want, **tolerance)
    assert set(grads) == {"x", "relation", "loop", "w_in", "w_out", "w_loop", "bias"}
    for key, w in want_grads.items():
        assert w.abs().sum() > 0, key
        torch.testing.assert_close(grads[key], w, **tolerance, msg=key)


def test_compgcn_plan_on_the_cpu_model_of_the_kernels(monkeypatch):
    from hector_kernel_model import install

    model_of_kernels = install(monkeypatch)
    compgcn, graph = MODELS["compgcn"], odd_graph(1)
    for applied in ((), ("reorder", "compact")):
        forward, backward = autodiff.split(passes.optimize(compgcn.program(), *applied))
        tensors = {"x": torch.randn(graph.num_nodes, 7)} | {
            k: v.detach() for k, v in compgcn.bind(compgcn.make_weights(graph, 7, 9, seed=2)).items()
        }
        widths = reference.bind_widths(forward, graph, tensors)
        outputs = codegen.run(lower.lower(forward), graph, tensors, widths)
        grad = torch.randn(outputs[0].shape, generator=torch.Generator().manual_seed(1))
        saved = {f"saved:{i}": t for i, t in enumerate(outputs[1:])}
        got = codegen.run(lower.lower(backward), graph, tensors | saved | {"grad:0": grad}, widths)
        assert not model_of_kernels.problems, model_of_kernels.problems[:3]
        leaves = {k: v.clone().requires_grad_() for k, v in tensors.items()}
        (out,) = reference.run(compgcn.program(), graph, leaves)
        expected = torch.autograd.grad(out, [leaves[leaf.name] for leaf in autodiff.leaves(forward)], grad)
        torch.testing.assert_close(outputs[0], out.detach(), rtol=1e-4, atol=1e-5)
        for have, want in zip(got, expected, strict=True):
            close(have, want)


@pytest.mark.gpu
@pytest.mark.parametrize("name", [*PROGRAMS, "compgcn"])
def test_the_generated_kernels_compute_the_reference_on_the_gpu(name):
    """Forward and backward on the awkward graph, every pass set; and the op's gradients."""
    from test_hector_codegen import RelGraph_on

    torch.backends.cuda.matmul.allow_tf32 = False
    graph = awkward_graph(seed=5)
    on_gpu = RelGraph_on(graph, "cuda")
    if name == "compgcn":
        trace = MODELS["compgcn"].program
        weights = MODELS["compgcn"].make_weights(graph, 8, 12, seed=1)
        tensors = {"x": torch.randn(graph.num_nodes, 8)} | {
            k: v.detach() for k, v in MODELS["compgcn"].bind(weights).items()
        }
        out_width = 12
    else:
        trace = PROGRAMS[name]
        tensors = tensors_for(name, graph, torch.float32, seed=3)
        out_width = 5 if name == "rational" else 2 * HEADS
    for applied in PASS_SETS:
        program = autodiff.differentiate(passes.optimize(trace(), *applied))
        given = tensors | {"grad:0": torch.randn(graph.num_nodes, out_width)}
        expected = reference.run(program, graph, given)
        widths = reference.bind_widths(program, graph, given)
        got = codegen.run(lower.lower(program), on_gpu, {k: v.cuda() for k, v in given.items()}, widths)
        for have, want in zip(got, expected, strict=True):
            close(have.cpu(), want)
    layer = op.Layer(passes.optimize(trace(), "reorder", "compact"))
    assert_gpu_matches_cpu(layer, graph, on_gpu, tensors)


@model
def edge_heads(m):
    """A literal-width (2) per-edge gate broadcast over each edge's transformed source (width out)."""
    x, gate = m.input("x", "in"), m.edge_input("gate", 2)
    return m.sum_into_dst(gate * (m.src(x) @ m.weight("W", ("in", "out"), per="relation")[m.relation]))


@pytest.mark.parametrize("out, refused", [(1, True), (3, True), (2, False), (6, False)])
def test_a_head_count_wider_than_its_named_width_is_refused_not_returned(out, refused):
    graph = small_graph()
    g = torch.Generator().manual_seed(3)
    x, gate = torch.randn(graph.num_nodes, 5, generator=g), torch.randn(graph.edges, 2, generator=g)
    W = torch.randn(graph.num_relations, 5, out, generator=g)
    layer = op.Layer(edge_heads())
    if refused:  # the result would have had 2 columns where the program says `out`
        with pytest.raises(reference.BindingError, match=f"width 'out' is {out} here, not a multiple of 2"):
            layer(graph, x=x, gate=gate, W=W)
        return
    messages = torch.bmm(x[graph.src].unsqueeze(1), W[graph.etype]).squeeze(1)
    heads = gate.repeat_interleave(out // 2, dim=1)
    expected = torch.zeros(graph.num_nodes, out).index_add_(0, graph.dst.long(), heads * messages)
    got = layer(graph, x=x, gate=gate, W=W)
    assert got.shape == (graph.num_nodes, out) and torch.allclose(got, expected, atol=1e-5)


def test_under_autocast_the_layer_computes_and_trains_in_its_inputs_type():
    graph = small_graph()
    layer = op.Layer(multihead_rgat())
    tensors = {k: v.float().requires_grad_() for k, v in tensors_for("multihead_rgat", graph).items()}
    plain = layer(graph, **tensors)
    plain_grads = torch.autograd.grad(plain.square().sum(), list(tensors.values()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = layer(graph, **tensors)
        loss = cast.square().sum()
    cast_grads = torch.autograd.grad(loss, list(tensors.values()))
    assert cast.dtype == torch.float32 and torch.equal(cast, plain)
    assert all(torch.equal(a, b) for a, b in zip(cast_grads, plain_grads, strict=True))


def test_inputs_may_be_named_self_or_graph():
    @model
    def plain(m):
        x, s = m.input("x", "in"), m.weight("root", ("in", "out"))
        return m.sum_into_dst(m.src(x) @ m.weight("W", ("in", "out"), per="relation")[m.relation]) + x @ s

    @model
    def clashing(m):
        x, s = m.input("graph", "in"), m.weight("self", ("in", "out"))
        return m.sum_into_dst(m.src(x) @ m.weight("W", ("in", "out"), per="relation")[m.relation]) + x @ s

    graph = small_graph()
    t = tensors_for("rgcn", graph, dtype=torch.float32)
    root = torch.randn(5, t["W"].shape[2])
    expected = op.Layer(plain())(graph, x=t["x"], W=t["W"], root=root)
    assert torch.equal(op.Layer(clashing())(graph, **{"graph": t["x"], "W": t["W"], "self": root}), expected)


def test_rsqrt_of_a_width_nothing_declares_is_refused_when_traced():
    @model
    def scaled(m):
        x = m.input("x", "in")
        return m.sum_into_dst(m.src(x) * m.rsqrt("dim", m.src(x)))  # "dim": meant "in"

    words = r"rsqrt of width 'dim': no input or weight the model uses has that width \(widths: in\)"
    with pytest.raises(ModelError, match=words):
        scaled()


def test_rsqrt_of_a_width_only_an_unused_input_declares_is_refused_when_traced():
    """The width's size comes from the tensors given, and an input the outputs do not reach is not
    given (the layer refuses it as unused): refused when traced, not a KeyError when run."""

    @model
    def edge_only(m):
        m.input("x", "in")  # declared, never used
        e = m.edge_input("e", "d")
        return m.sum_into_dst(e * m.rsqrt("in", e))

    words = (
        "rsqrt of width 'in': no input or weight the model uses has that width (widths: d); x declares it but no "
        "output reads it (a value used only as rsqrt's like gives the rows, not the width)"
    )
    with pytest.raises(ModelError, match=f"^{re.escape(words)}$"):
        edge_only()


def test_a_matrix_weight_in_elementwise_arithmetic_is_named_as_written():
    """``src(x) * W[m.relation]`` with a matrix W named each_edge, which the user never wrote."""

    @model
    def times_a_matrix(m):
        x = m.input("x", "in")
        return m.sum_into_dst(m.src(x) * m.weight("W", ("in", "out"), per="relation")[m.relation])

    words = "mul takes a vector weight per type, but W[m.relation] is a matrix (a matrix multiplies rows with @)"
    with pytest.raises(ModelError, match=f"^{re.escape(words)}$"):
        times_a_matrix()


@model
def rgcn_with_edge_bias(m):
    """RGCN with a shared bias on each message, averaged into targets."""
    x, b = m.input("x", "in"), m.weight("b", ("out",))
    return m.mean_into_dst(m.src(x) @ m.weight("W", ("in", "out"), per="relation")[m.relation] + b)


@model
def edge_input_with_bias(m):
    return m.sum_into_dst(m.edge_input("e", "d") + m.weight("b", ("d",)))


def plan_training_step(run, program, graph, given, upstream):
    """A training step as the GPU path runs it: the forward plan (the output and what the backward
    reads), then the backward plan, each run by ``run`` (lower.emulate or codegen.run)."""
    forward, backward = autodiff.split(program)
    widths = reference.bind_widths(program, graph, given)
    out, *saved = run(lower.lower(forward), graph, given, widths)
    kept = {f"saved:{i}": t for i, t in enumerate(saved)}
    return out, run(lower.lower(backward), graph, given | kept | {"grad:0": upstream}, widths)


def test_a_bias_added_to_every_edge_gets_its_gradient_on_the_gpu_plan(monkeypatch):
    """A shared vector added per edge, then summed or averaged into targets: its gradient sums the
    output's gradient as read per edge (a gather the plan reads in place), which the host step
    summing it failed on (KeyError). Forward and backward against plain torch in float64: the plan
    as its templates define it, and codegen.run on the CPU model of the kernels (float32)."""
    from hector_kernel_model import install

    model_of_kernels = install(monkeypatch)
    graph, gen = small_graph(), torch.Generator().manual_seed(8)
    src, dst, etype, nodes = graph.src, graph.dst, graph.etype, graph.num_nodes

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()

    cases = [
        (
            rgcn_with_edge_bias,
            {"x": rand(nodes, 5), "W": rand(graph.num_relations, 5, 3), "b": rand(3)},
            lambda t: _mean_into(_typed(t["x"][src], t["W"], etype) + t["b"], dst, nodes),
        ),
        (
            edge_input_with_bias,
            {"e": rand(graph.edges, 3), "b": rand(3)},
            lambda t: torch.zeros(nodes, 3, dtype=torch.float64).index_add(0, dst, t["e"] + t["b"]),
        ),
    ]
    for program, tensors, plain in cases:
        expected = plain(tensors)
        upstream = torch.randn(expected.shape, generator=gen, dtype=torch.float64)
        names = [leaf.name for leaf in autodiff.leaves(program())]
        want = torch.autograd.grad(expected, [tensors[n] for n in names], upstream)
        given = {k: v.detach() for k, v in tensors.items()}
        for applied in PASS_SETS:
            optimized = passes.optimize(program(), *applied)
            exact = plan_training_step(lower.emulate, optimized, graph, given, upstream)
            as_float32 = {k: v.float() for k, v in given.items()}
            launched = plan_training_step(codegen.run, optimized, graph, as_float32, upstream.float())
            assert not model_of_kernels.problems, model_of_kernels.problems[:3]
            for (out, grads), tol in ((exact, 1e-12), (launched, 2e-5)):
                torch.testing.assert_close(out.double(), expected.detach(), rtol=tol, atol=tol)
                for name, have, w in zip(names, grads, want, strict=True):
                    torch.testing.assert_close(have.double(), w, rtol=tol, atol=tol, msg=f"{name} {applied}")


def test_negation_is_a_subtraction_and_a_power_is_refused_by_name():
    @model
    def negated(m):
        x = m.input("x", "in")
        return m.sum_into_dst(-(m.src(x) @ m.weight("W", ("in", "out"), per="relation")[m.relation]))

    graph = small_graph()
    t = tensors_for("rgcn", graph, dtype=torch.float64)
    expected = -torch.zeros(graph.num_nodes, t["W"].shape[2], dtype=torch.float64).index_add_(
        0, graph.dst.long(), torch.bmm(t["x"][graph.src].unsqueeze(1), t["W"][graph.etype]).squeeze(1)
    )
    assert torch.allclose(reference.run(negated(), graph, {"x": t["x"], "W": t["W"]})[0], expected, atol=1e-12)
    with pytest.raises(ModelError, match="the language has no power"):
        model(lambda m: m.input("x", "in") ** 2)()


@pytest.mark.parametrize(
    "body, words",
    [
        (lambda m, x, W: x * m.tanh(0.5), "tanh takes rows (a node, edge or pair value), got float 0.5"),
        (lambda m, x, W: x * m.gelu(None), "gelu takes rows (a node, edge or pair value), got NoneType None"),
        (
            lambda m, x, W: m.sum_into_dst(m.leaky_relu(W[m.relation], 0.1)),
            "leaky_relu takes rows (a node, edge or pair value), got weight W[m.relation]",
        ),
        (lambda m, x, W: x * m.rsqrt("in", 2.0), "rsqrt's like takes rows (a node, edge or pair value), got float 2.0"),
        (lambda m, x, W: x * m.rsqrt(2.0, x), "rsqrt takes a width's name (such as 'in'), got float 2.0"),
        (
            lambda m, x, W: x * m.leaky_relu(x, "0.1"),
            "leaky_relu's slope must be a finite float32 number, got str '0.1'",
        ),
    ],
    ids=["tanh-number", "gelu-none", "leaky_relu-weight", "rsqrt-like", "rsqrt-width", "slope-string"],
)
def test_an_operator_given_something_that_is_not_rows_is_refused_naming_both(body, words):
    @model
    def layer(m):
        return body(m, m.input("x", "in"), m.weight("W", ("in", "in"), per="relation"))

    with pytest.raises(ModelError, match=f"^{re.escape(words)}$"):
        layer()


@pytest.mark.parametrize(
    "declare, what, got",
    [
        (lambda m: m.input("x", 4.0), "input x", "float 4.0"),
        (lambda m: m.input("x", -3), "input x", "int -3"),
        (lambda m: m.input("x", None), "input x", "NoneType None"),
        (lambda m: m.edge_input("s", ("in",)), "edge input s", "tuple ('in',)"),
        (lambda m: m.weight("W", ("in", None)), "weight W", "NoneType None"),
        (lambda m: m.weight("W", ("in", True)), "weight W", "bool True"),
    ],
    ids=["float", "negative", "none", "tuple", "weight-none", "weight-bool"],
)
def test_a_width_that_is_neither_a_name_nor_a_positive_whole_number_is_refused_where_declared(declare, what, got):
    """A float or a tuple width would become a symbol that nothing checks against the tensors; a
    negative one would be refused later as an operator's error."""

    @model
    def layer(m):
        return m.sum_into_dst(m.src(declare(m)))

    words = f"{what}: a width is a name (such as 'in') or a positive whole number, got {got}"
    with pytest.raises(ModelError, match=f"^{re.escape(words)}$"):
        layer()


def test_a_numpy_whole_number_width_is_a_literal_checked_against_the_tensors():
    import numpy as np

    from harness.errors import UserError

    @model
    def layer(m):
        return m.sum_into_dst(m.src(m.input("x", np.int64(4))))

    graph = RelGraph.build([0, 1], [1, 0], [0, 0], 2, 1)
    with pytest.raises(UserError, match="width 4 wanted, got 7"):
        op.Layer(layer())(graph, x=torch.randn(2, 7))


@pytest.mark.parametrize("name", ["in_degree", "out_degree", "norm"])
@pytest.mark.parametrize("declared_first", [True, False], ids=["declared-first", "declared-after"])
def test_a_leaf_named_like_graph_data_is_refused_as_reserved_where_the_model_reads_it(name, declared_first):
    """A mean reads the node's edge count as graph data by its name, and m.graph_data("norm") the
    norm: an input or weight of that name is refused as a reserved name, in either order."""
    reads = {
        "in_degree": lambda m, x: m.mean_into_dst(m.src(x)),
        "out_degree": lambda m, x: m.mean_into_src(m.dst(x)),
        "norm": lambda m, x: m.sum_into_dst(m.src(x) * m.graph_data("norm")),
    }[name]

    @model
    def layer(m):
        x = m.input("x", "in")
        if declared_first:
            mine = m.input(name, "in")
            return reads(m, x) + mine
        reduced = reads(m, x)
        return reduced + m.input(name, "in")

    with pytest.raises(
        ModelError, match=f"^the name '{name}' is reserved for graph data .*: name the input otherwise$"
    ):
        layer()


def test_the_docs_run_your_own_model_example_runs_as_written():
    """docs/hector.md's GATv2 model and the snippet that runs it on a user's graph, executed as
    printed there: the layer's output and gradient against the reference backend run directly."""
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "hector.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    defined = next(b for b in blocks if "def relational_gatv2(m)" in b)
    running = next(b for b in blocks if "RelGraph.build(" in b and "Layer(" in b)
    scope = {"torch": torch, "model": model}
    torch.manual_seed(0)
    exec(defined + running, scope)  # noqa: S102 (the docs' own code)
    out, x, graph, weights = scope["out"], scope["x"], scope["graph"], scope["weights"]
    assert out.shape == (3, 8) and x.grad.shape == (3, 16)
    leaf = x.detach().clone().requires_grad_()
    expected = reference.run(scope["relational_gatv2"](), graph, {"x": leaf, **weights})[0]
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x.grad, leaf.grad)
    assert bool(x.grad.abs().sum() > 0)
