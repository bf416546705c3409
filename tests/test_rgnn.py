"""Relational GNN layers: every registered form of RGCN, RGAT and HGT (systems/rgnn) computes the
same function from the same weights (outputs and gradients, against a float64 reference written
from the definition), on the real knowledge graphs and on synthetic ones with odd sizes, empty
relations and no edges; bad ids are refused by name; the registries say what each form is.

A new form joins these tests by registering: every form that computes a model here is run. The
model x form cross-products run whole in the full tier; the fast tier runs each form once, on a
model picked in turn (:func:`spread`)."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from harness.errors import UserError
from systems.relgraph.graph import RelGraph
from systems.rgnn.forms import FORMS, Form, LayerForm, forms_of
from systems.rgnn.forms.compiled import CompiledForm
from systems.rgnn.forms.hector import HectorForm
from systems.rgnn.models import MODELS, Model
from systems.rgnn.models.hgt import HGTWeights
from systems.rgnn.models.rgat import RGATWeights
from systems.rgnn.models.rgcn import RGCNWeights
from workloads.graphs import knowledge


def reference_rgcn(graph: RelGraph, x, w: RGCNWeights) -> torch.Tensor:
    """The definition, target by target in float64: root term, bias, per-relation means."""
    x, weight = x.double(), w.weight.double()
    out = x @ w.root.double() + w.bias.double()
    for v in range(graph.num_nodes):
        for r in range(graph.num_relations):
            mask = (graph.dst == v) & (graph.etype == r)
            if mask.any():
                out[v] += (x[graph.src[mask]] @ weight[r]).mean(0)
    return out


def reference_rgat(graph: RelGraph, x, w: RGATWeights) -> torch.Tensor:
    """The definition, target by target in float64: a softmax over all the target's edges."""
    x, weight, q, k = x.double(), w.weight.double(), w.q.double(), w.k.double()
    out = w.bias.double().repeat(graph.num_nodes, 1)
    for v in range(graph.num_nodes):
        edges = torch.nonzero(graph.dst == v).flatten()
        if not len(edges):
            continue
        sources = torch.stack([x[graph.src[e]] @ weight[graph.etype[e]] for e in edges])
        targets = torch.stack([x[v] @ weight[graph.etype[e]] for e in edges])
        scores = torch.nn.functional.leaky_relu(targets @ q + sources @ k, 0.2).squeeze(1)
        out[v] += (scores.softmax(0).unsqueeze(1) * sources).sum(0)
    return out


def reference_hgt(graph: RelGraph, x, w: HGTWeights) -> torch.Tensor:
    """The definition, node by node in float64 (one head)."""
    x, width = x.double(), w.out_dim
    types = graph.node_type.tolist()
    kqv = torch.stack([x[n] @ w.kqv_weight[t].double().T + w.kqv_bias[t].double() for n, t in enumerate(types)])
    k, q, v = kqv[:, :width], kqv[:, width : 2 * width], kqv[:, 2 * width :]
    summed = torch.zeros(graph.num_nodes, width, dtype=torch.float64)
    for node in range(graph.num_nodes):
        edges = torch.nonzero(graph.dst == node).flatten().tolist()
        if not edges:
            continue
        rel = [int(graph.etype[e]) for e in edges]
        keys = torch.stack([k[graph.src[e]] @ w.k_rel[r].double() for e, r in zip(edges, rel)])
        values = torch.stack([v[graph.src[e]] @ w.v_rel[r].double() for e, r in zip(edges, rel)])
        priority = torch.tensor([float(w.p_rel[r].detach()) for r in rel], dtype=torch.float64)
        scores = (q[node] * keys).sum(1) * priority / width**0.5
        summed[node] = (scores.softmax(0).unsqueeze(1) * values).sum(0)
    gelu = torch.nn.functional.gelu(summed)
    out = torch.stack([gelu[n] @ w.out_weight[t].double().T + w.out_bias[t].double() for n, t in enumerate(types)])
    if w.in_dim == w.out_dim:
        share = torch.stack([w.skip[t].double().sigmoid() for t in types]).unsqueeze(1)
        out = share * out + (1 - share) * x
    return out


DEFINITIONS = {"rgcn": reference_rgcn, "rgat": reference_rgat, "hgt": reference_hgt}
LAYERS = list(DEFINITIONS)


def runs_here(form: Form) -> bool:
    return form.missing("cpu") is None


def spread(cases: list[tuple[str, str]]) -> list:
    """pytest params of pairs: each second value once in the fast tier, with the first values in
    turn (each form on one model, the models taking turns), the other cases marked ``full``."""
    fast = set()
    for turn, second in enumerate(dict.fromkeys(b for _, b in cases)):
        having = [case for case in cases if case[1] == second]
        fast.add(having[turn % len(having)])
    return [pytest.param(*case, marks=() if case in fast else pytest.mark.full) for case in cases]


# Every form that computes each model and runs on a CPU: the baselines and any form a module of
# systems/rgnn/forms adds. Hector's variants are held to the reference forms in test_hector_ir.py
# (its HGT needs in = out, where these tests also take in != out); the compiled forms to their
# eager forms in test_rgnn_peers.py (a compile takes seconds to a minute).
CASES = [
    (layer, form.name)
    for layer in LAYERS
    for form in forms_of(MODELS[layer])
    if runs_here(form) and not isinstance(form, (HectorForm, CompiledForm))
]
# The forms the models implement as plain PyTorch: the strongest a user could write by hand.
PLAIN = [(layer, name) for layer, name in CASES if FORMS[name].role == "baseline" and name in MODELS[layer].layers]


def random_graph(nodes, relations, edges, seed=0, index_dtype=torch.int64, types=3):
    """Nodes of ``types`` types; each relation joins one source type to one target type (as in a
    heterograph), and the last relation has no edges."""
    g = torch.Generator().manual_seed(seed)
    node_type = torch.arange(nodes) % types
    ends = torch.randint(0, types, (relations, 2), generator=g)
    etype = torch.randint(0, max(relations - 1, 1), (edges,), generator=g)
    members = [torch.nonzero(node_type == t).flatten() for t in range(types)]

    def pick(side):  # a random node of the relation's type on that side, per edge
        of_type = [members[int(ends[r, side])] for r in etype.tolist()]
        return torch.stack([m[torch.randint(0, len(m), (1,), generator=g)][0] for m in of_type])

    src, dst = pick(0), pick(1)
    return RelGraph.build(
        src.to(index_dtype), dst.to(index_dtype), etype.to(index_dtype), nodes, relations,
        node_type=node_type, num_node_types=types,
    )  # fmt: skip


def build(layer, form_name, weights, graph):
    return FORMS[form_name].build(MODELS[layer], weights, graph)


def run(layer, form_name, graph, in_dim, out_dim, seed=0, device="cpu"):
    """Output and gradients (features, then every weight) of one form, from seeded weights and
    features; the gradients are of a random projection of the output, never a plain sum."""
    weights = MODELS[layer].make_weights(graph, in_dim, out_dim, seed=seed).to(device)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(graph.num_nodes, in_dim, generator=g).to(device).requires_grad_()
    projection = torch.randn(graph.num_nodes, out_dim, generator=g).to(device)
    out = build(layer, form_name, weights, graph)(x)
    (out * projection).sum().backward()
    grads = {"x": x.grad} | {name: p.grad for name, p in weights.named_parameters()}
    return out.detach(), grads, (x, weights)


@pytest.mark.parametrize("layer, name", spread(CASES))
def test_every_form_matches_the_definition_on_a_small_graph_with_odd_sizes(layer, name):
    graph = random_graph(nodes=37, relations=5, edges=211)
    out, grads, (x, weights) = run(layer, name, graph, in_dim=5, out_dim=7)
    expected = DEFINITIONS[layer](graph, x.detach(), weights)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    if layer != "hgt":
        assert all(g is not None and g.abs().sum() > 0 for g in grads.values())
    else:  # no skip gates where in != out; a type no edge leads to, a relation without edges: zero
        assert all((g is None) == (n == "skip") for n, g in grads.items())
        assert all(grads[n].abs().sum() > 0 for n in ("x", "k_rel", "v_rel", "kqv_weight", "p_rel"))


@pytest.mark.parametrize("graph_name, layer", spread([(g, layer) for layer in LAYERS for g in knowledge.GRAPHS]))
def test_every_form_agrees_on_the_real_knowledge_graphs(graph_name, layer):
    spec, arrays = knowledge.load(graph_name)
    graph = RelGraph.from_store(arrays, len(spec.relations))
    base_out, base_grads, _ = run(layer, MODELS[layer].reference, graph, 16, 16)
    for name in (name for model, name in CASES if model == layer):
        out, grads, _ = run(layer, name, graph, 16, 16)
        torch.testing.assert_close(out, base_out, rtol=1e-4, atol=1e-4, msg=name)
        for key in base_grads:
            torch.testing.assert_close(grads[key], base_grads[key], rtol=1e-4, atol=1e-4, msg=f"{name} {key}")


@pytest.mark.parametrize("layer, name", spread(CASES))
def test_a_graph_without_edges_gives_the_terms_without_neighbours(layer, name):
    graph = RelGraph.build([], [], [], num_nodes=4, num_relations=3)
    out, _, (x, weights) = run(layer, name, graph, 8, 8)
    expected = DEFINITIONS[layer](graph, x.detach(), weights).float()
    torch.testing.assert_close(out, expected)


def test_both_index_dtypes_and_views_give_one_graph():
    a = random_graph(20, 3, 64, index_dtype=torch.int64)
    b = random_graph(20, 3, 64, index_dtype=torch.int32)
    assert all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("src", "dst", "etype", "norm", "offsets"))
    # Strided views of a larger edge table are taken as they are.
    table = torch.stack([a.src, a.dst, a.etype], 1)
    c = RelGraph.build(table[:, 0], table[:, 1], table[:, 2], 20, 3)
    assert torch.equal(c.by_relation, a.by_relation)


def test_features_that_do_not_match_the_weights_are_refused():
    graph = random_graph(10, 2, 30)
    layer = build("rgcn", "segment_mm", RGCNWeights(2, 8, 8), graph)
    with pytest.raises(UserError, match=r"features must be \[10 nodes, 8\], got \(10, 7\)"):
        layer(torch.randn(10, 7))
    with pytest.raises(UserError, match="the weights have 3 relations, the graph 2"):
        build("rgcn", "per_edge", RGCNWeights(3, 8, 8), graph)
    with pytest.raises(UserError, match="unknown relational-GNN form 'dgl'; one of pyg, pyg_fast, per_edge"):
        build("rgcn", "dgl", RGCNWeights(2, 8, 8), graph)
    with pytest.raises(UserError, match="form pyg_fast does not compute rgat; its forms: segment_mm, pyg, per_edge"):
        build("rgat", "pyg_fast", RGATWeights(2, 8, 8), graph)
    with pytest.raises(UserError, match=r"unknown relational model 'gcn'; one of (\w+, )*hgt, rgat, rgcn"):
        MODELS["gcn"]
    with pytest.raises(UserError, match="the weights have 1 node types, the graph 3"):
        build("hgt", "segment_mm", HGTWeights(2, 8, 8), graph)


@pytest.mark.parametrize("layer, name", spread(CASES))
def test_a_graph_edited_in_place_after_it_was_built_is_refused_by_every_form(layer, name):
    graph = random_graph(12, 3, 40, seed=2)
    weights = MODELS[layer].make_weights(graph, 8, 8, seed=1)
    call = build(layer, name, weights, graph)
    x = torch.randn(12, 8, generator=torch.Generator().manual_seed(3))
    call(x)
    with torch.no_grad():
        graph.etype[0] = (graph.etype[0] + 1) % 3  # norm and the orders still describe the old relation
    with pytest.raises(UserError, match="^the graph's etype changed in place after RelGraph.build"):
        call(x)


@pytest.mark.parametrize("layer, name", spread(CASES))
def test_a_graph_built_under_inference_mode_trains_and_refuses_an_edit_made_there(layer, name):
    """A graph built inside torch.inference_mode (a data-loading function decorated with it) holds
    ordinary tensors: every form saves them for backward, and an edit made in inference mode is
    seen as one made outside it."""
    with torch.inference_mode():
        graph = random_graph(12, 3, 40, seed=2)
    plain = random_graph(12, 3, 40, seed=2)
    weights = MODELS[layer].make_weights(plain, 8, 8, seed=1)
    x = torch.randn(12, 8, generator=torch.Generator().manual_seed(3), requires_grad=True)
    calls = [build(layer, name, weights, g) for g in (graph, plain)]
    grads = [torch.autograd.grad(call(x).square().sum(), x)[0] for call in calls]
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)
    with torch.inference_mode():
        graph.etype[0] = (graph.etype[0] + 1) % 3
    with pytest.raises(UserError, match="^the graph's etype changed in place after RelGraph.build"):
        calls[0](x)


@pytest.mark.parametrize("layer, name", spread(CASES))
def test_a_layer_built_under_inference_mode_trains_like_one_built_outside_it(layer, name):
    """A layer made while evaluating (inside torch.inference_mode) and trained afterwards: the
    index tensors a form prepares when built are saved for backward, so they must be ordinary
    tensors, and its gradients are those of the same layer built outside inference mode."""
    graph = random_graph(12, 3, 40, seed=2)
    weights = MODELS[layer].make_weights(graph, 8, 8, seed=1)
    with torch.inference_mode():
        evaluated = build(layer, name, weights, graph)
    plain = build(layer, name, weights, graph)
    x = torch.randn(12, 8, generator=torch.Generator().manual_seed(3), requires_grad=True)
    grads = [torch.autograd.grad(call(x).square().sum(), [x, *weights.parameters()]) for call in (evaluated, plain)]
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("layer, name", spread(CASES))
def test_features_that_are_not_a_tensor_are_refused_in_one_line(layer, name):
    graph = random_graph(12, 3, 40, seed=2)
    call = build(layer, name, MODELS[layer].make_weights(graph, 8, 8, seed=1), graph)
    with pytest.raises((UserError, TypeError), match="must be a torch.Tensor, got ndarray$"):
        call(np.ones((12, 8), dtype=np.float32))


def test_pyg_hgt_refuses_a_relation_between_several_type_pairs():
    mixed = RelGraph.build([0, 1], [1, 0], [0, 0], num_nodes=2, num_relations=1, node_type=[0, 1], num_node_types=2)
    with pytest.raises(UserError, match=r"relation 0 joins several node types \(\[0, 1\] to \[0, 1\]\)"):
        build("hgt", "pyg", HGTWeights(1, 4, 4, num_node_types=2), mixed)


def test_ids_out_of_range_are_refused_by_name():
    with pytest.raises(UserError, match=r"etype\[2\] = 5 is not a relation id of this graph \(0 to 4; 1 such ids\)"):
        RelGraph.build([0, 1, 2], [1, 2, 0], [0, 1, 5], num_nodes=3, num_relations=5)
    with pytest.raises(UserError, match=r"dst\[0\] = -1 is not a node id"):
        RelGraph.build([0], [-1], [0], num_nodes=3, num_relations=1)
    with pytest.raises(UserError, match="src, dst and etype must be 1-d and of one length"):
        RelGraph.build([0, 1], [1], [0], num_nodes=3, num_relations=1)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"device": "gpu"}, "device must be 'cpu' or 'cuda' \\(or 'cuda:N'\\), got 'gpu'"),
        ({"device": "meta"}, "device must be 'cpu' or 'cuda' \\(or 'cuda:N'\\), got 'meta'"),
        ({"src": torch.tensor([0, 1]).to_sparse()}, "src must be a dense tensor of ids, got a torch.sparse_coo tensor"),
        (
            {"dst": torch.empty(2, dtype=torch.int64, device="meta")},
            "dst must be a dense tensor of ids, got a meta tensor",
        ),
    ],
)
def test_a_device_or_ids_tensor_the_graph_cannot_hold_is_refused_in_one_line(change, message):
    args = {"src": [0, 1], "dst": [1, 0], "etype": [0, 0], "num_nodes": 2, "num_relations": 1} | change
    with pytest.raises(UserError, match=message):
        RelGraph.build(**args)


def test_the_graph_counts_unique_source_relation_pairs():
    graph = RelGraph.build([0, 0, 0, 1], [1, 2, 2, 0], [0, 0, 1, 0], num_nodes=3, num_relations=2)
    assert graph.unique_source_relation_pairs() == 3
    assert np.allclose(graph.norm.numpy(), [1.0, 1.0, 1.0, 1.0])


def test_kernels_the_profiler_links_to_no_operator_still_count():
    """A profile whose device events hold kernels no operator's list names: the split counts them,
    Hector's by entry point, any other as ``other``, so it sums to every kernel; a profile where
    every kernel is linked is unchanged."""
    from systems.rgnn.breakdown import UNLINKED, _seconds, _seconds_by_operator

    mm, fill = _kernel("sm90_gemm", 0, 300), _kernel("vectorized_elementwise_kernel", 300, 50)
    gemm, scatter = _kernel("segment_gemm_0123456789", 350, 120), _kernel("scatter_map_abcdef0123", 470, 80)
    linked = [_operator("aten::mm", [mm]), _operator("hector::gemm", [gemm])]
    every = _profile(*linked, mm, gemm)
    assert _seconds_by_operator(every, "cuda") == pytest.approx(
        {"aten::mm": 300e-6, "hector::gemm": 0.0, "segment_gemm": 120e-6}
    )
    lost = _profile(*linked, mm, gemm, fill, scatter, _kernel("Activity Buffer Request", 0, 9))
    split = _seconds_by_operator(lost, "cuda")
    assert split == pytest.approx(
        {"aten::mm": 300e-6, "hector::gemm": 0.0, "segment_gemm": 120e-6, "scatter_map": 80e-6, UNLINKED: 50e-6}
    )
    classes = _seconds(lost, "cuda")
    assert classes["aggregation"] == pytest.approx(80e-6) and classes["other"] == pytest.approx(50e-6)
    assert sum(classes.values()) == pytest.approx(550e-6)


def test_a_device_record_spanning_others_of_its_stream_is_not_counted_as_work():
    """A CUDA graph's replay recorded as one span over the kernels it ran, and a kernel recorded
    twice: the split counts each kernel once, and sums to the time the device was busy. A kernel
    of another stream that runs beside a longer one counts."""
    from systems.rgnn.breakdown import UNLINKED, _seconds, _seconds_by_operator

    gemm, scatter = _kernel("segment_gemm_0123456789", 100, 120), _kernel("scatter_map_abcdef0123", 220, 80)
    replay = _kernel("graph replay", 90, 220)  # spans both, on their stream
    twice = _kernel("segment_gemm_0123456789", 100, 120)
    beside = _kernel("vectorized_elementwise_kernel", 150, 40, stream=9)  # inside replay's span, other stream
    split = _seconds_by_operator(
        _profile(_operator("hector::gemm", [gemm]), replay, gemm, twice, scatter, beside), "cuda"
    )
    assert split == pytest.approx({"hector::gemm": 0.0, "segment_gemm": 120e-6, "scatter_map": 80e-6, UNLINKED: 40e-6})
    classes = _seconds(_profile(replay, gemm, scatter), "cuda")
    assert classes["gemm"] == pytest.approx(120e-6) and classes["aggregation"] == pytest.approx(80e-6)
    assert sum(classes.values()) == pytest.approx(200e-6)


def test_a_ranges_device_span_is_not_counted_as_work():
    """The profiler records Hector's step ranges (``hector::gemm``) on the device as well, each
    spanning its kernels, at times over exactly the kernel's span: whichever of the two is listed
    first, the split counts the kernel under its entry point and nothing under ``other``."""
    from systems.rgnn.breakdown import _seconds

    for order in (0, 1):
        gemm, scatter = _kernel("segment_gemm_0123456789", 100, 120), _kernel("scatter_map_abcdef0123", 230, 80)
        ranges = [
            _kernel("hector::gemm", 100, 120, annotation=True),
            _kernel("hector::scatter", 225, 90, annotation=True),
        ]
        events = [*ranges, gemm, scatter] if order == 0 else [gemm, scatter, *ranges]
        classes = _seconds(_profile(_operator("hector::rgcn_layer", [gemm]), *events), "cuda")
        assert classes["gemm"] == pytest.approx(120e-6) and classes["aggregation"] == pytest.approx(80e-6)
        assert classes["other"] == 0


def _kernel(name: str, start: float, us: float, stream: int = 7, annotation: bool = False):
    """A fake profiler device event: ``us`` microseconds from ``start`` on ``stream`` of GPU 0 (the
    device side of a ``record_function`` range if ``annotation``)."""
    span = SimpleNamespace(start=start, end=start + us, elapsed_us=lambda: us)
    return SimpleNamespace(
        name=name, device_type=torch.autograd.DeviceType.CUDA, device_index=0, device_resource_id=stream,
        time_range=span, is_user_annotation=annotation,
    )  # fmt: skip


def _operator(name: str, kernels: list):
    """A fake profiler operator event that launched ``kernels``."""
    listed = [SimpleNamespace(name=k.name, duration=k.time_range.elapsed_us()) for k in kernels]
    total = sum(k.duration for k in listed)
    return SimpleNamespace(name=name, device_type=torch.autograd.DeviceType.CPU, kernels=listed,
                           self_device_time_total=total)  # fmt: skip


def _profile(*events):
    return SimpleNamespace(events=lambda: list(events))


def test_operators_are_classified_by_what_they_do():
    from systems.rgnn.breakdown import classify

    cases = {
        "aten::mm": "gemm",
        "aten::bmm": "gemm",
        "aten::_grouped_mm": "gemm",
        "aten::index_add": "aggregation",
        "aten::scatter_add_": "aggregation",
        "aten::index_select": "gather_scatter",
        "aten::index": "gather_scatter",
        "aten::_index_put_impl_": "gather_scatter",
        "aten::mul": "elementwise",
        "aten::leaky_relu": "elementwise",
        "aten::view": "other",
        "autograd::engine::evaluate_function: MmBackward0": "other",
        "hector::gemm": "gemm",
        "hector::outer": "gemm",
        "hector::softmax": "aggregation",
        "hector::map": "elementwise",
        "hector::scattermap": "aggregation",
        "hector::host": "other",
    }
    assert {name: classify(name) for name in cases} == cases


def test_every_generated_kernel_is_classed_by_its_entry_point():
    """The profiler links Hector's CuPy launches to the layer's custom op: the breakdown classes
    each by its entry point, so every kernel the models need must have a class, the right one."""
    from systems.hector import codegen, passes
    from systems.hector.autodiff import split
    from systems.rgnn.breakdown import kernel_class

    names = set()
    for trace in (m.program for m in MODELS if m.program is not None):
        for program in (trace(), passes.optimize(trace(), "reorder", "compact")):
            for part in (program, *split(program)):  # the forward, and the training step's two halves
                names |= set(codegen.sources(part))
    assert names and all(kernel_class(n) is not None for n in names), sorted(names)
    assert kernel_class("segment_gemm_0123456789") == "gemm"
    assert kernel_class("scatter_rows") == "aggregation"
    assert kernel_class("fused_map_abcdef0123") == "elementwise"
    assert kernel_class("void at::native::reduce_kernel") is None


def test_the_memory_breakdown_shows_the_per_edge_weights():
    """RGCN's per-edge form gathers a weight matrix per edge: the bytes the breakdown gives its
    gathers hold them all, where the segment form's gathers hold a small part of that."""
    from systems.rgnn.breakdown import profile_call

    spec, arrays = knowledge.load("kinships")
    graph = RelGraph.from_store(arrays, len(spec.relations))
    weights = RGCNWeights(graph.num_relations, 16, 16)
    x = torch.randn(graph.num_nodes, 16)
    per_edge_weights = graph.edges * 16 * 16 * 4
    allocated = {}
    for name in ("per_edge", "segment_mm"):
        layer = build("rgcn", name, weights, graph)
        with torch.no_grad():
            allocated[name] = profile_call(lambda: layer(x), "cpu")[1]  # noqa: B023 (called at once)
    assert allocated["per_edge"]["gather_scatter"] >= per_edge_weights, allocated
    assert allocated["segment_mm"]["gather_scatter"] < 0.25 * per_edge_weights, allocated
    assert all(v >= 0 for split in allocated.values() for v in split.values())


def test_a_plain_allocation_counts_for_the_operator_that_asked_for_it():
    from types import SimpleNamespace

    from systems.rgnn.breakdown import memory_class

    def event(name, parent=None):
        return SimpleNamespace(name=name, cpu_parent=parent)

    assert memory_class(event("aten::empty", event("aten::zeros", event("hector::scatter")))) == "aggregation"
    assert memory_class(event("aten::empty_strided", event("aten::index_select"))) == "gather_scatter"
    assert memory_class(event("aten::mm")) == "gemm"
    assert memory_class(event("aten::empty")) == "other"  # nobody asked: the user's own allocation


def test_the_breakdown_sees_each_forms_own_kind_of_work():
    """On the CPU: the per-edge form gathers far more than the segment form (compared in bytes,
    which no other process on the machine can change, unlike seconds); every class is a time,
    none negative, and matrix products take some."""
    from systems.rgnn.breakdown import CLASSES, profile_call

    spec, arrays = knowledge.load("kinships")
    graph = RelGraph.from_store(arrays, len(spec.relations))
    x = torch.randn(graph.num_nodes, 32)
    weights = RGCNWeights(graph.num_relations, 32, 32)
    seconds, allocated = {}, {}
    for name in ("per_edge", "segment_mm"):
        layer = build("rgcn", name, weights, graph)
        call = lambda: layer(x).sum().backward()  # noqa: B023, E731 (called at once)
        seconds[name], allocated[name] = profile_call(call, "cpu")
    for split in seconds.values():
        assert set(split) == set(CLASSES) and min(split.values()) >= 0 and split["gemm"] > 0
    # per edge: a [32, 32] weight matrix gathered for each of the 10,686 edges (43.8 MB); per segment: rows
    assert allocated["per_edge"]["gather_scatter"] > 5 * allocated["segment_mm"]["gather_scatter"]  # 46.6 vs 4.4 MB


def test_the_operators_behind_a_class_are_named():
    """What a class holds can be asked: per operator, its seconds, the matrix products among them;
    the loss and Adam's update are elementwise work, not "other"."""
    from systems.rgnn.breakdown import classify, operators

    x, w = torch.randn(300, 64), torch.randn(64, 64)
    seconds = operators(lambda: (x @ w).relu(), "cpu")
    assert seconds["aten::mm"] > 0 and classify("aten::mm") == "gemm"
    assert all(v >= 0 for v in seconds.values())
    assert {classify(n) for n in ("aten::mse_loss", "aten::mse_loss_backward", "aten::_fused_adam_")} == {"elementwise"}
    assert classify("segment_gemm") == "gemm" and classify("scatter_rows") == "aggregation"


@pytest.mark.parametrize("layer, name", spread(CASES))
def test_features_as_strided_offset_and_expanded_views_give_the_same_output(layer, name):
    """Features a user passes as views (every other column of a wider table, rows from an offset,
    one row expanded over all nodes) give what their contiguous copies give."""
    graph = random_graph(nodes=37, relations=5, edges=211)
    form = build(layer, name, MODELS[layer].make_weights(graph, 6, 6), graph)
    g = torch.Generator().manual_seed(5)
    wide = torch.randn(40, 12, generator=g)
    views = {
        "strided": wide[:37, ::2],
        "offset": torch.randn(50, 6, generator=g)[13:],
        "expanded": torch.randn(1, 6, generator=g).expand(37, 6),
    }
    with torch.no_grad():
        for kind, view in views.items():
            torch.testing.assert_close(form(view), form(view.contiguous()), msg=kind)


def _on(graph: RelGraph, device: str) -> RelGraph:
    return RelGraph.build(
        graph.src, graph.dst, graph.etype, graph.num_nodes, graph.num_relations, device=device,
        node_type=graph.node_type, num_node_types=graph.num_node_types,
    )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("layer, name", CASES)
def test_every_form_on_the_gpu_matches_its_cpu_run_outputs_and_gradients(layer, name):
    """The forms run on the GPU as timed (TF32 off); they give what the same form gives on the
    CPU, which the tests above hold to the float64 definition."""
    graph = random_graph(nodes=301, relations=7, edges=4001, types=3)
    cpu_out, cpu_grads, _ = run(layer, name, graph, 24, 24)
    torch.backends.cuda.matmul.allow_tf32 = False
    out, grads, _ = run(layer, name, _on(graph, "cuda"), 24, 24, device="cuda")
    torch.testing.assert_close(out.cpu(), cpu_out, rtol=1e-4, atol=1e-4)
    for key, expected in cpu_grads.items():
        if expected is None:
            assert grads[key] is None, key
        else:
            torch.testing.assert_close(grads[key].cpu(), expected, rtol=1e-4, atol=1e-4, msg=key)


@pytest.mark.gpu
@pytest.mark.parametrize("layer", LAYERS)
def test_the_gpu_breakdown_accounts_for_the_timed_call(layer):
    """The classes' device time sums to every kernel the profiler saw in the same call (a kernel
    the split does not reach through its operator would be missing from the sum) and never to
    more than the call's CUDA-event time. The kernels are counted on their own, from the
    profiler's device events: the call's wall time would also hold the gaps its host work leaves
    between kernels (grouped_mm's backward waits for the host)."""
    from harness.timing import measure
    from systems.rgnn.breakdown import breakdown

    g = torch.Generator().manual_seed(3)
    nodes, edges, relations = 50_000, 2_000_000, 40
    src, dst = torch.randint(0, nodes, (2, edges), generator=g)
    etype = torch.randint(0, relations, (edges,), generator=g)
    graph = RelGraph.build(src, dst, etype, nodes, relations, device="cuda")
    weights = MODELS[layer].make_weights(graph, 64, 64).to("cuda")
    x = torch.randn(nodes, 64, device="cuda")
    for name in ("grouped_mm", "hector_best"):
        form = build(layer, name, weights, graph)
        call = lambda: form(x).sum().backward()  # noqa: E731
        timed = measure(call, device="cuda", repeat=5, warmup=2).median
        kernels = sorted(_kernel_time(call) for _ in range(3))[1]
        split = breakdown(call, "cuda")
        assert 0.9 * kernels < sum(split.values()) < min(1.1 * kernels, 1.05 * timed), (name, split, kernels, timed)


def _kernel_time(call) -> float:
    """Seconds the device was busy in one call (not with the profiler's own buffer requests): on
    each stream, the union of its events' spans, so that a record spanning others (a CUDA graph's
    replay) or a record seen twice does not count its work twice."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    spans: dict[tuple, list] = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CPU and e.name != "Activity Buffer Request":
            spans.setdefault((e.device_index, e.device_resource_id), []).append((e.time_range.start, e.time_range.end))
    busy = 0
    for intervals in spans.values():
        reach = -math.inf
        for start, end in sorted(intervals):
            busy += max(0, end - max(start, reach))
            reach = max(reach, end)
    return busy / 1e6


def _autograd_nodes(tensor) -> list[str]:
    seen, stack, names = set(), [tensor.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return names


@pytest.mark.parametrize("layer, name", spread(PLAIN))
def test_plain_forms_build_no_per_relation_or_sorting_gradients(layer, name):
    """The plain forms are the strongest a user could write: no gradient that sorts indices
    (advanced indexing's) and no per-relation slice whose gradient is a full-size zero tensor (on
    fb15k-like such slices cost over 100 ms a training step on the H200)."""
    graph = random_graph(nodes=37, relations=9, edges=211)
    weights = MODELS[layer].make_weights(graph, 8, 8)
    x = torch.randn(graph.num_nodes, 8, requires_grad=True)
    names = _autograd_nodes(build(layer, name, weights, graph)(x))
    assert "IndexBackward0" not in names
    assert names.count("SliceBackward0") + names.count("SelectBackward0") < graph.num_relations, names


def test_the_registries_say_what_each_form_and_model_is():
    """PyG's layers are peers (what a user picks today), the plain forms baselines, Hector's
    variants optimized; the tensor-core variant is hector_best in TF32 and needs a GPU."""
    roles = {form.name: form.role for form in FORMS}
    assert roles["pyg"] == roles["pyg_fast"] == "peer"
    assert {roles[name] for name in ("per_edge", "segment_mm", "grouped_mm")} == {"baseline"}
    hector = ("hector_unopt", "hector_compact", "hector_reorder", "hector_best", "hector_best_tf32")
    assert {roles[name] for name in hector} == {"optimized"}
    tf32 = FORMS["hector_best_tf32"]
    assert (tf32.precision, tf32.form, tf32.needs_gpu, tf32.tolerance) == ("tf32", "hector_best", True, 1e-2)
    assert "CUDA" in tf32.missing("cpu") and FORMS["hector_best"].missing("cpu") is None
    assert FORMS["segment_mm"].form == "segment_mm" and FORMS["segment_mm"].precision == "float32"
    # Which layers the models declare to gather a weight matrix per edge (not attempted past a
    # memory limit on a CPU).
    declared = {(m.name, f.name) for m in MODELS for f in forms_of(m) if isinstance(f, LayerForm)}
    gathering = {case for case in declared if FORMS[case[1]].gathers_edge_weights(MODELS[case[0]])}
    assert gathering == {
        ("rgcn", "pyg_fast"),
        ("rgcn", "per_edge"),
        ("rgat", "pyg"),
        ("rgat", "per_edge"),
        ("hgt", "per_edge"),
    }
    for m in MODELS:
        names = [f.name for f in forms_of(m)]
        assert names[0] == m.reference and ("pyg_fast" in names) == (m.name == "rgcn")
        assert {"hector_unopt", "hector_best"} <= set(names)  # every model with a program


def test_a_form_of_its_own_code_joins_by_registering_and_says_what_it_computes():
    """A form that is not a layer of any model: its ``make`` builds the layer for the models it
    names; any other model is refused in one line naming that model's forms."""

    def twice_then_half(model, weights, graph):  # the reference form, its output scaled there and back
        inner = FORMS[model.reference].build(model, weights, graph)
        return lambda x: (inner(x) * 2) / 2

    form = Form("twice_then_half", "baseline", models=("rgcn",), make=twice_then_half)
    FORMS.register(form)
    try:
        assert "twice_then_half" in [f.name for f in forms_of(MODELS["rgcn"])]
        assert "twice_then_half" not in [f.name for f in forms_of(MODELS["rgat"])]
        graph = random_graph(nodes=20, relations=3, edges=60)
        out, _, _ = run("rgcn", "twice_then_half", graph, 4, 4)
        torch.testing.assert_close(out, run("rgcn", "segment_mm", graph, 4, 4)[0])
        with pytest.raises(UserError, match="form twice_then_half does not compute rgat; its forms: segment_mm"):
            build("rgat", "twice_then_half", RGATWeights(3, 4, 4), graph)
    finally:
        FORMS.unregister("twice_then_half")
    with pytest.raises(ValueError, match="precision 'fp8' is not one of float32, tf32"):
        Form("odd", "baseline", precision="fp8", models=("rgcn",), make=twice_then_half)
    # A form of its own code that could not build, or that would compute no model, is refused at once.
    with pytest.raises(ValueError, match=r"form no_code: give make\(model, weights, graph\)"):
        Form("no_code", "baseline", models=("rgcn",))
    with pytest.raises(ValueError, match=r"form no_models: name the models it computes"):
        Form("no_models", "baseline", make=twice_then_half)


def test_a_model_declaration_is_checked():
    with pytest.raises(ValueError, match="per_edge_weights names forms it has no layer for"):
        Model("m", RGCNWeights, layers={"segment_mm": object}, per_edge_weights=frozenset({"per_edge"}))
    with pytest.raises(ValueError, match="a program needs its binding"):
        Model("m", RGCNWeights, program=lambda: None)
    with pytest.raises(ValueError, match="lowercase"):
        Model("RGCN", RGCNWeights)
    assert LayerForm("segment_mm", "baseline").supports(MODELS["hgt"])


# The plain forms (the baselines and the dense peer): PyG's own layers are left to PyG.
OWN = [(layer, name) for layer, name in CASES if not name.startswith("pyg")]


@pytest.mark.parametrize("name", ["per_edge", "segment_mm", "dense", "hector_unopt", "hector_best"])
def test_float64_rgcn_is_exact_to_float64_where_the_norm_is_read(name):
    """The per-(target, relation) norm in float64 is made in float64, not widened from float32's
    reciprocals (which left a float64 layer only as exact as a float32 one)."""
    graph = random_graph(13, 4, 90, seed=4)
    weights = RGCNWeights(4, 5, 6, seed=2).double()
    x = torch.randn(13, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64, requires_grad=True)
    out = build("rgcn", name, weights, graph)(x)
    got = torch.autograd.grad(out.sum(), [x, weights.weight])
    x_ref, w_ref = x.detach().requires_grad_(), RGCNWeights(4, 5, 6, seed=2).double()
    expected = reference_rgcn(graph, x_ref, w_ref)
    want = torch.autograd.grad(expected.sum(), [x_ref, w_ref.weight])
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    for a, b, what in zip(got, want, ("x", "W"), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=what)


@pytest.mark.parametrize("layer", LAYERS)
def test_grouped_mm_refuses_float64_in_one_line_naming_the_type(layer):
    graph = random_graph(12, 3, 40, types=1)
    weights = MODELS[layer].make_weights(graph, 6, 6).double()
    with pytest.raises(UserError, match=r"^grouped_mm multiplies float32, bfloat16 or float16 tensors, got float64 "):
        build(layer, "grouped_mm", weights, graph)(torch.randn(12, 6, dtype=torch.float64))


@pytest.mark.parametrize("layer, name", OWN)
@pytest.mark.parametrize(
    "nodes, relations, types", [(3, 0, 1), (0, 0, 0), (0, 2, 0)], ids=["no-relations", "nothing", "no-node-types"]
)
def test_a_graph_of_no_relations_or_no_node_types_gives_what_the_definition_gives(layer, name, nodes, relations, types):
    graph = RelGraph.build([], [], [], num_nodes=nodes, num_relations=relations, num_node_types=types)
    out, grads, (x, weights) = run(layer, name, graph, 6, 6)
    expected = DEFINITIONS[layer](graph, x.detach(), weights).float() if nodes else torch.zeros(0, 6)
    torch.testing.assert_close(out, expected)
    _, per_edge_grads, _ = run(layer, "per_edge", graph, 6, 6)
    for what, grad in grads.items():
        torch.testing.assert_close(grad, per_edge_grads[what], msg=what)


@pytest.mark.parametrize("layer", ["rgcn", "hgt"])
def test_pyg_layers_that_fail_on_a_graph_of_no_relations_are_refused_in_one_line(layer):
    pytest.importorskip("torch_geometric")
    graph = RelGraph.build([], [], [], num_nodes=3, num_relations=0, num_node_types=1)
    model = MODELS[layer]
    with pytest.raises(UserError, match=r"PyG's (RGCNConv|HGTConv) cannot take a graph with no relations"):
        FORMS["pyg"].build(model, model.make_weights(graph, 6, 6), graph)


def _within(got: torch.Tensor, want: torch.Tensor, tolerance: float, what: str) -> None:
    """``got`` is finite and within ``tolerance`` times the largest magnitude of ``want`` (the
    topic's check of a form in another precision)."""
    assert torch.isfinite(got).all(), f"{what}: not finite"
    error = (got.double() - want.double()).abs().max().item()
    assert error <= tolerance * want.abs().max().item(), f"{what}: off by {error:.3g}"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("layer, name", OWN)
def test_the_plain_forms_run_under_bfloat16_autocast_within_its_tolerance_of_float32(layer, name, device):
    """RGCN's grouped_mm and RGAT's per_edge, segment_mm and dense raised dtype errors under
    autocast (a float32 grouped_mm beside bfloat16 products; bfloat16 rows summed into a float32
    bias). Forward under autocast, backward after it, as torch's autocast recipe has it."""
    from systems.rgnn.forms import TOLERANCE

    graph = _on(random_graph(nodes=37, relations=5, edges=211, seed=6), device)
    weights = MODELS[layer].make_weights(graph, 8, 8, seed=3).to(device)
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(graph.num_nodes, 8, generator=generator).to(device).requires_grad_()
    projection = torch.randn(graph.num_nodes, 8, generator=generator).to(device)
    parameters = [x, *weights.parameters()]
    form = build(layer, name, weights, graph)
    exact = form(x)
    want = torch.autograd.grad((exact * projection).sum(), parameters, allow_unused=True)
    with torch.autocast(device, dtype=torch.bfloat16):
        cast = form(x)
    got = torch.autograd.grad((cast.float() * projection).sum(), parameters, allow_unused=True)
    _within(cast, exact, TOLERANCE["bfloat16"], "output")
    names = ["x", *(n for n, _ in weights.named_parameters())]
    for what, a, b in zip(names, got, want, strict=True):
        if b is not None:
            _within(a, b, TOLERANCE["bfloat16"], what)


@pytest.mark.parametrize("name", ["per_edge", "segment_mm", "grouped_mm", "dense"])
def test_hgt_in_float16_on_features_of_magnitude_300_stays_finite_and_close_to_float32(name):
    """Query-key products of such rows pass float16's 65504: the forms gave NaN (inf - inf in the
    softmax) where float32 is finite. The logits are now computed in float32, as Hector computes
    them; every float16 result is then within float16's rounding of float32's (1e-2 of the scale)."""
    graph = random_graph(nodes=37, relations=5, edges=211, seed=8)
    generator = torch.Generator().manual_seed(9)
    x = torch.randn(graph.num_nodes, 8, generator=generator) * 300
    projection = torch.randn(graph.num_nodes, 8, generator=generator)
    results = []
    for dtype in (torch.float32, torch.float16):
        weights = MODELS["hgt"].make_weights(graph, 8, 8, seed=7).to(dtype)
        given = x.to(dtype).requires_grad_()
        out = build("hgt", name, weights, graph)(given)
        grads = torch.autograd.grad((out.float() * projection).sum(), [given, *weights.parameters()])
        results.append((out, grads))
    (exact, exact_grads), (half, half_grads) = results
    assert half.dtype == torch.float16 and torch.isfinite(exact).all()
    _within(half, exact, 1e-2, "output")
    names = ["x", *(n for n, _ in weights.named_parameters())]
    for what, a, b in zip(names, half_grads, exact_grads, strict=True):
        _within(a, b, 1e-2, what)
