"""Numbers quoted in a doc's prose, each tied to where it comes from and checked against it.

A measured quantity written in a sentence (a time, a size, a bandwidth, a percentage) outside the
generated tables carries its source in an HTML comment right after it, which a rendered page
does not show::

    HGT's step takes 2.3 ms<!-- = 1e3 * median("h200/relational_gnn/knowledge_graphs-h200",
        model="hgt", dataset="nations", variant="dense_compiled", mode="training") --> there.

- ``<!-- = EXPR -->``: EXPR, evaluated over the committed results, rounds to the number as
  written (``0.48`` holds for values in [0.475, 0.485]). A range (``1.4-4.9 s``) takes a pair.
- ``<!-- ~ EXPR -->``: for a number given as approximate ("about 0.7 s", "~2 GB/s"): within 10%.
- ``<!-- given: WHERE -->``: a number the suite does not measure (a paper's figure, a hardware
  specification, a download size), with where it comes from.

A number written the same way twice in one doc needs its source once. EXPR is a Python
expression over the names in :data:`NAMES`: ``median``, ``values`` and ``rows`` read a committed
results file (a path under ``results/``, ``.csv`` optional) filtered by column values (``median`` and
``values`` refuse rows of more than one measurement; ``all_values`` takes them all, for a source
that adds them up or takes their largest),
``provenance`` its provenance record, ``const`` a constant of the suite's code, ``span`` the
ends of a range (the smallest and largest of some values), and the units
``KiB``, ``MiB``, ``GiB`` (powers of two) and ``GB`` (10**9).

:func:`problems` lists every number that lacks a source, whose source fails, or whose source
disagrees with it; ``tests/test_doc_numbers.py`` runs it over the README and every doc.
"""

from __future__ import annotations

import functools
import importlib
import math
import numbers
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from analysis.doc_tables import REPO_ROOT, blocks
from harness.results import committed

# A number with the unit of a measured quantity; a range joins two numbers with "-", "–" or " to ".
_NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?"
_UNIT = r"(?:ms|µs|us|s|min|GB/s|GiB/s|MB/s|TB/s|TB|GB|GiB|MB|MiB|KiB|%|TFLOP/s|(?:million )?rows/s)"
QUOTED = re.compile(
    rf"(?<![\w.,/-])(?P<number>{_NUMBER}(?:(?:[–-]| to ){_NUMBER})?)\s?(?P<unit>{_UNIT})(?![\w/])"
    r"(?P<emphasis>\**)(?P<source><!--(?P<body>.*?)-->)?",
    re.S,
)
SOURCE = re.compile(r"^\s*(?:(?P<kind>[=~])(?P<expr>.*)|given:\s*(?P<given>\S.*))$", re.S)
APPROXIMATE = 0.10  # the relative tolerance of a "~" source


@dataclass(frozen=True)
class Quoted:
    line: int
    number: str  # as written: "0.48", "1,234", "1.4-4.9"
    unit: str
    source: str | None  # the comment's body, or None

    @property
    def text(self) -> str:
        return f"{self.number} {self.unit}"

    def __str__(self) -> str:
        return f"line {self.line}: {self.text}"


def masked(text: str) -> str:
    """``text`` with generated blocks, fenced code and inline code blanked (line count kept)."""
    text = blocks.outside(text)
    text = re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), text)


def quoted_numbers(text: str, exempt_lines: frozenset[str] = frozenset()) -> list[Quoted]:
    """Every measured-looking number in ``text``'s prose, with its source comment if it has one.

    ``exempt_lines``: lines checked elsewhere (the README's copy of the generated claims table)."""
    prose = masked(text)
    found = []
    for match in QUOTED.finditer(prose):
        line = prose.count("\n", 0, match.start()) + 1
        if text.split("\n")[line - 1].strip() in exempt_lines:
            continue
        found.append(Quoted(line, match["number"], match["unit"], match["body"]))
    return found


def shown_values(number: str) -> list[tuple[float, int]]:
    """Each number of ``number`` (one, or the two ends of a range) with its decimals."""
    parts = re.split(r"[–-]| to ", number)
    return [(float(p.replace(",", "")), len(p.split(".")[1]) if "." in p else 0) for p in parts]


def agrees(number: str, value, approximate: bool) -> bool:
    """Whether ``value`` (a number, or a pair for a range) is ``number`` as written."""
    shown = shown_values(number)
    values = list(value) if isinstance(value, (tuple, list)) else [value]
    real = all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values)  # numpy scalars too
    if len(values) != len(shown) or not real or not all(math.isfinite(v) for v in values):
        return False
    for (written, decimals), actual in zip(shown, values):
        if approximate:
            if abs(actual - written) > max(APPROXIMATE * abs(written), 0.5 * 10**-decimals):
                return False
        elif abs(actual - written) > 0.5 * 10**-decimals * (1 + 1e-9) + 1e-12:
            return False
    return True


# --- what a source may read --------------------------------------------------------------------


UNCOMMITTED = "local"  # results/local/: this machine's own runs, ignored by git, so no doc may quote them


def _results_path(path: str) -> Path:
    if Path(path).parts[:1] == (UNCOMMITTED,):
        raise LookupError(f"results/{path} is this machine's own run, not committed: quote a committed machine's")
    full = committed(REPO_ROOT / "results" / (path if path.endswith(".csv") else f"{path}.csv"))
    if not full.exists():
        raise LookupError(f"no results file results/{path}")
    return full


@functools.cache
def _frame(path: str):
    import pandas as pd

    return pd.read_csv(_results_path(path))


def rows(path: str, **where):
    """The rows of a committed results file whose columns equal ``where``'s values."""
    import pandas as pd

    frame = _frame(path)
    unknown = sorted(set(where) - set(frame.columns))
    if unknown:
        raise LookupError(f"results/{path} has no column {', '.join(unknown)}")
    for column, wanted in where.items():
        if isinstance(wanted, (int, float)) and not isinstance(wanted, bool):  # 2**28 matches 268435456.0
            frame = frame[pd.to_numeric(frame[column], errors="coerce") == wanted]
        else:
            frame = frame[frame[column].astype(str) == str(wanted)]
    if frame.empty:
        raise LookupError(f"no row of results/{path} has {where}")
    return frame


# Columns in which the repetitions of one measurement differ; rows that differ in any other column
# are different measurements, and a median over them would mix configurations.
REPEATED_IN = ("value", "repetition", "source")


def values(path: str, metric: str = "time", **where) -> list[float]:
    """The ``value`` column of the rows of ``metric`` matching ``where`` (one per repetition), refused
    when those rows are more than one measurement (a filter is missing)."""
    found = rows(path, metric=metric, **where)
    varying = [c for c in found.columns if c not in REPEATED_IN and found[c].nunique(dropna=False) > 1]
    if varying:
        raise LookupError(
            f"the rows of results/{path} with {dict(metric=metric, **where)} are several measurements: "
            f"they differ in {', '.join(varying)} (filter on them, or aggregate rows() explicitly)"
        )
    return [float(v) for v in found["value"]]


def all_values(path: str, metric: str = "time", **where) -> list[float]:
    """The ``value`` of every row of ``metric`` matching ``where``, over several measurements when they
    match (kernel classes to add up, graphs to take the largest of): the aggregate is the source's own."""
    return [float(v) for v in rows(path, metric=metric, **where)["value"]]


def median(path: str, metric: str = "time", **where) -> float:
    """The median ``value`` of ``metric`` over the rows matching ``where``."""
    return statistics.median(values(path, metric, **where))


def provenance(path: str) -> dict:
    from harness.results import load_provenance

    return load_provenance(_results_path(path))


def span(numbers) -> tuple[float, float]:
    """The smallest and largest of ``numbers``: the ends of a range as a doc writes it."""
    numbers = list(numbers)
    return min(numbers), max(numbers)


def const(name: str):
    """A constant of the suite's code, ``"package.module:NAME"`` (a number a doc restates)."""
    module, _, attribute = name.partition(":")
    return getattr(importlib.import_module(module), attribute)


NAMES = {
    "rows": rows,
    "values": values,
    "all_values": all_values,
    "median": median,
    "provenance": provenance,
    "const": const,
    "span": span,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "GB": 1e9,
    "min": min,
    "max": max,
    "abs": abs,
    "len": len,
    "zip": zip,
    "sum": sum,
    "round": round,
    "sorted": sorted,
    "tuple": tuple,
    "statistics": statistics,
}


def check(quote: Quoted, sourced: dict[str, str]) -> str | None:
    """Why ``quote`` is not supported (None if it is). ``sourced``: number text -> a source given
    for it elsewhere in the same doc."""
    body = quote.source if quote.source is not None else sourced.get(quote.text)
    if body is None:
        return f"{quote}: no source (add <!-- = EXPR -->, <!-- ~ EXPR --> or <!-- given: WHERE --> after it)"
    parsed = SOURCE.match(body)
    if parsed is None:
        return f"{quote}: a source reads '= EXPR', '~ EXPR' or 'given: WHERE', not {body.strip()[:60]!r}"
    if parsed["given"] is not None:
        return None
    try:
        value = eval(parsed["expr"], {"__builtins__": {}, **NAMES})  # the repository's own docs
    except Exception as error:  # a broken source is reported with the number it should support
        return f"{quote}: its source fails: {type(error).__name__}: {error}"
    if not agrees(quote.number, value, parsed["kind"] == "~"):
        shown = tuple(round(v, 6) for v in value) if isinstance(value, (tuple, list)) else value
        return f"{quote}: its source gives {shown!r}"
    return None


def claims_table_rows(text: str) -> frozenset[str]:
    """The rows of a claims table (the README's copy of the generated claims.md, which
    tests/test_docs.py holds to that file)."""
    inside, rows = False, set()
    for line in (line.strip() for line in text.split("\n")):
        if line.startswith("| technique | claim |"):
            inside = True
        elif not line.startswith("|"):
            inside = False
        if inside:
            rows.add(line)
    return frozenset(rows)


def problems(text: str) -> list[str]:
    """Every quoted number of ``text`` that lacks a source or disagrees with it, one line each."""
    quotes = quoted_numbers(text, claims_table_rows(text))
    sourced = {q.text: q.source for q in quotes if q.source is not None}
    return [found for q in quotes if (found := check(q, sourced))]
