"""docs/adding_a_topic.md, followed literally: its files written into a copy of the repository,
its command run at the tiny scale. Adding the topic must change no file that existed before."""

import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, copy_repository, file_digests

pytestmark = pytest.mark.slow
GUIDE = REPO_ROOT / "docs" / "adding_a_topic.md"
# What running the workflow may create beside the guide's files.
OUTPUTS = ("results/local/", "paper_figs/local/", "logs/", ".snakemake/", ".cache/", ".scratch/")


def guide_blocks() -> list[tuple[str, str, str]]:
    """(language, path, text) of every fenced block of the guide; path is '' where none is given."""
    fence = re.compile(r"^```(\w+)[ \t]*(\S*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
    return [m.groups() for m in fence.finditer(GUIDE.read_text())]


def test_the_guide_names_every_file_of_a_topic():
    paths = [path for _, path, _ in guide_blocks() if path]
    assert paths == [
        "workloads/vector_sum/__init__.py",
        "workloads/vector_sum/parts.py",
        "config/vector_sum.yaml",
        "workflow/schemas/vector_sum.schema.yaml",
        "analysis/vector_sum.py",
        "workflow/report/vector_sum.rst",
    ]


def test_a_new_topic_is_new_files_only_and_runs_at_tiny_scale(tmp_path):
    root = copy_repository(tmp_path / "repo")
    before = file_digests(root, OUTPUTS)
    blocks = guide_blocks()
    for _, path, text in blocks:
        if path:
            assert path not in before, f"the guide's {path} already exists"
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
    commands = [
        line
        for language, path, text in blocks
        if language == "bash" and not path
        for line in text.splitlines()
        if line.strip()
    ]
    assert commands == ["snakemake --cores all vector_sum --config scale=tiny"]
    env = {**os.environ, "SUITE_HIDE_GPU": "1"}  # the CPU path, also on a GPU machine
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "snakemake"
        result = subprocess.run(
            [sys.executable, "-m", "snakemake", *argv[1:]],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,  # a hang guard only: the run may be slow on a loaded machine
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    results = root / "results" / "local" / "vector_sum"
    assert sorted(p.name for p in results.iterdir()) == ["reduce-tiny.csv", "reduce-tiny.provenance.json"]
    figure = root / "paper_figs" / "local" / "vector_sum-tiny.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| size (MiB) | median GB/s |" in figure.with_suffix(".md").read_text()

    after = file_digests(root, OUTPUTS)
    changed = sorted(name for name in before if after.get(name) != before[name])
    assert changed == [], f"adding a topic changed existing files: {changed}"
    added = sorted(set(after) - set(before))
    assert added == sorted(path for _, path, _ in blocks if path)

    listed = subprocess.run(
        [sys.executable, "-m", "workloads", "vector_sum", "--list-parts"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert listed == ["reduce"]
