"""The ceilings probes at the tiny scale, through their entry point, into validated results."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.entry import main as entry
from harness.resources import block_device_counters
from harness.results import ResultsFormatError, load, load_provenance
from workloads.ceilings import TOPIC
from workloads.ceilings.schema import SCHEMA

ROOT = Path(__file__).resolve().parents[1]
HOST_PROBES = [p.name for p in TOPIC.parts_on(0)]
GPU_PROBES = [p.name for p in TOPIC.parts if not p.cpu]


def first_quick(names):
    """The first name in the quick tier, the others only in the full one (the same check of
    another probe: each probe's own behaviour has a test of its own below)."""
    return [name if i == 0 else pytest.param(name, marks=pytest.mark.full) for i, name in enumerate(names)]


def _run(tmp_path, probe):
    out = tmp_path / "results" / f"{probe}-tiny.csv"
    entry(
        ["ceilings", "--part", probe, "--scale", "tiny", "--out", str(out), "--scratch-dir", str(tmp_path / "scratch")]
    )
    return load([out], SCHEMA), load_provenance(out)


@pytest.mark.parametrize("probe", first_quick(HOST_PROBES))
def test_host_probe_writes_valid_results_with_provenance(tmp_path, probe):
    frame, prov = _run(tmp_path, probe)
    assert set(frame["role"]) == {"probe"}
    assert (frame["scale"] == "tiny").all()
    times = frame[frame.metric == "time"]["value"]
    assert len(times) > 0 and (times > 0).all()
    assert prov["part"] == probe and prov["scale"] == "tiny" and prov["parameters"]


def test_disk_probe_reaches_the_device_and_cleans_up(tmp_path):
    frame, prov = _run(tmp_path, "disk")
    assert set(frame.variant) == {"write", "overwrite", "read"}
    assert set(frame.threads) == {1, 2}
    assert list((tmp_path / "scratch").iterdir()) == []  # the probe's file is gone
    if block_device_counters(tmp_path) is None:
        pytest.skip("scratch directory is not on a block device here; byte counters unavailable")
    ratios = frame[frame.metric == "device_bytes_ratio"]
    reads = ratios[ratios.variant == "read"]["value"]
    writes = ratios[ratios.variant != "read"]["value"]
    assert (reads >= 0.95).all(), "O_DIRECT reads must come from the device, not the page cache"
    assert (writes >= 0.95).all()
    assert "verified with" in prov["disk_byte_counters"]


def test_matmul_rate_is_consistent_with_its_time(tmp_path):
    frame, _ = _run(tmp_path, "matmul")
    for _, rows in frame.groupby(["variant", "repetition"]):
        by = dict(zip(rows.metric, rows.value))
        n = int(rows.matrix_dim.iloc[0])
        assert by["flop_rate"] == pytest.approx(2 * n**3 / by["time"] / 1e12)


@pytest.mark.parametrize("probe", first_quick(GPU_PROBES))
def test_gpu_probe_without_gpu_is_one_line_error(tmp_path, probe, monkeypatch, capsys):
    monkeypatch.setenv("SUITE_HIDE_GPU", "1")
    from harness import machine

    machine.forget()
    try:
        with pytest.raises(SystemExit) as exit_info:
            _run(tmp_path, probe)
    finally:
        machine.forget()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"ceilings part '{probe}' needs 1 CUDA GPU and this machine has 0" in err
    assert not (tmp_path / "results").exists()


def test_unknown_scale_and_bad_out_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        entry(["ceilings", "--part", "matmul", "--scale", "huge", "--out", str(tmp_path / "x.csv")])
    assert "unknown scale 'huge'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        entry(["ceilings", "--part", "matmul", "--scale", "tiny", "--out", str(tmp_path / "x.txt")])
    assert "must name a .csv" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        entry(["ceilings", "--part", "nosuch", "--scale", "tiny", "--out", str(tmp_path / "x.csv")])
    assert "topic ceilings has no part 'nosuch'; its parts: pcie_copy, uva_read" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        entry(["ceilings", "--scale", "tiny"])
    assert "measuring needs --part, --out" in capsys.readouterr().err
    # checked before anything is measured: the name the reader takes part and scale from, the folders
    with pytest.raises(SystemExit):
        entry(["ceilings", "--part", "matmul", "--scale", "tiny", "--out", str(tmp_path / "x.csv")])
    assert "--out must be named matmul-tiny.csv (part-scale), got x.csv" in capsys.readouterr().err
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    with pytest.raises(SystemExit):
        entry(["ceilings", "--part", "matmul", "--scale", "tiny", "--out", str(a_file / "matmul-tiny.csv")])
    assert f"--out's folder {a_file} cannot be made: {a_file} is a file, not a folder" in capsys.readouterr().err
    out = str(tmp_path / "matmul-tiny.csv")
    with pytest.raises(SystemExit):
        entry(["ceilings", "--part", "matmul", "--scale", "tiny", "--out", out, "--scratch-dir", str(a_file)])
    assert f"the scratch folder {a_file} cannot be made: {a_file} is a file" in capsys.readouterr().err
    assert not (tmp_path / "matmul-tiny.csv").exists()


@pytest.mark.gpu
@pytest.mark.parametrize("probe", GPU_PROBES)
def test_gpu_probe_writes_valid_results(tmp_path, probe):
    frame, prov = _run(tmp_path, probe)
    assert (frame[frame.metric == "bandwidth"]["value"] > 0).all()
    assert prov["cuda"]["available"] is True


def test_disk_probe_refuses_a_directory_without_byte_counters(tmp_path, monkeypatch, capsys):
    from workloads.ceilings import disk

    monkeypatch.setattr(disk, "block_device_counters", lambda path: None)
    with pytest.raises(SystemExit):
        _run(tmp_path, "disk")
    assert "is not on a block device" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()
    assert not (tmp_path / "scratch").exists()  # a refused scratch folder is not left behind, made and empty


def test_disk_probe_refuses_a_file_larger_than_the_free_space_before_writing(tmp_path, monkeypatch, capsys):
    """A full disk mid-write ended in a BufferError that hid the ENOSPC: the size is checked first."""
    import collections

    from workloads.ceilings import disk

    monkeypatch.setattr(disk, "block_device_counters", lambda path: tmp_path / "stat")
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: usage(2**40, 2**40 - 4096, 4096))
    with pytest.raises(SystemExit):
        _run(tmp_path, "disk")
    assert re.search(
        r"disk: file_size_mib=\d+ needs that much space on scratch_dir .* which has 0 MiB free", capsys.readouterr().err
    )
    assert not (tmp_path / "scratch").exists()


def test_disk_probe_refuses_reads_served_from_the_page_cache(tmp_path, monkeypatch):
    from workloads.ceilings import disk

    if disk.block_device_counters(tmp_path) is None:
        pytest.skip("scratch directory is not on a block device here")
    real = disk.device_bytes
    # Pretend the device saw none of the reads (halving the counts would not do: other processes
    # reading from the same disk at the same time could make up the other half).
    monkeypatch.setattr(disk, "device_bytes", lambda stat: (0, real(stat)[1]))
    with pytest.raises(RuntimeError, match="page cache was not bypassed"):
        _run(tmp_path, "disk")


def measure_then_signal(signum):
    """A ``Topic.measure_function`` whose parts measure, then get ``signum`` and wait to be stopped."""
    from harness.topic import Topic

    real = Topic.measure_function

    def measure_function(self, name):
        def part(params, writer, **kwargs):
            real(self, name)(params, writer, **kwargs)
            os.kill(os.getpid(), signum)
            time.sleep(10)
            raise AssertionError(f"{signal.Signals(signum).name} did not stop the part")

        return part

    return measure_function


def test_a_part_stopped_by_sigterm_keeps_its_rows_marked_cut_short(tmp_path, monkeypatch):
    """A time limit's SIGTERM mid-part: the rows measured so far are written, labelled incomplete,
    and the exit is still a failure."""
    from harness.topic import Topic

    monkeypatch.setattr(Topic, "measure_function", measure_then_signal(signal.SIGTERM))
    with pytest.raises(SystemExit, match="stopped by SIGTERM; the [0-9]+ rows measured before it"):
        _run(tmp_path, HOST_PROBES[0])
    out = tmp_path / "results" / f"{HOST_PROBES[0]}-tiny.csv"
    assert len(load([out], SCHEMA, cut_short=True)) > 0
    assert "SIGTERM" in load_provenance(out)["cut_short"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is gone again


def test_a_part_stopped_under_the_workflow_writes_nothing(tmp_path, monkeypatch):
    """The workflow's rule passes --whole-or-nothing: Snakemake removes a stopped job's files, maybe
    before the part has written its rows, and a file written after would be taken for a finished
    one. The stopped part writes nothing, and the exit is a failure."""
    from harness.topic import Topic

    monkeypatch.setattr(Topic, "measure_function", measure_then_signal(signal.SIGTERM))
    out = tmp_path / "results" / f"{HOST_PROBES[0]}-tiny.csv"
    argv = ["ceilings", "--part", HOST_PROBES[0], "--scale", "tiny", "--out", str(out)]
    with pytest.raises(SystemExit, match=r"stopped by SIGTERM after [0-9]+ rows; nothing written"):
        entry([*argv, "--scratch-dir", str(tmp_path / "scratch"), "--whole-or-nothing"])
    assert not out.exists() and not out.with_suffix(".provenance.json").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    rule = (ROOT / "workflow" / "rules" / "topics.smk").read_text()
    assert "--whole-or-nothing" in rule.split("rule measure:")[1].split("rule")[0]


def test_measuring_into_another_machines_folder_is_refused_before_it_measures(tmp_path, monkeypatch, capsys):
    """A part written into results/<machine>/ whose records name other hardware would mix two
    machines in its figures (tools/gpu_box_run.sh and python -m workloads take --out as given):
    refused in one line, as the workflow refuses it; a malformed record is no evidence either way."""
    import json

    from harness import machine
    from harness.topic import Topic

    folder = tmp_path / "results" / "h200"
    (folder / "ceilings").mkdir(parents=True)
    broken = folder / "ceilings" / "other-tiny.provenance.json"
    broken.write_text(json.dumps({"machine": {"cpu_model": "x", "gpus": [None, "y"]}}))
    assert machine.other_hardware_in(folder) == ["no GPU; x"]  # the odd entries are skipped, not a traceback
    this = machine.hardware()
    same = {"machine": {"cpu_model": this[1], "gpus": [{"name": name} for name in this[0]]}}
    broken.write_text(json.dumps(same))
    assert machine.other_hardware_in(folder) == []
    (folder / "ceilings" / "matmul-tiny.provenance.json").write_text(
        json.dumps({"machine": {"cpu_model": "Some CPU", "gpus": [{"name": "NVIDIA H200"}]}})
    )
    out = folder / "ceilings" / f"{HOST_PROBES[0]}-tiny.csv"
    monkeypatch.setattr(Topic, "measure_function", lambda *a: pytest.fail("measured"))
    argv = ["ceilings", "--part", HOST_PROBES[0], "--scale", "tiny", "--out", str(out)]
    with pytest.raises(SystemExit) as stop:
        entry([*argv, "--scratch-dir", str(tmp_path / "scratch")])
    assert stop.value.code == 2 and not out.exists()
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"error: {folder} holds results measured on other hardware")
    assert f"(NVIDIA H200; Some CPU) than this machine ({machine.shown(machine.hardware())})" in error[0]


CTRL_C_PART = """
import signal, sys
from harness.entry import main
from harness.topic import Topic
from test_ceilings import measure_then_signal

Topic.measure_function = measure_then_signal(signal.SIGINT)
main(sys.argv[1:])
print("the process went on after the part")
"""


def run_in_a_terminal(tmp_path, script_text: str, out):
    """Run ``script_text`` on the first host probe's part, writing to ``out``, as a terminal starts
    a program (Ctrl-C not ignored)."""
    script = tmp_path / "script.py"
    script.write_text(script_text)
    done = subprocess.run(
        [sys.executable, str(script), "ceilings", "--part", HOST_PROBES[0], "--scale", "tiny", "--out", str(out)]
        + ["--scratch-dir", str(tmp_path / "scratch")],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"},
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )
    return done


def test_a_part_stopped_by_ctrl_c_keeps_its_rows_and_ends_killed_by_sigint(tmp_path):
    """Ctrl-C mid-part, as SIGTERM: the rows measured so far are written, labelled incomplete.
    The process then ends killed by SIGINT, as an interrupted program does: a shell loop over
    parts stops there (it goes on when a child exits with a status)."""
    out = tmp_path / "results" / f"{HOST_PROBES[0]}-tiny.csv"
    done = run_in_a_terminal(tmp_path, CTRL_C_PART, out)
    assert done.returncode == -signal.SIGINT, done.stdout + done.stderr
    assert re.search(r"stopped by Ctrl-C \(SIGINT\); the [0-9]+ rows measured before it", done.stderr)
    assert "went on" not in done.stdout and "did not stop" not in done.stdout + done.stderr
    assert len(load([out], SCHEMA, cut_short=True)) > 0
    with pytest.raises(ResultsFormatError, match="stopped before it ended"):
        load([out], SCHEMA)  # a reader that does not label a part cut short refuses it
    assert load_provenance(out)["cut_short"].startswith("stopped by Ctrl-C (SIGINT) before it ended")


SECOND_CTRL_C = """
import os, signal, sys
from harness.entry import main
from harness.results import ResultsWriter
from harness.topic import Topic
from test_ceilings import measure_then_signal

real_write = ResultsWriter.write


def write_with_a_second_ctrl_c(self, path, record):
    os.kill(os.getpid(), signal.SIGINT)  # impatient: pressed again while the rows are written
    real_write(self, path, record)


Topic.measure_function = measure_then_signal(signal.SIGINT)
ResultsWriter.write = write_with_a_second_ctrl_c
main(sys.argv[1:])
"""


def test_a_second_ctrl_c_while_a_stopped_part_is_written_ends_it_the_same_way(tmp_path):
    """Ctrl-C, then Ctrl-C again while the rows measured so far are written: the rows are written
    whole, the process says so in one line and ends killed by SIGINT, without a traceback."""
    out = tmp_path / "results" / f"{HOST_PROBES[0]}-tiny.csv"
    done = run_in_a_terminal(tmp_path, SECOND_CTRL_C, out)
    assert done.returncode == -signal.SIGINT, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert re.search(r"stopped by Ctrl-C \(SIGINT\); the [0-9]+ rows measured before it", done.stderr)
    assert len(load([out], SCHEMA, cut_short=True)) > 0


def test_a_signal_while_the_results_are_written_waits_until_both_files_are_there(tmp_path, monkeypatch):
    """A stop between the provenance record and the rows would pair one run's record with another
    run's rows: SIGINT and SIGTERM are held while the two files are written, and arrive after."""
    from harness.results import ResultsWriter

    real_write = ResultsWriter.write
    arrived = []

    def write_with_a_signal_in_the_middle(self, path, record):
        os.kill(os.getpid(), signal.SIGINT)
        assert arrived == []  # held, not yet delivered
        real_write(self, path, record)

    monkeypatch.setattr(ResultsWriter, "write", write_with_a_signal_in_the_middle)
    previous = signal.signal(signal.SIGINT, lambda signum, frame: arrived.append(signum))
    try:
        _run(tmp_path, HOST_PROBES[0])
        for _ in range(500):  # sent again once the files were written: it arrives at once
            if arrived:
                break
            time.sleep(0.01)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert arrived == [signal.SIGINT]
    out = tmp_path / "results" / f"{HOST_PROBES[0]}-tiny.csv"
    assert len(load([out], SCHEMA)) > 0 and "cut_short" not in load_provenance(out)


def test_a_sigterm_that_lands_in_a_finalizer_still_stops_the_part(tmp_path, monkeypatch):
    """Python prints and drops an exception raised inside a finalizer: the first stop is lost
    there, and the part must still stop (raised again each second) with its rows written."""
    from harness.topic import Topic

    real = Topic.measure_function

    class KillsWhenCollected:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, inside __del__

    def then_sigterm_in_a_finalizer(self, name):
        def part(params, writer, **kwargs):
            real(self, name)(params, writer, **kwargs)
            KillsWhenCollected()  # collected at once: the SIGTERM's exception is dropped
            for _ in range(200):
                time.sleep(0.05)
            raise AssertionError("SIGTERM did not stop the part")

        return part

    monkeypatch.setattr(Topic, "measure_function", then_sigterm_in_a_finalizer)
    with pytest.raises(SystemExit, match="stopped by SIGTERM"):
        _run(tmp_path, HOST_PROBES[0])
    assert "SIGTERM" in load_provenance(tmp_path / "results" / f"{HOST_PROBES[0]}-tiny.csv")["cut_short"]
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_part_s_clean_up_after_sigterm_is_not_cut_short(tmp_path, monkeypatch):
    """Once the stop has landed, the part's own clean-up (joining workers, closing a store) runs to
    its end even when it takes longer than the one-second re-raise."""
    from harness.topic import Topic

    real = Topic.measure_function
    cleaned = []

    def cleans_up_slowly(self, name):
        def part(params, writer, **kwargs):
            real(self, name)(params, writer, **kwargs)
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(10)
            finally:
                for step in range(5):  # 2.5 s: two re-raise ticks fall inside it
                    time.sleep(0.5)
                    cleaned.append(step)

        return part

    monkeypatch.setattr(Topic, "measure_function", cleans_up_slowly)
    with pytest.raises(SystemExit, match="stopped by SIGTERM"):
        _run(tmp_path, HOST_PROBES[0])
    assert cleaned == [0, 1, 2, 3, 4]
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_host_memcpy_leaves_out_more_threads_than_usable_cpus_and_says_so(monkeypatch):
    """64 threads on a 2-CPU machine were timed and recorded as 64 threads: the scheduler's time."""
    from harness.errors import UserError
    from workloads.ceilings import host_memcpy

    class Rows(list):
        def add_measurement(self, measurement, **row):
            self.append(row)

    monkeypatch.setattr(host_memcpy, "usable_cores", lambda: 2)
    rows = Rows()
    notes = host_memcpy.run({"size_mib": 1, "threads": [1, 64]}, rows, repeat=1, warmup=0)
    assert [row["config"]["threads"] for row in rows] == [1]
    assert notes == {"usable_cpus": 2, "threads_left_out": {"64": "more than the 2 usable CPUs"}}
    with pytest.raises(UserError, match=r"^host_memcpy: threads \[64\] are all more than the 2 usable CPUs here$"):
        host_memcpy.run({"size_mib": 1, "threads": [64]}, rows, repeat=1, warmup=0)
