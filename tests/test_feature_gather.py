"""The feature_gather workload at the tiny scale: index generators, then each part end to end."""

import pytest
import torch

from harness.entry import main
from harness.results import load, load_provenance
from workloads.feature_gather import TOPIC
from workloads.feature_gather.schema import SCHEMA
from workloads.feature_gather.tables import Popularity, uniform_rows, window_rows


def test_uniform_rows_are_distinct_and_in_range():
    g = torch.Generator().manual_seed(0)
    rows = uniform_rows(10_000, 3_000, g)
    assert rows.unique().numel() == 3_000 and rows.min() >= 0 and rows.max() < 10_000


def test_zipf_sample_is_distinct_and_prefers_popular_ranks():
    g = torch.Generator().manual_seed(1)
    popularity = Popularity(100_000, 1.0, g)
    ranks = popularity.sample_ranks(5_000)
    assert ranks.unique().numel() == 5_000
    # Under Zipf(1) the 1,000 most popular of 100,000 ranks hold about 60% of the weight: far
    # more of them are drawn than the 5% a uniform draw would give.
    assert (ranks < 1_000).float().mean() > 0.15
    assert (ranks < 100).sum() >= 90  # nearly all of the 100 most popular are in
    scattered = popularity.rows(ranks, "scattered")
    assert torch.equal(popularity.scattered[ranks], scattered)
    assert torch.equal(popularity.rows(ranks, "hot_first"), ranks)
    assert torch.equal(popularity.hottest_rows(10, "hot_first"), torch.arange(10))


def test_window_rows_stay_inside_their_windows():
    g = torch.Generator().manual_seed(2)
    rows = window_rows(num_rows=1 << 20, row_bytes=512, window_bytes=64 << 10, windows=32, n=2_000, generator=g)
    windows = (rows * 512) // (64 << 10)
    assert windows.unique().numel() <= 32 and rows.unique().numel() == 2_000
    with pytest.raises(ValueError, match="do not fit"):
        window_rows(1024, 512, 64 << 10, 1_000, 10, g)


def _run(tmp_path, part):
    out = tmp_path / f"{part}-tiny.csv"
    main(["feature_gather", "--part", part, "--scale", "tiny", "--out", str(out)])
    return load([out], SCHEMA), load_provenance(out)


@pytest.mark.parametrize("part", [p.name for p in TOPIC.parts_on(0)])
def test_cpu_part_writes_valid_results(tmp_path, part, monkeypatch):
    monkeypatch.setenv("SUITE_HIDE_GPU", "1")
    from harness import machine

    machine.forget()
    try:
        frame, prov = _run(tmp_path, part)
    finally:
        machine.forget()
    assert set(frame.variant) == {"cpu_gather"} and set(frame.device) == {"cpu"}
    assert (frame[frame.metric == "bandwidth"]["value"] > 0).all()
    assert prov["part"] == part
    if part == "row_sizes":
        assert "dgl" in prov  # the reason DGL was not measured is recorded
        assert prov["wholegraph"] == "not measured: no GPU"


@pytest.mark.gpu
@pytest.mark.parametrize("part", TOPIC.part_names)
def test_gpu_part_writes_valid_results(tmp_path, part):
    frame, prov = _run(tmp_path, part)
    assert (frame[frame.metric == "bandwidth"]["value"] > 0).all()
    if part == "table_sizes":
        assert {"naive", "vectorized", "sorted", "hot_cache", "split", "cpu_gather"} <= set(frame.variant)
        assert {"cpu_gather_pipelined", "torch_uva", "torch_uva_sorted"} <= set(frame.variant)
        assert set(frame[frame.variant.isin(["torch_uva", "cpu_gather"])].role) == {"baseline"}
        # WholeGraph is measured where it imports, and otherwise the reason is recorded.
        assert ("wholegraph" in set(frame.variant)) == (not prov["wholegraph"].startswith("not measured"))
        hits = frame[(frame.variant == "hot_cache") & (frame.metric == "pcie_bytes")]
        assert (hits.value < hits.batch_rows * hits.row_bytes).all()  # cached rows do not cross PCIe
    if part == "row_sizes":
        assert {"pageable", "all_in_gpu", "naive", "aligned", "torch_uva", "cpu_gather_pipelined"} <= set(frame.variant)
        assert set(frame[frame.variant == "all_in_gpu"].role) == {"upper_bound"}
        pipelined = frame[frame.variant == "cpu_gather_pipelined"]
        assert (pipelined.chunk_rows > 0).all() and (pipelined.threads > 0).all()


def test_gpu_parts_need_a_gpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SUITE_HIDE_GPU", "1")
    from harness import machine

    machine.forget()
    try:
        gpu_only = [p.name for p in TOPIC.parts if not p.cpu]
        assert gpu_only == ["table_sizes", "batch_sizes", "thread_cap", "locality"]
        for part in gpu_only:
            with pytest.raises(SystemExit):
                main(["feature_gather", "--part", part, "--scale", "tiny", "--out", str(tmp_path / "x.csv")])
            assert f"feature_gather part '{part}' needs 1 CUDA GPU and this machine has 0" in capsys.readouterr().err
    finally:
        machine.forget()


@pytest.mark.gpu
@pytest.mark.parametrize("dim, n", [(3, 1), (100, 5_001), (602, 4_099)])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_every_path_delivers_the_rows_into_a_poisoned_output(monkeypatch, dim, n, dtype):
    """Each baseline and zero-copy path against table[idx], on an odd batch; the pipelined CPU
    gather with chunks of a few rows, so the two staging buffers take many turns."""
    from workloads.feature_gather import variants
    from workloads.feature_gather.tables import DTYPES, HostTable

    monkeypatch.setattr(variants, "PIPELINE_CHUNK_BYTES", 7 * dim * DTYPES[dtype].itemsize)
    host = HostTable(64 << 20, "cuda", seed=5)
    try:
        table = host.view(64 << 20, dtype, dim)
        g = torch.Generator().manual_seed(dim)
        idx = torch.randperm(table.shape[0], generator=g)[:n].pin_memory()
        batch = variants.Batch(table=table, idx=idx, device="cuda", alias=host.cuda_view(table))
        expected = table[idx].cuda()
        names = ("cpu_gather", "cpu_gather_pipelined", "torch_uva", "torch_uva_sorted", "naive", "vectorized", "sorted")
        for name in names:
            batch.out.fill_(float("nan"))  # poison: a row left unwritten cannot pass
            got = variants.make(name, batch, threads=2)()
            torch.cuda.synchronize()
            assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8)), name
        assert batch.chunk_rows == 7
        del batch
    finally:
        host.close()


def test_the_pipelined_cpu_gather_needs_a_gpu():
    from workloads.feature_gather import variants

    table = torch.rand(100, 4)
    batch = variants.Batch(table=table, idx=torch.arange(10), device="cpu")
    with pytest.raises(ValueError, match="without a GPU it is cpu_gather"):
        variants.make("cpu_gather_pipelined", batch)
