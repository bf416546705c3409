"""PyTorch-Direct's gather: CPU reference semantics and refusals; on a GPU, every kernel against
the reference, index tensors of any layout, UnifiedTensor's in-place pinning and its CUDA alias."""

import gc
import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from systems import nvrtc
from systems.pytorch_direct import UnifiedTensor
from systems.pytorch_direct import unified as unified_module
from systems.pytorch_direct.ops import (
    INDEX_DTYPES,
    KERNELS,
    gather,
    gather_op,
    launch_gather,
    launch_sorted_gather,
    word_bytes,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int64]
ALIAS_DTYPES = DTYPES + [torch.float64, torch.uint8, torch.int16, torch.int32, torch.bool]
ROW_SIZES = [1, 3, 31, 64, 602, 1025]  # elements per row
ORDERS = [{}, {"sort": True}, {"dedup": True}]  # as asked, sorted, sorted and de-duplicated

# Index tensors whose elements are not one dense block from data_ptr(), made from 3000 random ids.
INDEX_VIEWS = {
    "strided": lambda ids: ids[::3],
    "offset": lambda ids: ids[5:],
    "strided_offset": lambda ids: ids[7::5],
    "column": lambda ids: ids.view(1000, 3)[:, 1],
    "expanded": lambda ids: ids[:1].expand(100),
    "expanded_offset": lambda ids: ids[9:10].expand(2500),
    "empty": lambda ids: ids[:0],
    "empty_strided": lambda ids: ids[::3][:0],
}
INDEX_VIEWS_2D = {
    "transposed": lambda ids: ids[:2400].view(40, 60).t(),
    "strided_2d": lambda ids: ids[:600].view(20, 30)[::2, 1::3],
    "expanded_2d": lambda ids: ids[4:5].view(1, 1).expand(7, 9),
    "empty_2d": lambda ids: ids[:0].view(0, 4),
}


def each_value_once(*axes):
    """The cross product of ``axes`` (sequences of values) as pytest params, tiered: a diagonal
    that takes every value of every axis at least once runs in the fast tier, every other
    combination only in the full one (marker ``full``)."""
    sizes = [len(axis) for axis in axes]
    diagonal = {tuple(k % n for n in sizes) for k in range(max(sizes))}
    return [
        pytest.param(*(axis[i] for axis, i in zip(axes, index)), marks=() if index in diagonal else pytest.mark.full)
        for index in itertools.product(*(range(n) for n in sizes))
    ]


def random_table(rows, dim, dtype, seed=0, pin=False):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        table = torch.randn(rows, dim, generator=g).to(dtype)
    elif dtype == torch.bool:
        table = torch.randint(0, 2, (rows, dim), generator=g).bool()
    else:
        info = torch.iinfo(dtype)
        table = torch.randint(max(info.min, -(10**6)), min(info.max, 10**6), (rows, dim), generator=g, dtype=dtype)
    return table.pin_memory() if pin else table


def random_ids(rows, dtype, device="cpu", seed=0, n=3000):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, rows, (n,), generator=g).to(dtype=dtype, device=device)


def index_view(name, rows, dtype, device="cpu", seed=0):
    """The view ``name`` of random ids, checked not to be a plain tensor from its storage's start."""
    idx = {**INDEX_VIEWS, **INDEX_VIEWS_2D}[name](random_ids(rows, dtype, device, seed))
    assert idx.numel() == 0 or idx.storage_offset() > 0 or not idx.is_contiguous()
    return idx


def expected_rows(table, idx):
    """``table[idx]`` through a fresh list of the index values, whatever the view's layout."""
    return table[torch.tensor(idx.tolist(), dtype=torch.long).view(idx.shape)]


def same_bytes(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# --- CPU: the reference op ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype, index_dtype", each_value_once(DTYPES, INDEX_DTYPES))
def test_reference_is_plain_indexing_with_duplicates_and_any_order(dtype, index_dtype):
    table = random_table(500, 37, dtype, seed=1)
    idx = torch.randint(0, 500, (2000,), dtype=index_dtype)
    for kernel in KERNELS:
        for order in ORDERS:
            assert same_bytes(gather(table, idx, loads=kernel, **order), table[idx.long()])


@pytest.mark.parametrize("view, index_dtype", each_value_once(list(INDEX_VIEWS), INDEX_DTYPES))
def test_reference_reads_strided_offset_expanded_and_empty_index_views(view, index_dtype):
    table = random_table(500, 37, torch.float32, seed=12)
    idx = index_view(view, 500, index_dtype, seed=13)
    before = idx.clone()
    for kernel in KERNELS:
        for order in ORDERS:
            assert same_bytes(gather(table, idx, loads=kernel, **order), expected_rows(table, idx))
    assert torch.equal(idx, before)


def test_reference_ignores_out_of_range_values_outside_the_view():
    table = random_table(500, 8, torch.float32, seed=14)
    ids = random_ids(500, torch.int64, seed=15)
    ids[1::3] = 10**9  # not in ids[::3]
    assert same_bytes(gather(table, ids[::3]), expected_rows(table, ids[::3]))
    ids[3] = -7  # position 1 of ids[::3]
    with pytest.raises(IndexError, match="index -7 is out of range for a table of 500 rows"):
        gather(table, ids[::3])


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
        ((torch.ones(10, 4), torch.tensor([1])), {"loads": "fast"}, "loads must be one of"),
        ((torch.ones(10, 4), torch.tensor([1])), {"slots": torch.full((10,), -1, dtype=torch.int32)}, "go together"),
        (
            (torch.ones(10, 4), torch.tensor([1])),
            {"slots": torch.full((20,), -1, dtype=torch.int32)[::2], "cache": torch.ones(3, 4)},
            "contiguous",
        ),
        (
            (torch.ones(10, 4), torch.tensor([1])),
            {"slots": torch.full((10,), -1, dtype=torch.int32), "cache": torch.ones(4, 3).t()},
            "contiguous",
        ),
    ],
)
def test_reference_refuses_bad_arguments(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        gather(*args, **kwargs)


def misaligned_table() -> torch.Tensor:
    """float32 rows at an address 1 byte past a multiple of 4: each load of them faults on a GPU."""
    table = torch.frombuffer(bytearray(41), dtype=torch.float32, offset=1).view(5, 2)
    if table.data_ptr() % 4 == 0:
        pytest.skip("the buffer landed aligned after all")
    return table


def test_a_misaligned_table_and_the_naive_kernel_with_a_cache_are_refused():
    """The first faulted on the GPU (the context lost); the second ran the aligned kernel under
    the naive one's name."""
    with pytest.raises(ValueError, match=r"^the table's address is not a multiple of its element size \(4 B"):
        gather(misaligned_table(), torch.tensor([1]))
    cached = {"slots": torch.full((10,), -1, dtype=torch.int32), "cache": torch.ones(3, 4)}
    with pytest.raises(ValueError, match="^the naive kernel has no hot-row cache form"):
        gather(torch.ones(10, 4), torch.tensor([1]), loads="naive", **cached)


@pytest.mark.parametrize(
    "table, idx, message",
    [
        (torch.arange(40.0).view(10, 4)[:, :2], torch.tensor([1, 3]), "densely packed"),
        (torch.arange(40.0).view(10, 4)[::2], torch.tensor([1, 3]), "densely packed"),
        (torch.arange(40.0).view(10, 4)[:1].expand(10, 4), torch.tensor([1, 3]), "densely packed"),
        (torch.arange(40.0).view(10, 4), torch.tensor([1, 3], dtype=torch.int16), "int32 or int64"),
    ],
)
def test_the_launch_checks_the_table_and_index_it_reads_by_offsets(table, idx, message):
    """The launch read rows at r * row bytes of whatever it was given: a column slice gave other
    rows' values, an expanded table memory past its one row, an int16 index was read as int64."""
    out = torch.empty(2, table.shape[1], dtype=table.dtype)
    with pytest.raises(ValueError, match=message):
        launch_gather(table, idx, out)


def test_an_int32_index_into_a_table_of_2_31_rows_or_more_is_in_range():
    """``idx >= rows`` wrapped the row count to int32: index 5 was 'out of range'."""
    table = torch.empty(2**31 + 16, 0)  # no bytes
    assert gather(table, torch.tensor([5, 2**31 - 1], dtype=torch.int32)).shape == (2, 0)
    with pytest.raises(IndexError, match="index -1 is out of range"):
        gather(table, torch.tensor([5, -1], dtype=torch.int32))


@pytest.mark.parametrize(
    "out, message",
    [
        (torch.empty(2, 8)[:, ::2], "out must be contiguous"),
        (torch.empty(3, 4), r"out must be torch.float32 of shape \(2, 4\)"),
        (torch.empty(2, 4, dtype=torch.float64), "got torch.float64"),
    ],
)
def test_launch_refuses_an_out_it_cannot_fill_row_by_row(out, message):
    # Checked before anything touches a GPU, so it runs here too.
    with pytest.raises(ValueError, match=message):
        launch_gather(torch.ones(10, 4), torch.tensor([1, 2])[::1], out)


def test_reference_passes_opcheck():
    table = random_table(64, 9, torch.float32, seed=2)
    idx = torch.randint(0, 64, (100,))
    torch.library.opcheck(gather_op, (table, idx), {"loads": "aligned", "dedup": True})
    torch.library.opcheck(gather_op, (table, idx), {"loads": "naive", "sort": True, "max_threads": 64})


def test_word_width_is_the_widest_that_every_address_allows():
    assert word_bytes("vectorized", 4, 512, 0x1000, 0x2000) == 16
    assert word_bytes("vectorized", 4, 400, 0x1000, 0x2000) == 16
    assert word_bytes("vectorized", 4, 100, 0x1000, 0x2000) == 4
    assert word_bytes("vectorized", 2, 1204, 0x1000, 0x2000) == 4
    assert word_bytes("vectorized", 4, 512, 0x1008, 0x2000) == 8
    assert word_bytes("naive", 4, 512, 0x1000, 0x2000) == 4
    assert word_bytes("aligned", 1, 512, 0x1000, 0x2000) == 1
    assert word_bytes("vectorized", 4, 512, 0x1000, 0x2000, 0x3004) == 4  # a hot-row cache at an odd offset


def test_a_function_calling_the_op_compiles_with_inductor():
    # An op argument named "kernel" clashed with inductor's fallback (FallbackKernel.create(kernel, ...)).
    table = random_table(40, 7, torch.float32, seed=3).requires_grad_()
    idx = torch.tensor([3, 0, 39, 3, 11], dtype=torch.int32)
    compiled = torch.compile(lambda t, i: gather(t, i, loads="aligned") * 2.0, backend="inductor", fullgraph=True)
    try:
        out = compiled(table, idx)
    except Exception as err:  # noqa: BLE001 - only a missing C compiler may excuse it
        if "compiler" in str(err).lower() and "not found" in str(err).lower():
            pytest.skip(f"inductor cannot build here: {err}")
        raise
    assert torch.equal(out, table.detach()[idx.long()] * 2.0)
    out.sum().backward()
    expected = torch.zeros(40, 7).index_add_(0, idx.long(), torch.full((5, 7), 2.0))
    assert torch.equal(table.grad, expected)


def test_forward_mode_differentiation_is_refused_not_zero():
    from torch.autograd import forward_ad

    table, idx = random_table(12, 5, torch.float32, seed=4), torch.tensor([1, 7, 7])
    with pytest.raises(NotImplementedError, match="no forward-mode derivative"):
        torch.func.jvp(lambda t: gather(t, idx), (table,), (torch.ones_like(table),))
    with forward_ad.dual_level(), pytest.raises(NotImplementedError, match="no forward-mode derivative"):
        gather(forward_ad.make_dual(table, torch.ones_like(table)), idx)
    assert torch.equal(gather(table, idx), table[idx])  # and outside a transform it runs as before


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: torch.ones(100, 8)[10:], "view into a larger allocation"),
        (lambda: torch.ones(8, 100).t(), "not contiguous"),
        (lambda: torch.ones(0, 8), "empty table"),
        (lambda: torch.tensor(3.0), "empty table"),
        (misaligned_table, "not a multiple of its element size"),
    ],
)
def test_unified_tensor_refuses_what_cannot_be_pinned_safely(make, message):
    with pytest.raises(ValueError, match=message):
        UnifiedTensor(make())


def test_unified_tensor_refuses_non_tensors():
    with pytest.raises(TypeError, match="expected a torch.Tensor"):
        UnifiedTensor([1, 2, 3])


# --- CPU: the alias's lifetime rule, with a stand-in for the CUDA driver ------------------------


PAGE = 4096


class FakeDriver:
    """Stands in for the CUDA runtime: records what is registered; unregistering twice fails."""

    def __init__(self):
        self.registered = {}
        self.last_error = 0  # as the runtime: a failed call's error stays until read

    def cudaHostRegister(self, address, nbytes, flags):
        # As the driver: a byte is registered once; ranges that only share a page both register.
        for start, size in self.registered.items():
            if address < start + size and start < address + nbytes:
                self.last_error = 712  # cudaErrorHostMemoryAlreadyRegistered
                return self.last_error
        self.registered[address] = nbytes
        return 0

    def cudaGetLastError(self):
        error, self.last_error = self.last_error, 0
        return error

    def cudaHostUnregister(self, address):
        del self.registered[address]
        return 0


class HostBytes:
    """The alias's bytes through the CPU array interface: numpy and torch then hold this object
    (and so the alias's owner) for as long as a tensor uses the memory, as torch does on a GPU."""

    def __init__(self, memory):
        self.memory = memory
        self.__array_interface__ = {**memory.__cuda_array_interface__, "version": 3}


@pytest.fixture
def fake_driver(monkeypatch):
    driver = FakeDriver()
    monkeypatch.setattr(unified_module, "_cudart", lambda: driver)
    monkeypatch.setattr(unified_module, "_process_cudarts", lambda: (driver,))
    monkeypatch.setattr(nvrtc, "device_pointer_of_pinned", lambda tensor: tensor.data_ptr())
    monkeypatch.setattr(
        unified_module, "_wrap_device_bytes", lambda memory: torch.from_numpy(np.asarray(HostBytes(memory)))
    )
    yield driver
    gc.collect()
    assert not driver.registered, "a test left memory registered"


@pytest.mark.parametrize("dtype", ALIAS_DTYPES)
def test_alias_has_the_table_shape_and_dtype_over_the_same_memory(fake_driver, dtype):
    table = random_table(50, 12, dtype, seed=16).view(50, 3, 4)
    unified = UnifiedTensor(table)
    alias = unified.cuda_alias()
    assert (alias.shape, alias.dtype, alias.data_ptr()) == (table.shape, dtype, table.data_ptr())
    assert same_bytes(alias, table)
    del alias
    unified.close()


def _two_views_of_one_array(overlapping: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.from_numpy of two numpy slices of one array, in one page: each tensor owns a storage
    of exactly its bytes at offset 0, so neither looks like a view. Their bytes overlap, or they
    only share the page (which the driver accepts: it tracks registered bytes, not pages). The
    second starts before the first, so no query of its first byte finds it pinned: the driver decides."""
    array = np.random.default_rng(5).standard_normal(3 * PAGE // 4).astype(np.float32)  # three pages
    page = (-array.ctypes.data % PAGE) // 4  # the first element at a page's start: both views in that page
    first, second = (page + 24, page + 8) if overlapping else (page + 8, page + 200)
    return (
        torch.from_numpy(array[first : first + 32].reshape(8, 4)),
        torch.from_numpy(array[second : second + 32].reshape(8, 4)),
    )


def test_a_second_table_over_pinned_bytes_is_refused_in_one_line(fake_driver):
    first, second = _two_views_of_one_array(overlapping=True)
    unified = UnifiedTensor(first)
    with pytest.raises(ValueError, match=r"^part of the tensor's memory is already page-locked"):
        UnifiedTensor(second)
    assert list(fake_driver.registered) == [first.data_ptr()]
    assert fake_driver.last_error == 0, "the refused registration's error was left for torch's next launch check"
    unified.close()


def test_two_tables_that_only_share_a_page_both_register(fake_driver):
    first, second = _two_views_of_one_array(overlapping=False)
    with UnifiedTensor(first) as one, UnifiedTensor(second) as other:
        assert sorted(fake_driver.registered) == sorted([first.data_ptr(), second.data_ptr()])
        assert same_bytes(one.cuda_alias(), first) and same_bytes(other.cuda_alias(), second)


@pytest.mark.gpu
def test_the_driver_refuses_a_second_table_over_pinned_bytes_as_the_fake_one_does():
    """And the refusal leaves no CUDA error behind: the next kernel launch succeeds (the failed
    registration is the thread's last error until read, and torch's launch check would raise it)."""
    first, second = _two_views_of_one_array(overlapping=True)
    unified = UnifiedTensor(first)
    try:
        with pytest.raises(ValueError, match="already page-locked"):
            UnifiedTensor(second)
        assert torch.arange(5, device="cuda").mul(3).sum().item() == 30
    finally:
        unified.close()


@pytest.mark.gpu
def test_the_driver_registers_two_tables_that_only_share_a_page_as_the_fake_one_does():
    first, second = _two_views_of_one_array(overlapping=False)
    idx = torch.tensor([7, 0, 3, 3], device="cuda")
    with UnifiedTensor(first) as one, UnifiedTensor(second) as other:
        assert same_bytes(one[idx].cpu(), first[idx.cpu()]) and same_bytes(other[idx].cpu(), second[idx.cpu()])


def test_close_is_refused_while_an_alias_or_a_view_of_it_lives(fake_driver):
    table = random_table(100, 6, torch.float32, seed=17)
    unified = UnifiedTensor(table)
    alias = unified.cuda_alias()
    rows = alias[10:20].t()  # a view shares the alias's memory
    copy = alias[[1, 2]]  # a result computed from it does not
    del alias
    with pytest.raises(RuntimeError, match=r"cannot close: 1 alias\(es\) from cuda_alias\(\)"):
        unified.close()
    assert unified.registered and fake_driver.registered
    del rows
    unified.close()
    assert not unified.registered and not fake_driver.registered
    assert same_bytes(copy, table[[1, 2]])
    with pytest.raises(RuntimeError, match="closed"):
        unified.cuda_alias()
    unified.close()  # still idempotent


def test_an_alias_keeps_the_registration_after_its_unified_tensor_is_dropped(fake_driver):
    table = random_table(100, 6, torch.float32, seed=18)
    alias = UnifiedTensor(table).cuda_alias()
    gc.collect()
    assert fake_driver.registered  # the UnifiedTensor lives on inside the alias
    assert same_bytes(alias, table)
    del alias
    gc.collect()
    assert not fake_driver.registered


def test_an_alias_left_in_a_reference_cycle_does_not_block_close(fake_driver):
    unified = UnifiedTensor(random_table(100, 6, torch.float32, seed=19))
    cycle = [unified.cuda_alias()]
    cycle.append(cycle)
    del cycle
    unified.close()


def test_with_block_closes_after_the_alias_and_leaves_an_error_in_flight_alone(fake_driver):
    table = random_table(100, 6, torch.float32, seed=20)
    with UnifiedTensor(table) as unified:
        row = unified.cuda_alias()[3].clone()  # the alias itself is gone at the end of the line
    assert not fake_driver.registered and same_bytes(row, table[3])
    # The error is not buried under the refusal to close.
    with pytest.raises(KeyError, match="the error in flight"), UnifiedTensor(table) as unified:
        alias = unified.cuda_alias()
        raise KeyError("the error in flight")
    assert fake_driver.registered  # left for garbage collection, after the alias
    del alias, unified
    gc.collect()
    assert not fake_driver.registered


# --- GPU: the kernels against the reference (skipped without a GPU) -----------------------------


def poisoned_like(shape, dtype):
    out = torch.empty(shape, dtype=dtype, device="cuda")
    out.view(torch.uint8).fill_(0xA5)
    return out


@pytest.fixture
def poisoned_allocations(monkeypatch):
    """During the test, torch.empty and torch.empty_like hand out CUDA memory filled with 0xA5, so
    a row the op allocates but never writes fails the comparison instead of passing on the stale
    bytes of an earlier, identical result."""

    def poisoning(make):
        def make_poisoned(*args, **kwargs):
            tensor = make(*args, **kwargs)
            if tensor.is_cuda:
                tensor.untyped_storage().fill_(0xA5)
            return tensor

        return make_poisoned

    monkeypatch.setattr(torch, "empty", poisoning(torch.empty))
    monkeypatch.setattr(torch, "empty_like", poisoning(torch.empty_like))


def gpu_row_cache(table, hot_rows, seed=0):
    """``slots`` and ``cache`` holding ``hot_rows`` random rows of ``table`` in GPU memory."""
    rows = table.shape[0]
    hot = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))[:hot_rows]
    slots = torch.full((rows,), -1, dtype=torch.int32)
    slots[hot] = torch.arange(hot_rows, dtype=torch.int32)
    return slots.cuda(), table[hot].cuda()


# Every option of the op, alone and combined with the GPU row cache ("cached": slots and cache).
GPU_OPTIONS = {
    "asked": {},
    "sort": {"sort": True},
    "dedup": {"dedup": True},
    "max_threads": {"max_threads": 64},
    "cached": {"cached": True},
    "cached_sort": {"cached": True, "sort": True},
    "cached_dedup": {"cached": True, "dedup": True},
    "cached_sort_max_threads": {"cached": True, "sort": True, "max_threads": 64},
}


def op_options(name, table):
    options = dict(GPU_OPTIONS[name])
    if options.pop("cached", False):
        options["slots"], options["cache"] = gpu_row_cache(table, table.shape[0] // 4, seed=21)
    return options


def mid_line_table(dtype=torch.float32, seed=0):
    """1200 rows of 144 bytes, pinned, from the second row of an allocation: every row starts
    mid-line (the aligned kernels mask) and 16-byte words fit (the vectorized kernel uses them)."""
    return random_table(1201, 144 // dtype.itemsize, dtype, seed=seed, pin=True)[1:]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, dim, kernel", each_value_once(DTYPES, [1, 3, 16, 37, 100, 128, 602, 1024], KERNELS))
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
    slots, cache = gpu_row_cache(table, 500, seed=3)
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
def test_op_reads_the_table_for_a_slot_outside_the_cache():
    table = random_table(5000, 100, torch.float32, seed=5, pin=True)
    slots, cache = gpu_row_cache(table, 500, seed=5)
    cached = (slots >= 0).nonzero().flatten()
    wrong = slots.clone()
    wrong[cached[:50]] = 500  # one past the cache's last row
    wrong[cached[50:100]] = 2**31 - 1  # far past it
    idx = torch.cat([cached[:120], torch.randint(0, 5000, (3000,), device="cuda")])
    for order in ORDERS:
        out = gather(table, idx, **order, slots=wrong, cache=cache).cpu()
        assert same_bytes(out, table[idx.cpu()])  # no read past the cache, and the rows are right


@pytest.mark.gpu
@pytest.mark.parametrize("bad", [5000, -1, 2**40])
def test_gpu_out_of_range_index_raises_and_is_never_read(bad):
    table = random_table(5000, 16, torch.float32, seed=4, pin=True)
    idx = torch.randint(0, 5000, (1000,), device="cuda")
    idx[777] = bad
    for kernel in KERNELS:
        for order in ORDERS:
            with pytest.raises(IndexError, match=f"index {bad} is out of range for a table of 5000 rows"):
                gather(table, idx, loads=kernel, **order)
    out = poisoned_like((1000, 16), torch.float32)
    bounds_check = launch_gather(table, idx, out, check=False)
    with pytest.raises(IndexError, match=f"index {bad} is out of range"):
        bounds_check()  # the deferred check names the same value


@pytest.mark.gpu
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_gpu_names_the_first_bad_index_in_the_callers_order_on_every_path(index_dtype):
    # Several bad indices, the first in order neither the smallest nor the largest: sorting or
    # taking each value once reads them in another order, and must still name the one the CPU does.
    table = random_table(5000, 16, torch.float32, seed=5, pin=True)
    idx = torch.randint(0, 5000, (1000,), device="cuda", dtype=index_dtype)
    idx[[100, 400, 700]] = torch.tensor([7000, 9000, -3], dtype=index_dtype, device="cuda")
    with pytest.raises(IndexError, match="^index 7000 is out of range for a table of 5000 rows$"):
        gather(table.clone(), idx.cpu())  # the CPU reference, the one every path must agree with
    for kernel in KERNELS:
        for order in ORDERS:
            with pytest.raises(IndexError, match="^index 7000 is out of range"):
                gather(table, idx, loads=kernel, **order)
    for launch in (launch_gather, launch_sorted_gather):
        bounds_check = launch(table, idx, poisoned_like((1000, 16), torch.float32), check=False)
        with pytest.raises(IndexError, match="^index 7000 is out of range"):
            bounds_check()


@pytest.mark.gpu
@pytest.mark.parametrize("view, kernel, option", each_value_once(list(INDEX_VIEWS), KERNELS, list(GPU_OPTIONS)))
def test_every_kernel_and_option_reads_index_views(view, kernel, option, poisoned_allocations):
    table = mid_line_table(seed=22)
    options = op_options(option, table)
    for index_dtype in INDEX_DTYPES:
        idx = index_view(view, 1200, index_dtype, "cuda", seed=23)
        before = idx.clone()
        if kernel == "naive" and "cache" in options:
            with pytest.raises(ValueError, match="^the naive kernel has no hot-row cache form"):
                gather(table, idx, loads=kernel, **options)
            continue
        rows = gather(table, idx, loads=kernel, **options)
        assert same_bytes(rows.cpu(), expected_rows(table, idx))
        assert torch.equal(idx, before)  # only read


@pytest.mark.gpu
@pytest.mark.parametrize("view, kernel", each_value_once(list(INDEX_VIEWS), KERNELS))
def test_launches_read_index_views_into_poisoned_outputs(view, kernel):
    # What the workloads call directly, with the bounds check deferred as they do.
    table = mid_line_table(torch.float16, seed=24)
    for index_dtype in INDEX_DTYPES:
        idx = index_view(view, 1200, index_dtype, "cuda", seed=25)
        expected = expected_rows(table, idx)
        for launch in (launch_gather, launch_sorted_gather):
            out = poisoned_like(expected.shape, table.dtype)
            bounds_check = launch(table, idx, out, kernel=kernel, check=False)
            bounds_check()
            assert same_bytes(out.cpu(), expected), launch.__name__


@pytest.mark.gpu
def test_gpu_reads_only_the_ids_inside_the_view():
    table = random_table(5000, 16, torch.float32, seed=26, pin=True)
    ids = random_ids(5000, torch.int64, "cuda", seed=27)
    ids[1::3] = 10**9  # not in ids[::3]: never read, so never reported
    broadcast = ids[:1].expand(500)  # ids[1] = 10**9 sits right after its only element
    for kernel in KERNELS:
        for order in ORDERS:
            for idx in (ids[::3], broadcast):
                assert same_bytes(gather(table, idx, loads=kernel, **order).cpu(), expected_rows(table, idx))
    ids[3 * 250] = -7  # position 250 of ids[::3]
    for kernel in KERNELS:
        for order in ORDERS:
            with pytest.raises(IndexError, match="index -7 is out of range for a table of 5000 rows"):
                gather(table, ids[::3], loads=kernel, **order)


@pytest.mark.gpu
@pytest.mark.parametrize("view, dedup", each_value_once([*INDEX_VIEWS, *INDEX_VIEWS_2D], [False, True]))
def test_unified_tensor_takes_index_views_of_any_shape(view, dedup):
    table = random_table(1200, 12, torch.bfloat16, seed=28).view(1200, 3, 4)
    with UnifiedTensor(table, dedup=dedup) as unified:
        for index_dtype in INDEX_DTYPES:
            idx = index_view(view, 1200, index_dtype, "cuda", seed=29)
            rows = unified[idx]
            assert rows.shape == idx.shape + (3, 4)
            assert same_bytes(rows.cpu(), expected_rows(table, idx))


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
    torch.library.opcheck(gather_op, (table, idx), test_utils=("test_autograd_registration",))
    before = table.clone()
    real = gather(table, idx)
    assert torch.equal(table, before)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = gather(mode.from_tensor(table), mode.from_tensor(idx))
    assert (fake.shape, fake.dtype, fake.device) == (real.shape, real.dtype, real.device)


@pytest.fixture(scope="module")
def table_over_4_gib():
    """A 5 GiB float32 table whose last 100 rows, past 4 GiB, are random (the tests read those)."""
    rows = (5 << 30) // 2048
    table = torch.empty((rows, 512), dtype=torch.float32)
    table[-100:] = torch.randn(100, 512, generator=torch.Generator().manual_seed(30))
    return table


def tail_rows(table, count=100):
    return torch.arange(table.shape[0] - count, table.shape[0])


@pytest.mark.gpu
def test_table_larger_than_4_gib(table_over_4_gib):
    table = table_over_4_gib
    with UnifiedTensor(table) as unified:
        idx = tail_rows(table).flip(0).cuda()
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


# --- GPU: the CUDA alias of a UnifiedTensor -------------------------------------------------------


def assert_stock_ops_read(alias, table, candidates, seed=0):
    """Stock torch reads of ``alias`` give ``table``'s bytes: indexing (1-D, strided, 2-D index
    views), index_select and F.embedding with int32 and int64 ids drawn from ``candidates``, and
    slicing."""
    rows = table.shape[0]
    for index_dtype in INDEX_DTYPES:
        positions = random_ids(len(candidates), torch.int64, seed=seed)
        idx = candidates[positions].to(dtype=index_dtype, device=alias.device)
        expected = expected_rows(table, idx)
        assert same_bytes(alias[idx].cpu(), expected)
        assert same_bytes(alias.index_select(0, idx).cpu(), expected)
        assert same_bytes(F.embedding(idx, alias.view(rows, -1)).cpu(), expected.view(len(idx), -1))
        for view in (idx[::3], idx[:1].expand(50), idx[:600].view(20, 30).t()):
            assert same_bytes(alias[view].cpu(), expected_rows(table, view))
    for piece in (slice(5, 17), slice(-3, None), slice(None, None, 7)):
        assert same_bytes(alias[piece].cpu(), table[piece])
    assert same_bytes(alias[:, -1].cpu(), table[:, -1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, dim", each_value_once(ALIAS_DTYPES, ROW_SIZES))
def test_alias_is_the_registered_memory_for_stock_torch_ops(dtype, dim):
    table = random_table(1000, dim, dtype, seed=dim)
    unified = UnifiedTensor(table)
    alias = unified.cuda_alias()
    assert alias.device == torch.device("cuda", torch.cuda.current_device())
    assert (alias.shape, alias.dtype) == (table.shape, dtype)
    assert alias.data_ptr() == nvrtc.device_pointer_of_pinned(table)  # the same memory: no copy
    assert_stock_ops_read(alias, table, torch.arange(1000), seed=dim)
    del alias
    unified.close()
    assert not table.is_pinned()


@pytest.mark.gpu
def test_alias_of_a_table_larger_than_4_gib(table_over_4_gib):
    table = table_over_4_gib
    unified = UnifiedTensor(table)
    alias = unified.cuda_alias()
    assert_stock_ops_read(alias, table, tail_rows(table), seed=31)
    del alias
    unified.close()


@pytest.mark.gpu
def test_alias_writes_reach_the_host_table():
    table = random_table(1000, 24, torch.int64, seed=32)
    before = table[7].clone()
    unified = UnifiedTensor(table)
    alias = unified.cuda_alias()
    alias[7].add_(5)  # a kernel writing over PCIe into the host memory
    torch.cuda.synchronize()  # the CPU sees the writes once the kernel has finished
    assert torch.equal(table[7], before + 5)
    del alias
    unified.close()


@pytest.mark.gpu
def test_close_is_refused_while_an_alias_lives_and_the_alias_is_refused_after_close():
    table = random_table(1000, 24, torch.float32, seed=33)
    unified = UnifiedTensor(table)
    alias = unified.cuda_alias()
    rows = alias[10:20]  # a view holds the registration too
    del alias
    with pytest.raises(RuntimeError, match="cannot close: 1 alias"):
        unified.close()
    assert unified.registered and table.is_pinned()
    assert same_bytes(rows.cpu(), table[10:20])
    del rows
    unified.close()
    assert not table.is_pinned()
    with pytest.raises(RuntimeError, match="closed"):
        unified.cuda_alias()


@pytest.mark.gpu
def test_alias_keeps_the_table_registered_after_its_unified_tensor_is_dropped():
    table = random_table(1000, 24, torch.float32, seed=34)
    alias = UnifiedTensor(table).cuda_alias()
    gc.collect()
    assert table.is_pinned()
    assert_stock_ops_read(alias, table, torch.arange(1000), seed=34)
    del alias
    gc.collect()
    assert not table.is_pinned()
