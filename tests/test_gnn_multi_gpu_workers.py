"""The CPU-worker baseline (cpu_gather_workers) in every rank of a data-parallel run: each rank on
a block of cores of its own, as many at 1 rank as at 2, its loader workers on that block, the same
losses as cpu_gather, and no worker left once the run ends, however it ends."""

import os
import random
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import test_gnn_multi_gpu as gnn_multi_gpu_tests

from harness.errors import UserError
from harness.results import ResultsWriter
from workloads.gnn_multi_gpu import launch
from workloads.gnn_multi_gpu.budgets import SHARE, cores_per_rank, rank_core_blocks
from workloads.gnn_multi_gpu.launch import NOT_DATA_PARALLEL, run_world
from workloads.gnn_multi_gpu.schema import SCHEMA

SHARED = gnn_multi_gpu_tests.SHARED  # the same tiny products-like run
MARKER = "GNN_MULTI_GPU_WORKERS_TEST_RUN"  # in the environment of every process a run starts


def test_the_cpu_pipelines_both_run_in_every_rank():
    run, skipped = launch._pipelines("cpu", table_bytes=1 << 20)
    assert run == ["cpu_gather", "cpu_gather_workers"]
    assert "cpu_gather_workers" not in skipped and "cpu_gather_workers" not in NOT_DATA_PARALLEL


def test_a_share_of_the_cores_is_the_same_at_every_world_size():
    rng = random.Random(7)
    for _ in range(200):
        usable, most = rng.randint(1, 256), rng.randint(1, 8)
        if usable < most:
            continue
        shares = {cores_per_rank(SHARE, usable, most, world) for world in range(1, most + 1)}
        assert len(shares) == 1
        (share,) = shares
        assert share * most <= usable < (share + 1) * most  # all ranks fit, no core is left that a rank could take


def test_rank_blocks_are_disjoint_equal_and_in_order():
    rng = random.Random(3)
    for _ in range(100):
        cores = sorted(rng.sample(range(512), rng.randint(2, 128)))
        world = rng.randint(1, len(cores))
        per_rank = rng.randint(1, len(cores) // world)
        blocks = rank_core_blocks(world, per_rank, cores)
        assert [len(b) for b in blocks] == [per_rank] * world
        flat = [c for b in blocks for c in b]
        assert flat == cores[: world * per_rank]  # in order, and no core in two blocks


def test_budgets_that_do_not_fit_are_refused_in_a_line():
    with pytest.raises(UserError, match="needs 6 cores; this process may use 5"):
        cores_per_rank(3, 5, 2, 2)
    with pytest.raises(UserError, match="positive number of cores or 'share'"):
        cores_per_rank("half", 16, 2, 2)
    with pytest.raises(UserError, match="positive number of cores"):
        cores_per_rank(0, 16, 2, 2)
    with pytest.raises(UserError, match="2 ranks need a core each; this process may use 1"):
        cores_per_rank(SHARE, 1, 2, 2)
    with pytest.raises(UserError, match="need 6 cores; there are 5"):
        rank_core_blocks(2, 3, list(range(5)))


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _alive(pid: int) -> bool:
    """Running: not gone, nor a zombie waiting for a reaper (init may not reap in a container)."""
    return _state(pid) not in (None, "Z", "X")


def _processes_of_run(marker: str) -> list[int]:
    """Live processes (other than this one) whose environment carries the run's marker: every
    torchrun, rank and loader worker it started, wherever they were reparented."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environment = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"{MARKER}={marker}".encode() in environment and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _none_left(marker: str, pids=()) -> list[int]:
    deadline = time.monotonic() + 60  # polled: as long as a loaded machine takes to reap them
    while time.monotonic() < deadline:
        left = sorted(set(_processes_of_run(marker)) | {p for p in pids if _alive(p)})
        if not left:
            return []
        time.sleep(0.1)
    return left


def _losses(rows) -> dict[str, list[float]]:
    curves = {}
    for row in sorted((r for r in rows if r["metric"] == "loss"), key=lambda r: r["repetition"]):
        curves.setdefault(row["variant"], []).append(row["value"])
    return curves


needs_linux_proc = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc (Linux)")


@needs_linux_proc
@pytest.mark.full  # torchrun ranks
def test_loader_workers_train_like_cpu_gather_on_equal_rank_budgets_at_1_and_2_ranks(monkeypatch):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two ranks on cores of their own need two cores")
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARKER, marker)
    monkeypatch.setenv("SUITE_HIDE_GPU", "1")
    budgets = {}
    for world in (1, 2):
        writer = ResultsWriter(SCHEMA, scale="tiny")
        notes = run_world(
            world, {}, writer, shared=SHARED, repeat=1, warmup=0, device="cpu", timeout_s=1800,  # a hang guard
            job_overrides={"dropout": 0.0},
        )  # fmt: skip
        curves = _losses(writer.rows)
        assert curves.keys() == {"cpu_gather", "cpu_gather_workers"} and len(curves["cpu_gather"]) >= 3
        # The same global batches, gathered in the workers: the same losses (summed in another
        # order by another thread count at most).
        np.testing.assert_allclose(curves["cpu_gather_workers"], curves["cpu_gather"], rtol=1e-5, atol=1e-6)
        ranks = notes["rank_budgets"]["cpu_gather_workers, sage2"]
        assert [r["rank"] for r in ranks] == list(range(world))
        for r in ranks:
            assert r["cores"] == notes["rank_cores"][str(r["rank"])] and len(r["cores"]) == r["cpu_budget"]
            assert r["worker_cores"] == r["cores"]  # the workers run on their rank's cores, only there
            assert r["sampler_workers"] == 1 and r["threads_per_worker"] == 1
            assert r["train_threads"] == max(1, r["cpu_budget"] - 1)
        cores = [c for r in ranks for c in r["cores"]]
        assert len(cores) == len(set(cores))  # no core in two ranks
        assert len({(r["cpu_budget"], r["sampler_workers"], r["train_threads"]) for r in ranks}) == 1
        assert notes["cpu_budget_per_rank"] == ranks[0]["cpu_budget"]
        assert notes["loader_worker_splits"]["cpu_gather_workers, sage2"]["workers"] == 1
        # The rows say what the rank ran with.
        config = {
            (r["sampler_workers"], r["train_threads"]) for r in writer.rows if r["variant"] == "cpu_gather_workers"
        }
        assert config == {(1, ranks[0]["train_threads"])}
        budgets[world] = ranks[0]["cpu_budget"]
    assert budgets[1] == budgets[2]  # one rank gets no more cores than each of two
    assert _none_left(marker) == []


RANK_THAT_FAILS = """
import os, sys
from pathlib import Path
from workloads.gnn_multi_gpu import rank

epochs = rank.timed_epochs


def failing_after_one_epoch(model, optimizer, pipeline, **kwargs):
    for epoch in epochs(model, optimizer, pipeline, **kwargs):
        # Written before the epoch is handed over: rank 1 fails only after a collective with rank 0.
        Path(sys.argv[2], os.environ["RANK"]).write_text(" ".join(map(str, pipeline.worker_pids())))
        yield epoch
        if os.environ["RANK"] == "1":
            raise RuntimeError("rank 1 fails on purpose")


rank.timed_epochs = failing_after_one_epoch
rank.main(sys.argv[1])
"""


@needs_linux_proc
@pytest.mark.full  # torchrun ranks
def test_a_rank_that_raises_ends_the_run_and_every_loader_worker(tmp_path, monkeypatch):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two ranks on cores of their own need two cores")
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARKER, marker)
    monkeypatch.setenv("SUITE_HIDE_GPU", "1")
    script, pids_dir = tmp_path / "rank_that_fails.py", tmp_path / "pids"
    script.write_text(RANK_THAT_FAILS)
    pids_dir.mkdir()
    monkeypatch.setattr(
        launch,
        "torchrun_command",
        lambda world, job: (
            [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            + [f"--nproc-per-node={world}", str(script), str(job), str(pids_dir)]
        ),
    )
    started = time.monotonic()
    with pytest.raises(UserError, match="exited with status"):
        run_world(
            2, {}, ResultsWriter(SCHEMA, scale="tiny"), shared=SHARED, repeat=3, warmup=0, device="cpu",
            timeout_s=600, job_overrides={"pipelines": ["cpu_gather_workers"]},
        )  # fmt: skip
    assert time.monotonic() - started < 300  # ended when rank 1 failed, not at the time limit
    workers = [int(pid) for f in pids_dir.iterdir() for pid in f.read_text().split()]
    assert sorted(f.name for f in pids_dir.iterdir()) == ["0", "1"] and len(workers) == 2  # one worker per rank
    assert _none_left(marker, workers) == []
