"""Inputs a user brings to the feature gather, the hot-row cache and the sampler that the suite's own
callers never make: unsigned id types, a zero-width table, a missing GPU, options given wrong, ids
on another GPU. Each result is held to plain torch (``index_select``, counting by hand)."""

from __future__ import annotations

import pytest
import torch

from harness.errors import NeedsGpuError, UserError
from systems.pytorch_direct import UnifiedTensor
from systems.pytorch_direct import hot_rows as hot
from systems.pytorch_direct import unified as unified_module
from systems.pytorch_direct.gather_variants import Batch, cpu_baselines
from systems.pytorch_direct.ops import gather
from systems.sampling.sampler import NeighborSampler

WIDE_UNSIGNED = (torch.uint16, torch.uint32, torch.uint64)


def small_csr():
    """In-neighbours of 5 nodes: a self-loop on 0, a duplicate edge into 2, node 4 isolated."""
    indptr = torch.tensor([0, 2, 3, 6, 7, 7])
    indices = torch.tensor([0, 1, 2, 1, 1, 3, 0])
    return indptr, indices


# --- the hot-row cache ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", WIDE_UNSIGNED)
def test_misses_and_counts_take_wide_unsigned_ids_and_reads(dtype):
    """torch has no min() of uint16/32/64: these failed with NotImplementedError ("min_all")."""
    table = torch.arange(24.0).reshape(8, 3)
    cache = hot.HotRows(table, torch.tensor([2, 5]), "cpu")
    ids = torch.tensor([2, 3, 5, 7, 7])
    assert int(cache.misses(ids.to(dtype))) == int((cache.slots[ids] < 0).sum()) == 3
    counts = torch.tensor([0, 4, 1, 4, 9, 0, 2, 0])
    assert torch.equal(hot.hottest_rows(counts.to(dtype), 3), hot.hottest_rows(counts, 3))
    assert hot.hit_rate(counts.to(dtype), torch.tensor([4, 1])) == 13 / 20


def test_uint64_ids_beyond_int64_are_named_as_given():
    """2^64 - 1 turned into -1 on the way to int64, and the error named rows "-1..-1"."""
    huge = torch.tensor([2**64 - 1], dtype=torch.uint64)
    table = torch.zeros(4, 2)
    message = "holds 18446744073709551615, too large for an int64"
    with pytest.raises(UserError, match=message):
        hot.count_rows([huge], 4)
    with pytest.raises(UserError, match=message):
        hot.HotRows(table, huge, "cpu")
    with pytest.raises(UserError, match=message):
        hot.HotRows(table, torch.tensor([1]), "cpu").misses(huge)
    with pytest.raises(UserError, match=message):
        hot.hottest_rows(torch.tensor([1, 2**64 - 1], dtype=torch.uint64), 1)


# --- the sampler --------------------------------------------------------------------------------


def test_a_uint64_seed_beyond_int64_is_named_as_given():
    sampler = NeighborSampler(*small_csr(), [2])
    with pytest.raises(UserError, match="^seed node 9223372036854775809 is out of range for a graph of 5 nodes$"):
        sampler.sample(torch.tensor([2**63 + 1], dtype=torch.uint64), 0)


def test_seeds_on_the_meta_device_are_refused_in_words():
    """Not torch's "Tensor.item() cannot be called on meta tensors"."""
    with pytest.raises(UserError, match="^seeds must be node ids in host or GPU memory, got a tensor on meta$"):
        NeighborSampler(*small_csr(), [2]).sample(torch.tensor([1]).to("meta"), 0)


def test_uva_sampling_without_a_gpu_says_a_gpu_is_missing(monkeypatch):
    """It said to pin the CSR, which cannot be done without a GPU either."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NeedsGpuError, match="^place='uva' samples on a CUDA GPU, and torch sees none here"):
        NeighborSampler(*small_csr(), [2], place="uva")


# --- UnifiedTensor and the gather variants ------------------------------------------------------


def test_unified_tensor_without_a_gpu_raises_the_suites_gpu_error(monkeypatch):
    """A plain RuntimeError before: entry points print UserErrors in one line, tracebacks otherwise."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NeedsGpuError, match="^UnifiedTensor needs a CUDA GPU; none is available") as raised:
        UnifiedTensor(torch.zeros(6, 4))
    assert isinstance(raised.value, RuntimeError)  # as it always was, for callers that catch that


@pytest.mark.parametrize(
    "options, message",
    [
        ({"kernel": "fast"}, r"kernel must be one of \('naive', 'aligned', 'vectorized'\), got 'fast'"),
        ({"max_threads": -5}, "max_threads must be a whole number >= 0"),
        ({"max_threads": 1.5}, "max_threads must be a whole number >= 0"),
        ({"dedup": "yes"}, "dedup must be a bool, got 'yes'"),
    ],
)
def test_unified_tensor_refuses_kernel_options_when_made(options, message, monkeypatch):
    """They were refused only at the first gather, and without a GPU the missing GPU hid them."""
    monkeypatch.setattr(unified_module, "_cudart", lambda: pytest.fail("the driver is not reached"))
    with pytest.raises(ValueError, match=message):
        UnifiedTensor(torch.zeros(6, 4), **options)


def test_the_pipelined_cpu_gather_takes_a_table_of_rows_without_features():
    """Rows per chunk divided by the row size: a zero-width table raised ZeroDivisionError."""
    batch = Batch(torch.zeros(10, 0), torch.tensor([3, 1, 3]), "cpu")
    assert cpu_baselines.chunk_rows(batch) >= batch.idx.numel()
    run = cpu_baselines.make_cpu_gather(batch)
    assert torch.equal(run(), batch.table.index_select(0, batch.idx))


# --- ids on another GPU (needs two) -------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_ids_on_a_gpu_other_than_the_current_one_are_refused():
    """The kernels run on the current GPU and would read the other GPU's memory by its addresses."""
    table = torch.randn(64, 8).pin_memory()
    with torch.cuda.device(0):
        with pytest.raises(ValueError, match="idx is on cuda:1, the current GPU is cuda:0"):
            gather(table, torch.tensor([3, 1], device="cuda:1"))
    with torch.cuda.device(1):
        idx = torch.tensor([3, 1, 3], device="cuda:1")
        assert torch.equal(gather(table, idx).cpu(), table.index_select(0, idx.cpu()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cpu_sampler_given_gpu_seeds_samples_them_not_a_buffer_still_being_filled():
    """The seeds came to the host with a copy that does not block, and the C++ kernel read them at once."""
    nodes = 200_000
    indptr = torch.arange(0, 2 * nodes + 1, 2)
    indices = torch.randint(0, nodes, (2 * nodes,), generator=torch.Generator().manual_seed(3))
    sampler = NeighborSampler(indptr, indices, [2])
    seeds = torch.randperm(nodes, generator=torch.Generator().manual_seed(4))[: nodes // 2]
    want = sampler.sample(seeds, 5)
    for _ in range(3):
        got = sampler.sample(seeds.cuda(), 5)
        assert torch.equal(got.n_id, want.n_id) and torch.equal(got.edge_index, want.edge_index)
