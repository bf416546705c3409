"""The results schema: round trip, and every way a malformed file is refused with file and line."""

import json
import math
import random
import re

import pytest

from harness.errors import UserError
from harness.results import (
    ResultsFormatError,
    ResultsWriter,
    Schema,
    committed,
    load,
    load_provenance,
    provenance_path,
    read_rows,
    results_bytes,
    results_in,
    results_name,
)
from harness.timing import Measurement

SCHEMA = Schema(topic="demo", config={"size_bytes": int, "ratio": float, "kind": str, "flag": bool})


PROVENANCE = {
    "scale": "cpu",
    "git": {"commit": "0" * 40, "dirty": False},
    "machine": {"cpu_model": "CPU", "usable_cpus": 2, "gpus": []},
    "packages": {"torch": "2.0"},
    "date_utc": "2026-11-30",
    "note": "test",
}


def _hand_edit(path, text: str) -> None:
    """``path``'s rows replaced by ``text``, its record made one without the rows' digest (written
    before records held one), so that what the loader says of the rows themselves is tested."""
    path.write_text(text)
    record = provenance_path(path)
    record.write_text(json.dumps({k: v for k, v in json.loads(record.read_text()).items() if k != "rows_sha256"}))


def _write(tmp_path, rows=3, name="demo-cpu.csv"):
    rng = random.Random(7)
    writer = ResultsWriter(SCHEMA, scale="cpu")
    for rep in range(rows):
        writer.add(
            role="baseline",
            variant="v",
            config={"size_bytes": 4096, "ratio": 0.5, "kind": None, "flag": True},
            metric="time",
            value=rng.uniform(0.1, 1.0),
            unit="s",
            repetition=rep,
        )
    path = tmp_path / name
    writer.write(path, PROVENANCE)
    return path, writer


def test_round_trip_keeps_values_types_and_missing_cells(tmp_path):
    path, writer = _write(tmp_path)
    frame = load([path], SCHEMA)
    assert list(frame["value"]) == [row["value"] for row in writer.rows]  # exact, not rounded
    assert frame["size_bytes"].tolist() == [4096] * 3
    assert frame["kind"].isna().all()
    assert frame["flag"].tolist() == [True] * 3
    assert json.loads(provenance_path(path).read_text())["note"] == "test"


def test_measurement_rows_carry_rates(tmp_path):
    m = Measurement(clock="monotonic", seconds=(0.5, 0.25), cpu_core_seconds=(0.4, 0.2))
    writer = ResultsWriter(SCHEMA, scale="cpu")
    writer.add_measurement(m, role="probe", variant="v", config={}, bytes_moved=10**9, flops=10**12)
    by_metric = {(r["metric"], r["repetition"]): r["value"] for r in writer.rows}
    assert by_metric[("bandwidth", 0)] == pytest.approx(2.0)
    assert by_metric[("bandwidth", 1)] == pytest.approx(4.0)
    assert by_metric[("flop_rate", 1)] == pytest.approx(4.0)
    assert by_metric[("cpu_time", 0)] == pytest.approx(0.4)


def test_writer_refuses_unknown_columns_wrong_types_and_nan():
    writer = ResultsWriter(SCHEMA, scale="cpu")
    with pytest.raises(ValueError, match="not in the schema"):
        writer.add(role="probe", variant="v", config={"oops": 1}, metric="time", value=1.0, unit="s")
    with pytest.raises(TypeError, match="size_bytes"):
        writer.add(role="probe", variant="v", config={"size_bytes": "big"}, metric="time", value=1.0, unit="s")
    with pytest.raises(TypeError, match="size_bytes"):
        writer.add(role="probe", variant="v", config={"size_bytes": True}, metric="time", value=1.0, unit="s")
    with pytest.raises(ValueError, match="not finite"):
        writer.add(role="probe", variant="v", config={}, metric="time", value=math.nan, unit="s")
    with pytest.raises(ValueError, match=r"time is negative \(-0.5\)"):
        writer.add(role="probe", variant="v", config={}, metric="time", value=-0.5, unit="s")


def test_writer_refuses_the_same_measurement_twice_when_it_is_added():
    """What every reader would refuse (one configuration, repetition and metric twice) is refused
    when the part adds it, naming the configuration, not after the part has run."""
    writer = ResultsWriter(SCHEMA, scale="cpu")
    config = {"size_bytes": 4096, "ratio": 0.5, "kind": "a", "flag": True}
    writer.add(role="probe", variant="v", config=config, metric="time", value=0.3, unit="s")
    writer.add(role="probe", variant="v", config=config, metric="time", value=0.3, unit="s", repetition=1)
    writer.add(role="probe", variant="v", config=config | {"kind": "b"}, metric="time", value=0.3, unit="s")
    with pytest.raises(ResultsFormatError, match="recorded twice .*kind=a.*come to one setting"):
        writer.add(role="probe", variant="v", config=dict(config), metric="time", value=0.7, unit="s")
    # None and "" are one empty cell in the file: one measurement
    writer.add(role="probe", variant="w", config=config | {"kind": None}, metric="time", value=0.3, unit="s")
    with pytest.raises(ResultsFormatError, match="recorded twice"):
        writer.add(role="probe", variant="w", config=config | {"kind": ""}, metric="time", value=0.3, unit="s")
    assert len(writer.rows) == 4


def test_a_measurement_refused_whole_can_be_added_again():
    """add_measurement adds all of a measurement's rows or none: rows it took back are not
    counted as recorded when the measurement is added again."""
    writer = ResultsWriter(SCHEMA, scale="cpu")
    broken = Measurement(clock="monotonic", seconds=(0.5, 0.25), cpu_core_seconds=(0.4, math.nan))
    with pytest.raises(ValueError, match="not finite"):
        writer.add_measurement(broken, role="probe", variant="v", config={})
    assert writer.rows == []
    writer.add_measurement(Measurement("monotonic", (0.5, 0.25), (0.4, 0.2)), role="probe", variant="v", config={})
    assert len(writer.rows) == 4


def test_writer_refuses_to_write_nothing(tmp_path):
    with pytest.raises(UserError, match="no rows were measured"):
        ResultsWriter(SCHEMA, scale="cpu").write(tmp_path / "x.csv", {})
    assert not (tmp_path / "x.csv").exists()


def test_a_folder_that_cannot_be_made_is_refused_in_one_line(tmp_path):
    """The entry point checks the folder before measuring, but that check is os.access, which root
    passes: the making itself is refused in one line, not a PermissionError traceback."""
    (tmp_path / "a_file").write_text("in the way")
    writer = _write(tmp_path / "first")[1]
    with pytest.raises(UserError, match=r"^could not make the folder of .*a_file/sub/demo-cpu\.csv: "):
        writer.write(tmp_path / "a_file" / "sub" / "demo-cpu.csv", PROVENANCE)


def test_a_write_that_fails_leaves_the_earlier_pair_and_no_file_of_its_own(tmp_path, monkeypatch):
    """A full disk (or a folder in the way) is refused in one line; nothing of the failed run is
    left, and an earlier run's CSV never ends up beside this run's record."""
    import errno
    import os
    from pathlib import Path

    path, _ = _write(tmp_path)
    writer = _write(tmp_path / "other")[1]  # the next run's rows
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    real_write = Path.write_text

    def full_disk(self, text, *args, **kwargs):
        if self.name.startswith(".demo-cpu.csv.tmp"):  # the record's temporary file is written, the CSV's not
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_write(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(UserError, match=r"could not write .*demo-cpu.csv and its record: No space left on device"):
        writer.write(path, PROVENANCE | {"note": "the failed run"})
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    monkeypatch.undo()
    # The record cannot be replaced (an immutable file, a read-only bind mount): the earlier CSV
    # stays beside its own record, and the error names the file, not a temporary one.
    real_replace = os.replace

    def record_refused(source, target, *args, **kwargs):
        if str(target).endswith("demo-cpu.provenance.json"):
            raise OSError(errno.EPERM, "Operation not permitted", str(source))
        return real_replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", record_refused)
    message = r"could not write .*demo-cpu.csv and its record: Operation not permitted \(.*/demo-cpu.provenance.json\)"
    with pytest.raises(UserError, match=message):
        writer.write(path, PROVENANCE | {"note": "the failed run"})
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    monkeypatch.undo()
    (tmp_path / "folder-cpu.csv").mkdir()
    with pytest.raises(UserError, match="Is a directory"):
        writer.write(tmp_path / "folder-cpu.csv", PROVENANCE)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert not (tmp_path / "folder-cpu.provenance.json").exists()


@pytest.mark.parametrize(
    "line_edit, message",
    [
        (lambda cells: cells.__setitem__(5, "lots"), r"demo-cpu.csv:3: column 'size_bytes': 'lots' is not an integer"),
        (lambda cells: cells.__setitem__(-2, "nan"), r"demo-cpu.csv:3: value 'nan' is not finite"),
        (lambda cells: cells.__setitem__(-2, "-1.25"), r"demo-cpu.csv:3: value '-1.25' is negative"),
        (lambda cells: cells.__setitem__(-4, "-1"), r"demo-cpu.csv:3: repetition -1 is negative"),
        (lambda cells: cells.__setitem__(0, "other"), r"demo-cpu.csv:3: workload 'other' does not belong"),
        (lambda cells: cells.__setitem__(2, ""), r"demo-cpu.csv:3: column 'role' is empty"),
        (lambda cells: cells.__setitem__(2, "pytorch_direct"), r"demo-cpu.csv:3: role 'pytorch_direct' is not one of"),
        (lambda cells: cells.__setitem__(8, "maybe"), r"demo-cpu.csv:3: column 'flag': 'maybe' is not true or false"),
        (lambda cells: cells.pop(), r"demo-cpu.csv:3: expected 13 fields"),
    ],
)
def test_loader_names_file_and_line_of_a_bad_row(tmp_path, line_edit, message):
    path, _ = _write(tmp_path)
    lines = path.read_text().splitlines()
    cells = lines[2].split(",")
    line_edit(cells)
    lines[2] = ",".join(cells)
    _hand_edit(path, "\n".join(lines) + "\n")
    with pytest.raises(ResultsFormatError, match=message):
        read_rows(path, SCHEMA)


def test_loader_refuses_wrong_header_missing_provenance_and_empty_file(tmp_path):
    path, _ = _write(tmp_path)
    text = path.read_text()
    _hand_edit(path, text.replace("size_bytes", "bytes", 1))
    with pytest.raises(ResultsFormatError, match="header does not match.*unexpected \\['bytes'\\]"):
        read_rows(path, SCHEMA)
    _hand_edit(path, text.splitlines()[0] + "\n")
    with pytest.raises(ResultsFormatError, match="no data rows"):
        read_rows(path, SCHEMA)
    _hand_edit(path, text)
    provenance_path(path).unlink()
    with pytest.raises(ResultsFormatError, match="no provenance record"):
        read_rows(path, SCHEMA)


def test_a_file_written_before_a_column_was_added_still_loads(tmp_path):
    path, _ = _write(tmp_path)
    lines = [line.split(",") for line in path.read_text().splitlines()]
    dropped = lines[0].index("ratio")
    _hand_edit(path, "\n".join(",".join(c for i, c in enumerate(cells) if i != dropped) for cells in lines) + "\n")
    frame = load([path], SCHEMA)
    assert frame["ratio"].isna().all() and (frame["size_bytes"] == 4096).all()


def test_loader_refuses_duplicates_wrong_scale_bad_units_and_odd_integers(tmp_path):
    path, _ = _write(tmp_path)
    text = path.read_text()
    lines = text.splitlines()
    _hand_edit(path, text + lines[1] + "\n")
    with pytest.raises(ResultsFormatError, match="demo-cpu.csv:5: the same measurement as line 2"):
        read_rows(path, SCHEMA)
    _hand_edit(path, text.replace(",cpu,", ",tiny,", 1))
    with pytest.raises(ResultsFormatError, match="demo-cpu.csv:2: a row of scale 'tiny' in a file of scale 'cpu'"):
        read_rows(path, SCHEMA)
    _hand_edit(path, text.replace(",time,", ",bandwidth,", 1))
    with pytest.raises(ResultsFormatError, match="metric 'bandwidth' in unit 's'"):
        read_rows(path, SCHEMA)
    _hand_edit(path, text.replace(",4096,", ",4_096,", 1))
    with pytest.raises(ResultsFormatError, match="'4_096' is not an integer"):
        read_rows(path, SCHEMA)
    _hand_edit(path, text)
    with pytest.raises(ResultsFormatError, match="given twice"):
        load([path, path], SCHEMA)


def test_provenance_must_agree_and_parse(tmp_path):
    path, _ = _write(tmp_path)
    provenance_path(path).write_text(json.dumps({**PROVENANCE, "scale": "h200"}))
    with pytest.raises(ResultsFormatError, match="provenance record says scale 'h200', its name says 'cpu'"):
        read_rows(path, SCHEMA)
    provenance_path(path).write_text("")
    with pytest.raises(ResultsFormatError, match="not valid JSON"):
        read_rows(path, SCHEMA)
    provenance_path(path).write_text("{}")
    with pytest.raises(ResultsFormatError, match="needs at least scale, git, machine, packages and date_utc"):
        read_rows(path, SCHEMA)


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda r: r["git"].update(commit=None), "the record's git.commit is None, not a string"),
        (lambda r: r.update(date_utc=5), "the record's date_utc is 5, not a string"),
        (lambda r: r.update(code="x"), "the record's code is 'x', not an object"),
        (lambda r: r.update(parameters=None), "the record's parameters is None, not an object"),
        (lambda r: r["machine"].update(gpus="x"), "the record's machine.gpus is 'x', not a list"),
        (lambda r: r["machine"].update(usable_cpus=True), "the record's machine.usable_cpus is True, not a whole"),
        (lambda r: r["machine"].update(gpus=["x"]), r"machine.gpus\[0\] is 'x', not a GPU with a name"),
        (lambda r: r["machine"].update(gpus=[{"driver": "1"}]), r"machine.gpus\[0\] is \{'driver': '1'\}, not a GPU"),
    ],
)
def test_a_record_with_a_field_of_the_wrong_type_is_refused_in_one_line(tmp_path, edit, words):
    """A record edited by hand or corrupted: refused where it is read, not as an AttributeError
    deep in a reader."""
    path, _ = _write(tmp_path)
    record = json.loads(provenance_path(path).read_text())
    load_provenance(path)  # as written: accepted
    edit(record)
    provenance_path(path).write_text(json.dumps(record))
    with pytest.raises(ResultsFormatError, match=words) as err:
        load_provenance(path)
    assert "\n" not in str(err.value)


def test_a_write_removes_what_a_killed_writer_left_and_nothing_of_a_live_one(tmp_path):
    """A writer killed mid-write (SIGKILL) leaves its temporary files and an earlier CSV it had
    moved aside, hidden in the results folder: the next write removes those of dead processes."""
    import os
    import subprocess
    import sys

    path, writer = _write(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    left = [tmp_path / f".demo-cpu.csv.earlier{dead_pid}", tmp_path / f".demo-cpu.csv.tmp{dead_pid}"]
    left.append(tmp_path / f".demo-cpu.provenance.json.tmp{dead_pid}")
    live = tmp_path / f".demo-cpu.csv.tmp{os.getppid()}"  # a writer still running (this test's parent)
    other = tmp_path / f".other-cpu.csv.tmp{dead_pid}"  # another part's: not this write's to judge
    for leftover in (*left, live, other):
        leftover.write_text("rows of a write cut short")
    writer.write(path, PROVENANCE)
    assert not any(p.exists() for p in left)
    assert live.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "demo-cpu.csv",
        "demo-cpu.provenance.json",
    ]


def test_writer_writes_numpy_floats_it_can_read_back(tmp_path):
    import numpy as np

    writer = ResultsWriter(SCHEMA, scale="cpu")
    writer.add(role="probe", variant="v", config={}, metric="time", value=np.float64(0.5), unit="s")
    writer.write(tmp_path / "np-cpu.csv", PROVENANCE)
    assert load([tmp_path / "np-cpu.csv"], SCHEMA)["value"].tolist() == [0.5]


def test_writer_refuses_a_metric_in_the_wrong_unit():
    with pytest.raises(ValueError, match="must be recorded in GB/s"):
        ResultsWriter(SCHEMA, scale="cpu").add(
            role="probe", variant="v", config={}, metric="bandwidth", value=1.0, unit="MB/s"
        )


def test_a_topic_adds_its_own_metrics_with_their_units(tmp_path):
    schema = Schema(topic="demo", config={}, metrics={"tokens_per_s": "1/s"})
    writer = ResultsWriter(schema, scale="cpu")
    writer.add(role="optimized", variant="v", config={}, metric="tokens_per_s", value=5.0, unit="1/s")
    writer.add(role="optimized", variant="v", config={}, metric="time", value=0.5, unit="s")
    path = tmp_path / "demo-cpu.csv"
    writer.write(path, PROVENANCE)
    assert set(load([path], schema)["metric"]) == {"tokens_per_s", "time"}
    with pytest.raises(ResultsFormatError, match="metric 'tokens_per_s' in unit '1/s'"):
        load([path], Schema(topic="demo", config={}))  # another topic does not know the metric
    with pytest.raises(ValueError, match="must be recorded in 1/s"):
        writer.add(role="optimized", variant="v", config={}, metric="tokens_per_s", value=5.0, unit="s")
    with pytest.raises(ValueError, match="already have units"):
        Schema(topic="demo", config={}, metrics={"time": "ms"})


def test_a_role_outside_the_vocabulary_is_refused(tmp_path):
    with pytest.raises(ValueError, match="role must be one of baseline, peer, optimized, upper_bound, probe"):
        ResultsWriter(SCHEMA, scale="cpu").add(
            role="pytorch_direct", variant="v", config={}, metric="time", value=1.0, unit="s"
        )


def test_a_part_cut_short_is_read_only_where_the_caller_labels_it(tmp_path):
    path, _ = _write(tmp_path)
    record = provenance_path(path)
    record.write_text(json.dumps(json.loads(record.read_text()) | {"cut_short": "stopped by SIGTERM"}))
    with pytest.raises(ResultsFormatError, match="stopped before it ended, so these rows are not the whole part"):
        read_rows(path, SCHEMA)
    assert read_rows(path, SCHEMA, cut_short=True)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r.pop("packages"), "needs at least scale, git, machine, packages and date_utc"),
        (lambda r: r["git"].pop("commit"), "the record lacks git.commit"),
        (lambda r: r["machine"].pop("usable_cpus"), "the record lacks machine.usable_cpus"),
        (lambda r: r.update(machine="a box"), "the record's machine is no object"),
    ],
)
def test_a_record_without_what_the_figures_read_is_refused_by_name(tmp_path, change, message):
    """A hand-made or older record passed the loader and crashed a notebook with a KeyError."""
    import json

    path, _ = _write(tmp_path)
    record_path = tmp_path / "demo-cpu.provenance.json"
    record = json.loads(record_path.read_text())
    change(record)
    record_path.write_text(json.dumps(record))
    with pytest.raises(ResultsFormatError, match=re.escape(message)):
        load_provenance(path)


@pytest.mark.parametrize("metric, unit", [("time", "s"), ("bandwidth", "GB/s")])
def test_a_time_or_rate_of_zero_is_refused_when_written(metric, unit):
    """In a ratio a zero is an infinite speedup (or a -100% transfer time)."""
    writer = ResultsWriter(SCHEMA, scale="cpu")
    config = {"size_bytes": 4096, "ratio": 0.5, "kind": None, "flag": True}
    with pytest.raises(ValueError, match=f"{metric} is 0"):
        writer.add(role="baseline", variant="v", config=config, metric=metric, value=0.0, unit=unit)
    writer.add(role="baseline", variant="v", config=config, metric="phase_time", value=0.0, unit="s")  # may be empty


def test_a_time_of_zero_is_refused_when_read(tmp_path):
    path, _ = _write(tmp_path)
    header, first, *rest = path.read_text().splitlines()
    cells = first.split(",")
    assert cells[-3] == "time"
    cells[-2] = "0.0"  # the value column, edited by hand
    _hand_edit(path, "\n".join([header, ",".join(cells), *rest]) + "\n")
    with pytest.raises(ResultsFormatError, match="demo-cpu.csv:2: time is 0"):
        load([path], SCHEMA)


def test_rows_edited_after_they_were_written_are_refused(tmp_path):
    """A value scaled by hand flipped a claim's verdict and nothing noticed: each record holds its
    rows' digest, and the loader compares."""
    path, _ = _write(tmp_path)
    assert len(json.loads(provenance_path(path).read_text())["rows_sha256"]) == 64
    load([path], SCHEMA)
    header, first, *rest = path.read_text().splitlines()
    cells = first.split(",")
    cells[-2] = repr(float(cells[-2]) * 0.65)
    path.write_text("\n".join([header, ",".join(cells), *rest]) + "\n")
    with pytest.raises(ResultsFormatError, match="its rows are not those its record was written with"):
        load([path], SCHEMA)


# --- compressed results: X.csv.gz stands for X.csv (tools/compress_results.py) ---


def _compress(path):
    from tools.compress_results import main

    assert main([str(path.parent)]) == 0
    return path.with_name(path.name + ".gz")


def test_a_compressed_results_file_reads_as_the_file_it_was(tmp_path):
    path, _ = _write(tmp_path, rows=5)
    want = read_rows(path, SCHEMA)
    gz = _compress(path)
    assert not path.exists() and gz.exists() and gz.read_bytes()[:2] == b"\x1f\x8b"
    assert read_rows(gz, SCHEMA) == want
    assert load_provenance(gz) == load_provenance(path)  # the record beside both forms
    assert committed(path) == gz and results_name(gz) == "demo-cpu"
    # The same bytes always compress to the same file (no name or time inside).
    again = tmp_path / "again"
    again.mkdir()
    copy, _ = _write(again, rows=5)
    assert _compress(copy).read_bytes() == gz.read_bytes()


def test_a_fresh_csv_wins_over_its_compressed_twin_and_a_folder_lists_each_once(tmp_path, capsys):
    path, _ = _write(tmp_path, rows=2)
    gz = _compress(path)
    assert results_in(tmp_path, "*-cpu") == [gz]
    fresh, _ = _write(tmp_path, rows=4)  # measured again: X.csv beside the committed X.csv.gz
    assert committed(fresh) == fresh and results_in(tmp_path, "*-cpu") == [fresh]
    assert results_in(tmp_path, "*-h200") == [] and committed(tmp_path / "other-cpu.csv").name == "other-cpu.csv"
    from tools.compress_results import main

    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "there in both forms" in capsys.readouterr().err


def test_a_compressed_file_edited_or_broken_is_refused_in_one_line(tmp_path):
    import gzip

    path, _ = _write(tmp_path, rows=3)
    gz = _compress(path)
    text = gzip.decompress(gz.read_bytes()).decode().replace("0.", "0.9", 1)
    gz.write_bytes(gzip.compress(text.encode()))
    with pytest.raises(ResultsFormatError, match="its rows are not those its record was written with"):
        read_rows(gz, SCHEMA)
    gz.write_bytes(gz.read_bytes()[:20])  # cut short
    with pytest.raises(ResultsFormatError, match=r"demo-cpu\.csv\.gz: cannot be read") as err:
        read_rows(gz, SCHEMA)
    assert "\n" not in str(err.value)
    with pytest.raises(ResultsFormatError, match=r"demo-cpu\.csv\.gz: cannot be read"):
        results_bytes(gz)  # every reader of the bytes (the analysis's check for copied processes too)


def test_the_tool_refuses_to_compress_rows_their_record_does_not_hold(tmp_path, capsys):
    from tools.compress_results import main

    path, _ = _write(tmp_path, rows=3)
    path.write_text(path.read_text().replace("0.", "0.8", 1))
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "its rows are not those its record was written with: not compressed" in capsys.readouterr().err
    assert path.exists() and not path.with_name(path.name + ".gz").exists()
