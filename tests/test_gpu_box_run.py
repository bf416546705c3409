"""tools/gpu_box_run.sh, the driver for a GPU machine without Snakemake: re-runs in separate
processes, part by part, and its refusal of run numbers that would overwrite the committed run."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.results import load_provenance

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu_box_run.sh"


def _run(cwd, out, env, *topics):
    return subprocess.run(
        ["bash", str(SCRIPT), "local", "tiny", str(out), *topics],
        cwd=cwd,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("runs", ["0", "1 0", "01", "2 x", "-1"])
def test_run_numbers_must_be_whole_numbers_from_one(tmp_path, runs):
    done = _run(tmp_path, tmp_path / "out", {"SUITE_RUNS": runs}, "ceilings")
    assert done.returncode == 2
    assert "SUITE_RUN(S) must hold whole numbers from 1" in done.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was made


@pytest.mark.parametrize("runs", ["", "  "])
def test_an_empty_list_of_runs_is_refused_not_a_run_that_measures_nothing(tmp_path, runs):
    done = _run(tmp_path, tmp_path / "out", {"SUITE_RUNS": runs}, "ceilings")
    assert done.returncode == 2 and "SUITE_RUNS is empty" in done.stderr


def test_each_part_is_measured_in_every_run_before_the_next_part(tmp_path):
    for folder in ("harness", "workloads", "systems", "config", "workflow"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    env = {"SUITE_SKIP_TESTS": "1", "SUITE_RUNS": "1 2", "SUITE_PARTS": "host_memcpy hbm_copy"}
    env |= {"SUITE_GIT_COMMIT": "0" * 40, "SUITE_GIT_DIRTY": "0", "CUDA_VISIBLE_DEVICES": ""}
    done = _run(tmp_path, tmp_path / "out", env, "ceilings")
    order = [line.split(":")[0] for line in done.stdout.splitlines() if line.startswith("ceilings/")]
    assert order[:2] == ["ceilings/host_memcpy (run 1)", "ceilings/host_memcpy (run 2)"], done.stdout + done.stderr
    results = tmp_path / "results" / "local" / "ceilings"
    first, rerun = results / "host_memcpy-tiny.csv", results / "reruns" / "run2" / "host_memcpy-tiny.csv"
    assert first.exists() and rerun.exists()
    assert load_provenance(rerun)["command"][-1].endswith("reruns/run2/host_memcpy-tiny.csv")
    assert (tmp_path / "out" / "results-local.tgz").exists()


def test_the_compile_caches_travel_in_one_archive(tmp_path):
    """What the compilers left in their cache folders is packed after each part and unpacked
    before the first part of the next machine (here: the same one, its folder emptied between)."""
    for folder in ("harness", "workloads", "systems", "config", "workflow"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    triton = tmp_path / "triton-cache"
    triton.mkdir()
    (triton / "kernel.cubin").write_bytes(b"compiled")
    archive = tmp_path / "caches.tgz"
    env = {"SUITE_SKIP_TESTS": "1", "SUITE_PARTS": "host_memcpy", "SUITE_COMPILE_CACHE": str(archive)}
    env |= {"TRITON_CACHE_DIR": str(triton), "CUDA_VISIBLE_DEVICES": "", "SUITE_GIT_COMMIT": "0" * 40}
    assert _run(tmp_path, tmp_path / "out", env, "ceilings").returncode == 0
    assert archive.exists()
    shutil.rmtree(triton)
    done = _run(tmp_path, tmp_path / "out", env, "ceilings")
    assert "compile caches unpacked" in done.stdout
    assert (triton / "kernel.cubin").read_bytes() == b"compiled"
