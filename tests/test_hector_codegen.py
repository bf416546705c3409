"""Hector's lowering and CUDA code generation: every plan, run as its templates define it
(lower.emulate), gives what the reference backend gives, forward and backward; every generated
kernel instance compiles for sm_90 without a GPU; on a GPU the generated kernels give the
reference's outputs and gradients, through the torch.library op as well. The cross-products of
models, passes, directions and graphs run whole in the full tier, a pairwise cover of them in the
fast tier (test_hector_ir.pairwise)."""

import dataclasses
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from test_hector_ir import BASELINES, GRAPHS, PASS_SETS, awkward_graph, make_weights, pairwise, relational_gatv2

from systems.hector import autodiff, codegen, lower, op, passes, reference
from systems.relgraph.ops import segment_products
from systems.rgnn.models import MODELS as MODELS_BY_NAME
from systems.rgnn.models.hgt import hgt_layer
from systems.rgnn.models.rgat import rgat_layer
from systems.rgnn.models.rgcn import rgcn_layer


def close(have, want):
    """float32 sums in another order: within 1e-4 relative, or 1e-5 of the largest magnitude (a
    weight gradient sums thousands of edges, some to near zero)."""
    largest = float(want.abs().max()) if want.numel() else 0.0
    torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-5 * max(1.0, largest))


def close_bf16(have, want):
    """A bf16 result against the float32 products of the same bf16 inputs: each entry rounded once,
    by at most half a bf16 step (2**-9 to 2**-8 relative, by where it lies in its binade); the
    float32 sums' other order is in the absolute term."""
    assert have.dtype == torch.bfloat16, have.dtype
    largest = float(want.abs().max()) if want.numel() else 0.0
    torch.testing.assert_close(have.float(), want, rtol=2**-8, atol=1e-5 * max(1.0, largest))


NAMES = [*BASELINES, "relational_gatv2"]
DIRECTIONS = (False, True)  # the forward program alone, or forward and backward


def cases():
    for name in NAMES:
        for applied in PASS_SETS:
            for backward in DIRECTIONS:
                yield name, applied, backward


def program_and_tensors(name, applied, backward, graph, width=6, device="cpu"):
    g = torch.Generator().manual_seed(21)
    if name == "relational_gatv2":
        program = passes.optimize(relational_gatv2(), *applied)
        # Weights scaled by 1 / sqrt(fan-in), as an initialization scales them (the other models'
        # are Glorot's): unscaled, a score grows as the width, and at 64 scores of some 25 make
        # the bf16 rounding of one move its softmax weight, and the gradients, by several percent.
        tensors = {
            "x": torch.randn(graph.num_nodes, width, generator=g),
            "Ws": torch.randn(graph.num_relations, width, 5, generator=g) / width**0.5,
            "Wd": torch.randn(graph.num_relations, width, 5, generator=g) / width**0.5,
            "a": torch.randn(graph.num_relations, 5, generator=g) / 5**0.5,
        }
        out_width = 5
    else:
        program = passes.optimize(BASELINES[name].program(), *applied)
        weights = make_weights(name, graph.num_relations, width, seed=4)
        tensors = {"x": torch.randn(graph.num_nodes, width, generator=g)}
        tensors |= {k: v.detach() for k, v in BASELINES[name].bind(weights).items()}
        out_width = width
    if backward:
        program = autodiff.differentiate(program)
        tensors["grad:0"] = torch.randn(graph.num_nodes, out_width, generator=g)
    return program, {k: v.to(device) for k, v in tensors.items()}


@pytest.mark.parametrize(
    "name, applied, backward, graph_name, fusion", pairwise(NAMES, PASS_SETS, DIRECTIONS, GRAPHS, ("fused", "unfused"))
)
def test_every_plan_computes_what_the_reference_computes(name, applied, backward, graph_name, fusion):
    graph = GRAPHS[graph_name]()
    program, tensors = program_and_tensors(name, applied, backward, graph)
    expected = reference.run(program, graph, tensors)
    plan = lower.lower(program, fusion == "fused")
    got = lower.emulate(plan, graph, tensors, reference.bind_widths(program, graph, tensors))
    assert len(got) == len(expected)
    for have, want in zip(got, expected, strict=True):
        close(have, want)


@pytest.mark.parametrize("backward", DIRECTIONS)
def test_a_float64_emulation_keeps_its_constants_in_float64(backward):
    """HGT scales its scores by 1/sqrt(width), a constant of the plan: in a float64 emulation it must
    not be rounded to float32 (the emulation then agrees with the float64 reference to 1e-12, not
    1e-8 as with one float32 constant)."""
    graph = awkward_graph()
    program, tensors = program_and_tensors("hgt", ("reorder", "compact"), backward, graph, width=7)
    tensors = {name: t.double() for name, t in tensors.items()}
    expected = reference.run(program, graph, tensors)
    got = lower.emulate(lower.lower(program), graph, tensors, reference.bind_widths(program, graph, tensors))
    for have, want in zip(got, expected, strict=True):
        assert have.dtype == torch.float64
        torch.testing.assert_close(have, want, rtol=1e-12, atol=1e-12)


def test_gathers_are_read_in_place_not_copied():
    """The optimized RGAT's plan: the GEMMs read the sources through the pairs' index lists and
    nothing is copied just to gather it."""
    plan = lower.lower(passes.optimize(rgat_layer(), "reorder", "compact"))
    gemms = [s for s in plan.steps if isinstance(s, lower.Gemm)]
    assert [(s.out.domain, s.a.kind, s.a.index) for s in gemms] == [("pair", "indexed", "pair_src")]
    # The folded attention vectors, one column per relation: a dot of each row with its relation's.
    dots = [s for s in plan.steps if isinstance(s, lower.Dot)]
    assert [(s.out.domain, s.a.index, s.b.index) for s in dots] == [
        ("edge", "dst", "etype"),
        ("pair", "pair_src", "pair_etype"),
    ]
    assert not [s for s in plan.steps if isinstance(s, lower.Map) and s.expression == "copy"]
    # The attention-weighted sources are summed into their targets as they are computed: no
    # [edges, out] product is stored (nor RGCN's normalized messages, nor HGT's weighted values).
    for program in (plan.program, rgcn_layer(), hgt_layer()):
        steps = lower.lower(program).steps
        fused = [s for s in steps if isinstance(s, lower.ScatterMap)]
        assert [(s.expression, s.index) for s in fused] == [("mul", "dst")]
        assert not [s for s in steps if isinstance(s, lower.Scatter)]


def all_instances() -> dict[str, str]:
    found = {}
    for name, applied, backward in cases():
        program, _ = program_and_tensors(name, applied, backward, awkward_graph())
        found |= codegen.sources(program) | codegen.sources(program, bf16=True)
    shapes = codegen.GEMM_SHAPES + codegen.BF16_SHAPES
    return found | dict(codegen.segment_gemm_source(shape) for shape in shapes)


def representative_instances() -> dict[str, str]:
    """One instance of each entry point in each element type (the first by name), and the
    standalone GEMM template in each of its shapes at one tile size (the bf16 variant's at both of
    its, whose warps split the tile differently): every template's every macro variant, once."""
    found = {}
    for name, text in sorted(all_instances().items()):
        bf16 = re.search(r"^#define (OUTER_)?BF16 1$", text, re.M) is not None
        entry = re.sub(r"_[0-9a-f]{10}$", "", name).removesuffix("_bf16")  # by entry point: name_<hash>
        found.setdefault((entry, bf16), (name, text))
    shapes = [shape for shape in codegen.GEMM_SHAPES + codegen.BF16_SHAPES if shape.rows == 64 or shape.bf16]
    return dict(found.values()) | dict(codegen.segment_gemm_source(shape) for shape in shapes)


@pytest.mark.parametrize("scope", ["representative", pytest.param("every", marks=pytest.mark.full)])
def test_every_generated_kernel_compiles_for_sm90(tmp_path, scope):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        if os.environ.get("CI"):
            pytest.fail("nvcc is not on PATH; CI must compile every generated kernel")
        pytest.skip("nvcc is not on PATH")
    instances = all_instances() if scope == "every" else representative_instances()
    assert {"edge_softmax", "scatter_rows"} <= set(instances) and len(instances) > 10

    def compile_one(item):
        name, text = item
        source = tmp_path / f"{name}.cu"
        source.write_text(text)
        flags = ["-arch=sm_90", "--cubin", "-std=c++17", "-Werror", "all-warnings"]
        result = subprocess.run(
            [nvcc, *flags, "-o", str(tmp_path / f"{name}.cubin"), str(source)], capture_output=True, text=True
        )
        return name, result.returncode, result.stderr

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        failed = [(n, err) for n, code, err in pool.map(compile_one, instances.items()) if code != 0]
    assert not failed, failed[0]


@pytest.mark.gpu
@pytest.mark.parametrize("graph_name", GRAPHS)
@pytest.mark.parametrize("name, applied, backward", list(cases()))
def test_generated_kernels_compute_what_the_reference_computes(name, applied, backward, graph_name, width=6):
    torch.backends.cuda.matmul.allow_tf32 = False
    graph = GRAPHS[graph_name]()
    program, tensors = program_and_tensors(name, applied, backward, graph, width=width)
    expected = reference.run(program, graph, tensors)
    cuda_graph = RelGraph_on(graph, "cuda")
    cuda_tensors = {k: v.cuda() for k, v in tensors.items()}
    for out in cuda_tensors.values():
        assert out.is_cuda
    got = codegen.run(lower.lower(program), cuda_graph, cuda_tensors, reference.bind_widths(program, graph, tensors))
    for have, want in zip(got, expected, strict=True):
        close(have.cpu(), want)


@pytest.mark.gpu
@pytest.mark.parametrize("name, applied, backward", list(cases()))
def test_replayed_generated_kernels_compute_what_the_reference_computes(name, applied, backward):
    torch.backends.cuda.matmul.allow_tf32 = False
    runs_replayed(name, applied, backward, GRAPHS["kinships"](), "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("width", [8, 132])  # float4 rows in 64- and in 128-wide tiles (132: a partial one)
@pytest.mark.parametrize("name", BASELINES)
def test_generated_kernels_in_every_gemm_shape(name, width):
    test_generated_kernels_compute_what_the_reference_computes(name, ("reorder", "compact"), True, "kinships", width)


@pytest.mark.gpu
@pytest.mark.parametrize("name", BASELINES)
def test_the_tf32_variant_is_close_to_float32_and_not_equal(name):
    """Tensor cores: within TF32's error of the float32 reference (inputs rounded to 10 mantissa
    bits), forward and backward, and not bit-equal (so the tensor-core path really ran)."""
    graph = GRAPHS["kinships"]()
    program, tensors = program_and_tensors(name, ("reorder", "compact"), True, graph, width=64)
    expected = reference.run(program, graph, tensors)
    widths = reference.bind_widths(program, graph, tensors)
    cuda_tensors = {k: v.cuda() for k, v in tensors.items()}
    got = codegen.run(lower.lower(program), RelGraph_on(graph, "cuda"), cuda_tensors, widths, tensor_cores=True)
    for have, want in zip(got, expected, strict=True):
        largest = float(want.abs().max()) if want.numel() else 0.0
        torch.testing.assert_close(have.cpu(), want, rtol=1e-2, atol=1e-2 * max(1.0, largest))
    assert any(not torch.equal(have.cpu(), want) for have, want in zip(got, expected, strict=True))


def assert_gpu_matches_cpu(layer, graph, on_gpu, tensors) -> None:
    """``layer``'s output and every input's gradient on the GPU (``on_gpu``: ``graph`` there)
    close to those on the CPU, under a loss that weighs each output element differently."""
    results = []
    for device in ("cpu", "cuda"):
        g = graph if device == "cpu" else on_gpu
        leaves = {k: v.detach().to(device).requires_grad_() for k, v in tensors.items()}
        out = layer(g, **leaves)
        (out * torch.arange(out.numel(), device=device).reshape(out.shape).sin()).sum().backward()
        results.append([out.detach().cpu()] + [leaves[n].grad.cpu() for n in layer.names])
    for have, want in zip(results[1], results[0], strict=True):
        close(have, want)


@pytest.mark.gpu
@pytest.mark.parametrize("name", BASELINES)
def test_the_op_runs_the_generated_kernels_on_the_gpu(name):
    graph = awkward_graph(seed=5)
    layer = op.Layer(passes.optimize(BASELINES[name].program(), "reorder", "compact"))
    program, tensors = program_and_tensors(name, (), False, graph)
    assert_gpu_matches_cpu(layer, graph, RelGraph_on(graph, "cuda"), tensors)
    leaves = [tensors[n].detach().cuda().requires_grad_() for n in layer.names]
    on_gpu = RelGraph_on(graph, "cuda")  # held: the op's handle is valid while the graph lives
    torch.library.opcheck(layer.forward_op, (op.register_graph(on_gpu), leaves))


@pytest.mark.gpu
def test_the_breakdown_classes_the_generated_kernels_by_their_step():
    """The profiler hangs CuPy's launches on driver calls; the breakdown must still put a GEMM
    step's kernels under gemm and a scatter's under aggregation, not under other."""
    from systems.rgnn.breakdown import breakdown, classify, operators

    def unclassed(fn):  # what "other" holds, for the failure's message
        return {name: spent for name, spent in operators(fn, "cuda").items() if classify(name) == "other" and spent}

    graph = awkward_graph(seed=5)
    layer = op.Layer(passes.optimize(rgcn_layer(), "reorder", "compact"))
    _, tensors = program_and_tensors("rgcn", (), False, graph, width=64)
    leaves = {k: v.detach().cuda().requires_grad_() for k, v in tensors.items()}
    on_gpu = RelGraph_on(graph, "cuda")
    layer(on_gpu, **leaves).sum().backward()  # compiled before it is profiled
    step = lambda: layer(on_gpu, **leaves).sum().backward()  # noqa: E731
    split = breakdown(step, "cuda")
    assert split["gemm"] > 0 and split["aggregation"] > 0, split
    # Every kernel here is generated or a torch operator's (fills, the sum): none is left "other",
    # in the forward under autograd (linked to the op's autograd wrapper) or the backward.
    assert split["other"] <= 0.02 * sum(split.values()), (split, unclassed(step))
    with torch.no_grad():
        alone = breakdown(lambda: layer(on_gpu, **leaves), "cuda")
        assert alone["gemm"] > 0 and alone["other"] <= 0.02 * sum(alone.values()), (
            alone,
            unclassed(lambda: layer(on_gpu, **leaves)),
        )


def RelGraph_on(graph, device):  # noqa: N802 (reads as the constructor it wraps)
    from systems.relgraph.graph import RelGraph

    return RelGraph.build(
        graph.src, graph.dst, graph.etype, graph.num_nodes, graph.num_relations, device=device,
        node_type=graph.node_type, num_node_types=graph.num_node_types,
    )  # fmt: skip


def test_the_gemm_template_part_needs_a_gpu():
    from harness.errors import UserError
    from workloads.relational_gnn.gemm import gemm_template

    with pytest.raises(UserError, match="gemm_template times CUDA kernels: it needs a GPU"):
        gemm_template({"seed": 0, "cases": []}, None, repeat=1, warmup=0, device="cpu")


def test_the_tile_schedule_covers_each_segment_once_in_tiles_of_one_type():
    sizes = [0, 5, 64, 0, 200, 129, 1]
    offsets = torch.tensor([0, *sizes]).cumsum(0)
    types, first, end = lower.tile_schedule(offsets, sum(sizes), 64)
    assert types.dtype == torch.int32 and first.dtype == end.dtype == torch.int64
    real = end > first
    assert int(real.sum()) == sum(-(-n // 64) for n in sizes)  # the rest are empty and skipped
    covered = torch.cat([torch.arange(int(b), int(e)) for b, e in zip(first[real], end[real], strict=True)])
    assert covered.tolist() == list(range(sum(sizes)))  # every row once, in order
    for t, b, e in zip(types[real].tolist(), first[real].tolist(), end[real].tolist(), strict=True):
        assert offsets[t] <= b < e <= offsets[t + 1] and e - b <= 64
    assert [len(x) for x in lower.tile_schedule(torch.tensor([0, 0, 0]), 0, 64)] == [0, 0, 0]


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("in_dim, out_dim", [(37, 70), (64, 132)])  # scalar 64-wide tiles; quads 128-wide
def test_the_gemm_template_alone_launches_right_on_a_cpu_model(monkeypatch, in_dim, out_dim, precision):
    from hector_kernel_model import install

    model = install(monkeypatch)
    g = torch.Generator().manual_seed(3)
    sizes = [0, 5, 64, 0, 200, 129]
    rows = torch.randn(sum(sizes), in_dim, generator=g)
    weight = torch.randn(len(sizes), in_dim, out_dim, generator=g)
    if precision == "bf16":
        rows, weight = rows.bfloat16(), weight.bfloat16()
    offsets = torch.tensor([0, *sizes]).cumsum(0)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # the model runs on the CPU
    out = codegen.segment_gemm(rows, weight, offsets, precision != "fp32")
    monkeypatch.undo()
    assert not model.problems, model.problems[:3]
    if precision == "tf32":  # the products of TF32-rounded inputs, and so not those of the float32 ones
        from hector_kernel_model import to_tf32

        close(out, segment_products(to_tf32(rows), to_tf32(weight), offsets))
        assert (out - segment_products(rows, weight, offsets)).abs().max() > 1e-4
    elif precision == "bf16":
        close_bf16(out, segment_products(rows.float(), weight.float(), offsets))
    else:
        close(out, segment_products(rows, weight, offsets))
    with pytest.raises(ValueError, match="offsets must rise from 0 to the number of rows"):
        install(monkeypatch)
        monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
        codegen.segment_gemm(rows, weight, offsets - 1, precision != "fp32")


def test_the_gemm_template_alone_refuses_what_it_cannot_compute(monkeypatch):
    from hector_kernel_model import install

    install(monkeypatch)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # the model runs on the CPU
    rows, weight, offsets = torch.randn(7, 4), torch.randn(2, 4, 3), torch.tensor([0, 3, 7])
    with pytest.raises(ValueError, match="float32 or bfloat16 CUDA tensors, got torch.bfloat16 and torch.float32"):
        codegen.segment_gemm(rows.bfloat16(), weight, offsets, True)
    with pytest.raises(ValueError, match="float32 or bfloat16 CUDA tensors, got torch.float64"):
        codegen.segment_gemm(rows.double(), weight.double(), offsets)
    with pytest.raises(ValueError, match="the bf16 variant multiplies on tensor cores: pass tensor_cores=True"):
        codegen.segment_gemm(rows.bfloat16(), weight.bfloat16(), offsets)
    with pytest.raises(ValueError, match="offsets must be a 1-d integer tensor"):
        codegen.segment_gemm(rows, weight, offsets.double())
    with pytest.raises(ValueError, match="do not fit"):
        codegen.segment_gemm(rows, weight, torch.tensor([0, 7]))
    with pytest.raises(ValueError, match="the segments cover 7 rows on cpu, not 6 on cpu"):
        codegen.segment_gemm(rows[:6], weight, codegen.Segments.of(offsets, 7, "cpu"))
    with pytest.raises(ValueError, match="rows on cpu, weight on meta: one device wanted"):
        codegen.segment_gemm(rows, weight.to("meta"), offsets)
    with pytest.raises(ValueError, match="the segments cover 7 rows on meta, not 7 on cpu"):
        codegen.segment_gemm(
            rows, weight, dataclasses.replace(codegen.Segments.of(offsets, 7, "cpu"), offsets=offsets.to("meta"))
        )


def test_the_gemm_template_alone_reuses_its_segments_and_takes_both_index_dtypes(monkeypatch):
    """Segments made once serve calls on other rows of the same layout (what the benchmark
    times), and int32 offsets give what int64 ones give."""
    from hector_kernel_model import install

    g = torch.Generator().manual_seed(5)
    sizes = [70, 0, 3]
    offsets = torch.tensor([0, *sizes]).cumsum(0)
    weight = torch.randn(len(sizes), 8, 12, generator=g)
    model = install(monkeypatch)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # the model runs on the CPU
    layout = codegen.Segments.of(offsets.int(), sum(sizes), "cpu")
    assert layout.offsets.dtype == torch.int64 and all(t[1].dtype == torch.int64 for t in layout.tiles.values())
    inputs = [torch.randn(sum(sizes), 8, generator=g) for _ in range(2)]
    outs = [codegen.segment_gemm(rows, weight, layout) for rows in inputs]
    outs.append(codegen.segment_gemm(inputs[0], weight, offsets.int()))
    monkeypatch.undo()
    assert not model.problems, model.problems[:3]
    for rows, out in zip([*inputs, inputs[0]], outs, strict=True):
        close(out, segment_products(rows, weight, offsets))


def test_the_gemm_template_alone_takes_views_and_empty_inputs(monkeypatch):
    """Rows and weights as users pass them: every other column of a wider table, rows from an
    offset, one row expanded over all; and no rows at all. Each gives what contiguous copies give."""
    from hector_kernel_model import install

    g = torch.Generator().manual_seed(4)
    sizes = [3, 0, 70, 1]
    rows_n, offsets = sum(sizes), torch.tensor([0, *sizes]).cumsum(0)
    weight = torch.randn(len(sizes), 12, 9, generator=g)
    cases = {
        "strided": (torch.randn(rows_n, 24, generator=g)[:, ::2], weight),
        "offset": (torch.randn(rows_n + 13, 12, generator=g)[13:], weight),
        "expanded rows": (torch.randn(1, 12, generator=g).expand(rows_n, 12), weight),
        "expanded weight": (torch.randn(rows_n, 12, generator=g), weight[:1].expand(len(sizes), 12, 9)),
    }
    for kind, (rows, w) in cases.items():
        model = install(monkeypatch)
        monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # the model runs on the CPU
        out = codegen.segment_gemm(rows, w, offsets)
        monkeypatch.undo()
        assert not model.problems, (kind, model.problems[:3])
        close(out, segment_products(rows.contiguous(), w.contiguous(), offsets))
    install(monkeypatch)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    empty = codegen.segment_gemm(torch.randn(0, 12), weight, torch.zeros(len(sizes) + 1, dtype=torch.int64))
    monkeypatch.undo()
    assert empty.shape == (0, 9)


def test_a_model_written_as_a_long_loop_is_cut_into_bounded_fused_kernels(monkeypatch):
    """400 rounds of three row-wise operators fold into kernels of at most MAX_FUSED_OPERATORS
    operators each (one chain would nest 1200 deep: past Python's recursion and any compiler's
    taste), and the plan still computes what the reference does, training's backward included."""
    from hector_kernel_model import install

    from systems.hector.lang import model

    @model
    def long_loop(m):
        e = m.src(m.input("x", "in"))
        for _ in range(400):
            e = m.tanh(e * 1.001 + 0.001)
        return m.sum_into_dst(e)

    graph = awkward_graph(seed=4)
    tensors = {"x": torch.randn(graph.num_nodes, 5, generator=torch.Generator().manual_seed(8))}
    program = long_loop()
    expected = reference.run(program, graph, tensors)
    plan = lower.lower(program)
    fused = [step for step in plan.steps if isinstance(step, lower.Fused)]

    def operators(node) -> int:
        return 1 + sum(operators(a) for a in node.args if isinstance(a, lower.Node))

    assert len(fused) >= 1200 // lower.MAX_FUSED_OPERATORS
    assert max(operators(step.root) for step in fused) <= lower.MAX_FUSED_OPERATORS
    widths = reference.bind_widths(program, graph, tensors)
    close(lower.emulate(plan, graph, tensors, widths)[0], expected[0])
    model = install(monkeypatch)
    close(codegen.run(plan, graph, tensors, widths)[0], expected[0])
    assert not model.problems, model.problems[:3]
    forward, backward = autodiff.split(program)
    for part in (forward, backward):
        assert (
            max((operators(s.root) for s in lower.lower(part).steps if isinstance(s, lower.Fused)), default=0)
            <= lower.MAX_FUSED_OPERATORS
        )


def _fused_roots(program) -> list:
    return [step.root for step in lower.lower(program).steps if isinstance(step, lower.Fused)]


def _chain_value(node, leaves: list[float], numbers) -> torch.Tensor:
    """The chain evaluated by the plan's own arithmetic (lower.EXPRESSIONS), in float32."""
    args = [
        _chain_value(a, leaves, numbers) if isinstance(a, lower.Node) else torch.tensor(leaves[next(numbers)])
        for a in node.args
    ]
    return lower.EXPRESSIONS[node.expression][1](args[0], args[-1], node.mapped)


def test_a_fused_chains_cuda_expression_computes_its_chain_and_grows_linearly(tmp_path):
    """The text the fused kernels evaluate (FUSED_VALUE), compiled by the host's C++ compiler with
    each leaf a number, against the chain's arithmetic; for the shipped models' plans (forward
    and backward) and a chain of 12 leaky ReLUs, whose text grew threefold a level when each
    operator pasted its operand in as often as its template reads it."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no host C++ compiler here")
    from systems.hector.lang import model

    @model
    def leaky_chain(m):
        e = m.src(m.input("x", "in"))
        for _ in range(12):
            e = m.leaky_relu(e * 1.5 - 0.25, 0.1)
        return m.sum_into_dst(e)

    roots = _fused_roots(leaky_chain())
    for name in ("rgcn", "rgat", "hgt", "compgcn"):
        program = passes.optimize(MODELS_BY_NAME[name].program(), "compact", "reorder")
        roots += [root for part in (program, *autodiff.split(program)) for root in _fused_roots(part)]
    generator = torch.Generator().manual_seed(5)
    lines, want = [], []
    for root in roots:
        count = len(lower.Fused(None, root).leaves())
        leaves = (torch.rand(count, generator=generator) * 4 - 2).tolist()
        text = codegen.fused_expression(root, iter(range(count)))
        assert len(text) < 400 * (count + 40)  # linear in the chain's size
        declared = " ".join(
            f"const float t{k} = {v!r}f; const long long x{k} = 0; const float s{k} = 0; const int w{k} = 1;"
            for k, v in enumerate(leaves)
        )
        lines.append(f'{{ {declared} std::printf("%.9g\\n", (double){text}); }}')
        want.append(float(_chain_value(root, leaves, iter(range(count)))))
    source = tmp_path / "chains.cpp"
    source.write_text(
        "#include <cmath>\n#include <cstdio>\n"
        "static float operand(int, float t, long long, float, long long, int, int, int) { return t; }\n"
        "int main() { const long long i = 0; const int c = 0, width = 1;\n" + "\n".join(lines) + "\nreturn 0; }\n"
    )
    subprocess.run([compiler, "-std=c++17", "-O0", "-o", str(tmp_path / "chains"), str(source)], check=True)
    got = [
        float(v)
        for v in subprocess.run([str(tmp_path / "chains")], capture_output=True, text=True, check=True).stdout.split()
    ]
    assert len(got) == len(want) > 12
    for a, b in zip(got, want, strict=True):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("kind", ["strided", "offset", "expanded"])
def test_the_generated_launches_take_feature_views(kind, monkeypatch):
    """Features passed as views to codegen.run give what their contiguous copies give."""
    from hector_kernel_model import install

    graph = awkward_graph(seed=2)
    program, tensors = program_and_tensors("rgat", ("reorder", "compact"), False, graph)
    g = torch.Generator().manual_seed(6)
    n, w = tensors["x"].shape
    tensors["x"] = {
        "strided": torch.randn(n, 2 * w, generator=g)[:, ::2],
        "offset": torch.randn(n + 5, w, generator=g)[5:],
        "expanded": torch.randn(1, w, generator=g).expand(n, w),
    }[kind]
    expected = reference.run(program, graph, {k: v.contiguous() for k, v in tensors.items()})
    model = install(monkeypatch)
    got = codegen.run(lower.lower(program), graph, tensors, reference.bind_widths(program, graph, tensors))
    assert not model.problems, model.problems[:3]
    close(got[0], expected[0])


@pytest.mark.gpu
def test_the_gemm_template_alone_matches_per_segment_products():
    """Odd widths, empty segments, a segment shorter than a tile and one of many tiles; float32
    and the TF32 variant."""
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator().manual_seed(3)
    sizes = [0, 5, 64, 0, 1000, 129]
    offsets = torch.tensor([0, *sizes]).cumsum(0).cuda()
    for in_dim, out_dim in [(37, 70), (64, 64), (256, 132), (20, 256)]:  # every shape, scalar and quads
        for precision in ("fp32", "tf32", "bf16"):
            check_alone(g, sizes, offsets, in_dim, out_dim, precision)


def check_alone(g, sizes, offsets, in_dim, out_dim, precision):
    """The template alone against per-segment products (of TF32-rounded inputs for TF32; for
    bf16, the float32 products of the bf16 inputs)."""
    from hector_kernel_model import to_tf32

    def expect(rows, weight):
        if precision == "tf32":
            rows, weight = to_tf32(rows), to_tf32(weight)
        return segment_products(rows.float(), weight.float(), offsets).cpu()

    # TF32's products are exact in float32; only the order of the sums differs from the reference.
    compare = close_bf16 if precision == "bf16" else close
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    rows = torch.randn(sum(sizes), in_dim, generator=g).to("cuda", dtype)
    weight = torch.randn(len(sizes), in_dim, out_dim, generator=g).to("cuda", dtype)
    torch.full((sum(sizes) * out_dim,), float("nan"), device="cuda")  # freed: the output's block is NaN
    compare(codegen.segment_gemm(rows, weight, offsets, precision != "fp32").cpu(), expect(rows, weight))
    # A row view that is not 16-byte aligned falls back to scalar loads, and is still right.
    shifted = torch.randn(sum(sizes) * in_dim + 1, generator=g).to("cuda", dtype)[1:].view(sum(sizes), in_dim)
    assert shifted.data_ptr() % 16
    compare(codegen.segment_gemm(shifted, weight, offsets, precision != "fp32").cpu(), expect(shifted, weight))


# The CPU model of the kernels runs every thread of a launch in Python: on kinships (10 k edges) a
# case takes up to a minute, so the fast tier's cover is over the small graphs.
ON_SMALL_GRAPHS = pairwise(NAMES, PASS_SETS, DIRECTIONS, GRAPHS, heavy=lambda case: case[3] == "kinships")


@pytest.mark.parametrize("name, applied, backward, graph_name", ON_SMALL_GRAPHS)
def test_the_launches_compute_the_reference_on_a_cpu_model_of_the_kernels(
    name, applied, backward, graph_name, monkeypatch
):
    """codegen.run end to end without a GPU: every launch's arguments (order, types, widths,
    pointers, grid) evaluated by a literal CPU model of its kernel (tests/hector_kernel_model.py)."""
    from hector_kernel_model import install

    model = install(monkeypatch)
    graph = GRAPHS[graph_name]()
    program, tensors = program_and_tensors(name, applied, backward, graph)
    expected = reference.run(program, graph, tensors)
    got = codegen.run(lower.lower(program), graph, tensors, reference.bind_widths(program, graph, tensors))
    assert not model.problems, model.problems[:3]
    for have, want in zip(got, expected, strict=True):
        assert have.shape == want.shape
        close(have, want)


def fresh(tensors: dict, seed: int, misaligned: str | None = None, device: str = "cpu") -> dict:
    """New random tensors of ``tensors``' shapes and spreads on ``device``, at new addresses;
    ``misaligned``: that one a view starting 4 bytes past an allocation (no float4 moves then).
    The spread is kept because unit weights in all of HGT's chained products give values in the
    hundreds whose backward cancels to near zero, past float32's reach at any fixed tolerance."""
    g = torch.Generator().manual_seed(seed)

    def spread(v):
        return float(v.std()) if v.numel() > 1 and float(v.std()) > 0 else 1.0

    out = {k: (torch.randn(v.shape, generator=g) * spread(v)).to(device) for k, v in tensors.items()}
    if misaligned is not None:  # made where it is used: a copy to another device would be aligned
        shape, scale = out[misaligned].shape, spread(tensors[misaligned])
        out[misaligned] = (torch.randn(shape.numel() + 1, generator=g) * scale).to(device)[1:].view(shape)
    return out


def replays_of(plan, graph) -> list:
    return [r for r in lower.GraphIndex.of(graph).replays.values() if r is not None and r.plan is plan]


def runs_replayed(name, applied, backward, graph, device, check_problems=lambda: None):
    """Three calls of one plan on one graph: the first works the launches out and records them,
    the second replays them on new tensors, the third is worked out again (a misaligned feature
    row changes the tile shape). Each gives the reference's results, and no call overwrites the
    results an earlier one returned."""
    program, tensors = program_and_tensors(name, applied, backward, graph, width=8)
    plan, widths = lower.lower(program), reference.bind_widths(program, graph, tensors)
    on = RelGraph_on(graph, device) if device != "cpu" else graph
    returned = []
    calls = [fresh(tensors, 0, device=device), fresh(tensors, 1, device=device)]
    calls.append(fresh(tensors, 2, misaligned="x", device=device))
    for call, given in enumerate(calls):
        assert (given["x"].data_ptr() % 16 == 0) == (call < 2)
        got = codegen.run(plan, on, given, widths)
        check_problems()
        expected = reference.run(program, graph, {k: v.cpu() for k, v in given.items()})
        for k, (have, want) in enumerate(zip(got, expected, strict=True)):
            try:
                close(have.cpu(), want)
            except AssertionError as e:
                which = ("recorded", "replayed", "misaligned")[call]
                raise AssertionError(f"result {k} of the {which} call: {e}") from None
        returned.append((got, [t.clone() for t in got]))
        assert len(replays_of(plan, on)) == (1 if call < 2 else 2)  # the misaligned call: a second record
    for got, copies in returned:
        for have, copy in zip(got, copies, strict=True):
            assert torch.equal(have, copy), "a later call wrote into an earlier call's result"


@pytest.mark.parametrize("name, applied, backward, graph_name", ON_SMALL_GRAPHS)
def test_a_replayed_plan_computes_the_reference_on_a_cpu_model_of_the_kernels(
    name, applied, backward, graph_name, monkeypatch
):
    """On every test graph: odd sizes, a relation with no edges, one relation, and no edges at all."""
    from hector_kernel_model import install

    model = install(monkeypatch)

    def check_problems():
        assert not model.problems, model.problems[:3]

    runs_replayed(name, applied, backward, GRAPHS[graph_name](), "cpu", check_problems)


@pytest.mark.parametrize("aliased_first", [True, False], ids=["aliased-then-distinct", "distinct-then-aliased"])
@pytest.mark.parametrize("name", BASELINES)
def test_one_tensor_given_for_two_names_is_never_replayed_as_two(name, aliased_first, monkeypatch):
    """A replay tells its arguments apart by address: a call that passes one tensor for two of a
    program's inputs that kernels read (the features and the output gradient, of one shape here)
    is not recorded, and one recorded with distinct tensors replays right when they are one."""
    from hector_kernel_model import install

    model = install(monkeypatch)
    graph = awkward_graph(seed=4)
    program, tensors = program_and_tensors(name, ("reorder", "compact"), True, graph, width=8)
    assert tensors["x"].shape == tensors["grad:0"].shape
    aliased = fresh(tensors, 5)
    aliased["grad:0"] = aliased["x"]
    plan, widths = lower.lower(program), reference.bind_widths(program, graph, tensors)
    for call, given in enumerate([aliased, fresh(tensors, 6)] if aliased_first else [fresh(tensors, 6), aliased]):
        got = codegen.run(plan, graph, given, widths)
        assert not model.problems, model.problems[:3]
        for have, want in zip(got, reference.run(program, graph, given), strict=True):
            close(have, want)
        if call == 0:
            assert len(replays_of(plan, graph)) == (0 if aliased_first else 1)


def test_a_slope_of_zero_is_written_as_a_float_literal():
    """leaky_relu(x, 0) is a ReLU: its expression must read 0.0f, not the invalid 0f."""
    from systems.hector.lang import model

    @model
    def relu_layer(m):
        return m.leaky_relu(m.input("x", "in"), 0) + m.input("y", "in")

    (text,) = [t for n, t in lower_sources(relu_layer(), fuse=False).items() if n.startswith("rows_map")][:1]
    assert "(a) * 0.0f)" in text
    (text,) = [t for n, t in codegen.sources(relu_layer()).items() if n.startswith("fused_map")]
    assert "#define FUSED_CHAIN add(leaky_relu@0.0(#0),#0)" in text
    assert "const float v0 = operand(0, t0, x0, s0, i, c, w0, width);" in text and "(v0) * 0.0f)" in text


def test_every_kind_of_step_has_a_profiler_range_the_breakdown_classes():
    from systems.rgnn.breakdown import classify

    for name in BASELINES:
        for program in autodiff.split(passes.optimize(BASELINES[name].program(), "reorder", "compact")):
            for step in lower.lower(program).steps:
                kind = classify(codegen.range_name(step))
                assert (kind == "other") == isinstance(step, lower.Host), (codegen.range_name(step), kind)


def lower_sources(program, fuse: bool) -> dict[str, str]:
    return {
        codegen.source_of(s)[0]: codegen.source_of(s)[1]
        for s in lower.lower(program, fuse).steps
        if not isinstance(s, lower.Host)
    }


def test_a_chain_of_row_wise_operators_is_one_fused_step():
    """The intermediate rows of a chain whose links have one reader each are never stored: RGAT's
    backward has fused steps, and no fused step's inner operator is a program output."""
    from systems.hector.lang import model

    @model
    def chain(m):
        x, y = m.input("x", "in"), m.input("y", "in")
        return m.sum_into_dst(m.src(m.exp(x) * y) + m.dst(y))

    plan = lower.lower(chain())
    kinds = [type(s).__name__ for s in plan.steps]
    assert kinds.count("Fused") == 1 and "Map" not in kinds, str(plan)  # exp and mul folded into the sum
    plan = lower.lower(autodiff.split(passes.optimize(rgat_layer(), "reorder", "compact"))[1])
    assert any(isinstance(s, lower.Fused) for s in plan.steps)


@pytest.mark.parametrize("name", BASELINES)
def test_a_training_step_computes_the_forward_once(name, monkeypatch):
    """autodiff.split: the backward program reads the forward's saved values instead of computing
    them again (no softmax, no forward product in it), and forward then backward, on the kernel
    model, give autograd's gradients."""
    from hector_kernel_model import install

    program = passes.optimize(BASELINES[name].program(), "reorder", "compact")
    forward, backward = autodiff.split(program)
    ops = [(v.op, v.attr("transpose")) for v in backward.values]
    assert ("edge_softmax", None) not in ops and ("typed_matmul", None) not in ops
    saves = any(v.name and v.name.startswith("saved:") for v in backward.values)
    assert saves == (name != "rgcn")  # RGCN is linear: its gradients need only x, W and the graph
    install(monkeypatch)
    graph = awkward_graph(seed=8)
    _, tensors = program_and_tensors(name, (), False, graph)
    widths = reference.bind_widths(program, graph, tensors)
    outputs = codegen.run(lower.lower(forward), graph, tensors, widths)
    grad = torch.randn(outputs[0].shape, generator=torch.Generator().manual_seed(1))
    saved = {f"saved:{i}": t for i, t in enumerate(outputs[1:])}
    got = codegen.run(lower.lower(backward), graph, tensors | saved | {"grad:0": grad}, widths)
    leaves = {k: v.clone().requires_grad_() for k, v in tensors.items()}
    (out,) = reference.run(program, graph, leaves)
    expected = torch.autograd.grad(out, [leaves[leaf.name] for leaf in autodiff.leaves(program)], grad)
    close(outputs[0], out.detach())
    for have, want in zip(got, expected, strict=True):
        close(have, want)
