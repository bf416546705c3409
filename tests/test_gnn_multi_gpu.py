"""Data-parallel GNN training: shards of global batches, the shared feature table, and two gloo
ranks launched by torchrun training exactly like one process that takes the same global batches
(gradient accumulation over the same shards); on machines with GPUs, the same with NCCL."""

import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from test_gnn_training import _tiny as ring_of_six
from torch.nn import functional as F

from harness import provenance
from harness.errors import UserError
from harness.results import ResultsWriter, load
from workloads.gnn.models import build
from workloads.gnn.pipelines import PIPELINES, Graph, Pipeline, epoch_seeds
from workloads.gnn_multi_gpu import NVLS_OFF, TOPIC
from workloads.gnn_multi_gpu.launch import NOT_DATA_PARALLEL, run_world
from workloads.gnn_multi_gpu.schema import SCHEMA
from workloads.graphs import shared, store
from workloads.graphs.datasets import cached_graph

SHARED = {
    "dataset": "products",
    "scale_factor": 0.002,
    "graph_seed": 0,
    "hidden": 32,
    "batch_size": 32,
    "sampler_workers": 0,
    "cpu_budget_per_rank": "share",
    "loader_workers": {"workers": [1], "threads_per_worker": [1]},
    "learning_rate": 0.01,
    "loss_steps": 1000,
    "models": [{"name": "sage", "layers": 2, "fanouts": [5, 5]}],
}


def test_rank_shards_partition_each_global_batch():
    train_idx = torch.randperm(1000)[:555]
    whole = epoch_seeds(train_idx, 4 * 50, seed=3, epoch=1)
    shards = [epoch_seeds(train_idx, 50, seed=3, epoch=1, shard=(r, 4)) for r in range(4)]
    steps = 555 // 200
    assert all(len(s) == steps for s in shards)  # the incomplete last global batch is dropped
    for i in range(steps):
        assert torch.equal(torch.cat([s[i] for s in shards]), whole[i])
    with pytest.raises(UserError, match="shard must be"):  # refused before the ring is read
        Pipeline("cpu_gather", Graph(ring_of_six(), "cpu"), [5], 10, seed=0, shard=(2, 2))


def test_a_training_set_smaller_than_one_global_batch_is_refused():
    _, _, folder = cached_graph("ogbn-products", SHARED, 0)
    graph = Graph(store.load(folder), "cpu")
    with pytest.raises(UserError, match="do not fill one global batch"):
        Pipeline("cpu_gather", graph, [5], graph.train_idx.numel(), seed=0, shard=(0, 2))


def test_the_shared_table_is_one_set_of_pages_and_is_removed_after(tmp_path):
    array = np.random.default_rng(0).standard_normal((1000, 7)).astype(np.float32)
    with shared.shared_table(array, "t", directory=tmp_path) as table:
        a, b = shared.map_table(table), shared.map_table(table)
        assert torch.equal(a, torch.from_numpy(array))
        a[3, 2] = 42.0  # one mapping's write is the other's: the same pages, no copies
        assert b[3, 2] == 42.0
        path = table["path"]
    assert not os.path.exists(path)
    with pytest.raises(UserError, match="is gone"):
        shared.map_table(table)


def test_one_process_table_is_shared_memory_that_a_fork_does_not_copy():
    array = np.random.default_rng(1).standard_normal((500, 3)).astype(np.float32)
    table = shared.shared_anonymous_copy(array)
    assert torch.equal(table, torch.from_numpy(array))
    child = os.fork()
    if child == 0:  # a sampling worker's view: the same pages, so its write shows in the parent
        table[0, 0] = 7.0
        os._exit(0)
    os.waitpid(child, 0)
    assert table[0, 0] == 7.0


def test_a_table_larger_than_shared_memory_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(shared.shutil, "disk_usage", lambda path: type("U", (), {"free": 100 + 2**31})())
    with pytest.raises(UserError, match="do not fit in"):
        with shared.shared_table(np.zeros((100, 4), np.float32), "t", directory=tmp_path):
            pass


def test_a_table_larger_than_free_memory_is_refused_before_it_is_copied(tmp_path, monkeypatch):
    array = np.random.default_rng(2).standard_normal((100, 4)).astype(np.float32)  # 1,600 bytes
    monkeypatch.setattr(shared.machine, "available_memory_bytes", lambda: shared.MEMORY_HEADROOM + 1_000)
    with pytest.raises(UserError, match=r"too large to hold and pin .*smaller scale_factor"):
        shared.shared_anonymous_copy(array)
    with pytest.raises(UserError, match="too large to hold and pin"):
        with shared.shared_table(array, "t", directory=tmp_path):
            pass
    assert not list(tmp_path.iterdir())  # refused before anything was written
    monkeypatch.setattr(shared.machine, "available_memory_bytes", lambda: shared.MEMORY_HEADROOM + 2_000)
    assert torch.equal(shared.shared_anonymous_copy(array), torch.from_numpy(array))


def _one_process_reference(steps_wanted: int, world: int):
    """One process, the same global batches: each rank's shard in turn, gradients accumulated."""
    spec, _, folder = cached_graph("ogbn-products", SHARED, 0)
    graph = Graph(store.load(folder), "cpu")
    torch.manual_seed(0)
    model = build("sage", spec.feature_dim, SHARED["hidden"], spec.classes, 2, [5, 5], dropout=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=SHARED["learning_rate"])
    shards = [
        list(Pipeline("cpu_gather", graph, [5, 5], SHARED["batch_size"], seed=0, shard=(r, world)).batches(0))
        for r in range(world)
    ]
    losses = []
    for step in range(len(shards[0])):
        optimizer.zero_grad()
        loss = (
            sum(
                F.cross_entropy(model(b.x, b.edge_index)[: b.batch_size], b.y)
                for b in (shard[step] for shard in shards)
            )
            / world
        )
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, model.state_dict()


@pytest.mark.full  # torchrun ranks
def test_two_gloo_ranks_train_like_one_process_on_the_same_global_batches(tmp_path, monkeypatch):
    monkeypatch.setenv("SUITE_HIDE_GPU", "1")
    writer = ResultsWriter(SCHEMA, scale="tiny")
    weights = tmp_path / "weights.pt"
    notes = run_world(
        2,
        {},
        writer,
        shared=SHARED,
        repeat=1,
        warmup=0,
        device="cpu",
        timeout_s=1800,  # a hang guard only
        job_overrides={"dropout": 0.0, "save_weights": str(weights), "pipelines": ["cpu_gather"]},
    )
    # The CPU pipelines run here: cpu_gather and cpu_gather_workers (tests/test_gnn_multi_gpu_workers.py).
    assert notes["skipped_pipelines"].keys() == set(PIPELINES) - {"cpu_gather", "cpu_gather_workers"}
    rows = [r for r in writer.rows if r["metric"] == "loss" and r["variant"] == "cpu_gather"]
    distributed = [r["value"] for r in sorted(rows, key=lambda r: r["repetition"])]
    expected, expected_weights = _one_process_reference(len(distributed), world=2)
    assert len(distributed) == len(expected) >= 3
    np.testing.assert_allclose(distributed, expected, rtol=1e-5, atol=1e-6)
    trained = torch.load(weights)
    for name, value in expected_weights.items():
        torch.testing.assert_close(trained[name], value, rtol=1e-5, atol=1e-6, msg=name)
    # The results file loads, with provenance, like every topic's.
    out = tmp_path / "world2-tiny.csv"
    writer.write(out, provenance.collect("tiny", topic="gnn_multi_gpu", part="world2"))
    assert set(load([out], SCHEMA).metric) == {"loss", "epoch_time", "cpu_time", "accuracy"}


def test_gpu_pipelines_and_the_reasons_for_those_left_out(monkeypatch):
    from harness import machine
    from workloads.gnn_multi_gpu import launch

    gpu = machine.GpuInfo(name="GPU", memory_mib=10 * 1024, driver="1", pcie="gen5 x16")
    monkeypatch.setattr(launch.machine, "nvidia_gpus", lambda: (gpu, gpu))
    run, skipped = launch._pipelines("cuda", table_bytes=2 << 30)
    assert run == list(launch.PIPELINES) and skipped == NOT_DATA_PARALLEL
    run, skipped = launch._pipelines("cuda", table_bytes=9 << 30)  # no replica in 80% of 10 GiB
    assert "all_in_gpu" not in run and "does not fit" in skipped["all_in_gpu"]
    assert skipped.keys() == {"all_in_gpu"} | NOT_DATA_PARALLEL.keys()
    # Every single-GPU pipeline is either run or skipped with a reason, never dropped silently.
    from workloads.gnn.pipelines import PIPELINES as SINGLE_GPU

    assert set(SINGLE_GPU) <= set(run) | skipped.keys()


def test_cpu_machines_run_one_and_two_processes(monkeypatch):
    assert [p.name for p in TOPIC.parts_on(0, cores=2)] == ["world1", "world2"]
    assert [p.name for p in TOPIC.parts_on(2, cores=16)] == ["world1", "world2"]
    assert [p.name for p in TOPIC.parts_on(8, cores=16)] == ["world1", "world2", "world4", "world8"]
    # A rank needs a core of its own: a one-core machine runs one process, four cores four GPUs.
    assert [p.name for p in TOPIC.parts_on(0, cores=1)] == ["world1"]
    assert [p.name for p in TOPIC.parts_on(8, cores=4)] == ["world1", "world2", "world4"]


def test_the_launcher_keeps_nvlink_multicast_off():
    assert NVLS_OFF == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def test_the_figure_gives_each_world_sizes_threads_per_rank_from_the_results(tmp_path):
    """Scaling efficiency compares unequal budgets where a rank's threads differ between world sizes:
    the figure says how many each rank had, from the results, and names all_in_gpu for what it is."""
    import json

    pytest.importorskip("jupytext", reason="notebook rendering needs jupytext (the CPU environment has it)")
    from analysis.render import main as render_notebook
    from workloads.gnn.pipelines import ROLE

    files = []
    for world, threads in ((1, 24), (2, 8)):
        writer = ResultsWriter(SCHEMA, "test")
        config = {
            "device": "cuda", "backend": "nccl", "world_size": world, "model": "sage", "layers": 2,
            "fanouts": "10-25", "batch_size": 64, "hidden": 32, "nodes": 1000, "edges": 20000,
            "feature_dim": 16, "sampler_workers": 8, "train_threads": threads, "rank": "all",
        }  # fmt: skip
        for variant in ("cpu_gather", "zero_copy", "all_in_gpu"):
            for rep in range(3):
                add = dict(role=ROLE[variant], variant=variant, config=config, dataset="products-like", repetition=rep)
                writer.add(**add, metric="epoch_time", value=2.0 / world + 0.01 * rep, unit="s")
                writer.add(**add, metric="cpu_time", value=10.0, unit="core-s")
        files.append(tmp_path / f"world{world}-test.csv")
        writer.write(files[-1], provenance.collect("test", topic="gnn_multi_gpu", part=f"world{world}", parameters={}))
    render_notebook(
        ["analysis/gnn_multi_gpu.py", "--executed", str(tmp_path / "nb.ipynb"), "-p", "machine=test"]
        + ["-p", "scale=test", "--topic", "gnn_multi_gpu"]
        + [a for f in files for a in ("--results", f"gnn_multi_gpu={f}")]
        + ["--figure", str(tmp_path / "mg.png"), "--summary", str(tmp_path / "mg.md")]
    )
    words = [w for panel in json.loads((tmp_path / "nb.text.json").read_text()) for w in panel]
    assert "Scaling efficiency\ntrain threads per rank: 24 at 1 GPU, 8 at 2 GPUs; unequal budgets" in words
    assert "all in GPU memory (no feature transfer)" in words and not [w for w in words if "bound" in w]


@pytest.mark.gpu
@pytest.mark.full  # torchrun ranks
@pytest.mark.parametrize("world, workers", [(1, 0), (1, 2), (2, 2)])
def test_gpu_ranks_run_every_pipeline(world, workers):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    writer = ResultsWriter(SCHEMA, scale="tiny")
    notes = run_world(
        world,
        {},
        writer,
        shared=SHARED | {"sampler_workers": workers},
        repeat=1,
        warmup=0,
        device="cuda",
        timeout_s=1800,  # a hang guard only
    )
    assert notes["skipped_pipelines"] == NOT_DATA_PARALLEL
    variants = {r["variant"] for r in writer.rows}
    assert variants == {"cpu_gather", "cpu_gather_workers", "zero_copy", "zero_copy_overlap", "all_in_gpu"}
    losses = {}
    for r in writer.rows:
        if r["metric"] == "loss":
            losses.setdefault(r["variant"], []).append(r["value"])
    for variant, curve in losses.items():  # the same global batches whatever the pipeline
        np.testing.assert_allclose(curve, losses["cpu_gather"], rtol=1e-3, atol=1e-3, err_msg=variant)
    ranks = {r["rank"] for r in writer.rows if r["metric"] == "bandwidth"}
    assert ranks == {str(r) for r in range(world)}


def _gone(pid: int) -> bool:
    """Ended: no such process, or a zombie waiting for a reaper (init may not reap in a container)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_a_run_past_its_time_limit_is_ended_with_every_session_under_it(tmp_path, monkeypatch):
    from workloads.gnn_multi_gpu import launch

    # A "torchrun" whose rank never finishes and, like torchrun's ranks, runs in a session of its
    # own, out of reach of one killpg of the launcher's child.
    pid_file = tmp_path / "rank.pid"
    monkeypatch.setattr(
        launch, "torchrun_command", lambda world, job: ["sh", "-c", f"setsid sleep 600 & echo $! > {pid_file}; wait"]
    )
    started = time.monotonic()
    with pytest.raises(UserError, match="ran past 1 s"):
        launch.launch(2, tmp_path / "job.json", timeout_s=1)
    assert time.monotonic() - started < 300  # ended at its limit, not when the rank's sleep is over
    rank = int(pid_file.read_text())
    deadline = time.monotonic() + 60  # polled: as long as a loaded machine takes to reap a killed process
    while not _gone(rank) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(rank), "the rank in its own session outlived the launcher's timeout"


RANK_THAT_HANGS = """
import os, subprocess, sys, time
from pathlib import Path
worker = subprocess.Popen(["sleep", "600"])  # stands in for a sampling worker
Path(sys.argv[1], os.environ["RANK"]).write_text(f"{os.getpid()} {worker.pid}")
time.sleep(600)
"""


@pytest.mark.full  # torchrun ranks
def test_sigterm_ends_real_torchrun_ranks_and_their_workers(tmp_path, monkeypatch):
    """A cancelled Snakemake job sends SIGTERM: the launcher must take the ranks down with it."""
    from workloads.gnn_multi_gpu import launch

    script = tmp_path / "rank_that_hangs.py"
    script.write_text(RANK_THAT_HANGS)
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    monkeypatch.setattr(
        launch,
        "torchrun_command",
        lambda world, job: [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={world}",
            str(script),
            str(pids_dir),
        ],
    )

    def terminate_once_both_ranks_run():
        deadline = time.monotonic() + 300  # polled: torchrun starts slowly on a loaded machine
        while len(list(pids_dir.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_once_both_ranks_run, daemon=True).start()
    with pytest.raises(SystemExit):
        launch.launch(2, tmp_path / "job.json", timeout_s=180)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the launcher's handler is gone again
    pids = [int(pid) for f in pids_dir.iterdir() for pid in f.read_text().split()]
    assert len(pids) == 4
    deadline = time.monotonic() + 60  # polled: as long as a loaded machine takes to reap them
    while not all(map(_gone, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in pids if not _gone(pid)] == []
