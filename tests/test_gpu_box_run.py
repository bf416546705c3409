"""tools/gpu_box_run.sh, the driver for a GPU machine without Snakemake: re-runs in separate
processes, part by part, its refusal of run numbers that would overwrite the committed run, of
arguments it cannot measure with (before anything runs), and an exit status that says whether the
tests, every part and the results archive succeeded."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.results import load_provenance

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu_box_run.sh"


USAGE = "usage: tools/gpu_box_run.sh MACHINE SCALE OUT_DIR TOPIC [TOPIC...]"
TREE = ("harness", "workloads", "systems", "config", "workflow")  # what measuring a part needs


def _run(cwd, out, env, *topics, machine="local", scale="tiny"):
    return _script(cwd, env, machine, scale, str(out), *topics)


def _script(cwd, env, *args):
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
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


@pytest.mark.parametrize(
    "env, message",
    [
        ({"SUITE_SKIP_TESTS": "true"}, "SUITE_SKIP_TESTS must be 1 (measure only) or 0, not 'true'"),
        ({"SUITE_GIT_COMMIT": "HEAD"}, "SUITE_GIT_COMMIT must be a commit hash (7 to 64 hex digits), not 'HEAD'"),
        ({"SUITE_GIT_COMMIT": "ABCDEF1"}, "SUITE_GIT_COMMIT must be a commit hash (7 to 64 hex digits), not 'ABCDEF1'"),
        ({"SUITE_GIT_DIRTY": "maybe"}, "SUITE_GIT_DIRTY must be 1 or 0 (or true/false, yes/no), not 'maybe'"),
    ],
)
def test_a_bad_environment_value_is_refused_before_the_tests_run(tmp_path, env, message):
    """SUITE_SKIP_TESTS=true ran the tests (only 1 skipped them); a bad commit or dirty flag was
    refused by each part after the tests' minutes."""
    done = _run(tmp_path, tmp_path / "out", env, "ceilings")
    assert done.returncode == 2 and done.stderr.strip() == message


def test_each_part_is_measured_in_every_run_before_the_next_part(tmp_path):
    for folder in TREE:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    env = {"SUITE_SKIP_TESTS": "1", "SUITE_RUNS": "1 2", "SUITE_PARTS": "host_memcpy matmul"}
    env |= {"SUITE_GIT_COMMIT": "0" * 40, "SUITE_GIT_DIRTY": "0", "CUDA_VISIBLE_DEVICES": ""}
    done = _run(tmp_path, tmp_path / "out", env, "ceilings")
    assert done.returncode == 0, done.stdout + done.stderr
    order = [line.split(":")[0] for line in done.stdout.splitlines() if line.startswith("ceilings/")]
    assert order == [f"ceilings/{part} (run {run})" for part in ("host_memcpy", "matmul") for run in (1, 2)]
    results = tmp_path / "results" / "local" / "ceilings"
    first, rerun = results / "host_memcpy-tiny.csv", results / "reruns" / "run2" / "host_memcpy-tiny.csv"
    assert first.exists() and rerun.exists()
    assert load_provenance(rerun)["command"][-1].endswith("reruns/run2/host_memcpy-tiny.csv")
    assert (tmp_path / "out" / "results-local.tgz").exists()


def test_the_compile_caches_travel_in_one_archive(tmp_path):
    """What the compilers left in their cache folders is packed after each part and unpacked
    before the first part of the next machine (here: the same one, its folder emptied between)."""
    for folder in TREE:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    triton = tmp_path / "triton-cache"
    triton.mkdir()
    (triton / "kernel.cubin").write_bytes(b"compiled")
    archive = tmp_path / "caches.tgz"
    env = {"SUITE_SKIP_TESTS": "1", "SUITE_PARTS": "host_memcpy", "SUITE_COMPILE_CACHE": str(archive)}
    env |= {"TRITON_CACHE_DIR": str(triton), "CUDA_VISIBLE_DEVICES": "", "SUITE_GIT_COMMIT": "0" * 40}
    # A CuPy cache of this test's own: the repository's is written by other tests running beside it.
    env |= {"CUPY_CACHE_DIR": str(tmp_path / "cupy-cache")}
    first = _run(tmp_path, tmp_path / "out", env, "ceilings")
    assert first.returncode == 0 and archive.exists(), first.stdout + first.stderr
    shutil.rmtree(triton)
    done = _run(tmp_path, tmp_path / "out", env, "ceilings")
    assert "compile caches unpacked" in done.stdout
    assert (triton / "kernel.cubin").read_bytes() == b"compiled"


def _copy_tree(to: Path) -> Path:
    for folder in TREE:
        shutil.copytree(ROOT / folder, to / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return to


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A copy of what measuring needs, for runs that are refused before they measure anything."""
    return _copy_tree(tmp_path_factory.mktemp("tree"))


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_prints_the_usage_and_what_the_script_does(tmp_path, flag):
    done = _script(tmp_path, {}, flag)
    assert done.returncode == 0 and done.stdout.splitlines()[0] == USAGE
    assert "SUITE_RUNS" in done.stdout and done.stderr == ""


@pytest.mark.parametrize("args", [[], ["box"], ["box", "tiny"], ["box", "tiny", "out"]])
def test_too_few_arguments_print_the_usage(tmp_path, args):
    done = _script(tmp_path, {}, *args)
    assert (done.returncode, done.stderr) == (2, USAGE + "\n")
    assert list(tmp_path.iterdir()) == []  # no output folder made, nothing measured


@pytest.mark.parametrize("machine", ["my/box", "../../escape", ".box", "-box", "box name", ""])
def test_a_machine_that_is_not_one_folder_name_is_refused_before_anything_runs(tmp_path, machine):
    done = _run(tmp_path, tmp_path / "out", {}, "ceilings", machine=machine)
    assert done.returncode == 2
    assert done.stderr == (
        f"MACHINE must be one folder name (letters, digits, '.', '_', '-'; a letter or digit first), not '{machine}'\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_the_machine_pattern_is_the_config_schemas():
    schema = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
    assert f"[[ $machine =~ {schema['properties']['machine']['pattern']} ]]" in SCRIPT.read_text()


@pytest.mark.parametrize(
    "scale, topics, env, message",
    [
        ("nosuch", ["ceilings"], {}, "error: unknown scale 'nosuch': config/config.yaml has "),
        ("h200", ["ceilings"], {}, "error: scale 'h200' needs a CUDA GPU and torch sees none here"),
        ("tiny", ["ceilings", "nosuch"], {}, "error: unknown topic 'nosuch': the topics are ceilings,"),
        ("tiny", ["ceilings"], {"SUITE_PARTS": "matmul nosuch"}, "error: topic ceilings has no part 'nosuch'"),
        (
            "tiny",
            ["ceilings"],
            {"SUITE_PARTS": "hbm_copy"},
            "error: SUITE_PARTS: ceilings/hbm_copy does not run here: it needs 1 CUDA GPU(s) and torch sees 0",
        ),
    ],
)
def test_a_scale_topic_or_part_it_cannot_measure_is_refused_before_the_tests(tree, scale, topics, env, message):
    """Not found part by part after the tests, leaving an empty archive: refused in one line, with
    nothing made (the tests would write OUT_DIR/pytest.log first)."""
    out = tree / "out"
    done = _run(tree, out, {"CUDA_VISIBLE_DEVICES": ""} | env, *topics, scale=scale)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr
    assert not out.exists() and not (tree / "results").exists()


def test_failed_tests_and_a_failed_archive_make_the_exit_status_a_failure(tmp_path):
    """Measuring goes on (the parts' results are written), but the status says what failed."""
    _copy_tree(tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_broken.py").write_text("def test_broken():\n    assert False\n")
    out = tmp_path / "out"
    (out / "results-local.tgz").mkdir(parents=True)  # the archive cannot be written there
    env = {"SUITE_PARTS": "host_memcpy", "CUDA_VISIBLE_DEVICES": "", "SUITE_GIT_COMMIT": "0" * 40}
    done = _run(tmp_path, out, env, "ceilings")
    assert done.returncode == 1
    assert f"the tests failed ({out}/pytest.log): measuring all the same, exit status 1\n" in done.stderr
    assert f"results/local could not be packed into {out}/results-local.tgz\n" in done.stderr
    assert (tmp_path / "results" / "local" / "ceilings" / "host_memcpy-tiny.csv").exists()
    # The tests pass and the archive is written: success.
    (tmp_path / "tests" / "test_broken.py").write_text("def test_fixed():\n    pass\n")
    (out / "results-local.tgz").rmdir()
    done = _run(tmp_path, out, env, "ceilings")
    assert done.returncode == 0, done.stderr
    assert (out / "results-local.tgz").is_file()
