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


@pytest.mark.gpu
@pytest.mark.parametrize("part", TOPIC.part_names)
def test_gpu_part_writes_valid_results(tmp_path, part):
    frame, prov = _run(tmp_path, part)
    assert (frame[frame.metric == "bandwidth"]["value"] > 0).all()
    if part == "table_sizes":
        assert {"naive", "vectorized", "sorted", "hot_cache", "split", "cpu_gather"} <= set(frame.variant)
        hits = frame[(frame.variant == "hot_cache") & (frame.metric == "pcie_bytes")]
        assert (hits.value < hits.batch_rows * hits.row_bytes).all()  # cached rows do not cross PCIe
    if part == "row_sizes":
        assert {"pageable", "all_in_gpu", "naive", "aligned"} <= set(frame.variant)


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
