"""What a user passes to the PyTorch-Direct gather, the hot-row cache, the zero-copy row reader and
the neighbour sampler on their own tables and graphs: index and table views, odd dtypes, empty and
out-of-range ids, inconsistent CSRs. Every result is held to plain torch indexing or to sampling
properties checked here (every sampled edge exists, min(degree, fan-out) distinct neighbours)."""

import ctypes
import re
from collections import Counter

import numpy as np
import pytest
import torch

from harness.errors import NeedsGpuError, UserError
from systems import nvrtc
from systems.pytorch_direct import dispatch
from systems.pytorch_direct.hot_rows import HotRows, count_rows, hit_rate, hottest_rows
from systems.pytorch_direct.ops import gather, gather_op
from systems.sampling import ops as sampling_ops
from systems.sampling.ops import sample_neighbors
from systems.sampling.sampler import NeighborSampler
from systems.zero_copy import ops as zero_copy_ops

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def random_table(rows, dim, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(rows, dim, generator=g).to(dtype)
    return torch.randint(-100, 100, (rows, dim), generator=g).to(dtype)


def random_ids(rows, n, seed):
    return torch.randint(0, rows, (n,), generator=torch.Generator().manual_seed(seed))


def plain_rows(table, idx):
    """``table[idx]`` through a fresh list of the ids, whatever the index view's layout."""
    return table[torch.tensor(idx.tolist(), dtype=torch.long)]


# --- the gather op (CPU reference) ----------------------------------------------------------------

INDEX_VIEWS = {
    "plain": lambda ids: ids,
    "strided": lambda ids: ids[::3],
    "offset": lambda ids: ids[7:],
    "expanded": lambda ids: ids[4:5].expand(50),
    "unsorted_duplicates": lambda ids: torch.cat([ids[:20], ids[:20].flip(0)]),
    "empty": lambda ids: ids[:0],
}


@pytest.mark.parametrize("view", INDEX_VIEWS)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8])
def test_gather_is_plain_indexing_for_index_views_and_small_dtypes(view, index_dtype, dtype):
    table = random_table(60, 5, dtype, seed=1)
    idx = INDEX_VIEWS[view](random_ids(60, 300, seed=2).to(index_dtype))
    out = gather(table, idx)
    assert out.dtype == dtype and torch.equal(out, plain_rows(table, idx))


def test_gather_reads_a_table_that_is_a_row_slice_and_refuses_column_slices():
    table = random_table(40, 6, torch.float32, seed=3)
    idx = random_ids(30, 100, seed=4)
    assert torch.equal(gather(table[10:], idx), plain_rows(table[10:], idx))
    for view in (table[:, 1:4], table.t(), table[::2]):  # rows not densely packed
        with pytest.raises(ValueError, match="contiguous and densely packed"):
            gather(view, idx[:5] % view.shape[0])
    with pytest.raises(ValueError, match="2-D"):
        gather(table[:, 0].contiguous(), idx)
    # One column: its stride is never stepped over, and torch calls such a transposed row contiguous.
    column = table[:, 2].contiguous().view(1, -1).t()
    assert column.stride() == (1, 40) and column.is_contiguous()
    assert torch.equal(gather(column, idx[:7] % 40), plain_rows(column, idx[:7] % 40))


@pytest.mark.parametrize("bad", [-1, 40, 2**40])
def test_gather_names_an_out_of_range_or_negative_index(bad):
    table = random_table(40, 3, torch.float32, seed=5)
    idx = torch.cat([random_ids(40, 10, seed=6), torch.tensor([bad])])
    with pytest.raises(IndexError, match=f"index {bad} is out of range for a table of 40 rows"):
        gather(table, idx)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_a_table_that_requires_grad_gets_the_gradient_of_plain_indexing(index_dtype):
    """A learnable table (an embedding kept in host memory): the gathered rows' gradient summed
    into the table's rows, repeated rows added, as ``table[idx]`` gives it; opcheck's autograd
    checks pass."""
    table = random_table(13, 5, torch.float64, seed=21).requires_grad_()
    idx = random_ids(13, 40, seed=22).to(index_dtype)[::2]  # a strided view, with repeats
    weights = torch.randn(20, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(23))
    (gather(table, idx) * weights).sum().backward()
    want = torch.zeros(13, 5, dtype=torch.float64).index_add_(0, idx.long(), weights)
    torch.testing.assert_close(table.grad, want, rtol=0, atol=1e-12)
    torch.library.opcheck(gather_op, (table.detach().requires_grad_(), idx))


def test_a_table_of_rows_without_features_gives_empty_rows_and_still_checks_the_ids():
    table = torch.randn(5, 0)
    assert gather(table, torch.tensor([1, 4, 4])).shape == (3, 0)
    with pytest.raises(IndexError, match="index 5 is out of range for a table of 5 rows"):
        gather(table, torch.tensor([1, 5]))


def test_gather_with_a_cache_larger_than_the_table_or_empty_gives_the_plain_rows():
    table = random_table(30, 4, torch.float32, seed=7)
    idx = random_ids(30, 200, seed=8)
    counts = count_rows([idx], 30)
    for capacity in (0, 5, 1000):  # 1000: every row read, more than the table holds
        hot = HotRows(table, hottest_rows(counts, capacity), "cpu")
        assert hot.cache.shape == (min(capacity, int((counts > 0).sum())), 4)
        assert torch.equal(gather(table, idx, slots=hot.slots, cache=hot.cache), table[idx])


@CUDA
@pytest.mark.parametrize("cache_offset", [0, 1, 2, 3])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_gather_on_the_gpu_with_a_cache_view_off_the_vector_alignment_gives_the_plain_rows(cache_offset, index_dtype):
    """A cache whose rows start 4, 8 or 12 bytes past a 16-byte boundary (a view of a larger
    buffer): the vectorized kernel must narrow its loads for the cache as for the table and the
    output, or it reads misaligned words (a CUDA error) or other rows."""
    table = random_table(301, 12, torch.float32, seed=30).pin_memory()  # 48-byte rows: 16-byte loads
    idx = random_ids(301, 700, seed=31).to(index_dtype)
    hot = HotRows(table, hottest_rows(count_rows([idx], 301), 40), "cuda")
    buffer = torch.full((hot.cache.numel() + cache_offset,), float("nan"), device="cuda")
    cache = buffer[cache_offset:].view_as(hot.cache)
    cache.copy_(hot.cache)
    assert cache.data_ptr() % 16 == 4 * cache_offset
    out = gather(table, idx.cuda(), slots=hot.slots, cache=cache)
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), plain_rows(table, idx))


# --- hot rows: counting, choosing, caching --------------------------------------------------------


@pytest.mark.parametrize("ids", [torch.tensor([1.7, 3.2]), torch.tensor([True, False, True])])
def test_row_counts_refuse_float_ids_and_boolean_masks(ids):
    # Without the check 1.7 counted as row 1 and the mask as rows 1, 0, 1.
    with pytest.raises(UserError, match="a batch must be a tensor of integer row ids"):
        count_rows([ids], 10)


def test_row_counts_take_ids_of_any_shape():
    ids = random_ids(17, 60, seed=9)
    batches = [ids.view(6, 10), ids[:20].view(4, 5).t(), ids[3]]  # 2-D, transposed, 0-d
    plain = Counter(int(i) for b in batches for i in b.reshape(-1))
    assert count_rows(batches, 17).tolist() == [plain.get(row, 0) for row in range(17)]


def test_row_counts_and_capacities_refuse_what_is_not_a_number_of_rows():
    counts = torch.tensor([3, 0, 5])
    for bad in (-3, 4.0, True, "2", None):  # 4.0 failed in torch.zeros, True was taken as 1 row
        with pytest.raises(UserError, match=re.escape(f"num_rows must be a whole number of rows >= 0, got {bad!r}")):
            count_rows([], bad)
        with pytest.raises(UserError, match=re.escape(f"capacity must be a whole number of rows >= 0, got {bad!r}")):
            hottest_rows(counts, bad)
    assert hottest_rows(counts, np.int64(1)).tolist() == [2]
    assert count_rows([torch.tensor([2])], np.int32(3)).tolist() == [0, 0, 1]
    with pytest.raises(UserError, match="table must be a torch tensor"):
        HotRows(np.zeros((4, 2), np.float32), torch.tensor([1]), "cpu")


def test_hit_rate_counts_each_cached_row_once_and_refuses_rows_outside_the_counts():
    counts = torch.randint(1, 9, (12,), generator=torch.Generator().manual_seed(10))
    rows = torch.tensor([4, 4, 7, 4])
    assert hit_rate(counts, rows) == (int(counts[4]) + int(counts[7])) / int(counts.sum())
    with pytest.raises(UserError, match="rows -1..7 outside counts of 12 rows"):
        hit_rate(counts, torch.tensor([7, -1]))  # would read the last row's count
    with pytest.raises(UserError, match="outside counts of 12"):
        hit_rate(counts, torch.tensor([12]))
    with pytest.raises(UserError, match="integer row ids"):
        hit_rate(counts, counts > 4)  # a mask, not row ids


@pytest.mark.parametrize(
    "counts", [torch.tensor([1.5, 1.5]), torch.tensor([0.6, 0.4]), torch.tensor([True, False]), torch.ones(2, 2)]
)
def test_counts_that_are_not_integer_reads_per_row_are_refused(counts):
    # Without the check 1.5 + 1.5 reads counted as 1 of 2 (0.33 instead of 0.5), 0.6 as 0 reads,
    # and a 2-D tensor was sorted row by row.
    with pytest.raises(UserError, match="counts must be a 1-D tensor of integer reads per row"):
        hit_rate(counts, torch.tensor([0]))
    with pytest.raises(UserError, match="counts must be a 1-D tensor of integer reads per row"):
        hottest_rows(counts, 1)


@pytest.mark.parametrize("device", ["gpu", "cuda:x", 3.5, "meta", True])
def test_hot_rows_refuse_a_device_torch_does_not_know_in_one_line(device):
    table = random_table(10, 3, torch.float32, seed=21)
    with pytest.raises(
        UserError, match=rf"^device must be 'cpu' or 'cuda' \(or 'cuda:N'\), got {re.escape(repr(device))}$"
    ):
        HotRows(table, torch.tensor([2, 7]), device)


def test_hot_rows_take_a_cuda_ordinal_as_torch_does():
    table = random_table(10, 3, torch.float32, seed=21)
    if torch.cuda.is_available():
        assert HotRows(table, torch.tensor([2, 7]), 0).cache.device == torch.device("cuda", 0)
    else:
        with pytest.raises(NeedsGpuError, match="^HotRows on 'cuda:0' needs a CUDA GPU"):
            HotRows(table, torch.tensor([2, 7]), 0)


def test_misses_counts_uncached_ids_and_refuses_ids_that_are_not_rows():
    table = random_table(10, 3, torch.float32, seed=20)
    hot = HotRows(table, torch.tensor([2, 7]), "cpu")
    assert int(hot.misses(torch.tensor([2, 3, 7, 9, 9], dtype=torch.int32))) == 3
    assert int(hot.misses(torch.tensor([], dtype=torch.int64))) == 0
    # Every integer type holds ids: torch reads a uint8 tensor as a mask and refuses int16 ones.
    for dtype in (torch.uint8, torch.int8, torch.int16):
        assert int(hot.misses(torch.tensor([3, 3, 3, 2], dtype=dtype))) == 3, dtype
    # Views as users pass them: strided, offset, expanded, 2-D transposed.
    ids = torch.tensor([9, 2, 4, 7, 3, 2, 8, 7, 1, 0, 5, 6])
    for view in (ids[::3], ids[5:], ids[1:2].expand(6), ids.view(3, 4).t(), ids[3::4]):
        expected = sum(int(i) not in (2, 7) for i in view.flatten().tolist())
        assert int(hot.misses(view)) == expected
    for ids, error, message in [
        (torch.tensor([True, False]), UserError, "integer row ids, got torch.bool"),
        (torch.tensor([1.0, 2.0]), UserError, "integer row ids, got torch.float32"),
        (torch.tensor([3, 10]), UserError, "id 10 is out of range for a table of 10 rows"),
        (torch.tensor([-1]), UserError, "id -1 is negative"),
    ]:
        with pytest.raises(error, match=re.escape(message)):
            hot.misses(ids)


def test_gather_of_meta_tensors_gives_a_meta_result_of_the_right_shape():
    """Shape inference on meta tensors: never rows of uninitialised memory on a real device."""
    for table, idx in [
        (torch.empty(5, 3, device="meta"), torch.tensor([1, 2])),
        (torch.empty(5, 3), torch.empty(4, dtype=torch.int64, device="meta")),
    ]:
        out = gather(table, idx)
        assert out.device.type == "meta" and out.shape == (idx.shape[0], 3)


@pytest.mark.parametrize("rows", [torch.tensor([1.9, 4.0]), torch.tensor([True, False, True])])
def test_hot_rows_refuse_float_rows_and_boolean_masks(rows):
    with pytest.raises(UserError, match="rows must be a tensor of integer row ids"):
        HotRows(random_table(10, 3, torch.float32, seed=11), rows, "cpu")


def test_gpu_only_entry_points_say_so_in_one_line_without_a_gpu(monkeypatch):
    """Not torch's AssertionError "Torch not compiled with CUDA enabled"."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NeedsGpuError, match="^HotRows on 'cuda' needs a CUDA GPU; none is available"):
        HotRows(torch.randn(10, 4), torch.tensor([1, 2]), "cuda")
    with pytest.raises(NeedsGpuError, match="^choose_for picks the gather path of a CUDA GPU, and none is available$"):
        dispatch.choose_for(torch.randn(10, 4))


def test_hot_rows_of_a_2d_id_tensor_cache_those_rows():
    table = random_table(20, 3, torch.bfloat16, seed=12)
    rows = torch.tensor([[5, 0], [17, 9]])
    hot = HotRows(table, rows, "cpu")
    for row in range(20):
        slot = int(hot.slots[row])
        assert (slot >= 0) == (row in (5, 0, 17, 9))
        if slot >= 0:
            assert torch.equal(hot.cache[slot], table[row])


# --- zero-copy row reads: the launcher hands the kernel dense ids ---------------------------------


def emulated_read_rows(module, name, grid, block, args):
    """The read_rows kernel on the CPU: reads ``num_rows`` ids back to back from the ids' address,
    as the GPU does, and copies those rows."""
    table_at, rows_at, num_rows, row_bytes, out_at = (int(a) for a in args)
    rows = np.ctypeslib.as_array((ctypes.c_int64 * num_rows).from_address(rows_at))
    for i, row in enumerate(rows.tolist()):
        ctypes.memmove(out_at + i * row_bytes, table_at + row * row_bytes, row_bytes)


@pytest.mark.parametrize("view", ["strided", "expanded", "offset"])
def test_read_rows_launch_reads_the_ids_of_a_view(monkeypatch, view):
    monkeypatch.setattr(nvrtc, "load_module", lambda source: None)
    monkeypatch.setattr(nvrtc, "device_pointer_of_pinned", lambda tensor: tensor.data_ptr())
    monkeypatch.setattr(nvrtc, "launch", emulated_read_rows)
    table = torch.randint(0, 256, (50, 24), dtype=torch.uint8, generator=torch.Generator().manual_seed(13))
    rows = INDEX_VIEWS[view](random_ids(50, 90, seed=14))
    out = torch.empty((rows.numel(), 24), dtype=torch.uint8)
    zero_copy_ops.launch_read_rows(table, rows, out, max_blocks=1)
    assert torch.equal(out, plain_rows(table, rows))


@CUDA
def test_read_rows_on_the_gpu_reads_a_strided_index():
    table = torch.randint(0, 256, (50, 32), dtype=torch.uint8).pin_memory()
    rows = random_ids(50, 90, seed=15).cuda()[::3]
    assert torch.equal(zero_copy_ops.read_rows(table, rows).cpu(), plain_rows(table, rows.cpu()))


# --- neighbour sampling ---------------------------------------------------------------------------


def random_csr(nodes, max_degree, seed):
    """A graph with isolated nodes, self-loops and repeated edges, neighbour lists unsorted."""
    g = torch.Generator().manual_seed(seed)
    degree = torch.randint(0, max_degree + 1, (nodes,), generator=g)
    degree[torch.randperm(nodes, generator=g)[: nodes // 4]] = 0
    indptr = torch.cat([torch.zeros(1, dtype=torch.long), degree.cumsum(0)])
    return indptr, torch.randint(0, nodes, (int(degree.sum()),), generator=g)


def check_subgraph(indptr, indices, seeds, fanouts, subgraph):
    """Every sampled edge is an edge of the graph; each node of a frontier got min(degree,
    fan-out) neighbours, each at most as often as it is in its neighbour list."""
    n_id = subgraph.n_id
    assert torch.equal(n_id[: seeds.numel()], seeds) and n_id.unique().numel() == n_id.numel()
    neighbours = [indices[indptr[v] : indptr[v + 1]].tolist() for v in range(indptr.numel() - 1)]
    sources, targets = n_id[subgraph.edge_index[0]].tolist(), n_id[subgraph.edge_index[1]].tolist()
    drawn = {}
    for source, target in zip(sources, targets):
        drawn.setdefault(target, []).append(source)
    start = 0
    for hop, fanout in enumerate(fanouts):
        frontier = n_id[start : start + subgraph.num_sampled_nodes[hop]].tolist()
        start += len(frontier)
        for node in frontier:
            got, real = Counter(drawn.get(node, [])), Counter(neighbours[node])
            assert sum(got.values()) == min(len(neighbours[node]), fanout)
            assert all(got[v] <= real[v] for v in got)


@pytest.mark.parametrize("native_kernel", [True, False])
def test_sampled_subgraphs_hold_real_edges_with_isolated_nodes_and_fanouts_above_the_degree(native_kernel):
    indptr, indices = random_csr(80, 6, seed=16)
    fanouts = [3, 10]  # 10: above every degree
    sampler = NeighborSampler(indptr, indices, fanouts, seed=4)
    isolated = torch.nonzero(indptr[1:] == indptr[:-1]).flatten()[:3]
    seeds = torch.cat([torch.randperm(80, generator=torch.Generator().manual_seed(17))[:12], isolated]).unique()
    for view in (seeds, torch.stack([seeds, seeds], 1)[:, 0], seeds.to(torch.int32)):
        subgraph = sampler.sample(view, batch=3, native_kernel=native_kernel)
        check_subgraph(indptr, indices, seeds, fanouts, subgraph)


def test_a_sampler_over_csr_views_samples_as_over_the_dense_csr():
    indptr, indices = random_csr(60, 8, seed=18)
    # Every other entry of interleaved arrays (one column of a [n, 2] array): not contiguous.
    indptr_view = torch.stack([indptr, -indptr]).t().reshape(-1)[::2]
    indices_view = torch.stack([indices, -indices - 1]).t().reshape(-1)[::2]
    assert not (indptr_view.is_contiguous() or indices_view.is_contiguous())
    seeds = torch.randperm(60, generator=torch.Generator().manual_seed(19))[:15]
    dense = NeighborSampler(indptr, indices, [4, 3], seed=2).sample(seeds, batch=1)
    for native_kernel in (True, False):
        got = NeighborSampler(indptr_view, indices_view, [4, 3], seed=2).sample(
            seeds, batch=1, native_kernel=native_kernel
        )
        assert torch.equal(got.n_id, dense.n_id) and torch.equal(got.edge_index, dense.edge_index)


def test_gpu_sampling_refuses_a_csr_it_would_read_by_plain_offsets():
    with pytest.raises(ValueError, match="must be contiguous"):
        sampling_ops._address(torch.arange(20)[::2])


def test_uva_sampler_refuses_a_csr_view(monkeypatch):
    indptr, indices = random_csr(20, 4, seed=20)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self: True)  # stands in for pinned memory
    with pytest.raises(UserError, match="place='uva' needs a contiguous CSR"):
        NeighborSampler(torch.stack([indptr, indptr], 1)[:, 0], indices, [2], place="uva")


@pytest.mark.parametrize(
    "indptr, indices, message",
    [
        ([0, 3, 1, 4], [0, 1, 2, 0], "never decrease"),  # unsorted indptr
        ([0, 2, 2, 3], [0, 1, 2, 0], "end at the number of indices"),  # short of the indices
        ([1, 2, 3, 4], [0, 1, 2, 0], "start at 0"),
        ([0, 1, 2, 4], [0, 1, 2, 3], r"node ids in \[0, 3\)"),
        ([0, 1, 2, 4], [0, 1, -1, 2], r"node ids in \[0, 3\)"),
        ([], [], "no nodes"),
        ([0], [], "no nodes"),
    ],
)
def test_a_sampler_refuses_an_inconsistent_csr(indptr, indices, message):
    with pytest.raises(UserError, match=message):
        NeighborSampler(torch.tensor(indptr, dtype=torch.long), torch.tensor(indices, dtype=torch.long), [2])


def test_a_sampler_refuses_int32_and_numpy_csrs_and_non_tensor_seeds_by_name():
    indptr, indices = random_csr(20, 4, seed=21)
    with pytest.raises(UserError, match="int64"):
        NeighborSampler(indptr.int(), indices.int(), [2])
    with pytest.raises(UserError, match="indptr must be a torch tensor"):
        NeighborSampler(indptr.numpy(), indices, [2])
    sampler = NeighborSampler(indptr, indices, [2])
    with pytest.raises(UserError, match="seeds must be a 1-D tensor of node ids, got list"):
        sampler.sample([1, 2], batch=0)
    for fanouts in ([0], [-2], [65], [2.0], [True], "22", []):
        with pytest.raises(UserError, match="fanouts must be"):
            NeighborSampler(indptr, indices, fanouts)


def test_a_sampler_takes_numpy_and_torch_integer_fanouts_as_plain_ones():
    indptr, indices = random_csr(30, 5, seed=22)
    seeds = torch.tensor([4, 0, 17])
    plain = NeighborSampler(indptr, indices, [3, 2], seed=5).sample(seeds, batch=2)
    for fanouts in ([np.int64(3), np.int32(2)], (3, torch.tensor(2))):
        other = NeighborSampler(indptr, indices, fanouts, seed=5)
        assert other.fanouts == [3, 2] and all(type(k) is int for k in other.fanouts)
        sub = other.sample(seeds, batch=2)
        assert torch.equal(sub.n_id, plain.n_id) and torch.equal(sub.edge_index, plain.edge_index)


def test_hot_rows_refuse_a_negative_id_on_the_cpu_instead_of_counting_the_last_row():
    hot = HotRows(torch.randn(6, 3), torch.tensor([5]), "cpu")
    assert int(hot.misses(torch.tensor([5, 0, 5]))) == 1
    with pytest.raises(UserError, match="id -1 is negative"):
        hot.misses(torch.tensor([5, -1]))


def test_the_op_samples_duplicate_and_strided_seeds_like_their_dense_copy():
    indptr, indices = random_csr(40, 9, seed=22)
    base = torch.randint(0, 40, (30,), generator=torch.Generator().manual_seed(23))[::2]
    seeds = torch.cat([base, base[:3]])  # the last three repeat the first three
    counts, neighbours = sample_neighbors(indptr, indices, torch.stack([seeds, seeds], 1)[:, 1], 4, False, 7)
    dense_counts, dense = sample_neighbors(indptr, indices, seeds.contiguous(), 4, False, 7)
    assert torch.equal(counts, dense_counts) and torch.equal(neighbours, dense)
    assert torch.equal(counts, (indptr[seeds + 1] - indptr[seeds]).clamp(max=4))
    first = (torch.cumsum(counts, 0) - counts).tolist()
    for k in range(3):  # a repeated seed draws what its first occurrence drew
        again = base.numel() + k
        assert (
            neighbours[first[k] : first[k] + counts[k]].tolist()
            == neighbours[first[again] : first[again] + counts[again]].tolist()
        )


def test_the_op_refuses_an_empty_indptr_in_words():
    empty = torch.empty(0, dtype=torch.long)
    with pytest.raises(ValueError, match="indptr must hold at least one entry"):
        sample_neighbors(empty, empty, torch.tensor([0]), 2, False, 1)


@CUDA
def test_the_gpu_op_samples_strided_seeds_like_their_dense_copy():
    indptr, indices = random_csr(40, 9, seed=24)
    indptr, indices = indptr.cuda(), indices.cuda()
    seeds = torch.randperm(40, generator=torch.Generator().manual_seed(25)).cuda()[::3]
    counts, neighbours = sample_neighbors(indptr, indices, seeds, 4, False, 7)
    dense_counts, dense = sample_neighbors(indptr, indices, seeds.contiguous(), 4, False, 7)
    assert torch.equal(counts, dense_counts) and torch.equal(neighbours, dense)


def test_negative_read_counts_and_a_negative_thread_cap_are_refused():
    from systems.pytorch_direct.hot_rows import hit_rate

    with pytest.raises(UserError, match="counts are reads per row and cannot be negative, got -5"):
        hit_rate(torch.tensor([-5, 10]), torch.tensor([1]))  # a share of 2.0 of the reads
    table = torch.randn(9, 3)
    with pytest.raises(ValueError, match="max_threads must be >= 0"):
        gather(table, torch.tensor([1, 2]), max_threads=-7)


def test_count_rows_takes_one_tensor_as_one_batch_in_one_count(monkeypatch):
    # Iterated, a tensor was its ids one at a time: right counts, at ids x rows cost (hours at a real batch).
    calls = []
    bincount = torch.bincount
    monkeypatch.setattr(torch, "bincount", lambda *a, **k: calls.append(1) or bincount(*a, **k))
    assert count_rows(torch.tensor([[3, 1], [3, 0]]), 5).tolist() == [1, 1, 0, 2, 0]
    assert len(calls) == 1
    assert count_rows([torch.tensor([3, 1]), torch.tensor([3, 0])], 5).tolist() == [1, 1, 0, 2, 0]


def test_hit_rate_stays_a_share_when_counts_are_near_int64s_limit():
    counts = torch.tensor([2**62, 2**62, 2**62, 2**61])  # their int64 sum wraps negative
    assert hit_rate(counts, torch.tensor([0])) == pytest.approx(2 / 7)
    assert hit_rate(counts, torch.tensor([0, 1, 2, 3])) == 1.0


def test_the_cpu_reference_reads_cached_rows_from_the_cache_as_the_kernel_does():
    """The reference ignored slots and cache and returned the table's row: a stale cache (the table
    written after the fill), or a slot naming the wrong cached row, which the kernel reads, passed
    every CPU test. Now it reads what the kernel reads; a slot past the cache reads the table."""
    table = random_table(10, 3, torch.float32, seed=3)
    hot, old = HotRows(table, torch.tensor([7, 2]), "cpu"), table[7].clone()
    with torch.no_grad():
        table[7] += 100.0  # written after the fill: the cache holds the old row 7
    idx = torch.tensor([7, 1, 2, 7], dtype=torch.int32)
    got = gather(table, idx, slots=hot.slots, cache=hot.cache)
    assert torch.equal(got[0], old) and torch.equal(got[3], old)
    assert torch.equal(got[1], table[1]) and torch.equal(got[2], table[2])
    slots = torch.full((10,), -1, dtype=torch.int32)
    slots[1], slots[4] = 0, 5  # row 1 at cache row 0 (another row's copy), row 4 past the cache
    cache = random_table(2, 3, torch.float32, seed=4)
    got = gather(table, torch.tensor([1, 4, 3]), slots=slots, cache=cache)
    assert torch.equal(got, torch.stack([cache[0], table[4], table[3]]))


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((np.zeros((4, 2), np.float32), torch.tensor([1])), {}, "table must be a torch tensor .* got ndarray"),
        ((torch.zeros(4, 2), [1]), {}, "idx must be a torch tensor .* got list"),
        ((torch.zeros(4, 2), torch.tensor([1])), {"loads": 5}, "loads must be one of naive, aligned, vectorized"),
        ((torch.zeros(4, 2), torch.tensor([1])), {"sort": "yes"}, "sort must be True or False, got 'yes'"),
        ((torch.zeros(4, 2), torch.tensor([1])), {"max_threads": 1.5}, "max_threads must be an integer"),
        ((torch.zeros(4, 2), torch.tensor([1])), {"slots": [0], "cache": torch.zeros(1, 2)}, "slots must be a torch"),
    ],
)
def test_arguments_of_the_wrong_type_are_named_in_one_line(args, kwargs, message):
    """The dispatcher's schema error took several lines (23 with a numpy table, printed whole) and
    named no argument."""
    with pytest.raises(TypeError, match=f"^{message}") as raised:
        gather(*args, **kwargs)
    assert "\n" not in str(raised.value)


def test_a_numpy_array_of_ids_is_one_batch_of_counts():
    """count_rows iterated an array's elements and refused the first as "got int64"."""
    assert torch.equal(count_rows(np.array([1, 2, 2, 4]), 5), torch.tensor([0, 1, 2, 0, 1]))
    assert torch.equal(count_rows([np.array([3]), torch.tensor([3])], 4), torch.tensor([0, 0, 0, 2]))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("view", ["strided", "offset", "expanded", "empty"])
def test_cached_rows_come_from_the_cache_for_every_index_view(view, dtype):
    """The cache path of the CPU reference, on the index tensors users pass; held to a plain
    per-row lookup written here, a table of an odd row width (7)."""
    table = random_table(11, 7, torch.float32, seed=5)
    hot = HotRows(table, torch.tensor([3, 9, 0]), "cpu")
    with torch.no_grad():
        table.mul_(-1.0)  # the cache keeps the rows as filled
    base = torch.tensor([9, 1, 3, 3, 10, 0, 5], dtype=dtype)
    idx = {
        "strided": base[::2],
        "offset": base[1:],
        "expanded": base[:1].expand(4),
        "empty": base[:0],
    }[view]
    got = gather(table, idx, slots=hot.slots, cache=hot.cache)
    cached = {3: 0, 9: 1, 0: 2}
    want = [hot.cache[cached[i]] if i in cached else table[i] for i in idx.tolist()]
    assert got.shape == (idx.numel(), 7)
    assert torch.equal(got, torch.stack(want) if want else table[:0])
