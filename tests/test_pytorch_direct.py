"""PyTorch-Direct's gather: CPU reference semantics and refusals; on a GPU, every kernel against
the reference, and UnifiedTensor's in-place pinning."""

import gc

import pytest
import torch

from systems.pytorch_direct import UnifiedTensor
from systems.pytorch_direct.ops import KERNELS, gather, launch_gather, word_bytes

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int64]
ORDERS = [{}, {"sort": True}, {"dedup": True}]  # as asked, sorted, sorted and de-duplicated


def random_table(rows, dim, dtype, seed=0, pin=False):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        table = torch.randn(rows, dim, generator=g).to(dtype)
    else:
        info = torch.iinfo(dtype)
        table = torch.randint(max(info.min, -(10**6)), min(info.max, 10**6), (rows, dim), generator=g, dtype=dtype)
    return table.pin_memory() if pin else table


def same_bytes(a, b):
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# --- CPU: the reference op ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_reference_is_plain_indexing_with_duplicates_and_any_order(dtype, index_dtype):
    table = random_table(500, 37, dtype, seed=1)
    idx = torch.randint(0, 500, (2000,), dtype=index_dtype)
    for kernel in KERNELS:
        for order in ORDERS:
            assert same_bytes(gather(table, idx, kernel=kernel, **order), table[idx.long()])


@pytest.mark.parametrize("bad", [500, -1, 2**40])
def test_reference_names_an_out_of_range_index(bad):
    table = random_table(500, 4, torch.float32)
    with pytest.raises(IndexError, match=f"index {bad} is out of range for a table of 500 rows"):
        gather(table, torch.tensor([0, bad, 3]))


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((torch.ones(10), torch.tensor([1])), {}, "2-D"),
        ((torch.ones(10, 4)[:, ::2], torch.tensor([1])), {}, "contiguous"),
        ((torch.ones(10, 4), torch.tensor([1.0])), {}, "int32 or int64"),
        ((torch.ones(10, 4), torch.tensor([[1]])), {}, "1-D"),
        ((torch.ones(10, 4), torch.tensor([1])), {"kernel": "fast"}, "kernel must be one of"),
        ((torch.ones(10, 4), torch.tensor([1])), {"slots": torch.full((10,), -1, dtype=torch.int32)}, "go together"),
    ],
)
def test_reference_refuses_bad_arguments(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        gather(*args, **kwargs)


def test_reference_passes_opcheck():
    table = random_table(64, 9, torch.float32, seed=2)
    idx = torch.randint(0, 64, (100,))
    torch.library.opcheck(gather, (table, idx), {"kernel": "aligned", "dedup": True})
    torch.library.opcheck(gather, (table, idx), {"kernel": "naive", "sort": True, "max_threads": 64})


def test_word_width_is_the_widest_that_every_address_allows():
    assert word_bytes("vectorized", 4, 512, 0x1000, 0x2000) == 16
    assert word_bytes("vectorized", 4, 400, 0x1000, 0x2000) == 16
    assert word_bytes("vectorized", 4, 100, 0x1000, 0x2000) == 4
    assert word_bytes("vectorized", 2, 1204, 0x1000, 0x2000) == 4
    assert word_bytes("vectorized", 4, 512, 0x1008, 0x2000) == 8
    assert word_bytes("naive", 4, 512, 0x1000, 0x2000) == 4
    assert word_bytes("aligned", 1, 512, 0x1000, 0x2000) == 1


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: torch.ones(100, 8)[10:], "view into a larger allocation"),
        (lambda: torch.ones(8, 100).t(), "not contiguous"),
        (lambda: torch.ones(0, 8), "empty table"),
        (lambda: torch.tensor(3.0), "empty table"),
    ],
)
def test_unified_tensor_refuses_what_cannot_be_pinned_safely(make, message):
    with pytest.raises(ValueError, match=message):
        UnifiedTensor(make())


def test_unified_tensor_refuses_non_tensors():
    with pytest.raises(TypeError, match="expected a torch.Tensor"):
        UnifiedTensor([1, 2, 3])


# --- GPU: the kernels against the reference (skipped without a GPU) -----------------------------


def poisoned_like(shape, dtype):
    out = torch.empty(shape, dtype=dtype, device="cuda")
    out.view(torch.uint8).fill_(0xA5)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [1, 3, 16, 37, 100, 128, 602, 1024])
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_matches_reference(dtype, dim, kernel):
    torch.manual_seed(dim)
    # One row of offset makes the table start mid-line for most row sizes.
    base = random_table(1201, dim, dtype, seed=dim, pin=True)
    table = base[1:]
    idx = torch.randint(0, 1200, (3000,), device="cuda")  # duplicates and any order
    for index_dtype in (torch.int32, torch.int64):
        out = poisoned_like((3000, dim), dtype)
        launch_gather(table, idx.to(index_dtype), out, kernel=kernel)
        assert same_bytes(out.cpu(), table[idx.cpu()])


@pytest.mark.gpu
@pytest.mark.parametrize("order", ORDERS, ids=["asked", "sort", "dedup"])
def test_op_cached_rows_and_thread_cap_give_the_same_rows(order):
    table = random_table(5000, 100, torch.float32, seed=3, pin=True)
    idx = torch.randint(0, 5000, (20000,), device="cuda")
    expected = table[idx.cpu()]
    hot = torch.randperm(5000)[:500].cuda()
    slots = torch.full((5000,), -1, dtype=torch.int32, device="cuda")
    slots[hot] = torch.arange(500, dtype=torch.int32, device="cuda")
    cache = table[hot.cpu()].cuda()
    cache_poisoned = cache.clone()
    assert same_bytes(gather(table, idx, **order, slots=slots, cache=cache).cpu(), expected)
    # The cached copy is really read: corrupt it and the cached rows change.
    cache_poisoned.view(torch.uint8).fill_(0xA5)
    out = gather(table, idx, **order, slots=slots, cache=cache_poisoned).cpu()
    hit = (slots[idx] >= 0).cpu()
    assert same_bytes(out[~hit], expected[~hit]) and not same_bytes(out[hit], expected[hit])
    for cap in (32, 256, 1024):
        assert same_bytes(gather(table, idx, **order, max_threads=cap).cpu(), expected)


@pytest.mark.gpu
@pytest.mark.parametrize("bad", [5000, -1, 2**40])
def test_gpu_out_of_range_index_raises_and_is_never_read(bad):
    table = random_table(5000, 16, torch.float32, seed=4, pin=True)
    idx = torch.randint(0, 5000, (1000,), device="cuda")
    idx[777] = bad
    for kernel in KERNELS:
        for order in ORDERS:
            with pytest.raises(IndexError, match=f"index {bad} is out of range for a table of 5000 rows"):
                gather(table, idx, kernel=kernel, **order)
    out = poisoned_like((1000, 16), torch.float32)
    bounds_check = launch_gather(table, idx, out, check=False)
    with pytest.raises(IndexError, match=f"index {bad} is out of range"):
        bounds_check()  # the deferred check names the same value


@pytest.mark.gpu
def test_gpu_refuses_pageable_table():
    with pytest.raises(ValueError, match="page-locked"):
        gather(random_table(10, 4, torch.float32), torch.tensor([1], device="cuda"))


@pytest.mark.gpu
def test_gpu_opcheck_and_fake_registration():
    table = random_table(64, 48, torch.float32, seed=5, pin=True)
    idx = torch.randint(0, 64, (100,), device="cuda")
    # opcheck's schema and fake-tensor checks run the op on copies of the inputs; a copy of a
    # pinned tensor is not pinned, which the op rightly refuses. Those two are checked by hand.
    torch.library.opcheck(gather, (table, idx), test_utils=("test_autograd_registration",))
    before = table.clone()
    real = gather(table, idx)
    assert torch.equal(table, before)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = gather(mode.from_tensor(table), mode.from_tensor(idx))
    assert (fake.shape, fake.dtype, fake.device) == (real.shape, real.dtype, real.device)


@pytest.mark.gpu
def test_table_larger_than_4_gib():
    rows = (5 << 30) // 2048
    table = torch.empty((rows, 512), dtype=torch.float32)
    tail = torch.arange(rows - 100, rows)
    table[tail] = torch.randn(100, 512)
    with UnifiedTensor(table) as unified:
        idx = tail.flip(0).cuda()
        assert same_bytes(unified[idx].cpu(), table[idx.cpu()])


@pytest.mark.gpu
def test_unified_tensor_pins_in_place_and_unregisters_exactly_once():
    table = random_table(1000, 3, torch.bfloat16, seed=6).view(1000, 3)
    pointer = table.data_ptr()
    unified = UnifiedTensor(table)
    assert table.is_pinned() and unified.tensor.data_ptr() == pointer  # no copy
    idx = torch.randint(0, 1000, (50,), device="cuda")
    assert same_bytes(unified[idx].cpu(), table[idx.cpu()])
    with pytest.raises(ValueError, match="already page-locked"):
        UnifiedTensor(table)
    unified.close()
    assert not table.is_pinned() and not unified.registered
    unified.close()  # idempotent: a second unregister would fail
    with pytest.raises(RuntimeError, match="closed"):
        unified[idx]
    again = UnifiedTensor(table)  # can be pinned again once released
    del again
    gc.collect()
    assert not table.is_pinned()  # released by garbage collection too


@pytest.mark.gpu
def test_unified_tensor_refuses_cuda_tensors_and_keeps_row_shape():
    with pytest.raises(ValueError, match="already on cuda"):
        UnifiedTensor(torch.ones(4, 4, device="cuda"))
    table = random_table(200, 12, torch.float32, seed=7).view(200, 3, 4)
    with UnifiedTensor(table) as unified:
        idx = torch.randint(0, 200, (30,), device="cuda", dtype=torch.int32)
        out = unified[idx]
        assert out.shape == (30, 3, 4) and same_bytes(out.cpu(), table[idx.long().cpu()])
        with pytest.raises(TypeError, match="CUDA tensor"):
            unified[idx.cpu()]
