"""Hector's model language, IR, passes and reference backend: the programs compute what the
models' reference forms (systems/rgnn) compute (outputs and gradients), before and after every
pass, on real and awkward graphs; the printed IR after the passes is what Hector's optimizations
mean; bad programs and bad bindings are refused by name.

The cross-products of models, passes and graphs run whole in the full tier; the fast tier runs a
pairwise cover of them (:func:`pairwise`: every pair of values of any two parameters at least once)."""

import gc
import itertools

import pytest
import torch

from harness.errors import UserError
from systems.hector import autodiff, op, passes, reference
from systems.hector.lang import ModelError, model
from systems.relgraph.graph import RelGraph
from systems.rgnn.forms import FORMS
from systems.rgnn.forms.hector import HectorForm
from systems.rgnn.models import MODELS
from systems.rgnn.models.rgat import rgat_layer
from systems.rgnn.models.rgcn import RGCNWeights, rgcn_layer
from workloads.graphs import knowledge

# The models that have a program, by name: every test of a model runs for each of them.
BASELINES = {m.name: m for m in MODELS if m.program is not None}
PASS_SETS = [(), ("reorder",), ("compact",), ("reorder", "compact")]


def pairwise(*axes, heavy=lambda case: False) -> list:
    """pytest params for the product of ``axes``: the fewest cases (picked greedily) that hold
    every pair of values of any two axes stay in the fast tier, every other case is marked
    ``full``. ``heavy`` cases (on a large graph) are left to the full tier, and the pairs are
    those of the other cases."""
    cases = list(itertools.product(*axes))

    def pairs(case):
        return {(i, repr(a), j, repr(b)) for (i, a), (j, b) in itertools.combinations(enumerate(case), 2)}

    light = [k for k, case in enumerate(cases) if not heavy(case)]
    missing, fast = set().union(*(pairs(cases[k]) for k in light)), set()
    while missing:
        best = max(light, key=lambda k: len(pairs(cases[k]) & missing))
        fast.add(best)
        missing -= pairs(cases[best])
    return [
        pytest.param(*case, marks=() if k in fast else pytest.mark.full, id="-".join(map(_case_id, case)))
        for k, case in enumerate(cases)
    ]


def _case_id(value) -> str:
    if isinstance(value, tuple):  # a pass set
        return "+".join(value) or "none"
    return {True: "backward", False: "forward"}.get(value, str(value)) if isinstance(value, bool) else str(value)


def typed_graph(src, dst, etype, nodes, relations, types=3, seed=0):
    node_type = torch.randint(0, types, (nodes,), generator=torch.Generator().manual_seed(seed))
    return RelGraph.build(src, dst, etype, nodes, relations, node_type=node_type, num_node_types=types)


def awkward_graph(seed=0):
    """Odd sizes, a relation with no edges, isolated nodes, duplicate edges."""
    g = torch.Generator().manual_seed(seed)
    nodes, relations, edges = 41, 6, 257
    src, dst = torch.randint(0, nodes - 5, (2, edges), generator=g)  # the last 5 nodes: isolated
    etype = torch.randint(0, relations - 1, (edges,), generator=g)  # the last relation: no edges
    src, dst, etype = (torch.cat([t, t[:20]]) for t in (src, dst, etype))  # 20 duplicate edges
    return typed_graph(src, dst, etype, nodes, relations, seed=seed)


def knowledge_graph(name="kinships"):
    spec, arrays = knowledge.load(name)
    g = RelGraph.from_store(arrays, len(spec.relations))
    return typed_graph(g.src, g.dst, g.etype, g.num_nodes, g.num_relations)


def single_relation_graph():
    g = torch.Generator().manual_seed(3)
    src, dst = torch.randint(0, 30, (2, 90), generator=g)
    return typed_graph(src, dst, torch.zeros(90, dtype=torch.long), 30, 1)


def edgeless_graph():
    return typed_graph(
        torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 9, 3
    )


GRAPHS = {
    "awkward": awkward_graph,
    "kinships": knowledge_graph,
    "one_relation": single_relation_graph,
    "no_edges": edgeless_graph,
}


def outputs_and_gradients(run, weights, x, projection):
    out = run(x)
    (out * projection).sum().backward()
    grads = {"x": x.grad.clone()} | {n: p.grad.clone() for n, p in weights.named_parameters() if p.grad is not None}
    return out.detach(), grads


def reference_form(name, weights, graph):
    """The model's reference form (``segment_mm``), which every other form is checked against."""
    m = BASELINES[name]
    return FORMS[m.reference].build(m, weights, graph)


def make_weights(name, relations, width, seed=0):
    return BASELINES[name].weights(relations, width, width, seed=seed, num_node_types=3)


@pytest.mark.parametrize("name, applied, graph_name", pairwise(BASELINES, PASS_SETS, GRAPHS))
def test_programs_match_the_baseline_forms_before_and_after_the_passes(name, applied, graph_name):
    graph = GRAPHS[graph_name]()
    width = 12
    g = torch.Generator().manual_seed(7)
    m = BASELINES[name]
    program = passes.optimize(m.program(), *applied)
    results = []
    for runner in ("baseline", "hector"):
        weights = make_weights(name, graph.num_relations, width, seed=1)
        x = torch.randn(graph.num_nodes, width, generator=torch.Generator().manual_seed(2)).requires_grad_()
        if runner == "baseline":
            run = reference_form(name, weights, graph)
        else:
            run = lambda x, w=weights: reference.run(program, graph, {"x": x} | m.bind(w))[0]  # noqa: E731
        results.append(outputs_and_gradients(run, weights, x, torch.randn(graph.num_nodes, width, generator=g)))
        g = torch.Generator().manual_seed(7)  # the same projection for both
    (base_out, base_grads), (out, grads) = results
    torch.testing.assert_close(out, base_out, rtol=1e-5, atol=1e-5)
    assert base_out.abs().sum() > 0 and set(grads) == set(base_grads)
    for key in base_grads:
        torch.testing.assert_close(grads[key], base_grads[key], rtol=1e-4, atol=1e-5, msg=key)


RGAT_OPTIMIZED = """\
program rgat_layer
  %0 = weight bias() : weight[out]
  %1 = broadcast(%0) : node[out]
  %2 = input x() : node[in]
  %3 = gather[end=dst](%2) : edge[in] {dst}
  %4 = weight W() : weight[in,out] per relation
  %5 = weight q() : weight[out,1]
  %6 = weight_product(%4, %5) : weight[in,1] per relation
  %7 = typed_matmul[by=etype](%3, %6) : edge[1] {dst,etype}
  %8 = gather[end=src](%2) : pair[in] {src}
  %9 = weight k() : weight[out,1]
  %10 = weight_product(%4, %9) : weight[in,1] per relation
  %11 = typed_matmul[by=etype](%8, %10) : pair[1] {src,etype}
  %12 = unpair(%11) : edge[1] {src,etype}
  %13 = add(%7, %12) : edge[1] {dst,src,etype}
  %14 = leaky_relu[slope=0.2](%13) : edge[1] {src,dst,etype}
  %15 = edge_softmax(%14) : edge[1] {src,dst,etype}
  %16 = typed_matmul[by=etype](%8, %4) : pair[out] {src,etype}
  %17 = unpair(%16) : edge[out] {src,etype}
  %18 = mul(%15, %17) : edge[out] {src,dst,etype}
  %19 = sum_into_dst(%18) : node[out]
  %20 = add(%1, %19) : node[out]
  return %20"""


def test_rgat_after_both_passes_is_hectors_optimized_rgat():
    """Golden IR: the attention vectors folded into the relation weights once per relation (no
    per-edge [in, out] transform of the target), and the source transform once per (source,
    relation) pair, read per edge."""
    printed = str(passes.optimize(rgat_layer(), "reorder", "compact"))
    assert printed.replace("{dst,src,etype}", "{src,dst,etype}") == RGAT_OPTIMIZED.replace(
        "{dst,src,etype}", "{src,dst,etype}"
    )


def test_passes_move_work_where_hector_says():
    def ops(program):
        return [(v.op, v.domain, v.width) for v in program.values]

    plain, compact = rgcn_layer(), passes.optimize(rgcn_layer(), "compact")
    assert ("typed_matmul", "edge", "out") in ops(plain) and ("typed_matmul", "pair", "out") in ops(compact)
    hgt_compact = ops(passes.optimize(MODELS["hgt"].program(), "compact"))
    assert hgt_compact.count(("typed_matmul", "pair", "out")) == 2  # keys and values per pair
    # Reordering leaves no per-edge [in, out] product on RGAT's target side.
    reordered = passes.optimize(rgat_layer(), "reorder")
    edge_products = [v for v in reordered.values if v.op == "typed_matmul" and v.attr("by") == "etype"]
    assert sorted(str(v.width) for v in edge_products) == ["1", "1", "out"]


@model
def relational_gatv2(m):
    """A relation-typed GATv2 (not in the paper): the score is a per-relation vector against the
    nonlinearity of both ends' transforms."""
    x = m.input("x", "in")
    Ws, Wd = (m.weight(n, ("in", "out"), per="relation") for n in ("Ws", "Wd"))
    source = m.src(x) @ Ws[m.relation]
    hidden = m.leaky_relu(source + m.dst(x) @ Wd[m.relation], 0.2)
    score = m.dot(hidden, m.each_edge(m.weight("a", ("out",), per="relation")[m.relation]))
    return m.sum_into_dst(m.edge_softmax(score) * source)


def test_a_new_model_runs_with_no_new_kernel_and_matches_its_definition():
    graph = awkward_graph(seed=4)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(graph.num_nodes, 5, generator=g, dtype=torch.float64)
    tensors = {
        "x": x,
        "Ws": torch.randn(graph.num_relations, 5, 7, generator=g, dtype=torch.float64),
        "Wd": torch.randn(graph.num_relations, 5, 7, generator=g, dtype=torch.float64),
        "a": torch.randn(graph.num_relations, 7, generator=g, dtype=torch.float64),
    }
    expected = torch.zeros(graph.num_nodes, 7, dtype=torch.float64)
    for v in range(graph.num_nodes):  # the definition, target by target
        edges = torch.nonzero(graph.dst == v).flatten()
        if len(edges):
            r, u = graph.etype[edges], graph.src[edges]
            source = torch.einsum("ei,eio->eo", x[u], tensors["Ws"][r])
            hidden = torch.nn.functional.leaky_relu(source + torch.einsum("i,eio->eo", x[v], tensors["Wd"][r]), 0.2)
            expected[v] = ((hidden * tensors["a"][r]).sum(1).softmax(0).unsqueeze(1) * source).sum(0)
    for applied in PASS_SETS:
        (out,) = reference.run(passes.optimize(relational_gatv2(), *applied), graph, tensors)
        torch.testing.assert_close(out, expected, msg=str(applied))


def test_bad_programs_are_refused_by_name():
    def trace(body):
        return model(body)()

    with pytest.raises(ModelError, match="@ of width in by weight W of shape"):
        trace(
            lambda m: m.sum_into_dst(
                m.src(m.input("x", "in")) @ m.weight("W", ("out", "out"), per="relation")[m.relation]
            )
        )
    with pytest.raises(ModelError, match="add of a node value and an edge value"):
        trace(lambda m: m.input("x", "in") + m.src(m.input("y", "in")))
    with pytest.raises(ModelError, match="weight W is per relation, not per node_type"):
        trace(lambda m: m.input("x", "in") @ m.weight("W", ("in", "in"), per="relation")[m.node_type])
    with pytest.raises(ModelError, match="must return node values"):
        trace(lambda m: m.src(m.input("x", "in")))
    with pytest.raises(ModelError, match="the name 'x' is used twice"):
        trace(lambda m: m.input("x", "in") + m.input("x", "in"))
    with pytest.raises(ModelError, match="no graph data 'weight'"):
        trace(lambda m: m.graph_data("weight"))
    with pytest.raises(ModelError, match="leaky_relu's slope must be a finite float32 number, got float inf"):
        trace(lambda m: m.leaky_relu(m.input("x", "in"), float("inf")))
    with pytest.raises(ModelError, match="leaky_relu's slope must be a finite float32 number, got float 1e"):
        trace(lambda m: m.leaky_relu(m.input("x", "in"), 1e300))  # inf in the kernels' float32
    assert issubclass(ModelError, UserError)


def test_bad_bindings_are_refused_by_name():
    graph = awkward_graph()
    weights = RGCNWeights(graph.num_relations, 4, 6)
    program = rgcn_layer()
    bound = MODELS["rgcn"].bind(weights)
    x = torch.randn(graph.num_nodes, 4)
    with pytest.raises(reference.BindingError, match="no tensor named 'x'"):
        reference.run(program, graph, bound)
    with pytest.raises(reference.BindingError, match=r"input x: \[41 nodes, width\] wanted"):
        reference.run(program, graph, bound | {"x": x[:-1]})
    with pytest.raises(
        reference.BindingError, match=r"^input x: \[41 nodes, 4\] wanted \(width 'in' is 4 in \w+\), got \(41, 5\)$"
    ):
        reference.run(program, graph, bound | {"x": torch.randn(graph.num_nodes, 5)})
    with pytest.raises(reference.BindingError, match="weight W: 6 relations x"):
        reference.run(program, graph, bound | {"x": x, "W": weights.weight[:-1]})


@pytest.mark.parametrize("name, applied, graph_name", pairwise([*BASELINES, "relational_gatv2"], PASS_SETS, GRAPHS))
def test_the_ir_backward_pass_matches_autograd(name, applied, graph_name):
    """differentiate()'s program, run by the reference backend, gives every input's and weight's
    gradient as torch's autograd does through the forward program."""
    graph = GRAPHS[graph_name]()
    g = torch.Generator().manual_seed(11)
    if name == "relational_gatv2":
        program = passes.optimize(relational_gatv2(), *applied)
        tensors = {
            "x": torch.randn(graph.num_nodes, 6, generator=g),
            "Ws": torch.randn(graph.num_relations, 6, 5, generator=g),
            "Wd": torch.randn(graph.num_relations, 6, 5, generator=g),
            "a": torch.randn(graph.num_relations, 5, generator=g),
        }
        tensors = {k: v.requires_grad_() for k, v in tensors.items()}
    else:
        program = passes.optimize(BASELINES[name].program(), *applied)
        bound = BASELINES[name].bind(make_weights(name, graph.num_relations, 6, seed=3))
        tensors = {"x": torch.randn(graph.num_nodes, 6, generator=g, requires_grad=True)} | bound
    (out,) = reference.run(program, graph, tensors)
    seed = torch.randn(out.shape, generator=g)
    leaves = autodiff.leaves(program)
    expected = torch.autograd.grad(out, [tensors[leaf.name] for leaf in leaves], seed)
    plain = {k: v.detach() for k, v in tensors.items()}
    got = reference.run(autodiff.differentiate(program), graph, plain | {"grad:0": seed})
    torch.testing.assert_close(got[0], out.detach())
    for leaf, want, have in zip(leaves, expected, got[1:], strict=True):
        assert want.abs().sum() > 0 or graph.edges == 0, leaf.name  # with edges, a zero gradient is a bug
        # Two float32 sums of the same terms in another order differ by rounding that grows with the
        # terms' size (unit-normal weights make large ones): the tolerance scales with the largest.
        scale = max(1.0, want.abs().max().item())
        torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-5 * scale, msg=leaf.name)


@pytest.mark.parametrize("name", BASELINES)
def test_a_layer_is_a_differentiable_operator_that_passes_opcheck(name):
    """The program and its IR backward as torch.library ops: outputs and gradients as the
    baseline form's, and torch's operator checks (schema, fake tensors, autograd registration)."""
    graph = awkward_graph(seed=2)
    m = BASELINES[name]
    layer = op.Layer(passes.optimize(m.program(), "reorder", "compact"))
    results = []
    for runner in ("baseline", "layer"):
        weights = make_weights(name, graph.num_relations, 6, seed=5)
        x = torch.randn(graph.num_nodes, 6, generator=torch.Generator().manual_seed(6), requires_grad=True)
        if runner == "baseline":
            run = reference_form(name, weights, graph)
        else:
            run = lambda x, w=weights: layer(graph, x=x, **m.bind(w))  # noqa: E731
        projection = torch.randn(graph.num_nodes, 6, generator=torch.Generator().manual_seed(8))
        results.append(outputs_and_gradients(run, weights, x, projection))
    (base_out, base_grads), (out, grads) = results
    torch.testing.assert_close(out, base_out, rtol=1e-5, atol=1e-5)
    for key in base_grads:
        torch.testing.assert_close(grads[key], base_grads[key], rtol=1e-4, atol=1e-5, msg=key)
    tensors = {"x": torch.randn(graph.num_nodes, 6)} | m.bind(make_weights(name, graph.num_relations, 6))
    leaves = [tensors[n].detach().requires_grad_() for n in layer.names]
    torch.library.opcheck(layer.forward_op, (op.register_graph(graph), leaves))


def test_a_layer_called_wrongly_says_how():
    graph = awkward_graph()
    layer = op.Layer(rgcn_layer())
    weights = MODELS["rgcn"].bind(RGCNWeights(graph.num_relations, 4, 4))
    with pytest.raises(
        UserError,
        match=r"rgcn_layer takes x, root, bias, W; missing x; it does not read y \(misspelled, or declared but",
    ):
        layer(graph, y=torch.randn(graph.num_nodes, 4), **weights)
    with pytest.raises(UserError, match="graph handle 12345 is not registered"):
        layer.forward_op(12345, [torch.randn(graph.num_nodes, 4), *weights.values()])


def test_the_op_and_its_index_cache_do_not_keep_graphs_alive():
    import gc
    import weakref

    from systems.hector import lower

    graph = awkward_graph()
    layer = op.Layer(rgcn_layer())
    weights = MODELS["rgcn"].bind(RGCNWeights(graph.num_relations, 4, 4))
    layer(graph, x=torch.randn(graph.num_nodes, 4), **weights)
    lower.GraphIndex.of(graph)["pair_src"]
    gone = weakref.ref(graph)
    del graph
    gc.collect()
    assert gone() is None


def test_the_command_line_shows_the_ir_after_each_pass_and_the_plan(capsys):
    from systems.hector.__main__ import main

    main(["rgat", "--passes", "reorder,compact", "--backward"])
    shown = capsys.readouterr().out
    for heading in ("program rgat_layer", "# after reorder", "# after compact", "# with its backward", "# plan"):
        assert heading in shown
    assert "weight_product" in shown and "scattermap" in shown and "typed_outer" in shown
    with pytest.raises(SystemExit):
        main(["rgat", "--passes", "bogus"])
    assert "unknown pass 'bogus'; passes: reorder, compact" in capsys.readouterr().err


@pytest.mark.parametrize("name", BASELINES)
def test_a_layer_takes_features_as_strided_offset_and_expanded_views(name):
    graph = awkward_graph(seed=6)
    layer = op.Layer(passes.optimize(BASELINES[name].program(), "reorder", "compact"))
    weights = BASELINES[name].bind(make_weights(name, graph.num_relations, 6))
    g = torch.Generator().manual_seed(2)
    views = {
        "strided": torch.randn(graph.num_nodes, 12, generator=g)[:, ::2],
        "offset": torch.randn(graph.num_nodes + 7, 6, generator=g)[7:],
        "expanded": torch.randn(1, 6, generator=g).expand(graph.num_nodes, 6),
    }
    for kind, x in views.items():
        assert not x.is_contiguous() or kind == "offset"
        torch.testing.assert_close(layer(graph, x=x, **weights), layer(graph, x=x.contiguous(), **weights), msg=kind)


COPIES = 8  # of each pattern in one model: more places where a freed value's id can be taken


def _compact_case(which: str):
    """A model whose compacted chains feed operators compact leaves per edge (tanh, a target's
    rows), its pattern repeated on scaled inputs, with its float64 definition:
    (model, definition(graph, x, W, W2))."""
    patterns = {  # (model's pattern of (m, x, W, W2), plain pattern of (x, h1, h2, dst)), h = src(x) @ W[r]
        # a depends on (source, relation) only, so it is compacted; tanh is not, and b reads it
        "tanh_beside_a_compacted_chain": (
            lambda m, h1, h2, xd: m.sum_into_dst(h1 - h1 * 2.0) + m.sum_into_dst(m.tanh(h1) * 3.0),
            lambda h1, h2, xd, into: into(h1 - 2 * h1) + into(3 * torch.tanh(h1)),
        ),
        "two_products_and_a_tanh": (
            lambda m, h1, h2, xd: m.sum_into_dst(h1 * h2 - h1) + m.sum_into_dst(m.tanh(h2) * h1) * 0.5,
            lambda h1, h2, xd, into: into(h1 * h2 - h1) + 0.5 * into(torch.tanh(h2) * h1),
        ),
        "a_target_side_user": (
            lambda m, h1, h2, xd: m.sum_into_dst(m.exp(h1 * 0.1) - h1) + m.sum_into_dst(m.sigmoid(m.tanh(h1)) * xd),
            lambda h1, h2, xd, into: into(torch.exp(0.1 * h1) - h1) + into(torch.sigmoid(torch.tanh(h1)) * xd),
        ),
    }
    traced, plain = patterns[which]

    @model
    def layer(m):
        x = m.input("x", "in")
        W, W2 = (m.weight(name, ("in", "in"), per="relation") for name in ("W", "W2"))
        total = None
        for i in range(COPIES):
            scale = 1.0 + i / 4
            h1, h2 = (m.src(x) @ w[m.relation] * scale for w in (W, W2))
            term = traced(m, h1, h2, m.dst(x))
            total = term if total is None else total + term
        return total

    def definition(graph, x, W, W2):
        def into(rows):
            return rows.new_zeros(graph.num_nodes, rows.shape[1]).index_add(0, graph.dst, rows)

        total = 0
        for i in range(COPIES):
            scale = 1.0 + i / 4
            h1, h2 = (torch.einsum("ei,eio->eo", x[graph.src], w[graph.etype]) * scale for w in (W, W2))
            total = total + plain(h1, h2, x[graph.dst], into)
        return total

    return layer, definition


@pytest.mark.parametrize("which", ["tanh_beside_a_compacted_chain", "two_products_and_a_tanh", "a_target_side_user"])
def test_compact_gives_the_same_program_and_numbers_on_every_trace(which):
    """The pass's bookkeeping must not depend on where Python places freed objects: a value it
    builds and then replaces is freed at once, and a later value may land at its address. Each of
    300 traces (with collections between them) must give one program, and the definition's numbers."""
    layer, definition = _compact_case(which)
    graph = RelGraph.build([0, 1, 2, 0, 3, 3, 1], [1, 2, 0, 3, 0, 1, 1], [0, 1, 0, 1, 1, 0, 1], 4, 2)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 3, generator=g, dtype=torch.float64) * 0.3
    W, W2 = (torch.randn(2, 3, 3, generator=g, dtype=torch.float64) for _ in range(2))
    expected = definition(graph, x, W, W2)
    texts = set()
    for trace in range(300):
        if trace % 20 == 0:
            gc.collect()
        program = passes.optimize(layer(), "compact")
        text = str(program)
        if text not in texts:  # a new program: check its numbers (each distinct text once)
            texts.add(text)
            assert text.count(" = tanh(") == COPIES and "unpair" in text, text
            (out,) = reference.run(program, graph, {"x": x, "W": W, "W2": W2})
            torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12, msg=text)
    assert len(texts) == 1, "\n\n".join(texts)


def test_an_unknown_pass_is_refused_in_one_line_naming_the_passes():
    with pytest.raises(UserError, match=r"^no pass 'compat'; the passes are reorder, compact$"):
        passes.optimize(rgcn_layer(), "compat")
    with pytest.raises(UserError, match=r"^no pass 'typo'; the passes are reorder, compact$"):
        HectorForm("hector_typo", "optimized", passes=("typo",))
