"""docs/adding_a_variant.md, followed literally: each technique's new entry written as one new file
into a copy of the repository, each topic's tiny target run. The new entries must be measured,
checked against the reference like the others (a broken copy is refused), shown in the summary
tables, speedups and figure, and no file that existed before may change."""

import importlib
import json
import os
import re
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO_ROOT, copy_repository, file_digests

GUIDE = REPO_ROOT / "docs" / "adding_a_variant.md"
COMMAND = "snakemake --cores all feature_gather llm_offload relational_gnn --config scale=tiny"
OUTPUTS = ("results/local/", "paper_figs/local/", "logs/", ".snakemake/", ".cache/", ".scratch/", "data/")


@dataclass(frozen=True)
class NewEntry:
    """What one section of the guide adds, and where it must show."""

    topic: str
    registry: str  # "module:NAME" of the registry the file adds to
    entry: str  # the entry's name there
    variant: str  # the results' variant of its rows
    columns: dict  # other columns its rows carry
    parts: tuple  # results files (parts) that must hold its rows
    shown: str  # how the summary and the figure name it
    summary: tuple  # lines of the summary that must name it (regular expressions)
    broken: tuple  # (text, replacement): a copy of the entry that computes a wrong answer
    refusal: tuple  # (part, a pattern its error matches) for the broken copy
    in_figure: str = ""  # how the figure names it, where not as ``shown`` (a store's legend entry)


NEW = {
    "systems/pytorch_direct/gather_variants/cpu_gather_halves.py": NewEntry(
        topic="feature_gather",
        registry="systems.pytorch_direct.gather_variants:GATHER_VARIANTS",
        entry="cpu_gather_halves",
        variant="cpu_gather_halves",
        columns={"role": "optimized"},
        parts=("row_sizes", "cpu_threads"),
        shown="cpu_gather_halves",
        summary=(r"^\| dtype \| dim \| row \|.*\| cpu_gather_halves \|", r"^\|.*\| x cpu_gather_halves \|"),
        broken=("            return b.staging\n", "            return b.staging + 1\n"),
        refusal=("row_sizes", "returned rows that differ from the table"),
    ),
    "systems/ssdtrain/stores/zlib_host.py": NewEntry(
        topic="llm_offload",
        registry="systems.ssdtrain.stores:STORES",
        entry="zlib_host",
        variant="offload_all_zlib_host",
        columns={"role": "optimized", "policy": "offload_all", "store": "zlib_host"},
        parts=("policies",),
        shown="offload_all, zlib_host",
        summary=(r"^\| gpt2-tiny \| offload_all, zlib_host \|", r"^\| llama-tiny \| offload_all, zlib_host \|"),
        broken=(
            "        raw = bytearray(zlib.decompress(self._blobs[key]))\n",
            # a bit of the middle byte: the last bytes hold the last position, which no loss term reads
            "        raw = bytearray(zlib.decompress(self._blobs[key]))\n        raw[len(raw) // 2] ^= 0x10\n",
        ),
        # refused by the bandwidth probe of the planned policies, or else by the checked step
        refusal=("policies", "returned other bytes than it was given|differs? from keep's"),
        in_figure="store: zlib-compressed host memory",  # the label it registers, beside its own marker
    ),
    "systems/rgnn/forms/padded_bmm.py": NewEntry(
        topic="relational_gnn",
        registry="systems.rgnn.forms:FORMS",
        entry="padded_bmm",
        variant="padded_bmm",
        columns={"role": "baseline", "form": "padded_bmm", "precision": "float32"},
        parts=("knowledge_graphs", "datasets"),
        shown="padded_bmm",
        summary=(r"^\| nations \|.*\| rgcn \|.*\| training \| padded_bmm \|", r"^Competitors: .*\bpadded_bmm\b"),
        broken=("g.norm[ordered].unsqueeze(1)\n", "g.norm[ordered].unsqueeze(1) * 1.5\n"),
        refusal=("knowledge_graphs", "differs from segment_mm"),
    ),
}


def guide_files() -> dict[str, str]:
    """The guide's new files: path -> text, from every fenced block with a path."""
    fence = re.compile(r"^```(\w+)[ \t]+(\S+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
    return {path: text for _, path, text in fence.findall(GUIDE.read_text())}


def registry_of(new: NewEntry):
    module, name = new.registry.split(":")
    return getattr(importlib.import_module(module), name)


def test_the_guide_adds_one_file_per_technique_and_runs_the_three_tiny_targets():
    assert list(guide_files()) == list(NEW)
    assert f"```bash\n{COMMAND}\n```" in GUIDE.read_text()
    for path in NEW:
        assert not (REPO_ROOT / path).exists(), f"the guide's {path} is already in the repository"


@pytest.mark.parametrize("path", list(NEW))
def test_each_new_file_registers_its_entry_and_nothing_else(path):
    new = NEW[path]
    registry = registry_of(new)
    before = registry.names()
    module = types.ModuleType(path.removesuffix(".py").replace("/", "."))
    try:
        exec(compile(guide_files()[path], path, "exec"), module.__dict__)
        assert registry.names() == (*before, new.entry)
        assert registry[new.entry].role == new.columns["role"]
    finally:
        registry.unregister(new.entry)
    assert registry.names() == before


def run(root: Path, argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "SUITE_HIDE_GPU": "1", "PYTHONPATH": str(root)}  # the CPU path, also on a GPU machine
    return subprocess.run([sys.executable, *argv], cwd=root, env=env, capture_output=True, text=True, timeout=1500)


@pytest.mark.full
@pytest.mark.slow
def test_each_new_entry_is_measured_checked_and_shown_and_no_file_changes(tmp_path):
    root = copy_repository(tmp_path / "repo")
    before = file_digests(root, OUTPUTS)
    files = guide_files()
    for path, text in files.items():
        (root / path).write_text(text)
    result = run(root, ["-m", *COMMAND.split()])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    after = file_digests(root, OUTPUTS)
    assert {name: after.get(name) for name in before} == before, "an existing file changed"
    assert set(after) - set(before) == set(files)

    for new in NEW.values():
        for part in new.parts:
            frame = pd.read_csv(root / "results" / "local" / new.topic / f"{part}-tiny.csv")
            rows = frame[frame["variant"] == new.variant]
            assert len(rows), f"{new.topic}/{part}: no rows of {new.variant}"
            for column, value in new.columns.items():
                assert set(rows[column].astype(str)) == {str(value)}, f"{new.topic}/{part}: {column}"
            timed = rows[rows["metric"] == "time"]["value"]
            assert len(timed) and (timed > 0).all()
        summary = (root / "paper_figs" / "local" / f"{new.topic}-tiny.md").read_text()
        for line in new.summary:
            assert re.search(line, summary, re.MULTILINE), f"{new.topic}'s summary has no line like {line!r}"
        words = json.loads((root / "logs" / "local" / "notebooks" / f"{new.topic}-tiny.text.json").read_text())
        in_figure = new.in_figure or new.shown
        assert any(in_figure in w for panel in words for w in panel), f"{new.topic}'s figure does not show it"

    # A broken copy of each entry is refused by its part's check, before anything is timed.
    for path, new in NEW.items():
        good, bad = new.broken
        assert files[path].count(good) == 1
        (root / path).write_text(files[path].replace(good, bad))
        part, error = new.refusal
        out = tmp_path / f"{part}-tiny.csv"
        argv = ["-m", "workloads", new.topic, "--part", part, "--scale", "tiny", "--out", str(out)]
        result = run(root, argv)
        assert result.returncode != 0 and re.search(error, result.stdout + result.stderr), result.stderr[-2000:]
        assert not out.exists()
        (root / path).write_text(files[path])
