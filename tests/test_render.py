"""Executing a text-based notebook headless: parameters and results files injected, outputs
replaced only when every cell succeeds, failures reported in one line."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from analysis.render import main

pytest.importorskip("jupytext", reason="notebook rendering needs jupytext (the CPU environment has it)")

NOTEBOOK = """# %% tags=["parameters"]
value = "default"
figure = summary = "none"
results = {}

# %%
from pathlib import Path
Path(summary).write_text(value + " " + repr(results))
if value == "boom":
    raise ValueError("the notebook refused value=boom")
if value == "deep":
    from harness.config import scale_params
    scale_params({"scales": {}}, "nope", check_gpu=False)
if value != "lazy":
    Path(figure).write_text("a figure")
"""


@pytest.fixture
def notebook(tmp_path):
    path = tmp_path / "demo.py"
    path.write_text(NOTEBOOK)
    return path


def render(notebook, tmp_path, *args):
    main(
        [
            str(notebook),
            "--executed",
            str(tmp_path / "run.ipynb"),
            "--figure",
            str(tmp_path / "fig.png"),
            "--summary",
            str(tmp_path / "fig.md"),
            *args,
        ]
    )


def test_parameters_and_results_files_reach_the_notebook(notebook, tmp_path):
    files = ["--results", "a=x.csv", "--results", "b=y.csv", "--results", "a=z.csv"]
    render(notebook, tmp_path, "-p", "value=hello", "--topic", "a", "--topic", "c", *files)
    # A topic named with --topic is in `results` even when it has no files.
    assert (tmp_path / "fig.md").read_text() == "hello {'a': ['x.csv', 'z.csv'], 'c': [], 'b': ['y.csv']}"
    assert (tmp_path / "fig.png").read_text() == "a figure"
    assert "Injected by analysis.render" in (tmp_path / "run.ipynb").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.py", "fig.md", "fig.png", "run.ipynb"]


@pytest.mark.parametrize(
    "value, message",
    [
        # Where it was raised: the notebook's cell (in the executed copy), or the suite's own file.
        ("boom", r"failed at \S+run\.ipynb cell In\[\d+\], line 4: ValueError: the notebook refused value=boom"),
        ("deep", r"failed at harness/config\.py:\d+: ConfigError: unknown scale 'nope'"),
        ("lazy", "ran but wrote no"),  # a notebook that forgets its figure fails too
    ],
)
def test_a_failed_render_leaves_the_previous_outputs_as_they_were(notebook, tmp_path, capsys, value, message):
    (tmp_path / "fig.png").write_text("old figure")
    (tmp_path / "fig.md").write_text("old summary")
    with pytest.raises(SystemExit) as exit_info:
        render(notebook, tmp_path, "-p", f"value={value}")
    assert exit_info.value.code in (1, 2)
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and re.search(message, err), err
    assert (tmp_path / "fig.png").read_text() == "old figure"
    assert (tmp_path / "fig.md").read_text() == "old summary"
    assert (tmp_path / "run.ipynb").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.py", "fig.md", "fig.png", "run.ipynb"]


def test_refuses_notebook_without_parameters_cell_and_bad_arguments(tmp_path, capsys):
    plain = tmp_path / "plain.py"
    plain.write_text("# %%\nx = 1\n")
    with pytest.raises(SystemExit):
        render(plain, tmp_path)
    assert "no cell tagged 'parameters'" in capsys.readouterr().err
    for bad in (["-p", "no-equals-sign"], ["--results", "no-file"], ["--results", "bad topic=x.csv"]):
        with pytest.raises(SystemExit):
            render(plain, tmp_path, *bad)
    capsys.readouterr()
    (tmp_path / "a_file").write_text("")
    for flag in ("--executed", "--figure", "--summary"):  # given again, after the defaults: it wins
        with pytest.raises(SystemExit):
            render(plain, tmp_path, flag, str(tmp_path / "a_file" / "out.x"))
        error = capsys.readouterr().err.strip()
        folder = tmp_path / "a_file"
        assert error == f"error: {flag}'s folder {folder} cannot be made: {folder} is a file, not a folder"


SUPPORTING = """# %% tags=["parameters"]
figure = summary = "none"
results = {}

# %%
from pathlib import Path
import matplotlib.pyplot as plt
from analysis import style
fig, ax = plt.subplots()
ax.plot([0, 1], [3, 1])
ax.set_title("my_new_store")
style.save(fig, figure, "detail")
fig, ax = plt.subplots()
ax.bar(["a"], [2])
style.save(fig, figure)
Path(summary).write_text("ok")
"""


def test_supporting_figures_replace_those_of_the_last_render_and_record_their_words(tmp_path):
    (tmp_path / "demo.py").write_text(SUPPORTING)
    (tmp_path / "fig-gone.png").write_text("a supporting figure the notebook no longer writes")
    (tmp_path / "fig-detail.png").write_text("the last render's")
    (tmp_path / "figure-other.png").write_text("another topic's figure")
    render(tmp_path / "demo.py", tmp_path)
    assert (tmp_path / "fig-detail.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "fig-gone.png").exists()
    assert (tmp_path / "figure-other.png").exists()
    assert not list(tmp_path.glob(".*tmp*"))
    assert "my_new_store" in (tmp_path / "run-detail.text.json").read_text()
    assert "my_new_store" not in (tmp_path / "run.text.json").read_text()


# Parts of llm_offload with tables and panels of their own, none of which times a step per policy.
LLM_OWN_PART_HEADINGS = {
    "micro_batches": "## Micro-batches at a fixed global batch (part micro_batches)",
    "memory_bound": "## The largest micro-batch under a memory cap (part memory_bound)",
    "convergence": "## Convergence on the generated corpus (part convergence)",
}


@pytest.mark.parametrize("part", list(LLM_OWN_PART_HEADINGS))
def test_llm_offload_renders_the_results_of_one_part_without_a_step_per_policy(tmp_path, part):
    """A machine whose llm_offload results hold only micro_batches, memory_bound or convergence:
    that part's table, and its panel as the topic's figure (no ratios to keep, which need parts
    that time a step per policy). The committed H200 files where there are, else the part measured
    at scale tiny."""
    committed = REPO_ROOT / "results" / "h200" / "llm_offload" / f"{part}-h200.csv"
    if committed.exists():
        results, scale = committed, "h200"
    else:
        results, scale = tmp_path / "results" / f"{part}-tiny.csv", "tiny"
        measured = subprocess.run(
            [sys.executable, "-m", "workloads", "llm_offload", "--part", part, "--scale", "tiny"]
            + ["--out", str(results), "--scratch-dir", str(tmp_path)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert measured.returncode == 0, measured.stderr
    figure, summary = tmp_path / "llm.png", tmp_path / "llm.md"
    main(
        ["analysis/llm_offload.py", "--executed", str(tmp_path / "nb.ipynb"), "-p", "machine=m", "-p", f"scale={scale}"]
        + ["--topic", "llm_offload", "--topic", "llm_offload_reruns", "--results", f"llm_offload={results}"]
        + ["--figure", str(figure), "--summary", str(summary)]
    )
    text = summary.read_text()
    assert f"Parts measured here: {part}. None of them times one training step per policy" in text
    assert LLM_OWN_PART_HEADINGS[part] in text and "| model | variant | step s |" not in text
    assert figure.read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.glob("llm*.png")) == ["llm.png"]  # no supporting figure


def test_the_place_named_is_the_suites_deepest_frame_not_a_librarys():
    """A library under the repository's .venv is not the suite's code: the frame named is the last
    one in the suite's own files; without one, the last notebook cell's line; else nothing."""
    from analysis.render import REPO_ROOT, _fault

    ours = f"\x1b[36mFile \x1b[39m\x1b[32m{REPO_ROOT}/analysis/style.py:12\x1b[39m, in f()"
    library = f"File {REPO_ROOT}/.venv/lib/python3.11/site-packages/matplotlib/axes.py:99, in g()"
    cell = "Cell In[4], line 7"
    executed = Path("run.ipynb")
    assert _fault("\n".join([cell, ours, library]), executed) == " at analysis/style.py:12"
    assert _fault("\n".join([cell, library]), executed) == " at run.ipynb cell In[4], line 7"
    assert _fault(library, executed) == ""
