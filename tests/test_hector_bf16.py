"""Hector on bfloat16 tensors: every model's plan, forward and backward, stores bf16 rows and
computes in float32 (bf16 tensor-core products, float32 traversal arithmetic, float32 sums into
targets and weight gradients), and gives the float64 reference's results on the same bf16 values
within the suite's bf16 tolerance (systems/rgnn/forms TOLERANCE), in bf16. On a CPU the launches
run on the literal kernel model (tests/hector_kernel_model.py), which also checks that every
pointer has the element type its kernel declares (bf16 rows, float32 sums); on a GPU the
generated kernels run. The op refuses tensors of mixed types in one line naming them."""

import pytest
import torch
from test_hector_codegen import NAMES, RelGraph_on, program_and_tensors, replays_of
from test_hector_ir import BASELINES, GRAPHS, awkward_graph, typed_graph

from harness.errors import UserError
from systems.hector import autodiff, codegen, cuda_graphs, lower, op, passes, reference
from systems.rgnn.forms import FORMS, TOLERANCE
from systems.rgnn.models import MODELS

TOL = TOLERANCE["bfloat16"]
BEST = ("reorder", "compact")
SMALL_GRAPHS = ("awkward", "one_relation", "no_edges")  # the kernel model runs every thread in Python


def close_at_bf16(have: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """As the suite checks a bf16 form against float arithmetic on the same rounded values:
    norm-wise, ||have - want|| / ||want|| within TOL (an attention weight, the exp of a score
    rounded to bf16, may move by several percent of the largest output; a wrong result moves the
    whole norm)."""
    assert have.dtype == torch.bfloat16, f"{what}: {have.dtype}"
    assert have.shape == want.shape, f"{what}: {tuple(have.shape)} for {tuple(want.shape)}"
    if not want.numel() or not want.abs().max():
        assert not have.abs().max() if have.numel() else True, f"{what}: nonzero where the reference is all zeros"
        return
    have, want = have.detach().cpu().double(), want.detach().cpu().double()
    error = float((have - want).norm() / want.norm())
    assert error <= TOL, f"{what}: off by {error:.3g} norm-wise"


def bf16_case(name, applied, backward, graph, width):
    """A program, its tensors in bf16, and the float64 reference's results on those values."""
    program, tensors = program_and_tensors(name, applied, backward, graph, width=width)
    narrow = {k: v.bfloat16() for k, v in tensors.items()}
    want = reference.run(program, graph, {k: v.double() for k, v in narrow.items()})
    return program, narrow, want


def check_run(program, graph, tensors, want, on=None) -> list[torch.Tensor]:
    on = on if on is not None else graph
    moved = {k: v.to(on.src.device) for k, v in tensors.items()}
    got = codegen.run(lower.lower(program), on, moved, reference.bind_widths(program, graph, tensors))
    assert len(got) == len(want)
    for k, (have, expected) in enumerate(zip(got, want, strict=True)):
        close_at_bf16(have, expected, f"{program.name} result {k}")
    return got


def cpu_model_cases():
    """Rows of 9 (entry by entry), and of 64 as the GPU's fast tier runs every model's backward."""
    fast = {(name, BEST, True, "awkward", width) for name in NAMES for width in (9, 64)}
    fast |= {("rgat", (), True, "no_edges", 9), ("hgt", (), False, "one_relation", 9)}
    fast |= {("compgcn", (), True, "one_relation", 9)}
    for name in NAMES:
        for applied in ((), BEST):
            for backward in (False, True):
                for graph_name in SMALL_GRAPHS:
                    for width in (9, 64):
                        case = (name, applied, backward, graph_name, width)
                        yield case if case in fast else pytest.param(*case, marks=pytest.mark.full)


@pytest.mark.parametrize("name, applied, backward, graph_name, width", list(cpu_model_cases()))
def test_a_bf16_plan_computes_the_reference_on_a_cpu_model_of_the_kernels(
    name, applied, backward, graph_name, width, monkeypatch
):
    from hector_kernel_model import install

    model = install(monkeypatch)
    graph = GRAPHS[graph_name]()
    program, tensors, want = bf16_case(name, applied, backward, graph, width=width)
    check_run(program, graph, tensors, want)
    assert not model.problems, model.problems[:3]


def stored_in_bf16(program, graph, tensors, monkeypatch) -> list[torch.Tensor]:
    """The float64 reference with every value it computes rounded to bf16: what storing each row
    in bf16 costs, whatever the kernels (the plan keeps some sums in float32, so it is an
    estimate, not the plan's exact arithmetic)."""
    exact = reference._evaluate

    def rounded(value, args, *rest):
        result = exact(value, args, *rest)
        return result.bfloat16().double() if result.is_floating_point() else result

    with monkeypatch.context() as patched:
        patched.setattr(reference, "_evaluate", rounded)
        return reference.run(program, graph, {k: v.double() for k, v in tensors.items()})


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_an_ill_conditioned_bf16_plan_errs_as_storing_its_rows_in_bf16_does(device, monkeypatch):
    """GATv2 with standard-normal weights, not scaled by 1 / sqrt(fan-in) (scores of some 25,
    softmax weights near 0 or 1): the bf16 rounding of a stored score moves its softmax weight, and the gradients,
    by several times the tolerance, in any bf16 implementation. Against the reference that rounds
    every value it computes to bf16 (the bf16 GEMMs at rows of 5: entry by entry, the weight
    transposed for the data gradient) the results are within tolerance: a kernel's fault would
    not be."""
    if device == "cpu":
        from hector_kernel_model import install

        model = install(monkeypatch)
    graph = awkward_graph()
    program, tensors = program_and_tensors("relational_gatv2", BEST, True, graph, width=64)
    tensors |= {"Ws": tensors["Ws"] * 64**0.5, "Wd": tensors["Wd"] * 64**0.5, "a": tensors["a"] * 5**0.5}
    narrow = {k: v.bfloat16() for k, v in tensors.items()}
    exact = reference.run(program, graph, {k: v.double() for k, v in narrow.items()})
    with pytest.raises(AssertionError, match="off by"):  # the case is as ill-conditioned as said
        check_run(program, graph, narrow, exact, on=RelGraph_on(graph, device) if device == "cuda" else graph)
    check_run(program, graph, narrow, stored_in_bf16(program, graph, narrow, monkeypatch),
              on=RelGraph_on(graph, device) if device == "cuda" else graph)  # fmt: skip
    if device == "cpu":
        assert not model.problems, model.problems[:3]


def test_a_bf16_plan_is_replayed_and_its_pieces_move_16_bytes_at_a_time_on_a_cpu_model(monkeypatch):
    """Rows of 64 bf16s (the GEMM's 16-byte pieces), two calls: the second replays the first's
    launches, with its roundings, on new tensors; a float32 call of the same plan is its own."""
    from hector_kernel_model import install

    model = install(monkeypatch)
    graph = awkward_graph(seed=3)
    program, tensors, want = bf16_case("rgat", BEST, True, graph, width=64)
    plan = lower.lower(program)
    widths = reference.bind_widths(program, graph, tensors)
    first = codegen.run(plan, graph, tensors, widths)
    again = {k: (v.float() * 0.5).bfloat16() for k, v in tensors.items()}
    second = codegen.run(plan, graph, again, widths)
    assert not model.problems, model.problems[:3]
    assert len(replays_of(plan, graph)) == 1
    for k, (have, expected) in enumerate(zip(first, want, strict=True)):
        close_at_bf16(have, expected, f"result {k} of the recorded call")
    halved = reference.run(program, graph, {k: v.double() for k, v in again.items()})
    for k, (have, expected) in enumerate(zip(second, halved, strict=True)):
        close_at_bf16(have, expected, f"result {k} of the replayed call")
    recorded = replays_of(plan, graph)[0].steps
    assert any(getattr(r, "rounded", None) == torch.bfloat16 for r in recorded)  # sums a kernel reads
    assert any(getattr(r, "shared", 0) > 0 for r in recorded)  # the bf16 GEMM's stages
    codegen.run(plan, graph, {k: v.float() for k, v in tensors.items()}, widths)
    assert len(replays_of(plan, graph)) == 2


def test_codegen_refuses_tensors_of_two_types(monkeypatch):
    from hector_kernel_model import install

    install(monkeypatch)
    graph = awkward_graph()
    program, tensors, _ = bf16_case("rgcn", BEST, False, graph, width=9)
    tensors["x"] = tensors["x"].float()
    with pytest.raises(ValueError, match=r"\(float32 or bfloat16, as every tensor\) on cpu wanted, got torch\.b"):
        codegen.run(lower.lower(program), graph, tensors, reference.bind_widths(program, graph, tensors))


def bf16_layer(name, graph, width=9, tensor_cores=False):
    layer = op.Layer(passes.optimize(BASELINES[name].program(), *BEST), tensor_cores=tensor_cores)
    _, tensors = program_and_tensors(name, BEST, False, graph, width=width)
    return layer, {k: v.bfloat16() for k, v in tensors.items()}


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_the_op_on_bf16_tensors_on_a_cpu_computes_the_reference_in_float32_and_returns_bf16(name):
    graph = awkward_graph(seed=1)
    layer, tensors = bf16_layer(name, graph)
    leaves = {k: v.clone().requires_grad_() for k, v in tensors.items()}
    out = layer(graph, **leaves)
    program = passes.optimize(BASELINES[name].program(), *BEST)
    wide = {k: v.float() for k, v in tensors.items()}
    assert torch.equal(out, reference.run(program, graph, wide)[0].bfloat16())  # float32 arithmetic, rounded once
    projection = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).bfloat16()
    (out * projection).sum().backward()
    backward = autodiff.differentiate(program)
    want = reference.run(backward, graph, {k: v.double() for k, v in tensors.items()} | {"grad:0": projection.double()})
    for k, n in enumerate(layer.names):
        close_at_bf16(leaves[n].grad, want[1 + k], f"{name} gradient of {n}")
    with torch.no_grad():
        assert layer(graph, **tensors).dtype == torch.bfloat16


def test_tensors_of_two_types_are_refused_in_one_line_naming_them():
    graph = awkward_graph(seed=1)
    layer, tensors = bf16_layer("rgat", graph)
    with pytest.raises(UserError, match=r"one type .* got x float32; .*W.* bfloat16$") as refused:
        layer(graph, **(tensors | {"x": tensors["x"].float()}))
    assert "\n" not in str(refused.value)
    with pytest.raises(UserError, match="the TF32 variant multiplies float32 tensors"):
        bf16_layer("rgat", graph, tensor_cores=True)[0](graph, **tensors)
    half = {k: v.half() for k, v in tensors.items()}
    with pytest.raises(UserError, match="the generated kernels take float32 or bfloat16 tensors, got float16"):
        op.element_type(half)
    assert op.element_type(half, generated=False) == torch.float16  # the reference takes it
    assert op.element_type({}) == torch.float32


def test_the_ops_fake_results_have_the_tensors_type():
    """What tracing (torch.compile) sees: the forward's output and saved values, and the
    backward's gradients, in the inputs' type."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    graph = awkward_graph(seed=1)
    layer, tensors = bf16_layer("hgt", graph)
    handle = op.register_graph(graph)
    given = [tensors[n] for n in layer.names]
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = [mode.from_tensor(t) for t in given]
        results = layer.forward_op(handle, fake)
        grads = layer.backward_op(handle, fake, mode.from_tensor(results[0].new_zeros(results[0].shape)), results[1:])
    assert {t.dtype for t in [*results, *grads]} == {torch.bfloat16}


def test_hectors_variants_take_bf16_but_the_tf32_one():
    for name in ("hector_unopt", "hector_compact", "hector_reorder", "hector_best"):
        assert FORMS[name].missing_element_type("bfloat16") is None
        assert FORMS[name].precision_on("bfloat16") == "bfloat16"
    assert "float32 tensors only" in FORMS["hector_best_tf32"].missing_element_type("bfloat16")


@pytest.mark.parametrize("model_name", ["rgcn", "compgcn"])
def test_a_hector_form_on_bf16_agrees_with_the_reference_form_in_float32(model_name):
    graph = awkward_graph(seed=4)
    model = MODELS[model_name]
    weights = model.make_weights(graph, 9, 9, seed=1).to(torch.bfloat16)
    x = torch.randn(graph.num_nodes, 9, generator=torch.Generator().manual_seed(5)).bfloat16()
    with torch.no_grad():
        out = FORMS["hector_best"].build(model, weights, graph)(x)
        want = FORMS[model.reference].build(model, weights.float(), graph)(x.float())
    close_at_bf16(out, want, f"{model_name} hector_best")


# On a GPU: the generated kernels. Fast tier: each model forward and backward at rows of 64 (the
# bf16 GEMM's 16-byte pieces) on the awkward graph and on no edges; the rest in the full tier.
def gpu_cases():
    for name in NAMES:
        for applied in ((), BEST):
            for graph_name in GRAPHS:
                for width in (9, 64):
                    case = (name, applied, graph_name, width)
                    fast = applied == BEST and width == 64 and graph_name in ("awkward", "no_edges")
                    yield case if fast else pytest.param(*case, marks=pytest.mark.full)


@pytest.mark.gpu
@pytest.mark.parametrize("name, applied, graph_name, width", list(gpu_cases()))
def test_bf16_generated_kernels_compute_the_reference(name, applied, graph_name, width):
    graph = GRAPHS[graph_name]()
    on_gpu = RelGraph_on(graph, "cuda")
    for backward in (False, True):
        program, tensors, want = bf16_case(name, applied, backward, graph, width)
        check_run(program, graph, tensors, want, on=on_gpu)


@pytest.mark.gpu
def test_a_sum_of_many_rows_into_one_node_adds_in_float32():
    """3001 edges into one node: once a bf16 partial sum is some 256 times a row's part, adding
    the part no longer moves it (half a bf16 step is 2**-9 of the sum); float32 sums reach the
    reference, forward and backward (the weight gradients sum the same rows)."""
    edges = 3001
    src = torch.arange(edges) % 50 + 1
    graph = typed_graph(src, torch.zeros(edges, dtype=torch.int64), torch.arange(edges) % 2, 51, 2, seed=0)
    program, tensors, want = bf16_case("rgcn", BEST, True, graph, width=64)
    check_run(program, graph, tensors, want, on=RelGraph_on(graph, "cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(BASELINES))
def test_the_op_on_bf16_tensors_on_the_gpu_matches_the_cpu_and_is_captured(name):
    """Through the op, four training calls (worked out, recorded, captured, replayed as a CUDA
    graph): each call's output and gradients close to the CPU op's, all bf16."""
    graph = awkward_graph(seed=5)
    on_gpu = RelGraph_on(graph, "cuda")
    layer, tensors = bf16_layer(name, graph, width=64)

    def call(g, device):
        leaves = {k: v.detach().to(device).requires_grad_() for k, v in tensors.items()}
        out = layer(g, **leaves)
        (out * torch.arange(out.numel(), device=device).reshape(out.shape).sin()).sum().backward()
        return [out.detach().cpu()] + [leaves[n].grad.cpu() for n in layer.names]

    want = call(graph, "cpu")
    for round_ in range(4):
        for k, (have, expected) in enumerate(zip(call(on_gpu, "cuda"), want, strict=True)):
            close_at_bf16(have, expected.float(), f"{name} call {round_} result {k}")
    if cuda_graphs.ENABLED:
        assert cuda_graphs.captured(on_gpu) >= 1
    with pytest.raises(UserError, match="got x float32"):
        layer(on_gpu, **{k: v.cuda() for k, v in tensors.items()} | {"x": tensors["x"].float().cuda()})
