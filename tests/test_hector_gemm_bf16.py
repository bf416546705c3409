"""The GEMM template's bf16 variant (kernels/gemm.cu with BF16): bf16 tensor-core products
(mma.m16n8k16, fp32 accumulate) fed by ldmatrix and cp.async, each result rounded to bf16 once.

On the CPU: which shape and which feeding (16-byte pieces or entry by entry) codegen picks, and
that every bf16 instance, gathers, scatters and the transposed weight included, compiles for
sm_90. On a GPU: results against float64 products of the same bf16 inputs, within one bf16
rounding of the output and fp32 accumulation, over odd segment sizes, empty segments, widths that
are and are not whole 16-byte pieces, views, and many random segments."""

import math
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

from systems import nvrtc
from systems.hector import codegen, lower

WIDTHS = (8, 24, 64, 100, 128, 256)  # whole pieces of 8 or not (100), under, at and over a tile's columns


def bf16_table(g, *shape, device="cuda"):
    return torch.randn(*shape, generator=g).to(device, torch.bfloat16)


def products64(rows, weight, offsets, transpose=False):
    """Per-segment products of the bf16 inputs in float64 (exact for these widths), and the same of
    their magnitudes (what bounds the fp32 accumulation's error)."""
    rows, weight = rows.double().cpu(), weight.double().cpu()
    if transpose:
        weight = weight.transpose(1, 2)
    exact = torch.zeros(rows.shape[0], weight.shape[2], dtype=torch.float64)
    magnitude = torch.zeros_like(exact)
    bounds = offsets.tolist()
    for t in range(len(bounds) - 1):
        b, e = bounds[t], bounds[t + 1]
        exact[b:e] = rows[b:e] @ weight[t]
        magnitude[b:e] = rows[b:e].abs() @ weight[t].abs()
    return exact, magnitude


def assert_rounded_once(have, exact, magnitude, k):
    """Each entry is the bf16 nearest a float32 sum: off the exact product by at most the fp32
    accumulation's error (k steps of 2**-22 of the sum of magnitudes: twice the textbook bound, for
    tensor cores' truncating adders) plus half a bf16 step where that sum lies (2**-9 of its
    binade's top). A dropped or doubled term, a wrong row or column, or a second rounding exceeds
    it."""
    assert have.dtype == torch.bfloat16 and have.shape == exact.shape, (have.dtype, have.shape)
    have = have.double().cpu()
    assert torch.isfinite(have).all(), "an entry never written, or a NaN"
    accumulation = max(k, 1) * 2.0**-22 * magnitude
    reach = exact.abs() + accumulation
    _, exponent = torch.frexp(reach)
    half_step = torch.where(reach > 0, torch.ldexp(torch.ones_like(reach), exponent - 9), torch.zeros_like(reach))
    error = (have - exact).abs()
    allowed = accumulation + half_step
    worst = int(torch.argmax(error - allowed)) if error.numel() else 0
    assert (error <= allowed).all(), (
        f"entry {divmod(worst, exact.shape[1])}: {float(have.view(-1)[worst])} for {float(exact.view(-1)[worst])}, "
        f"allowed {float(allowed.view(-1)[worst]):.3g}"
    )


def poisoned_output_memory(count):
    """A block of NaNs freed just before the call: the result's allocation reuses it, so an entry
    the kernel never writes reads NaN."""
    torch.full((count,), float("nan"), device="cuda", dtype=torch.bfloat16)


def check(g, sizes, k, n, rows=None, weight=None):
    offsets = torch.tensor([0, *sizes]).cumsum(0)
    rows = bf16_table(g, sum(sizes), k) if rows is None else rows
    weight = bf16_table(g, len(sizes), k, n) if weight is None else weight
    poisoned_output_memory(sum(sizes) * n)
    out = codegen.segment_gemm(rows, weight, offsets.cuda(), tensor_cores=True)
    assert_rounded_once(out, *products64(rows, weight, offsets), k)
    return out


# On the CPU: the shape and the feeding codegen picks.


def test_bf16_tiles_are_128_rows_with_the_columns_n_asks():
    table = torch.zeros(32, 64, dtype=torch.bfloat16)
    assert codegen.gemm_shape(64, 64, table, bf16=True) == codegen.GemmShape(128, 64, True, True, True)
    assert codegen.gemm_shape(256, 256, table, bf16=True) == codegen.GemmShape(128, 128, True, True, True)
    assert codegen.gemm_shape(64, 65, table, bf16=True).columns == 128
    assert all(shape.bf16 and shape.tensor_cores for shape in codegen.BF16_SHAPES)
    picked = {codegen.gemm_shape(k, n, table, bf16=True) for k in WIDTHS for n in WIDTHS}
    assert picked <= set(codegen.BF16_SHAPES)  # CI compiles every shape codegen can pick


def test_bf16_rows_move_in_pieces_only_where_whole_aligned_pieces_fit():
    """cp.async copies 16 aligned bytes (8 bf16s): k and n multiples of 8 and every tensor 16-byte
    aligned, or entry by entry. Quads of 4 are not enough for it (12 passes quads_fit)."""
    storage = torch.zeros(4096, dtype=torch.bfloat16)
    aligned = storage[:1024]
    assert aligned.data_ptr() % 16 == 0
    assert codegen.pieces_fit(64, 24, aligned, aligned)
    assert codegen.quads_fit(12, 64, aligned) and not codegen.pieces_fit(12, 64, aligned)
    assert not codegen.pieces_fit(64, 100, aligned)
    for shift in (1, 4):  # 2 and 8 bytes off: neither is a 16-byte boundary
        assert not codegen.pieces_fit(64, 64, aligned, storage[shift:])
    assert codegen.pieces_fit(64, 64, storage[8:])  # 16 bytes on: aligned again
    assert not codegen.gemm_shape(64, 64, aligned, storage[1:], bf16=True).vec4
    assert codegen.gemm_shape(12, 12, aligned).vec4  # the float32 variants' quads are unchanged


BF16_FORMS = [(shape, indexed) for shape in codegen.BF16_SHAPES for indexed in (False, True)]


@pytest.mark.parametrize(
    "shape, indexed",
    [form if k == 0 else pytest.param(*form, marks=pytest.mark.full) for k, form in enumerate(BF16_FORMS)],
    ids=[f"{s.rows}x{s.columns}{'-pieces' if s.vec4 else ''}{'-indexed' if i else ''}" for s, i in BF16_FORMS],
)
def test_every_bf16_instance_compiles_for_sm90_with_the_shared_memory_the_host_passes(shape, indexed, tmp_path):
    """Each shape codegen picks, as segment_gemm launches it and with a gathered A, a scattered C
    and a transposed weight (the fast tier compiles one, test_hector_codegen the plain ones); the
    kernel's own count of its shared memory is what GemmShape.shared_bytes passes."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        if os.environ.get("CI"):
            pytest.fail("nvcc is not on PATH; CI must compile every generated kernel")
        pytest.skip("nvcc is not on PATH")
    name, text = indexed_instance(shape) if indexed else codegen.segment_gemm_source(shape)
    size = shape.shared_bytes(transpose_b=indexed)
    source = tmp_path / f"{name}.cu"
    source.write_text(text + f'static_assert(POOL * sizeof(bf16) == {size}, "the host passes {size} bytes");\n')
    flags = ["-arch=sm_90", "--cubin", "-std=c++17", "-Werror", "all-warnings"]
    result = subprocess.run(
        [nvcc, *flags, "-o", str(source.with_suffix(".cubin")), str(source)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert 0 < size <= 227 * 1024  # within what an H200 block may take


def indexed_instance(shape):
    """The bf16 template with A's rows gathered, C's scattered and the weight transposed (the
    model path's form, which segment_gemm does not take)."""
    defines = {"GATHER_A": 1, "SCATTER_C": 1, "TRANSPOSE_B": 1, **shape.defines()}
    return codegen._instance("gemm.cu", "GEMM_NAME", "segment_gemm", defines)[:2]


# On a GPU: the results.


@pytest.mark.gpu
@pytest.mark.parametrize("k, n", [(64, 64), (100, 24)])  # whole pieces (cp.async); not (entry by entry)
def test_bf16_products_on_odd_and_empty_segments(k, n):
    g = torch.Generator().manual_seed(11)
    sizes = [0, 1, 15, 17, 0, 129, 300, 128, 0]
    check(g, sizes, k, n)


@pytest.mark.gpu
@pytest.mark.full
@pytest.mark.parametrize("k", WIDTHS)
@pytest.mark.parametrize("n", WIDTHS)
def test_bf16_products_in_every_width(k, n):
    g = torch.Generator().manual_seed(k * 1000 + n)
    check(g, [1, 0, 15, 17, 255, 64, 0, 700], k, n)


@pytest.mark.gpu
def test_bf16_products_on_many_random_segments():
    g = torch.Generator().manual_seed(12)
    sizes = torch.randint(0, 400, (300,), generator=g)
    sizes[torch.randperm(300, generator=g)[:40]] = 0
    check(g, sizes.tolist(), 64, 64)


@pytest.mark.gpu
@pytest.mark.full
def test_bf16_products_on_one_long_segment():
    """One segment of many tiles, at the widths where both column blocks of a tile run (N = 256)."""
    check(torch.Generator().manual_seed(13), [20001], 256, 256)


@pytest.mark.gpu
def test_bf16_products_of_views():
    """Views as users pass them: rows from an offset (16-byte aligned or not), every other column
    of a wider table, a transposed weight, a weight from an offset that is not aligned. Each is
    right, and the unaligned ones take the entry-by-entry path."""
    g = torch.Generator().manual_seed(14)
    sizes, k, n = [17, 0, 130, 1], 64, 72
    rows_n, types = sum(sizes), len(sizes)
    flat = bf16_table(g, rows_n * k + 8)
    weight = bf16_table(g, types, k, n)
    views = {
        "rows at 16 bytes on": (flat[8:].view(rows_n, k), weight, True),
        "rows at 2 bytes on": (flat[1 : 1 + rows_n * k].view(rows_n, k), weight, False),
        "every other column": (bf16_table(g, rows_n, 2 * k)[:, ::2], weight, True),
        "transposed weight": (bf16_table(g, rows_n, k), bf16_table(g, types, n, k).transpose(1, 2), True),
        "weight at 2 bytes on": (
            bf16_table(g, rows_n, k),
            bf16_table(g, types * k * n + 1)[1:].view(types, k, n),
            False,
        ),
    }
    for kind, (rows, w, pieces) in views.items():
        contiguous = [t.contiguous() for t in (rows, w)]
        out = torch.empty(rows_n, n, device="cuda", dtype=torch.bfloat16)
        assert codegen.gemm_shape(k, n, *contiguous, out, bf16=True).vec4 == pieces, kind
        check(g, sizes, k, n, rows, w)


@pytest.mark.gpu
def test_bf16_products_of_empty_inputs():
    g = torch.Generator().manual_seed(15)
    assert check(g, [0, 0, 0], 64, 64).shape == (0, 64)
    zero_k = check(g, [5, 0, 130], 0, 24)  # no k: every entry a sum of nothing
    assert zero_k.shape == (135, 24) and not zero_k.any()
    assert check(g, [5, 0, 130], 64, 0).shape == (135, 0)


@pytest.mark.gpu
@pytest.mark.parametrize("k, n", [(64, 64), (256, 136), (37, 70)])
def test_bf16_gathered_scattered_and_transposed(k, n):
    """The model path's form of the template: A's rows read through a_rows, C's rows written
    through c_rows (a permutation), the weight multiplied transposed; both tile shapes, pieces and
    entry by entry."""
    g = torch.Generator().manual_seed(k + n)
    sizes = [3, 0, 129, 17, 1]
    rows_n, types = sum(sizes), len(sizes)
    offsets = torch.tensor([0, *sizes]).cumsum(0)
    table = bf16_table(g, rows_n + 9, k)  # more rows than positions: a_rows picks
    weight = bf16_table(g, types, n, k)  # [t][n][k]: multiplied as its transpose
    a_rows = torch.randint(0, rows_n + 9, (rows_n,), generator=g)
    c_rows = torch.randperm(rows_n, generator=g)
    out = torch.full((rows_n, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    shape = codegen.gemm_shape(k, n, table, weight, out, bf16=True)
    assert shape.vec4 == (k % 8 == 0 and n % 8 == 0)
    name, text = indexed_instance(shape)
    schedule = lower.tile_schedule(offsets.cuda(), rows_n, shape.rows)
    pointers = (table, a_rows.cuda(), weight, out, c_rows.cuda(), *schedule)
    args = (*(np.uint64(t.data_ptr()) for t in pointers), np.int32(k), np.int32(n))
    module, shared = codegen._module(text), shape.shared_bytes(transpose_b=True)
    codegen.allow_shared(module, name, shared, out.device)
    grid = (len(schedule[0]), math.ceil(n / shape.columns))
    nvrtc.launch(module, name, grid, (codegen.THREADS,), args, shared)
    exact, magnitude = products64(table[a_rows.cuda()], weight, offsets, transpose=True)
    expected = torch.empty_like(exact), torch.empty_like(magnitude)
    expected[0][c_rows], expected[1][c_rows] = exact, magnitude  # position i's result is C's row c_rows[i]
    assert_rounded_once(out, *expected, k)
