"""One part of the workload: data-parallel training at one world size, launched with torchrun.

The launcher (this process) prepares what the ranks share: the cached graph (generated once),
the feature table copied into shared memory, a job file; then runs torchrun with NVLink
multicast off in the environment, and turns rank 0's rows into the results file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from harness import machine, resources
from harness.errors import UserError
from harness.progress import report
from workloads.gnn.pipelines import GPU_PIPELINES
from workloads.gnn.pipelines import PIPELINES as SINGLE_GPU_PIPELINES
from workloads.gnn_multi_gpu import NVLS_OFF, TOPIC, WORLDS
from workloads.gnn_multi_gpu.budgets import allowed_cores, cores_per_rank, rank_core_blocks
from workloads.graphs import store
from workloads.graphs.datasets import cached_graph
from workloads.graphs.shared import shared_table
from workloads.graphs.spec import SHORT_NAMES

PIPELINES = ("cpu_gather", "cpu_gather_workers", "zero_copy", "zero_copy_overlap", "all_in_gpu")
REPLICA_HEADROOM = 0.8  # all_in_gpu replicates the table only where it fits in this share of a GPU's memory


def run_world(
    world: int,
    params: dict,
    writer,
    *,
    shared: dict,
    repeat: int,
    warmup: int,
    device: str,
    job_overrides: dict | None = None,
    timeout_s: float | None = None,
    **_,
) -> dict:
    """Train at ``world`` ranks and add rank 0's rows to ``writer``; ``timeout_s`` ends a run that
    takes longer (all its processes), with an error."""
    if device == "cuda" and world > len(machine.nvidia_gpus()):
        raise UserError(f"world size {world} needs {world} GPUs; this machine has {len(machine.nvidia_gpus())}")
    spec, dataset, folder = cached_graph(SHORT_NAMES[shared["dataset"]], shared, shared["graph_seed"])
    features = store.load(folder)["features"]
    pipelines, skipped = _pipelines(device, features.nbytes)
    cores = allowed_cores()
    per_rank = cores_per_rank(shared["cpu_budget_per_rank"], len(cores), _most_ranks(device), world)
    rank_cores = rank_core_blocks(world, per_rank, cores)
    with shared_table(features, folder.name) as table, tempfile.TemporaryDirectory() as tmp:
        job = {
            "device": device,
            "dataset": dataset,
            "graph_folder": str(folder),
            "table": table,
            "nodes": spec.nodes,
            "edges": spec.edges,
            "feature_dim": spec.feature_dim,
            "classes": spec.classes,
            "models": shared["models"],
            "pipelines": pipelines,
            "batch_size": shared["batch_size"],
            "hidden": shared["hidden"],
            "sampler_workers": shared["sampler_workers"],
            "loader_workers": shared["loader_workers"],
            "rank_cores": rank_cores,
            "learning_rate": shared["learning_rate"],
            "loss_steps": shared["loss_steps"],
            "graph_seed": shared["graph_seed"],
            "repeat": repeat,
            "warmup": warmup,
            "out": str(Path(tmp) / "rows.json"),
            **(job_overrides or {}),
        }
        job_file = Path(tmp) / "job.json"
        job_file.write_text(json.dumps(job))
        report(
            f"{dataset}: training on {world} {'GPUs' if device == 'cuda' else 'CPU processes'} ({', '.join(pipelines)})"
        )
        launch(world, job_file, timeout_s)
        out = json.loads(Path(job["out"]).read_text())
    for row in out["rows"]:
        writer.add(**row)
    return {
        "skipped_pipelines": skipped,
        "graph": spec.as_dict(),
        "world_size": world,
        "cpu_budget_per_rank": per_rank,
        "rank_cores": {str(rank): block for rank, block in enumerate(rank_cores)},
        # Per "pipeline, model": each rank's cores, workers and threads, as the rank saw them.
        "rank_budgets": out["rank_budgets"],
        "loader_worker_splits": out["loader_worker_splits"],
        "shared_table": "/dev/shm",
        "environment": NVLS_OFF,
    }


def _most_ranks(device: str) -> int:
    """The most ranks this machine runs at once (its largest world size): each rank's share of the
    cores is the same at every world size."""
    gpus = len(machine.nvidia_gpus()) if device == "cuda" else 0
    return max((WORLDS[part.name] for part in TOPIC.parts_on(gpus)), default=1)


def launch(world: int, job_file: Path, timeout_s: float | None = None) -> None:
    """torchrun with ``world`` local ranks running rank.py on ``job_file``; fails loudly. Past
    ``timeout_s``, on Ctrl-C or on SIGTERM (a cancelled Snakemake job) it ends torchrun, every
    rank and every sampling worker before raising, so no GPU or shared table is left held."""
    command = torchrun_command(world, job_file)
    # OMP_NUM_THREADS only quiets torchrun's notice; each rank sets its torch threads itself.
    environment = os.environ | NVLS_OFF | {"PYTHONPATH": _python_path(), "OMP_NUM_THREADS": "1"}
    # SIGTERM raises, so the finally blocks run (only the main thread may set a handler).
    main_thread = threading.current_thread() is threading.main_thread()
    previous_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None
    try:
        process = subprocess.Popen(command, env=environment, start_new_session=True)
        try:
            status = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _end_all(process)
            raise UserError(f"torchrun with {world} ranks ran past {timeout_s} s and was ended") from None
        except BaseException:
            _end_all(process)
            raise
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous_handler)
    if status != 0:
        raise UserError(f"torchrun with {world} ranks exited with status {status} (rank output above)")


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _end_all(process: subprocess.Popen) -> None:
    """Kill torchrun and everything under it. One killpg is not enough: torchrun starts each rank
    in a session of its own, so each rank (with its sampling workers) is its own process group."""
    groups = {process.pid}
    for pid in resources.descendant_pids(process.pid):
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            continue
    groups.discard(os.getpgrp())  # never this launcher's own group
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            continue
    process.wait()


def torchrun_command(world: int, job_file: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world}",
        "-m",
        "workloads.gnn_multi_gpu.rank",
        str(job_file),
    ]


def _python_path() -> str:
    root = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


# Single-GPU pipelines that the data-parallel comparison leaves out, and why.
# Only the registered ones: PyG's loader registers only where its sampling backend imports.
NOT_DATA_PARALLEL = {
    name: why
    for name, why in {
        "uva_sampling": "single-GPU only here: every rank would pin a private copy of the CSR",
        "pyg_neighbor_loader": "single-GPU only here: cpu_gather_workers stands for a PyG-style loader in every rank",
        "hot_cache": "single-GPU only here: every rank would fill a cache of its own",
        "hot_cache_oracle": "single-GPU only here: every rank would fill a cache of its own",
    }.items()
    if name in SINGLE_GPU_PIPELINES
}


def _pipelines(device: str, table_bytes: int) -> tuple[list[str], dict]:
    if device != "cuda":
        return [p for p in PIPELINES if p not in GPU_PIPELINES], {
            p: "no GPU on this machine" for p in PIPELINES if p in GPU_PIPELINES
        } | NOT_DATA_PARALLEL
    # From nvidia-smi, so the launcher itself never opens a CUDA context on the ranks' GPUs.
    smallest = min(gpu.memory_mib for gpu in machine.nvidia_gpus()) * 2**20
    if table_bytes > REPLICA_HEADROOM * smallest:
        return [p for p in PIPELINES if p != "all_in_gpu"], {
            "all_in_gpu": f"a {table_bytes / 2**30:.1f} GiB replica per GPU does not fit in "
            f"{REPLICA_HEADROOM:.0%} of {smallest / 2**30:.0f} GiB"
        } | NOT_DATA_PARALLEL
    return list(PIPELINES), dict(NOT_DATA_PARALLEL)
