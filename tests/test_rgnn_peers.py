"""The peers of relational_gnn: the dense form (every node under every relation in one GEMM)
against a float64 definition and the segment_mm reference, outputs and gradients, on odd-sized
graphs of both index dtypes; the compiled forms against their eager forms (inductor, full tier)
and the compile machinery with dynamo alone (``backend="eager"``, fast): many layers in one
process never fall back to eager past dynamo's cache limit, a recompile after the first call is
an error, graph breaks are counted, a form that does not compile is one line; the part records
every form's first call and the compiled forms' graph breaks; HGT with in != out."""

import itertools

import pytest
import torch
from test_rgnn import DEFINITIONS, LAYERS, build, random_graph, run

from harness.errors import UserError
from harness.results import ResultsWriter
from systems.relgraph.graph import RelGraph
from systems.rgnn.forms import FORMS
from systems.rgnn.forms.compiled import CompiledForm, CompiledLayer, CompileFailed
from systems.rgnn.models import MODELS
from systems.rgnn.models.hgt import HGTWeights
from workloads.relational_gnn import parts
from workloads.relational_gnn.schema import SCHEMA

COMPILED = [form.name for form in FORMS if isinstance(form, CompiledForm)]


def assert_same(a, b, what):
    """Outputs and gradients (None where a weight takes no part) of two runs agree."""
    (out_a, grads_a, _), (out_b, grads_b, _) = a, b
    torch.testing.assert_close(out_a, out_b, rtol=1e-4, atol=1e-4, msg=what)
    for key, expected in grads_b.items():
        if expected is None:
            assert grads_a[key] is None, f"{what} {key}"
        else:
            torch.testing.assert_close(grads_a[key], expected, rtol=1e-4, atol=1e-4, msg=f"{what} {key}")


# Each model once in the fast tier, int32 ids for one of them; the rest of the cross-product full.
FAST = {("rgcn", torch.int64), ("rgat", torch.int32), ("hgt", torch.int64)}
DTYPES = [
    pytest.param(layer, dtype, marks=() if (layer, dtype) in FAST else pytest.mark.full)
    for layer in LAYERS
    for dtype in (torch.int64, torch.int32)
]


@pytest.mark.parametrize("layer, index_dtype", DTYPES)
def test_dense_matches_the_definition_and_segment_mm(layer, index_dtype):
    graph = random_graph(nodes=41, relations=6, edges=257, seed=3, index_dtype=index_dtype)
    for in_dim, out_dim in ((5, 7), (6, 6)):  # HGT's gated skip only where in = out
        dense = run(layer, "dense", graph, in_dim, out_dim, seed=2)
        out, grads, (x, weights) = dense
        expected = DEFINITIONS[layer](graph, x.detach(), weights)
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
        assert_same(dense, run(layer, "segment_mm", graph, in_dim, out_dim, seed=2), f"{layer} {in_dim}->{out_dim}")
        assert grads["x"].abs().sum() > 0


def test_dense_is_a_peer_that_gathers_no_weight_per_edge():
    form = FORMS["dense"]
    assert form.role == "peer" and form.missing("cpu") is None
    assert all(form.supports(MODELS[m]) and not form.gathers_edge_weights(MODELS[m]) for m in LAYERS)


def test_hgt_takes_in_other_than_out_in_every_form_but_hectors_which_refuse_in_one_line():
    """Without the skip where in != out (as PyG's HGTConv); Hector's program has the skip."""
    graph = random_graph(nodes=23, relations=4, edges=97, seed=1)
    reference = run("hgt", "segment_mm", graph, 9, 4)
    expected = DEFINITIONS["hgt"](graph, reference[2][0].detach(), reference[2][1])
    torch.testing.assert_close(reference[0].double(), expected, rtol=1e-5, atol=1e-5)
    assert_same(run("hgt", "dense", graph, 9, 4), reference, "dense")
    for name in ("hector_unopt", "hector_best"):
        layer = build("hgt", name, HGTWeights(4, 9, 4, num_node_types=3), graph)
        with pytest.raises(UserError, match=r"needs in_dim = out_dim; got in_dim 9 and out_dim 4") as refused:
            layer(torch.randn(23, 9))
        assert "\n" not in str(refused.value)


# The compile machinery, with dynamo alone: a compile takes a second, not inductor's code generation.


def compiled(layer_name, graph, seed=0, backend="eager", width=6):
    weights = MODELS[layer_name].make_weights(graph, width, width, seed=seed)
    eager = build(layer_name, "dense", weights, graph)
    return CompiledLayer(eager, f"{layer_name} dense, seed {seed}", backend=backend), weights


def test_many_compiled_layers_in_one_process_all_run_compiled():
    """More layers than dynamo's recompile limit, called in turn in both modes twice over: each
    call runs a compiled graph (the backend sees one per layer and mode each time a layer takes
    the caches) and gives the eager layer's output."""
    graph = random_graph(nodes=19, relations=3, edges=53)
    seen = []

    def backend(gm, inputs):
        seen.append(gm)
        return gm.forward

    limit = 2  # dynamo's default is 8: the same, in fewer compiles
    layers = [compiled("rgcn", graph, seed=s, backend=backend)[0] for s in range(limit + 2)]
    x = torch.randn(19, 6)
    with torch._dynamo.config.patch(recompile_limit=limit):
        for _, layer in itertools.product(range(2), layers):
            with torch.no_grad():
                torch.testing.assert_close(layer(x), layer.eager(x))
                layer(x)  # a second call: no compile (it would raise)
            torch.testing.assert_close(layer(x), layer.eager(x))
            assert layer.graph_breaks == {"inference": 0, "training": 0}
    assert len(seen) == 2 * 2 * len(layers)


def test_a_layer_that_compiles_again_after_its_first_call_is_an_error():
    """A guard that fails on every call (a Python number the forward reads, changed between
    calls): dynamo would recompile inside a timed call, and past its limit run eagerly."""
    graph = random_graph(nodes=19, relations=3, edges=53)
    layer, _ = compiled("rgat", graph)
    scale = {"value": 1.0}
    eager = layer.eager.forward
    layer.eager.forward = lambda x: eager(x) * scale["value"]
    x = torch.randn(19, 6)
    with torch.no_grad():
        layer(x)
        scale["value"] = 2.0
        with pytest.raises(CompileFailed, match=r"rgat dense, seed 0 compiled again in a later inference call"):
            layer(x)


def test_graph_breaks_are_counted_on_the_first_call_of_each_mode():
    graph = random_graph(nodes=19, relations=3, edges=53)
    layer, _ = compiled("hgt", graph)
    eager = layer.eager.forward

    def broken(x):
        out = eager(x)
        torch._dynamo.graph_break()
        return out * 1.0

    layer.eager.forward = broken
    x = torch.randn(19, 6)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), eager(x))
    layer(x)
    assert layer.graph_breaks == {"inference": 1, "training": 1}


def test_a_form_that_does_not_compile_is_refused_in_one_line():
    def failing(gm, inputs):
        raise RuntimeError("this backend compiles nothing\nsecond line")

    graph = random_graph(nodes=19, relations=3, edges=53)
    layer, _ = compiled("rgcn", graph, backend=failing)
    with pytest.raises(CompileFailed, match=r"^rgcn dense, seed 0 does not compile \(training\): .*compiles nothing$"):
        layer(torch.randn(19, 6))


# The part: every form's first call, the compiled forms' graph breaks, a form that does not compile.


def nations(**given) -> dict:
    return {
        "seed": 0,
        "graphs": ["nations"],
        "models": ["rgcn"],
        "dims": [8],
        "modes": ["inference", "training"],
        "cpu_materialize_limit_gib": 1,
        "breakdown_dims": [],
    } | given


def test_the_part_records_each_forms_first_call_and_the_compiled_forms_graph_breaks():
    def failing(gm, inputs):
        raise RuntimeError("no code today")

    forms = (
        CompiledForm("dense_traced", "peer", compiles="dense", backend="eager"),
        CompiledForm("dense_uncompilable", "peer", compiles="dense", backend=failing),
    )
    for form in forms:
        FORMS.register(form)
    try:
        keep = ("segment_mm", "dense", "dense_traced", "dense_uncompilable")
        params = nations(leave_out=[n for n in FORMS.names() if n not in keep])
        writer = ResultsWriter(SCHEMA, scale="tiny")
        notes = parts.knowledge_graphs(params, writer, repeat=1, warmup=0, device="cpu")
    finally:
        for form in forms:
            FORMS.unregister(form.name)
    rows = writer.rows
    first = {(r["model"], r["variant"], r["mode"]): r["value"] for r in rows if r["metric"] == "first_call_time"}
    timed = {(r["model"], r["variant"], r["mode"]) for r in rows if r["metric"] == "time"}
    assert set(first) == timed == {("rgcn", v, mode) for v in keep[:3] for mode in ("inference", "training")}
    assert all(seconds > 0 for seconds in first.values())
    assert all(r["unit"] == "s" for r in rows if r["metric"] == "first_call_time")
    breaks = {(r["model"], r["variant"], r["mode"]): r["value"] for r in rows if r["metric"] == "graph_breaks"}
    assert breaks == {("rgcn", "dense_traced", "inference"): 0, ("rgcn", "dense_traced", "training"): 0}
    refused = notes["skipped"]["rgcn dense_uncompilable on nations at 8"]
    assert refused.endswith("does not compile (inference): backend='failing' raised: no code today")


# The compiled forms as registered (inductor), against their eager forms: a compile takes 5 to
# 50 s on a CPU, so the full tier only.


@pytest.mark.full
@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("name", COMPILED)
def test_a_compiled_form_agrees_with_its_eager_form(layer, name):
    form = FORMS[name]
    if not form.supports(MODELS[layer]) or form.eager.missing("cpu") is not None:
        pytest.skip(f"{name} does not compute {layer} here")
    graph = random_graph(nodes=37, relations=5, edges=211)
    try:
        got = run(layer, name, graph, 6, 6)
    except CompileFailed as err:  # grouped_mm in float32: dynamo's check takes bfloat16 only
        assert name == "grouped_mm_compiled" and "does not compile" in str(err) and "\n" not in str(err)
        return
    assert_same(got, run(layer, form.compiles, graph, 6, 6), name)


@pytest.mark.gpu
@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("name", COMPILED)
def test_a_compiled_form_on_the_gpu_agrees_with_its_eager_form(layer, name):
    """As timed: inductor's GPU kernels, TF32 off; the first calls compile, the later ones must not."""
    form = FORMS[name]
    if not form.supports(MODELS[layer]):
        pytest.skip(f"{name} does not compute {layer}")
    torch.backends.cuda.matmul.allow_tf32 = False
    graph = random_graph(nodes=301, relations=7, edges=4001, types=3)
    graph = RelGraph.build(
        graph.src, graph.dst, graph.etype, graph.num_nodes, graph.num_relations, device="cuda",
        node_type=graph.node_type, num_node_types=graph.num_node_types,
    )  # fmt: skip
    try:
        got = run(layer, name, graph, 24, 24, device="cuda")
    except CompileFailed as err:  # grouped_mm in float32: dynamo's check takes bfloat16 only
        assert name == "grouped_mm_compiled" and "\n" not in str(err), str(err)
        return
    assert_same(got, run(layer, form.compiles, graph, 24, 24, device="cuda"), name)
    weights = MODELS[layer].make_weights(graph, 24, 24).to("cuda")
    compiled = build(layer, name, weights, graph)
    x = torch.randn(graph.num_nodes, 24, device="cuda")
    for _ in range(3):  # a recompile or an eager fallback after the first calls raises
        with torch.no_grad():
            compiled(x)
        compiled(x).sum().backward()
    assert set(compiled.graph_breaks) == {"inference", "training"}


def test_a_compiled_form_refuses_a_graph_edited_in_place_after_it_was_built():
    """The eager layer's check returns early while dynamo traces: without one outside the compiled
    code, a compiled form kept computing with the old edges' norm and orders."""
    graph = random_graph(nodes=19, relations=3, edges=53)
    layer, _ = compiled("rgcn", graph)
    x = torch.randn(19, 6, generator=torch.Generator().manual_seed(2))
    layer(x)
    with torch.no_grad():
        graph.etype[0] = (graph.etype[0] + 1) % 3
    with pytest.raises(UserError, match="^the graph's etype changed in place after RelGraph.build"):
        layer(x)
