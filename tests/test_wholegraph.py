"""NVIDIA WholeGraph as a peer (systems/pytorch_direct/wholegraph.py): without a GPU or without
pylibwholegraph, a one-line reason instead of a crash; on a GPU with it, WholeGraph's gather from
its host-mapped copy returns the table's rows byte for byte."""

import sys

import pytest
import torch

from systems.pytorch_direct import wholegraph
from systems.pytorch_direct.gather_variants import GATHER_VARIANTS, Batch
from tests.test_pytorch_direct import each_value_once


@pytest.fixture
def fresh_state(monkeypatch):
    """A module state of its own: no communicator, no remembered failure."""
    monkeypatch.setattr(wholegraph, "_state", wholegraph._State())
    return wholegraph._state


def _assert_one_line_reason(reason):
    assert isinstance(reason, str) and reason.strip() and "\n" not in reason


# --- any machine ----------------------------------------------------------------------------------


def test_available_says_why_not_here():
    reason = wholegraph.available()
    if reason is None:
        pytest.skip("WholeGraph runs on this machine")
    _assert_one_line_reason(reason)
    assert "pylibwholegraph" in reason or "GPU" in reason or "WholeGraph" in reason


def test_missing_pylibwholegraph_is_reported_with_the_import_error(fresh_state, monkeypatch):
    monkeypatch.setitem(sys.modules, "pylibwholegraph", None)  # makes `import pylibwholegraph` fail
    monkeypatch.setitem(sys.modules, "pylibwholegraph.torch", None)
    reason = wholegraph.available()
    _assert_one_line_reason(reason)
    assert reason.startswith("pylibwholegraph not importable (") and "Error" in reason
    assert wholegraph.available() == reason  # remembered, not retried
    with pytest.raises(wholegraph.WholeGraphUnavailable, match="not importable"):
        wholegraph.WholeGraphTable(torch.ones(4, 2))
    assert wholegraph.version() is None


def test_no_gpu_is_reported(fresh_state, monkeypatch):
    monkeypatch.setattr(wholegraph, "_import", lambda: (object(), object()))
    monkeypatch.setenv("SUITE_HIDE_GPU", "1")
    reason = wholegraph.available()
    _assert_one_line_reason(reason)
    assert "no CUDA GPU" in reason


def test_a_failing_communicator_is_reported(fresh_state, monkeypatch):
    class Binding:
        create_communicator = object

        @staticmethod
        def create_unique_id():
            raise RuntimeError("ncclGetUniqueId failed\nsecond line")

    class Torch:
        WholeMemoryCommunicator = object

        @staticmethod
        def init(*args, **kwargs):
            pass

    monkeypatch.setattr(wholegraph, "_import", lambda: (Torch, Binding))
    monkeypatch.setattr(wholegraph.machine, "has_gpu", lambda: True)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    reason = wholegraph.available()
    _assert_one_line_reason(reason)
    assert reason.startswith("WholeGraph could not create a single-process communicator on cuda:0")
    assert "ncclGetUniqueId failed" in reason


def test_wholegraph_needs_a_gpu_batch():
    batch = Batch(table=torch.ones(8, 4), idx=torch.arange(3), device="cpu")
    with pytest.raises(ValueError, match="CUDA device"):
        wholegraph.make_wholegraph(batch)


def test_the_registry_entry_says_why_wholegraph_cannot_run_here():
    entry = GATHER_VARIANTS["wholegraph"]
    assert entry.role == "peer" and entry.table_copy is wholegraph.WholeGraphTable
    assert entry.missing("cpu") == "wholegraph needs a CUDA GPU"
    reason = entry.missing("cuda")
    if reason is not None:  # no pylibwholegraph, or no communicator: one line either way
        _assert_one_line_reason(reason)


def test_host_mapping_describes_plain_memory():
    table = torch.ones(1 << 20, dtype=torch.uint8)
    report = wholegraph.host_mapping(table.data_ptr())
    assert report["address"] == hex(table.data_ptr())
    assert "KernelPageSize" in report["mapping"] and "shmem_enabled" in report["thp"]


# --- GPU with pylibwholegraph -------------------------------------------------------------------

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
DIMS = [1, 3, 100, 128, 602]


def random_table(rows, dim, dtype, seed=0):
    """Random bytes, none of them zero (so bf16 tables hold NaNs of every payload too)."""
    g = torch.Generator().manual_seed(seed)
    nbytes = rows * dim * torch.empty((), dtype=dtype).element_size()
    return torch.randint(1, 256, (nbytes,), dtype=torch.uint8, generator=g).view(dtype).view(rows, dim)


def same_bytes(a, b):
    return a.shape == b.shape and torch.equal(a.cpu().contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.fixture
def wg():
    pytest.importorskip("pylibwholegraph")
    reason = wholegraph.available()
    if reason is not None:
        pytest.fail(f"pylibwholegraph imports but WholeGraph cannot run: {reason}")
    return wholegraph


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, dim", each_value_once(list(DTYPES), DIMS))
def test_gather_returns_the_rows_byte_for_byte(wg, dtype, dim):
    table = random_table(3001, dim, DTYPES[dtype], seed=dim)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 3001, (5000,), generator=g)  # int64 with duplicates, any order
    idx[:10] = 3000  # the last row too
    with wg.WholeGraphTable(table) as t:
        assert t.shape == (3001, dim) and t.dtype == DTYPES[dtype]
        assert same_bytes(t.host_view(), table)
        out = t.gather(idx.cuda())
        assert out.is_cuda and out.dtype == DTYPES[dtype]
        assert same_bytes(out, table[idx])
        out32 = t.gather(idx.to(torch.int32).cuda())
        assert same_bytes(out32, table[idx])
        distinct = torch.randperm(3001, generator=g)[:2000]
        assert same_bytes(t.gather(distinct.cuda(), check=False), table[distinct])


@pytest.mark.gpu
@pytest.mark.parametrize(
    "view",
    {
        "strided": lambda ids: ids[::3],
        "offset": lambda ids: ids[5:],
        "expanded": lambda ids: ids[7:8].expand(300),
        "transposed_2d": lambda ids: ids[:2400].view(40, 60).t(),
        "empty": lambda ids: ids[:0],
        "empty_2d": lambda ids: ids[:0].view(0, 4),
    }.items(),
    ids=lambda item: item[0],
)
def test_gather_reads_index_views(wg, view):
    name, make = view
    table = random_table(700, 37, torch.float32, seed=3)
    ids = torch.randint(0, 700, (3000,), generator=torch.Generator().manual_seed(4))
    idx_cpu = make(ids)
    idx = make(ids.cuda())
    with wg.WholeGraphTable(table) as t:
        out = t.gather(idx)
        assert out.shape == (*idx.shape, 37)
        expected = table[torch.tensor(idx_cpu.tolist(), dtype=torch.long).view(idx_cpu.shape)]
        assert same_bytes(out, expected), name


@pytest.mark.gpu
def test_gather_refuses_bad_indices_and_closed_tables(wg):
    table = random_table(100, 8, torch.float32)
    t = wg.WholeGraphTable(table)
    with pytest.raises(IndexError, match="100"):
        t.gather(torch.tensor([0, 100], device="cuda"))
    with pytest.raises(IndexError, match="-1"):
        t.gather(torch.tensor([-1, 3], device="cuda"))
    with pytest.raises(TypeError):
        t.gather(torch.tensor([1, 2]))  # host indices
    with pytest.raises(TypeError):
        t.gather(torch.tensor([1.0], device="cuda"))
    report = t.memory_report()
    assert report["bytes"] == 100 * 32 and report["gathers_sorted"]
    t.close()
    t.close()  # idempotent
    assert not t.open
    with pytest.raises(RuntimeError, match="closed"):
        t.gather(torch.tensor([1], device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", pytest.param("fp32", marks=pytest.mark.full)])
def test_make_wholegraph_follows_the_variants_contract(wg, dtype):
    table = random_table(4096, 602, DTYPES[dtype], seed=5)
    idx = torch.randperm(4096, generator=torch.Generator().manual_seed(6))[:1000].pin_memory()
    batch = Batch(table=table, idx=idx, device="cuda")
    run = wg.make_wholegraph(batch)
    try:
        out = run()
        assert same_bytes(out, table[idx])
        shared = wg.make_wholegraph(batch, run.table)  # one copy serves other batches
        assert same_bytes(shared(), table[idx])
        shared.close()  # not its table: stays open
        assert run.table.open
    finally:
        run.close()
    assert not run.table.open
