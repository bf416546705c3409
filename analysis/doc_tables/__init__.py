"""Tables of measured numbers in docs/, rendered from the committed results files.

A doc quotes a measured table between two markers, and never by hand::

    <!-- generated: ceilings-h200 -->
    | ceiling | measured |
    ...
    Source: ...
    <!-- /generated -->

Each name is a renderer registered here (one small function per table, in the module of its
topic: ``analysis/doc_tables/<topic>.py``). A renderer reads results files through
:func:`results` and returns a :class:`Table`; the block it fills ends with a line naming the
files, the commits their provenance records and the scale, so a reader can trace every number.

    python -m analysis.doc_tables            rewrite every generated block in docs/
    python -m analysis.doc_tables --check    list the blocks that differ from their renderer (exit 1)

``snakemake --cores 1 doc_tables`` (and ``make doc_tables``) runs the first. A test fails when
a block in a doc differs from what its renderer makes of the committed files, so a re-measured
number reaches the docs only through here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UserError
from harness.results import committed, results_in

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
# The topics with renderers: each module registers its tables when imported.
TOPIC_MODULES = ("ceilings", "feature_gather", "gnn_multi_gpu", "gnn_training", "llm_offload", "relational_gnn")


@dataclass(frozen=True)
class Table:
    """A rendered table: its markdown lines and the results files its numbers come from."""

    lines: Sequence[str]
    sources: Sequence[Path]
    note: str = ""  # one sentence after the table (how the numbers were reduced), if any
    # With no sources: which results are not there yet, said where the source line would be.
    not_measured: str = ""


@dataclass(frozen=True)
class Renderer:
    name: str
    topic: str
    render: Callable[[], Table]


_REGISTRY: dict[str, Renderer] = {}


def table(name: str, topic: str):
    """Register the decorated function as the renderer of the generated block ``name``."""

    def register(render: Callable[[], Table]) -> Callable[[], Table]:
        if name in _REGISTRY:
            raise ValueError(f"doc table {name!r} is registered twice")
        _REGISTRY[name] = Renderer(name, topic, render)
        return render

    return register


def registry() -> dict[str, Renderer]:
    """Every registered renderer by name (importing each topic's module once)."""
    for module in TOPIC_MODULES:
        importlib.import_module(f"{__name__}.{module}")
    return dict(sorted(_REGISTRY.items()))


def results_files(machine: str, topic: str, parts: Sequence[str], scale: str, rerun: str | None = None) -> list[Path]:
    """The committed files ``results/<machine>/<topic>/[reruns/<rerun>/]<part>-<scale>.csv``,
    refused in one line when one is missing (a doc table never quietly loses a row)."""
    folder = REPO_ROOT / "results" / machine / topic
    if rerun is not None:
        folder = folder / "reruns" / rerun
    files = [committed(folder / f"{part}-{scale}.csv") for part in parts]
    missing = [str(f.relative_to(REPO_ROOT)) for f in files if not f.exists()]
    if missing:
        raise UserError(f"doc table needs results files that are not there: {', '.join(missing)}")
    return files


def same_code_processes(machine: str, topic: str, part: str, scale: str) -> list[Path]:
    """The committed file of ``part``, then its re-runs (``reruns/*/``) of the same code on the same
    hardware, each its own process: a re-run of other code says nothing of this code's spread."""
    from analysis.common import same_code_reruns

    committed_file = results_files(machine, topic, [part], scale)[0]
    reruns = results_in(REPO_ROOT / "results" / machine / topic, f"reruns/*/{part}-{scale}")
    same, _ = same_code_reruns([str(f) for f in reruns], [str(committed_file)])
    return [committed_file, *map(Path, same)]


def load(files: Sequence[Path], topic: str):
    """The rows of ``files`` (validated against the topic's schema), with a ``part`` column."""
    from analysis.common import load_results

    schema = importlib.import_module(f"workloads.{topic}.schema").SCHEMA
    frame, _ = load_results([str(f) for f in files], schema)
    return frame


def source_line(files: Sequence[Path]) -> str:
    """Where the numbers come from: the files, each file's commit from its provenance, the scale."""
    from harness.results import load_provenance

    if not files:
        raise ValueError("a doc table names at least one results file")
    commits: dict[str, list[str]] = {}
    scales = set()
    for path in files:
        record = load_provenance(path)
        commit = record["git"]["commit"][:7] + ("+dirty" if record["git"].get("dirty") else "")
        commits.setdefault(commit, []).append(str(Path(path).resolve().relative_to(REPO_ROOT)))
        scales.add(record["scale"])
    listed = "; ".join(
        ", ".join(f"`{f}`" for f in names) + f" (commit `{commit}`)" for commit, names in sorted(commits.items())
    )
    return f"Source: {listed}; scale `{'`, `'.join(sorted(scales))}`."


def render(name: str) -> str:
    """The body of the generated block ``name``: the table, its note, its source line."""
    renderers = registry()
    if name not in renderers:
        raise UserError(f"no doc table named {name!r}; registered: {', '.join(renderers)}")
    made = renderers[name].render()
    parts = ["\n".join(made.lines)]
    if made.note:
        parts.append(made.note)
    parts.append(made.not_measured if not made.sources and made.not_measured else source_line(made.sources))
    return "\n\n".join(parts)
