"""The Snakemake workflow end to end at the tiny scale, in a copy of the repository.

Checks what a user does first: reproduce, figures from committed results, the report, lint,
resuming an interrupted run, the one-line errors for bad input, and reproduce beside processes
that keep every core busy (no check may rest on how fast the machine is).

Tiers: the quick one (``make test``) keeps lint and one refusal, which need no measuring; the
rest measure or render and run in the full tier (``make test-all``).

Most tests share one copy, made and measured once per run: every pytest-xdist worker of the
run uses the same copy, one test at a time (a lock), so the tests are right however they are
spread over the workers. They are also one xdist group (``--dist loadgroup``), which keeps them
on one worker where the installed pytest and xdist honour groups, so no worker waits for the
lock. The interrupted run and the load test make copies of their own and run beside them.
"""

import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import copy_repository, run_directory, taking_turns

from harness import results
from harness.topic import discover

TOPICS = discover()
HOST_PROBES = [p.name for p in TOPICS["ceilings"].parts_on(0)]
# Measuring jobs of `reproduce` without a GPU.
CPU_JOBS = sum(len(topic.parts_on(0)) for topic in TOPICS.values())

pytestmark = pytest.mark.slow
SHARED_COPY = pytest.mark.xdist_group("workflow_copy")
REPO_ROOT = Path(__file__).resolve().parent.parent
HIDE_GPU = {"SUITE_HIDE_GPU": "1"}  # the CPU path, also on a GPU machine
# Only a guard against a hung run: a whole tiny reproduce on a loaded 2-core machine must fit.
HANG_GUARD_S = 3600


@pytest.fixture
def workdir(tmp_path_factory):
    """The run's shared copy of the repository's files (tracked and untracked-not-ignored),
    without local results, held by this test alone until it ends."""
    shared = run_directory(tmp_path_factory)
    copy, made = shared / "workflow_copy", shared / "workflow_copy.made"
    with taking_turns(shared / "workflow_copy.lock"):
        if not made.exists():  # the first test of the run to ask (or one after a failed copy)
            if copy.exists():
                shutil.rmtree(copy)
            copy_repository(copy)
            made.touch()
        yield copy


def snakemake(workdir, *args, env=None, check=True):
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        env={**os.environ, **HIDE_GPU, **(env or {})},
        timeout=HANG_GUARD_S,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def planned_outputs(result, rule):
    """The output lines of the jobs of ``rule`` that a dry run planned."""
    outputs, current = [], None
    for line in (result.stdout + result.stderr).splitlines():
        if line.startswith(("rule ", "localrule ")):
            current = line.split()[1].rstrip(":")
        elif current == rule and line.strip().startswith("output:"):
            outputs.append(line.strip())
    return outputs


def planned_jobs(result, rule):
    """How many jobs of ``rule`` a dry run planned (from its job-stats table)."""
    for line in (result.stdout + result.stderr).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == rule and parts[1].isdigit():
            return int(parts[1])
    return 0


def reproduce_measures_renders_and_is_then_up_to_date(workdir):
    snakemake(workdir, "reproduce", "--config", "scale=tiny")
    folder = workdir / "results" / "local" / "ceilings"
    for probe in HOST_PROBES:
        assert (folder / f"{probe}-tiny.csv").stat().st_size > 0
        assert (folder / f"{probe}-tiny.provenance.json").exists()
    figure = workdir / "paper_figs" / "local" / "ceilings-tiny.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| matmul fp32 |" in (workdir / "paper_figs" / "local" / "ceilings-tiny.md").read_text()
    records = sorted((workdir / "results" / "local").rglob("*-tiny.provenance.json"))
    assert len(records) >= 10
    for record in records:  # every suite module a part loaded is among its topic's files
        code = json.loads(record.read_text())["code"]
        assert code["topic"] and code.get("loaded_outside_scope", []) == [], record
    again = snakemake(workdir, "reproduce", "--config", "scale=tiny", "-n")
    assert "Nothing to be done" in again.stdout + again.stderr


@pytest.mark.full
@SHARED_COPY
def test_reproduce_measures_renders_and_is_then_up_to_date(workdir):
    reproduce_measures_renders_and_is_then_up_to_date(workdir)


@pytest.mark.full
def test_reproduce_is_the_same_beside_processes_that_keep_every_core_busy(tmp_path):
    """The reproduce check on a machine with no idle core (two spinning processes, as many as
    the 2-core machines this suite runs on have): every measuring part, correctness check and
    rendering must come out the same, however long it takes."""
    workdir = copy_repository(tmp_path / "repo")
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL) for _ in range(2)
    ]
    try:
        reproduce_measures_renders_and_is_then_up_to_date(workdir)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@pytest.mark.full
@SHARED_COPY
def test_figures_renders_committed_h200_results_without_measuring(workdir):
    committed = workdir / "results" / "h200" / "ceilings"
    if not committed.exists():
        pytest.skip("no committed H200 results in this checkout")
    figure = workdir / "paper_figs" / "h200" / "ceilings-h200.png"
    figure.unlink(missing_ok=True)
    # One part of this machine's ceilings at the cpu scale, the others never measured (the shared
    # copy may hold its tiny-scale results): that figure is left out, and said to be.
    one_part = workdir / "results" / "local" / "ceilings" / "matmul-cpu.csv"
    record = one_part.with_name("matmul-cpu.provenance.json")
    one_part.parent.mkdir(parents=True, exist_ok=True)
    one_part.write_text("x\n")
    record.write_text("{}")
    try:
        dry = snakemake(workdir, "figures", "-n")
        assert planned_jobs(dry, "measure") == 0
        assert planned_jobs(dry, "ceilings_figure") >= 1
        rendered = snakemake(workdir, "figures")
    finally:
        one_part.unlink()
        record.unlink()
    assert figure.stat().st_size > 50_000
    assert not (workdir / "paper_figs" / "local" / "ceilings-cpu.png").exists()
    said = [line for line in rendered.stderr.splitlines() if "ceilings-cpu.png" in line]
    assert len(said) == 1 and said[0].startswith("figures: paper_figs/local/ceilings-cpu.png not rendered"), said
    assert "results/local/ceilings/" in said[0] and "snakemake --cores all ceilings --config scale=cpu" in said[0]


@pytest.mark.full
@SHARED_COPY
def test_remeasured_ceilings_rerender_every_figure_that_reads_them(workdir):
    snakemake(workdir, "reproduce", "--config", "scale=tiny")
    (workdir / "results" / "local" / "ceilings" / "matmul-tiny.csv").unlink()
    dry = snakemake(workdir, "reproduce", "--config", "scale=tiny", "-n")
    readers = [name for name, topic in TOPICS.items() if "ceilings" in topic.reads]
    assert readers
    for name in ["ceilings", *readers]:
        assert planned_jobs(dry, f"{name}_figure") == 1, name
    snakemake(workdir, "reproduce", "--config", "scale=tiny")


@pytest.mark.full
@SHARED_COPY
def test_a_failed_render_keeps_the_committed_figure(workdir):
    committed = workdir / "results" / "h200" / "ceilings"
    if not committed.exists():
        pytest.skip("no committed H200 results in this checkout")
    csv = results.committed(committed / "disk-h200.csv")  # compressed where committed so
    figure = workdir / "paper_figs" / "h200" / "ceilings-h200.png"
    summary = figure.with_suffix(".md")
    before = figure.read_bytes(), summary.read_bytes(), csv.read_bytes()
    try:
        other = workdir / "paper_figs" / "h200" / "gnn_multi_gpu-h200.png"
        os.utime(other, (1, 1))
        corrupted = results.results_bytes(csv).replace(b"GB/s", b"furlongs", 1)  # a corrupted results file
        csv.write_bytes(gzip.compress(corrupted) if csv.name.endswith(".gz") else corrupted)
        forced = ["--forcerun", "ceilings_figure", "gnn_multi_gpu_figure"]
        result = snakemake(workdir, "--cores", "1", "figures", *forced, check=False)
        assert result.returncode != 0
        assert "furlongs" in result.stdout + result.stderr  # the refusal names what is wrong
        assert (figure.read_bytes(), summary.read_bytes()) == before[:2]
        assert not list(figure.parent.glob(".*tmp*"))  # no temporary files left behind
        assert other.stat().st_mtime > 1  # the other figure still rendered
        # The figure put back is not taken as up to date: the next run renders it again.
        again = snakemake(workdir, "--cores", "1", "figures", "-n")
        assert planned_outputs(again, "ceilings_figure")
    finally:
        csv.write_bytes(before[2])


@pytest.mark.full
@SHARED_COPY
def test_report_holds_every_figure(workdir):
    snakemake(workdir, "reproduce", "--config", "scale=tiny")
    snakemake(workdir, "--report", "report.html", "figures")
    html = (workdir / "report.html").read_text(errors="replace")
    assert "ceilings-tiny.png" in html
    if (workdir / "results" / "h200").exists():
        assert "ceilings-h200.png" in html


@SHARED_COPY
def test_lint_leaves_only_the_explained_warning(workdir):
    result = snakemake(workdir, "--lint", check=False)
    warnings = [line.strip() for line in result.stderr.splitlines() if line.strip().startswith("* ")]
    assert warnings, "expected the documented conda/container warning"
    assert all(w.startswith("* Specify a conda environment or container") for w in warnings), warnings


@pytest.mark.full
@SHARED_COPY
def test_a_deleted_result_is_the_only_job_redone(workdir):
    snakemake(workdir, "reproduce", "--config", "scale=tiny")
    (workdir / "results" / "local" / "ceilings" / "disk-tiny.csv").unlink()
    dry = snakemake(workdir, "reproduce", "--config", "scale=tiny", "-n")
    assert planned_jobs(dry, "measure") == 1
    assert "disk-tiny.csv" in " ".join(planned_outputs(dry, "measure"))


@pytest.mark.full
def test_interrupted_run_redoes_only_unfinished_jobs(tmp_path):
    workdir = copy_repository(tmp_path / "repo")  # of its own: it starts from no results at all
    folder = workdir / "results" / "local" / "ceilings"
    proc = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "reproduce", "--config", "scale=tiny"],
        cwd=workdir,
        env={**os.environ, **HIDE_GPU},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        # Ctrl-C must reach it even when the tests themselves run where SIGINT is ignored (a
        # background job of a script: its children inherit the ignoring, and Python then never
        # raises KeyboardInterrupt).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # Measuring jobs run one at a time, so once a second results file appears the first job is
    # over and recorded; interrupt then (Ctrl-C), while the second job may still be running.
    # However slow the machine, the run is interrupted at that point (the deadline only guards
    # against a run that hangs).
    deadline = time.monotonic() + HANG_GUARD_S
    while len(list(folder.parent.glob("*/*.csv"))) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"reproduce ended (exit {proc.returncode}) before its second results file"
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=HANG_GUARD_S)
    first_done = min(folder.parent.glob("*/*.csv"), key=lambda p: p.stat().st_mtime)
    dry = snakemake(workdir, "reproduce", "--config", "scale=tiny", "-n")
    redone = " ".join(planned_outputs(dry, "measure"))
    assert 1 <= planned_jobs(dry, "measure") <= CPU_JOBS - 1, redone
    # Whole paths, split on the separators: datasets-tiny.csv is a substring of large_datasets-tiny.csv.
    assert str(first_done.relative_to(workdir)) not in re.split(r"[\s,]+", redone), redone
    snakemake(workdir, "reproduce", "--config", "scale=tiny")
    assert len(list(folder.glob("*.csv"))) == len(HOST_PROBES)
    assert len(list(folder.parent.glob("*/*.csv"))) == CPU_JOBS


@SHARED_COPY
@pytest.mark.parametrize(
    "args, env, message",
    [
        # One refusal in the quick tier: each is a dry run of the whole workflow (seconds).
        (["reproduce", "--config", "scale=huge"], {}, "error: unknown scale 'huge'; choose one of tiny, cpu, h200"),
        *(
            pytest.param(*case, marks=pytest.mark.full)
            for case in [
                (["reproduce", "--config", "scale=h200"], {}, "error: scale 'h200' needs a CUDA GPU"),
                (["ceilings", "--config", "scale=h200"], {}, "error: scale 'h200' needs a CUDA GPU"),
                (["claims", "--config", "scale=h200"], {}, "error: scale 'h200' needs a CUDA GPU"),
                (["reproduce", "--config", "machine=../x"], {}, "error: config key 'machine': '../x' does not match"),
                (
                    ["reproduce", "--config", "machine=h200"],
                    {},
                    "error: results/h200/ holds results measured on other hardware (NVIDIA H200;",
                ),
                (
                    ["reproduce", "--config", "scale=tiny", "topics={gnn_training: {}}"],
                    {},
                    "error: topic 'gnn_training' has no block for scale 'tiny' (config/gnn_training.yaml",
                ),
                (
                    ["reproduce", "--config", "scale=tiny", "topics={gnn_training: {cpu: {}}}"],
                    {},
                    "error: the config's topics/gnn_training: key 'cpu': 'repeat' is a required property",
                ),
                (["nosuchtarget"], {}, "No rule to produce nosuchtarget"),
            ]
        ),
    ],
)
def test_bad_input_is_refused_in_one_line(workdir, args, env, message):
    result = snakemake(workdir, *args, "-n", env=env, check=False)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert message in output, output[-2000:]
    if message.startswith("error:"):
        errors = [line for line in output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in output


@SHARED_COPY
@pytest.mark.full
def test_a_key_given_twice_in_a_config_file_is_refused_in_one_line(workdir, tmp_path):
    """Snakemake's own reader keeps a repeated key's last value: scale cpu, then scale tiny, planned tiny."""
    repeated = tmp_path / "config.yaml"
    repeated.write_text((workdir / "config" / "config.yaml").read_text() + "scale: tiny\n")
    result = snakemake(workdir, "ceilings", "-n", "--configfile", str(repeated), check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "key 'scale' is given twice" in errors[0] and "Traceback" not in output


def committed_figures():
    """Every PNG under paper_figs/ that git tracks (relative paths)."""
    listed = subprocess.run(
        ["git", "ls-files", "paper_figs"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return sorted(path for path in listed if path.endswith(".png"))


@SHARED_COPY
@pytest.mark.parametrize("config", [[], ["--config", "scale=h200"]], ids=["configured_scale", "gpu_scale"])
def test_figures_plans_only_rendering(workdir, config):
    """`figures` never measures: its dry run plans renders (and supporting-figure checks) only,
    also at a GPU scale on a machine without a GPU."""
    dry = snakemake(workdir, "--cores", "1", "-n", "figures", *config)
    rules = {
        line.split()[1].rstrip(":") for line in dry.stdout.splitlines() if line.startswith(("rule ", "localrule "))
    }
    assert planned_jobs(dry, "measure") == 0
    assert all(rule.endswith("_figure") or rule in {"figures", "claims_table"} for rule in rules), rules


@SHARED_COPY
def test_the_report_shows_every_committed_figure_with_a_caption(workdir, tmp_path):
    """Each PNG committed under paper_figs/ (headline and supporting) is the output of a rule
    marked for the report, and the report gives it a caption."""
    figures = committed_figures()
    assert any(re.search(r"-[a-z0-9_]+-[a-z0-9_]+\.png$", f) for f in figures), "no supporting figure committed"
    snakemake(workdir, "--report", str(tmp_path / "report.html"), "figures")
    html = (tmp_path / "report.html").read_text(errors="replace")
    record = (
        r'"{path}": \{{"name": "[^"]*", "filename": "[^"]*", "labels": \{{[^}}]*\}}, "size": "[^"]*", "caption": "<p>\S'
    )
    missing = [f for f in figures if not re.search(record.format(path=re.escape(f)), html)]
    assert not missing, f"figures the report does not show with a caption: {missing}"
