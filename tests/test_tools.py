"""The command lines of tools/: the GPU-only ones refuse a machine without a GPU in one line,
before they read or generate anything, and add_code_digest refuses a malformed record by name and
says when a folder holds none."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Each tool with the arguments it is run with: a small graph, where one is made.
GPU_TOOLS = {
    "gnn_step_profile": [],
    "gather_call_overhead": [],
    "gather_kernel_probe": [],
    "profile_gnn_batch": ["--scale-factor", "0.001", "--batches", "2"],
}


def _tool(cwd: Path, name: str, *args, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, f"tools/{name}.py", *map(str, args)],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(cwd), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A copy of the code: a tool that went on without a GPU would write its graph under this
    copy's data/, not the checkout's."""
    to = tmp_path_factory.mktemp("tree")
    for folder in ("harness", "workloads", "systems", "config", "workflow", "tools"):
        shutil.copytree(ROOT / folder, to / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return to


@pytest.mark.parametrize("name", list(GPU_TOOLS))
def test_a_gpu_tool_refuses_a_machine_without_a_gpu_in_one_line(tree, name):
    done = _tool(tree, name, *GPU_TOOLS[name], CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"error: tools/{name}.py needs a CUDA GPU: ") and done.stderr.count("\n") == 1
    assert not (tree / "data").exists()  # nothing generated before the refusal


def test_profile_gnn_batch_refuses_bad_arguments_before_the_gpu(tree):
    done = _tool(tree, "profile_gnn_batch", "--batches", "0", CUDA_VISIBLE_DEVICES="")
    assert (done.returncode, done.stderr) == (2, "error: --batches must be at least 1 and --workers at least 0\n")
    done = _tool(tree, "profile_gnn_batch", "--scale-factor", "2", CUDA_VISIBLE_DEVICES="")
    assert (done.returncode, done.stderr) == (2, "error: --scale-factor must be in (0, 1], got 2.0\n")


def test_add_code_digest_names_a_malformed_record_in_one_line_and_writes_nothing(tmp_path):
    folder = tmp_path / "results" / "ceilings"
    folder.mkdir(parents=True)
    whole = folder / "disk-h200.provenance.json"
    whole.write_text(json.dumps({"git": {"commit": "0" * 40, "dirty": True}, "topic": "ceilings"}))
    cut = folder / "matmul-h200.provenance.json"
    cut.write_text('{"git": {"commit": ')
    before = whole.read_text()
    done = _tool(ROOT, "add_code_digest", tmp_path / "results")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"error: {cut} is not valid JSON (line 1, column 20: Expecting value)\n"
    assert whole.read_text() == before
    cut.write_text("[]")
    done = _tool(ROOT, "add_code_digest", tmp_path / "results")
    assert (done.returncode, done.stderr) == (
        2,
        f"error: {cut} holds a JSON list, not a provenance record (an object)\n",
    )


def test_add_code_digest_says_when_a_folder_holds_no_record(tmp_path):
    done = _tool(ROOT, "add_code_digest", tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"{tmp_path}: no provenance records (*.provenance.json) in it or below it\n"
