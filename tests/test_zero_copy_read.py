"""zero_copy::read_rows: CPU reference semantics and errors; on a GPU, the kernel against it."""

import pytest
import torch

from systems.zero_copy.ops import launch_read_rows, read_rows
from tests.test_pytorch_direct import each_value_once


def _table(rows, row_bytes, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (rows, row_bytes), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.full), pytest.param(2, marks=pytest.mark.full)])
def test_reference_matches_plain_indexing_with_duplicates_and_any_order(seed):
    g = torch.Generator().manual_seed(100 + seed)
    table = _table(1000, 1 + seed * 37, seed)
    rows = torch.randint(0, 1000, (5000,), generator=g)  # duplicates certain
    out = read_rows(table, rows)
    assert out.shape == (5000, table.shape[1])
    assert torch.equal(out, table[rows])
    assert torch.equal(read_rows(table, rows[:0]), table[:0])


@pytest.mark.parametrize("bad, shown", [(1000, "1000"), (-1, "-1"), (10**12, str(10**12))])
def test_out_of_range_index_is_named(bad, shown):
    table = _table(1000, 16, 0)
    rows = torch.tensor([3, 999, bad, 5])
    with pytest.raises(IndexError, match=f"row index {shown} is out of range for a table of 1000 rows"):
        read_rows(table, rows)


@pytest.mark.parametrize(
    "table, rows, message",
    [
        (torch.zeros(10, 4, dtype=torch.float32), torch.tensor([1]), "2-D uint8"),
        (torch.zeros(40, dtype=torch.uint8), torch.tensor([1]), "2-D uint8"),
        (torch.zeros(10, 8, dtype=torch.uint8)[:, ::2], torch.tensor([1]), "contiguous"),
        (torch.zeros(10, 4, dtype=torch.uint8), torch.tensor([1], dtype=torch.int32), "1-D int64"),
        (torch.zeros(10, 4, dtype=torch.uint8), torch.tensor([[1]]), "1-D int64"),
    ],
)
def test_bad_arguments_are_refused(table, rows, message):
    with pytest.raises(ValueError, match=message):
        read_rows(table, rows)


def test_opcheck_on_cpu():
    table = _table(64, 48, 1)
    rows = torch.randint(0, 64, (100,))
    torch.library.opcheck(read_rows, (table, rows))


# --- GPU: the NVRTC kernel against the reference (skipped without a GPU) ---------------------


@pytest.mark.gpu
@pytest.mark.parametrize("row_bytes, offset_rows", each_value_once([1, 3, 16, 17, 100, 128, 512, 1000, 4096], [0, 1]))
def test_kernel_matches_reference(row_bytes, offset_rows):
    torch.manual_seed(row_bytes)
    base = torch.randint(0, 256, ((2000 + offset_rows) * row_bytes,), dtype=torch.uint8).pin_memory()
    # A view that starts one row in: misaligned for odd row sizes, so the byte path runs too.
    table = base[offset_rows * row_bytes :].view(2000, row_bytes)
    rows = torch.randint(0, 2000, (7000,), device="cuda")
    out = torch.full((7000, row_bytes), 0xA5, dtype=torch.uint8, device="cuda")  # poison
    launch_read_rows(table, rows, out)
    assert torch.equal(out.cpu(), table[rows.cpu()])
    assert torch.equal(read_rows(table, rows).cpu(), table[rows.cpu()])


@pytest.mark.gpu
def test_gpu_op_refuses_pageable_table_and_bad_index():
    table = torch.randint(0, 256, (100, 32), dtype=torch.uint8)
    with pytest.raises(ValueError, match="page-locked"):
        read_rows(table, torch.tensor([1], device="cuda"))
    with pytest.raises(IndexError, match="row index 100 is out of range"):
        read_rows(table.pin_memory(), torch.tensor([0, 100], device="cuda"))


@pytest.mark.gpu
def test_gpu_opcheck_and_fake_registration():
    table = torch.randint(0, 256, (64, 48), dtype=torch.uint8).pin_memory()
    rows = torch.randint(0, 64, (100,), device="cuda")
    # opcheck's schema and fake-tensor checks run the op on copies of the inputs, and a copy of a
    # pinned tensor is not pinned, which the op rightly refuses; so those two are checked here
    # by hand against the real output.
    torch.library.opcheck(read_rows, (table, rows), test_utils=("test_autograd_registration",))
    before = table.clone()
    real = read_rows(table, rows)
    assert torch.equal(table, before)  # the op did not write to its input
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = read_rows(mode.from_tensor(table), mode.from_tensor(rows))
    assert (fake.shape, fake.dtype, fake.device) == (real.shape, real.dtype, real.device)


@pytest.mark.gpu
def test_kernel_reads_beyond_4_gib():
    rows_total = (5 << 30) // 4096  # a 5 GiB table: offsets past 2^32 bytes
    table = torch.empty((rows_total, 4096), dtype=torch.uint8, pin_memory=True)
    last = torch.arange(rows_total - 64, rows_total)
    table[last] = torch.randint(0, 256, (64, 4096), dtype=torch.uint8)
    rows = last.flip(0).cuda()
    out = torch.full((64, 4096), 0xA5, dtype=torch.uint8, device="cuda")
    launch_read_rows(table, rows, out)
    assert torch.equal(out.cpu(), table[rows.cpu()])
