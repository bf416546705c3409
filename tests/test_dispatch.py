"""The measured dispatch of ``UnifiedTensor[idx]``: the committed tables are what the committed
results give, lookups take the nearest measured cell, and on a GPU every path returns the same
rows as the reference, refuses out-of-range indices without a device assert, and reads index
views of any layout."""

import itertools
import json
import threading
from pathlib import Path

import pytest
import torch

from systems.pytorch_direct import UnifiedTensor, dispatch
from systems.pytorch_direct.ops import INDEX_DTYPES, index_select_alias
from tests.test_pytorch_direct import (
    INDEX_VIEWS,
    INDEX_VIEWS_2D,
    each_value_once,
    expected_rows,
    index_view,
    poisoned_allocations,  # noqa: F401 (a fixture)
    random_table,
    same_bytes,
)
from workloads.feature_gather import dispatch_table

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted(dispatch.TABLES.glob("*.json"))
GiB = 1 << 30


# --- CPU: the tables and the lookup ------------------------------------------------------------


def test_there_is_a_committed_table_for_the_h200():
    assert dispatch.table_file("NVIDIA H200") in COMMITTED


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_committed_table_is_what_its_results_give(path, monkeypatch):
    committed = json.loads(path.read_text())
    monkeypatch.chdir(ROOT)  # the table names its sources relative to the repository
    rebuilt = dispatch_table.build([Path(f) for f in committed["built_from"]])
    assert dispatch_table.render(rebuilt) == path.read_text()
    for cell in committed["cells"]:  # the choice is the fastest measured path, every time
        assert cell["gbps"][cell["path"]] == max(cell["gbps"].values())


def test_builder_finds_every_process_and_refuses_an_empty_folder(tmp_path, capsys):
    files = dispatch_table.process_files(ROOT / "results/h200/feature_gather")
    assert len(files) >= 3 and any("reruns" in str(f) for f in files)
    assert dispatch_table.main([str(tmp_path)]) == 2
    assert "no table_sizes-*.csv or row_sizes-*.csv" in capsys.readouterr().err


def test_lookup_takes_the_nearest_measured_cell():
    table = dispatch.load_table("NVIDIA H200")
    for cell in table["cells"]:
        assert dispatch.choose(cell["row_bytes"], cell["table_bytes"], "NVIDIA H200").path == cell["path"]
    # 640 B rows (16-byte aligned) are nearest to 512 B; a 3 GiB table nearest to the 4 GiB cell.
    by_cell = {(c["row_bytes"], c["table_bytes"]): c["path"] for c in table["cells"]}
    choice = dispatch.choose(640, 3 * GiB, "NVIDIA H200")
    assert choice.path == by_cell[(512, 4 * GiB)]
    assert "512 B rows, 4 GiB table" in choice.reason
    # A row of 2392 B is nearer 2408 B than 2048 B in size, but rows are matched by alignment first:
    # 2392 and 2408 are multiples of 8, not 16; 2400 is a multiple of 16, like 2048.
    assert "2408 B rows" in dispatch.choose(2392, 4 * GiB, "NVIDIA H200").reason
    assert "2048 B rows" in dispatch.choose(2400, 4 * GiB, "NVIDIA H200").reason
    # Beyond the measured range the edge cell decides.
    assert dispatch.choose(16, 1 << 20, "NVIDIA H200").path == by_cell[(32, 4 * GiB)]


@pytest.mark.parametrize("row_bytes, expected", [(1, 1), (2, 2), (12, 4), (200, 8), (2408, 8), (1204, 4), (4096, 16)])
def test_alignment_is_the_widest_word_a_row_allows(row_bytes, expected):
    assert dispatch.alignment(row_bytes) == expected


def test_a_gpu_without_a_table_gets_the_kernel_and_says_why():
    choice = dispatch.choose(512, GiB, "Some Future GPU")
    assert choice.path == "kernel" and "no dispatch table for 'Some Future GPU'" in choice.reason


@pytest.mark.parametrize("row_bytes, table_bytes", [(0, GiB), (512, 0), (-4, GiB)])
def test_lookup_refuses_sizes_that_are_not_positive(row_bytes, table_bytes):
    with pytest.raises(ValueError, match="must be positive"):
        dispatch.choose(row_bytes, table_bytes, "NVIDIA H200")


def test_gather_rows_refuses_what_a_path_cannot_do():
    table, idx = random_table(50, 4, torch.float32, seed=1), torch.arange(5)
    with pytest.raises(ValueError, match="unknown gather path 'fastest'"):
        dispatch.gather_rows("fastest", table, None, idx)
    with pytest.raises(ValueError, match="reads the table through its CUDA alias; none was given"):
        dispatch.gather_rows("torch", table, None, idx)
    with pytest.raises(ValueError, match=r"kernel options \['max_threads'\] do not apply"):
        dispatch.gather_rows("torch_sorted", table, table, idx, max_threads=64)
    # The kernel paths run the op's CPU reference on CPU tensors.
    assert torch.equal(dispatch.gather_rows("kernel_sorted", table, None, idx.flip(0)), table[idx.flip(0)])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"path": "fastest"}, "path must be 'auto' or one of"),
        ({"path": "torch", "max_threads": 64}, r"kernel options \['max_threads'\] apply to the kernel paths"),
    ],
)
def test_unified_tensor_refuses_a_path_it_cannot_take(kwargs, message, monkeypatch):
    from systems.pytorch_direct import unified as unified_module

    monkeypatch.setattr(unified_module, "_cudart", lambda: pytest.fail("the driver is not reached"))
    with pytest.raises(ValueError, match=message):
        UnifiedTensor(random_table(10, 4, torch.float32), **kwargs)


@pytest.mark.parametrize("lazy", ["conj", "neg"])
def test_a_table_with_a_lazy_conjugate_or_negative_bit_is_refused_before_it_is_pinned(lazy, monkeypatch):
    """The paths read the table's raw bytes, which do not have the bit applied: a .conj() view
    would give the unconjugated rows on the torch paths, so it is refused in one line. (The op
    itself gets torch's resolved copy: right on the CPU, refused as not pinned on a GPU.)"""
    from systems.pytorch_direct import unified as unified_module
    from systems.pytorch_direct.ops import gather

    table = torch.randn(6, 3, dtype=torch.complex64, generator=torch.Generator().manual_seed(3))
    view = table.conj() if lazy == "conj" else torch._neg_view(table)
    assert view.is_conj() or view.is_neg()
    monkeypatch.setattr(unified_module, "_cudart", lambda: pytest.fail("the driver is not reached"))
    call = "resolve_conj" if lazy == "conj" else "resolve_neg"
    with pytest.raises(ValueError, match=rf"^the tensor has torch's lazy .* bit set .* pass tensor\.{call}\(\)$"):
        UnifiedTensor(view)
    idx = torch.tensor([1, 0, 1])
    assert torch.equal(gather(view, idx), view.resolve_conj().resolve_neg()[idx])


# --- GPU: every path against the reference (skipped without a GPU) ------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("path", dispatch.PATHS)
@pytest.mark.parametrize("when", ["before", "after"])
def test_every_path_gives_a_table_that_requires_grad_its_gradient(path, when):
    """A learnable table in host memory (an embedding): ``unified[idx]`` trains it on every path,
    with requires_grad_() set before or after pinning (the torch paths' alias has no autograd link,
    so they give way to the kernel); under no_grad the chosen path runs and nothing is recorded."""
    table = random_table(300, 8, torch.float32, seed=50)
    if when == "before":
        table.requires_grad_()
    with UnifiedTensor(table, path=path) as unified:
        if when == "after":
            table.requires_grad_()
        idx = torch.randint(0, 300, (500,), generator=torch.Generator().manual_seed(51)).cuda()  # repeats
        weights = torch.randn(500, 8, generator=torch.Generator().manual_seed(52)).cuda()
        rows = unified[idx]
        assert rows.requires_grad and unified.path == path
        (rows * weights).sum().backward()
        want = torch.zeros(300, 8).index_add_(0, idx.cpu(), weights.cpu())
        torch.testing.assert_close(table.grad, want, rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            assert not unified[idx].requires_grad
            unified.launch_into(idx, torch.empty(500, 8, device="cuda"))()
        with pytest.raises(RuntimeError, match="launch_into writes into out=, which autograd cannot follow"):
            unified.launch_into(idx, torch.empty(500, 8, device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("path, view", each_value_once(dispatch.PATHS, [*INDEX_VIEWS, *INDEX_VIEWS_2D]))
def test_every_path_reads_index_views_of_any_shape(path, view, poisoned_allocations):  # noqa: F811
    table = random_table(1200, 36, torch.float16, seed=40).view(1200, 4, 9)
    with UnifiedTensor(table, path=path) as unified:
        assert unified.path == path and unified.path_reason == "chosen by the caller"
        for index_dtype in INDEX_DTYPES:
            idx = index_view(view, 1200, index_dtype, "cuda", seed=41)
            before = idx.clone()
            rows = unified[idx]
            assert rows.shape == idx.shape + (4, 9)
            assert same_bytes(rows.cpu(), expected_rows(table, idx))
            assert torch.equal(idx, before)


@pytest.mark.gpu
@pytest.mark.parametrize("sort, bad", each_value_once([False, True], [1200, -1, 2**40]))
def test_torch_paths_refuse_out_of_range_indices_and_the_gpu_stays_usable(sort, bad):
    table = random_table(1200, 8, torch.float32, seed=42)
    with UnifiedTensor(table, path="torch_sorted" if sort else "torch") as unified:
        for index_dtype in INDEX_DTYPES:
            if index_dtype == torch.int32 and bad == 2**40:
                continue
            idx = torch.randint(0, 1200, (3000,), device="cuda").to(index_dtype)
            idx[1234] = bad
            idx[2000] = -5  # a later bad position is not the one named
            with pytest.raises(IndexError, match=f"index {bad} is out of range for a table of 1200 rows"):
                unified[idx]
            torch.cuda.synchronize()  # no device-side assert fired: the context still works
            good = idx.clamp(0, 1199)
            assert same_bytes(unified[good].cpu(), table[good.cpu().long()])


@pytest.mark.gpu
def test_index_select_alias_checks_its_arguments():
    table = random_table(100, 4, torch.float32, seed=43)
    with UnifiedTensor(table) as unified:
        alias = unified.cuda_alias()
        with pytest.raises(ValueError, match="idx must be a 1-D int32 or int64 tensor"):
            index_select_alias(alias, torch.arange(5))  # a CPU index
        with pytest.raises(ValueError, match="alias must be a 2-D CUDA tensor"):
            index_select_alias(table, torch.arange(5, device="cuda"))
        empty = index_select_alias(alias, torch.arange(0, device="cuda"), sort=True)
        assert empty.shape == (0, 4)
        del alias


@pytest.mark.gpu
def test_auto_path_follows_the_table_and_close_needs_no_user_alias_gone():
    table = random_table(4096, 128, torch.float32, seed=44)  # 512 B rows, 2 MiB
    unified = UnifiedTensor(table)
    expected = dispatch.choose(512, table.numel() * 4, torch.cuda.get_device_name())
    assert (unified.path, unified.path_reason) == (expected.path, expected.reason)
    idx = torch.randperm(4096, device="cuda")[:1000]
    assert same_bytes(unified[idx].cpu(), table[idx.cpu()])
    unified.close()  # the torch paths' own alias does not block close()
    assert not unified.registered
    with pytest.raises(RuntimeError, match="closed"):
        unified[idx]


# --- GPU: launch_into, the gather a prefetching loader queues without waiting ------------------


@pytest.mark.gpu
@pytest.mark.parametrize("path, view", each_value_once(dispatch.PATHS, list(INDEX_VIEWS)))
def test_launch_into_fills_the_callers_buffer_on_every_path(path, view):
    table = random_table(1200, 25, torch.float32, seed=45)  # 100 B rows: 4-byte words only
    side = torch.cuda.Stream()
    with UnifiedTensor(table, path=path) as unified:
        for index_dtype, cap in itertools.product(INDEX_DTYPES, (0, 512)):  # a cap: the kernel, same order
            idx = index_view(view, 1200, index_dtype, "cuda", seed=46)
            out = torch.full((idx.numel(), 25), float("nan"), device="cuda")  # every row must be written

            def launch():  # as a prefetch thread does: its own thread, its own stream
                with torch.cuda.stream(side):
                    side.wait_stream(torch.cuda.default_stream())
                    checks.append(unified.launch_into(idx, out, max_threads=cap))

            checks = []
            worker = threading.Thread(target=launch)
            worker.start()
            worker.join()
            side.synchronize()
            checks[0]()  # in range: returns
            assert same_bytes(out.cpu(), expected_rows(table, idx))


@pytest.mark.gpu
@pytest.mark.parametrize("path", dispatch.PATHS)
def test_launch_into_never_waits_for_the_gpu(path):
    table = random_table(4000, 32, torch.float32, seed=49)
    with UnifiedTensor(table, path=path) as unified:
        idx = torch.randint(0, 4000, (5000,), device="cuda")
        out = torch.empty((5000, 32), device="cuda")
        unified.launch_into(idx, out)  # first use: compiles the kernels, makes the alias
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for cap in (0, 1024):
                check = unified.launch_into(idx, out, max_threads=cap)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        check()
        assert same_bytes(out.cpu(), table[idx.cpu()])


@pytest.mark.gpu
@pytest.mark.parametrize("path", dispatch.PATHS)
def test_launch_into_hands_back_the_range_check(path):
    table = random_table(1200, 8, torch.float32, seed=47)
    with UnifiedTensor(table, path=path) as unified:
        idx = torch.randint(0, 1200, (3000,), device="cuda")
        idx[1717] = 1200
        out = torch.empty((3000, 8), device="cuda")
        check = unified.launch_into(idx, out)
        with pytest.raises(IndexError, match="index 1200 is out of range for a table of 1200 rows"):
            check()
        torch.cuda.synchronize()  # no device-side assert: the context still works
        good = idx.clamp(0, 1199)
        unified.launch_into(good, out)()
        assert same_bytes(out.cpu(), table[good.cpu()])


@pytest.mark.gpu
@pytest.mark.parametrize("path", dispatch.PATHS)
def test_launch_into_refuses_what_it_cannot_do_the_same_on_every_path(path):
    table = random_table(100, 4, torch.float32, seed=48)
    idx = torch.arange(10, device="cuda")
    with UnifiedTensor(table, path=path) as unified:
        for bad_idx, error, message in [
            (torch.arange(10), TypeError, "CUDA tensor of row ids"),
            (idx.float(), ValueError, "idx must be a 1-D int32 or int64 CUDA tensor, got torch.float32"),
            (idx.view(2, 5), ValueError, "idx must be a 1-D int32 or int64 CUDA tensor"),
        ]:
            with pytest.raises(error, match=message):
                unified.launch_into(bad_idx, torch.empty((10, 4), device="cuda"))
        for bad_out, message in [
            (torch.empty((10, 8), device="cuda")[:, ::2], "out must be a dense torch.float32 tensor of shape"),
            (torch.empty((9, 4), device="cuda"), r"of shape \(10, 4\) on cuda:0, got torch.float32 \(9, 4\)"),
            (torch.empty((10, 4), device="cuda", dtype=torch.float64), "got torch.float64"),
            (torch.empty((10, 4)), "on cpu"),
        ]:
            with pytest.raises(ValueError, match=message):
                unified.launch_into(idx, bad_out)
        with pytest.raises(ValueError, match="max_threads must be a whole number"):
            unified.launch_into(idx, torch.empty((10, 4), device="cuda"), max_threads=-1)
    with UnifiedTensor(table, dedup=True) as unified:
        with pytest.raises(ValueError, match="cannot de-duplicate without waiting"):
            unified.launch_into(idx, torch.empty((10, 4), device="cuda"))
    unified = UnifiedTensor(table)
    unified.close()
    with pytest.raises(RuntimeError, match="closed"):
        unified.launch_into(idx, torch.empty((10, 4), device="cuda"))
