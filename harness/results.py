"""Tidy, long-format results: the schema, the writer and the validating loader.

One row per (workload, dataset, role, variant, scale, configuration..., repetition, metric) with
its value and unit. The configuration columns are typed and declared once per topic by a
:class:`Schema`. Each CSV file has a provenance record beside it (``<name>.provenance.json``).
Files are written atomically: a results file either exists whole or not at all.

Every metric has one unit (:data:`UNITS`, plus the metrics a topic's schema adds): seconds
``s``; bandwidth ``GB/s`` (10^9 bytes per second); ``TFLOP/s``; bytes ``B``; CPU time ``core-s``
(user + system seconds of all the process's threads); ``ratio``.

A file written before a configuration column was added to its topic's schema still loads: the
missing column reads as NA. Any other difference from the schema refuses the file.
"""

from __future__ import annotations

import csv
import glob
import gzip
import hashlib
import io
import json
import math
import os
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import UserError
from harness.timing import Measurement

KEY_COLUMNS = ("workload", "dataset", "role", "variant", "scale")
# What a row's variant is there for: the path to beat, what a user would pick instead today (another
# library, stock torch, a compiler), the technique, a bound no real pipeline can pass, or a
# measurement of the machine itself (harness/registry.py says more).
ROLES = ("baseline", "peer", "optimized", "upper_bound", "probe")
UNITS = {
    "time": "s",
    "cpu_time": "core-s",
    "bandwidth": "GB/s",
    "flop_rate": "TFLOP/s",
    "peak_gpu_memory": "B",
    "peak_host_rss": "B",
    "pinned_host_memory": "B",
    "pcie_bytes": "B",
    "device_bytes_ratio": "ratio",
    "epoch_time": "s",
    "phase_time": "s",
    "accuracy": "ratio",
    "loss": "nats",
}
# A timed call takes time, and a rate is made of one: a zero is a broken clock or an edited file,
# and in a ratio it is an infinite speedup or a -100% transfer time.
POSITIVE_METRICS = ("time", "epoch_time", "bandwidth", "flop_rate")
_INTEGER = re.compile(r"-?[0-9]+")
TAIL_COLUMNS = ("repetition", "metric", "value", "unit")
PROVENANCE_SUFFIX = ".provenance.json"
ROWS_DIGEST = "rows_sha256"  # the provenance key of the CSV's digest

_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _parse_int(text: str) -> int:
    if not _INTEGER.fullmatch(text):
        raise ValueError(text)
    return int(text)


_PARSERS = {
    int: _parse_int,
    float: float,
    str: str,
    bool: lambda s: {"true": True, "false": False}[s.lower()],
}


class ResultsFormatError(UserError):
    """A results file that does not follow the schema."""


@dataclass(frozen=True)
class Schema:
    """The results format of one topic: its name and its typed configuration columns.

    A configuration cell may be empty when the column does not apply to that row (for example a
    block size on a matrix-multiply row); it is read back as missing (NA).
    """

    topic: str
    config: dict[str, type]
    metrics: dict[str, str] = field(default_factory=dict)  # this topic's own metrics, with their units

    def __post_init__(self):
        clash = {m for m, unit in self.metrics.items() if UNITS.get(m, unit) != unit}
        if clash:
            raise ValueError(f"{self.topic}: metrics {sorted(clash)} already have units in harness.results.UNITS")

    @property
    def units(self) -> dict[str, str]:
        """Every metric this topic may record, with its unit."""
        return {**UNITS, **self.metrics}

    @property
    def columns(self) -> tuple[str, ...]:
        return KEY_COLUMNS + tuple(self.config) + TAIL_COLUMNS

    def check_config(self, config: dict) -> None:
        unknown = set(config) - set(self.config)
        if unknown:
            raise ValueError(f"{self.topic}: configuration columns not in the schema: {sorted(unknown)}")
        for name, value in config.items():
            kind = self.config[name]
            wrong_type = value is not None and not isinstance(value, kind)
            bool_for_number = isinstance(value, bool) and kind is not bool
            if wrong_type or bool_for_number:
                raise TypeError(f"{self.topic}: column {name!r} expects {kind.__name__}, got {value!r}")


# A results file as a part writes it, or gzip-compressed as committed (tools/compress_results.py):
# ``X.csv.gz`` holds the bytes of ``X.csv`` and stands for it wherever ``X.csv`` is not there.
CSV, COMPRESSED = ".csv", ".csv.gz"


def results_name(path: Path | str) -> str | None:
    """``<part>-<scale>`` of a results file's name (either form), or None for another file."""
    name = Path(path).name
    for suffix in (COMPRESSED, CSV):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return None


def committed(path: Path | str) -> Path:
    """The file that stands for results file ``X.csv``: itself where it exists (a part's fresh
    output wins), else ``X.csv.gz`` where that exists, else ``X.csv`` (missing)."""
    path = Path(path)
    compressed = path.with_name(path.name + ".gz")
    return compressed if not path.exists() and compressed.exists() else path


def results_in(folder: Path | str, pattern: str) -> list[Path]:
    """The results files in ``folder`` whose ``<part>-<scale>`` matches the glob ``pattern`` (which
    may hold folders: ``*/*-h200``), one per name and folder (``X.csv`` over ``X.csv.gz``), sorted."""
    found: dict[Path, Path] = {}
    for suffix in (COMPRESSED, CSV):  # .csv second: it replaces its compressed twin
        for path in Path(folder).glob(pattern + suffix):
            found[path.with_name(results_name(path))] = path
    return [found[key] for key in sorted(found)]


def results_bytes(path: Path | str) -> bytes:
    """The CSV bytes of a results file of either form; one that cannot be read (a truncated or
    corrupt archive, no permission) is refused in one line naming it."""
    try:
        data = Path(path).read_bytes()
        return gzip.decompress(data) if str(path).endswith(COMPRESSED) else data
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise ResultsFormatError(f"{path}: cannot be read ({err})") from None


def provenance_path(csv_path: Path) -> Path:
    return csv_path.with_name((results_name(csv_path) or csv_path.name) + PROVENANCE_SUFFIX)


def write_both(record: Path, record_text: str, csv_path: Path, csv_text: str) -> None:
    """Write the provenance record, then the CSV, so that a CSV is there only beside its own record.

    Both go to temporary files first (where a full disk or a folder in the way fails, and then
    nothing of this run is left and an earlier run's pair is untouched); then an earlier CSV is
    moved aside, the record put in place (where that fails, the earlier CSV is put back: the
    earlier pair stands), and the CSV last: a stop after the record leaves a record without rows,
    never this run's record beside an earlier run's rows."""
    try:  # the caller checked the folder before measuring, but a check is not the making (root passes os.access)
        csv_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(f"could not make the folder of {csv_path}: {error.strerror or error}") from None
    _remove_files_of_dead_writers(record, csv_path)
    pending, aside = [], csv_path.with_name(f".{csv_path.name}.earlier{os.getpid()}")
    destination = {}  # a temporary file's final name, for the error
    try:
        for path, text in ((record, record_text), (csv_path, csv_text)):
            if path.is_dir():
                raise IsADirectoryError(21, "Is a directory", str(path))
            tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
            pending.append((tmp, path))
            destination[str(tmp)] = str(path)
            tmp.write_text(text)
        if csv_path.exists():
            os.replace(csv_path, aside)
        try:
            os.replace(*pending[0])
        except OSError:
            if aside.exists():
                os.replace(aside, csv_path)
            raise
        aside.unlink(missing_ok=True)
        os.replace(*pending[1])
    except OSError as error:
        for tmp, _ in pending:
            tmp.unlink(missing_ok=True)
        reason = error.strerror or str(error)
        where = destination.get(str(error.filename), error.filename or csv_path)
        raise UserError(f"could not write {csv_path} and its record: {reason} ({where})") from None


def _remove_files_of_dead_writers(*paths: Path) -> None:
    """Remove what a writer killed mid-write (SIGKILL, a power cut: other signals wait for the
    write) left beside ``paths``: its temporary files and an earlier CSV it had moved aside. Such an
    earlier CSV cannot be put back, as the record beside it may already be the killed run's."""
    for path in paths:
        for leftover in path.parent.glob(f".{glob.escape(path.name)}.*"):
            pid = leftover.name.rsplit(".", 1)[-1].removeprefix("tmp").removeprefix("earlier")
            if pid.isdigit() and int(pid) != os.getpid() and not _running(int(pid)):
                leftover.unlink(missing_ok=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class ResultsWriter:
    """Collects the rows of one run and writes them, with provenance, in one atomic step."""

    def __init__(self, schema: Schema, scale: str):
        self.schema = schema
        self.scale = scale
        self.rows: list[dict] = []
        self._keys: set[tuple] = set()

    def add(
        self,
        *,
        role: str,
        variant: str,
        config: dict,
        metric: str,
        value: float,
        unit: str,
        repetition: int = 0,
        dataset: str = "",
    ) -> None:
        self.schema.check_config(config)
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        if self.schema.units.get(metric) != unit:
            expected = self.schema.units.get(metric, "a unit listed in harness.results.UNITS or the topic's schema")
            raise ValueError(f"metric {metric!r} must be recorded in {expected}, not {unit!r}")
        if not math.isfinite(value):
            raise ValueError(f"{role}/{variant}: {metric} is not finite ({value})")
        if value < 0:  # times, bytes, rates, ratios and counts: a negative one is a broken measurement
            raise ValueError(f"{role}/{variant}: {metric} is negative ({value})")
        if value == 0 and metric in POSITIVE_METRICS:
            raise ValueError(f"{role}/{variant}: {metric} is 0 (a timed call takes time)")
        row = {
            "workload": self.schema.topic,
            "dataset": dataset,
            "role": role,
            "variant": variant,
            "scale": self.scale,
            **{name: config.get(name) for name in self.schema.config},
            "repetition": repetition,
            "metric": metric,
            "value": value,
            "unit": unit,
        }
        # The readers refuse a file holding one measurement twice: refuse it here, when it is made
        # (two config entries that come to the same setting, say), not after the part has run.
        key = self._key(row)
        if key in self._keys:
            shown = ", ".join(f"{c}={row[c]}" for c in self.schema.columns if c not in ("value", "workload", "scale"))
            raise ResultsFormatError(
                f"the same measurement was recorded twice ({shown}): do two entries of the config come to one setting?"
            )
        self._keys.add(key)
        self.rows.append(row)

    def _key(self, row: dict) -> tuple:
        """What makes a row one measurement, as the file will hold it (None and "" are one cell)."""
        return tuple(_format_cell(row[c]) for c in self.schema.columns if c != "value")

    def add_measurement(
        self,
        m: Measurement,
        *,
        role: str,
        variant: str,
        config: dict,
        bytes_moved: int | None = None,
        flops: int | None = None,
        dataset: str = "",
    ) -> None:
        """Rows for each repetition: time, CPU time, and the rates and memory that apply. All of
        them or none: a part stopped mid-way (harness/entry.py) never writes half a measurement."""
        start = len(self.rows)
        try:
            self._add_measurement(m, role, variant, config, bytes_moved, flops, dataset)
        except BaseException:
            for row in self.rows[start:]:
                self._keys.discard(self._key(row))
            del self.rows[start:]
            raise

    def _add_measurement(self, m, role, variant, config, bytes_moved, flops, dataset) -> None:
        for rep, seconds in enumerate(m.seconds):

            def add(metric, value, unit):
                self.add(
                    role=role,
                    variant=variant,
                    config=config,
                    metric=metric,
                    value=value,
                    unit=unit,
                    repetition=rep,
                    dataset=dataset,
                )

            add("time", seconds, "s")
            add("cpu_time", m.cpu_core_seconds[rep], "core-s")
            if bytes_moved is not None:
                add("bandwidth", bytes_moved / seconds / 1e9, "GB/s")
            if flops is not None:
                add("flop_rate", flops / seconds / 1e12, "TFLOP/s")
            if m.peak_gpu_bytes:
                add("peak_gpu_memory", m.peak_gpu_bytes[rep], "B")
            if m.peak_rss_bytes:
                add("peak_host_rss", m.peak_rss_bytes[rep], "B")
            if m.pinned_host_bytes:
                add("pinned_host_memory", m.pinned_host_bytes[rep], "B")

    def write(self, csv_path: Path | str, provenance: dict) -> None:
        """Write the provenance record, then the CSV (the CSV's presence means 'complete'): refused
        in one line where the disk or the path fails, leaving no file of this run (write_both)."""
        csv_path = Path(csv_path)
        if not self.rows:
            raise UserError(
                f"refusing to write {csv_path}: no rows were measured (does the part's config leave it nothing to run?)"
            )
        lines = _CsvLines()
        writer = csv.DictWriter(lines, fieldnames=self.schema.columns, lineterminator="\n")
        writer.writeheader()
        for row in self.rows:
            writer.writerow({k: _format_cell(v) for k, v in row.items()})
        text = "".join(lines.parts)
        # The rows' digest in their record: a file edited after it was written is refused when read.
        record = json.dumps(provenance | {ROWS_DIGEST: _digest(text.encode())}, indent=2, sort_keys=True) + "\n"
        write_both(provenance_path(csv_path), record, csv_path, text)


class _CsvLines:
    def __init__(self):
        self.parts: list[str] = []

    def write(self, s: str) -> None:
        self.parts.append(s)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _format_cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(float(value))  # shortest round-trip form (also for numpy floats): the exact value
    return str(value)


def _parse_row(raw: dict, schema: Schema, where: str) -> dict:
    row = {}
    for name in KEY_COLUMNS:
        value = raw[name]
        if name != "dataset" and not value:
            raise ResultsFormatError(f"{where}: column '{name}' is empty")
        row[name] = value
    if row["workload"] != schema.topic:
        raise ResultsFormatError(f"{where}: workload '{row['workload']}' does not belong in topic '{schema.topic}'")
    if row["role"] not in ROLES:
        raise ResultsFormatError(f"{where}: role '{row['role']}' is not one of {', '.join(ROLES)}")
    for name, kind in schema.config.items():
        cell = raw[name]
        try:
            row[name] = None if cell == "" else _PARSERS[kind](cell)
        except (ValueError, KeyError):
            raise ResultsFormatError(f"{where}: column '{name}': {cell!r} is not {_TYPE_NAMES[kind]}") from None
    try:
        row["repetition"] = _parse_int(raw["repetition"])
        row["value"] = float(raw["value"])
    except ValueError:
        raise ResultsFormatError(
            f"{where}: repetition must be an integer and value a number, got {raw['repetition']!r} and {raw['value']!r}"
        ) from None
    if row["repetition"] < 0:
        raise ResultsFormatError(f"{where}: repetition {row['repetition']} is negative")
    if not math.isfinite(row["value"]):
        raise ResultsFormatError(f"{where}: value {raw['value']!r} is not finite")
    if row["value"] < 0:
        raise ResultsFormatError(
            f"{where}: value {raw['value']!r} is negative (every metric is a time, size, rate or count)"
        )
    if row["value"] == 0 and raw["metric"] in POSITIVE_METRICS:
        raise ResultsFormatError(f"{where}: {raw['metric']} is 0 (a timed call takes time)")
    row["metric"], row["unit"] = raw["metric"], raw["unit"]
    units = schema.units
    if units.get(row["metric"]) != row["unit"]:
        raise ResultsFormatError(
            f"{where}: metric '{row['metric']}' in unit '{row['unit']}'; "
            f"expected one of {sorted(units)} in its unit ({units.get(row['metric'], 'unknown metric')})"
        )
    return row


def _scale_of(path: Path) -> str:
    """Results files are named <part>-<scale>.csv."""
    stem = results_name(path) or path.name
    if "-" not in stem:
        raise ResultsFormatError(f"{path}: results files are named <part>-<scale>.csv")
    return stem.rsplit("-", 1)[1]


def read_rows(path: Path | str, schema: Schema, *, cut_short: bool = False) -> list[dict]:
    """Read one results file, refusing it with the file and line named if it breaks the schema.
    A part stopped before it ended (``cut_short`` in its provenance) holds only some of its rows:
    refused unless the caller says it labels such a part (``cut_short=True``)."""
    path = Path(path)
    scale = _scale_of(path)
    provenance = load_provenance(path)
    if provenance.get("cut_short") and not cut_short:
        raise ResultsFormatError(
            f"{path}: the part was stopped before it ended, so these rows are not the whole part; measure it again "
            "(delete it and its .provenance.json: the workflow measures a part whose file is missing)"
        )
    if provenance.get("scale") != scale:
        raise ResultsFormatError(
            f"{path}: its provenance record says scale {provenance.get('scale')!r}, its name says {scale!r}"
        )
    data = results_bytes(path)
    if ROWS_DIGEST in provenance and provenance[ROWS_DIGEST] != _digest(data):
        raise ResultsFormatError(
            f"{path}: its rows are not those its record was written with (edited, or another run's): measure the "
            "part again rather than edit its file"
        )
    with io.TextIOWrapper(io.BytesIO(data), newline="") as f:
        reader = csv.DictReader(f)
        header = tuple(reader.fieldnames or ())
        # Configuration columns added to the schema after the file was written read as NA.
        expected = tuple(c for c in schema.columns if c in header or c not in schema.config)
        if header != expected:
            missing = [c for c in expected if c not in header]
            extra = [c for c in header if c not in schema.columns]
            raise ResultsFormatError(
                f"{path}: header does not match the '{schema.topic}' schema "
                f"(missing {missing or 'none'}, unexpected {extra or 'none'}, expected order {list(schema.columns)})"
            )
        rows, seen = [], {}
        for line_no, raw in enumerate(reader, start=2):
            if None in raw or any(v is None for v in raw.values()):
                raise ResultsFormatError(f"{path}:{line_no}: expected {len(header)} fields")
            raw = {name: raw.get(name, "") for name in schema.columns}
            row = _parse_row(raw, schema, f"{path}:{line_no}")
            if row["scale"] != scale:
                raise ResultsFormatError(
                    f"{path}:{line_no}: a row of scale '{row['scale']}' in a file of scale '{scale}'"
                )
            key = tuple(row[c] for c in schema.columns if c != "value")
            if key in seen:
                raise ResultsFormatError(
                    f"{path}:{line_no}: the same measurement as line {seen[key]} "
                    "(same configuration, repetition and metric)"
                )
            seen[key] = line_no
            rows.append(row)
    if not rows:
        raise ResultsFormatError(f"{path}: no data rows")
    return rows


def load(paths: Iterable[Path | str], schema: Schema, *, cut_short: bool = False):
    """Load and validate results files into one pandas DataFrame (with a 'source' column);
    ``cut_short``: accept parts stopped before they ended (see :func:`read_rows`)."""
    import pandas as pd

    frames, seen = [], set()
    for path in paths:
        if Path(path).resolve() in seen:
            raise ResultsFormatError(f"{path}: given twice")
        seen.add(Path(path).resolve())
        rows = read_rows(path, schema, cut_short=cut_short)
        frame = pd.DataFrame(rows)
        frame["source"] = str(path)
        frames.append(frame)
    if not frames:
        raise ResultsFormatError(f"no results files given for topic '{schema.topic}'")
    frame = pd.concat(frames, ignore_index=True)
    for name, kind in schema.config.items():
        frame[name] = frame[name].astype({int: "Int64", float: "Float64", str: "string", bool: "boolean"}[kind])
    return frame


def load_provenance(csv_path: Path | str) -> dict:
    """The provenance record beside a results file; refused if missing or not a JSON object."""
    path = provenance_path(Path(csv_path))
    if not path.exists():
        raise ResultsFormatError(
            f"{csv_path}: no provenance record beside it ({path.name}); "
            "a results file without provenance is not accepted"
        )
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ResultsFormatError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(record, dict) or not {"scale", "git", "machine", "date_utc", "packages"} <= set(record):
        raise ResultsFormatError(
            f"{path}: a provenance record needs at least scale, git, machine, packages and date_utc"
        )
    # What every figure's label and every grouping of processes reads (analysis/common.py).
    needed = {"git": ("commit",), "machine": ("cpu_model", "usable_cpus", "gpus"), "packages": ()}
    for part, keys in needed.items():
        if not isinstance(record[part], dict):
            raise ResultsFormatError(f"{path}: the record's {part} is no object (a record the suite writes has one)")
        if missing := [key for key in keys if key not in record[part]]:
            raise ResultsFormatError(f"{path}: the record lacks {part}.{', '.join(missing)} (the suite writes it)")
    # The types the readers rely on: a record edited by hand or corrupted is refused here, in one
    # line, not deep in a reader as an AttributeError.
    fields = {
        "scale": (record["scale"], str),
        "date_utc": (record["date_utc"], str),
        "git.commit": (record["git"]["commit"], str),
        "machine.cpu_model": (record["machine"]["cpu_model"], str),
        "machine.usable_cpus": (record["machine"]["usable_cpus"], int),
        "machine.gpus": (record["machine"]["gpus"], list),
        **{name: (record[name], dict) for name in ("code", "parameters") if name in record},
    }
    for name, (value, kind) in fields.items():
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ResultsFormatError(f"{path}: the record's {name} is {value!r}, not {_KIND_WORDS[kind]}")
    for i, gpu in enumerate(record["machine"]["gpus"]):
        if not isinstance(gpu, dict) or not isinstance(gpu.get("name"), str):
            raise ResultsFormatError(f"{path}: the record's machine.gpus[{i}] is {gpu!r}, not a GPU with a name")
    return record


_KIND_WORDS = {str: "a string", int: "a whole number", list: "a list", dict: "an object"}
