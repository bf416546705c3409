"""Helpers shared by the analysis notebooks: loading results, summarizing repetitions, labelling."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import pandas as pd

from harness.contention import NOTED_SHARE
from harness.errors import UserError
from harness.results import load, load_provenance, results_bytes, results_name


def _name(path) -> str:
    """``<part>-<scale>`` of a results file (``X.csv`` or ``X.csv.gz``)."""
    return results_name(path) or Path(path).stem


def load_results(files: list[str], schema, *, cut_short: bool = False) -> tuple[pd.DataFrame, list[dict]]:
    """The results files the workflow passed for one topic (``results[topic]``), validated, with
    their provenance; a ``part`` column names the file each row came from. ``cut_short``: the
    caller labels parts stopped before they ended (refused otherwise)."""
    if not files:
        raise UserError(f"no results files were passed for topic {schema.topic}")
    files = [Path(f) for f in files]
    frame = load(files, schema, cut_short=cut_short)
    frame["part"] = frame["source"].map(lambda s: _name(s).rsplit("-", 1)[0])
    records = [load_provenance(f) for f in files]
    for f, record in zip(files, records):
        part = _name(f).rsplit("-", 1)[0]
        # A record beside the wrong file (another topic's, a renamed copy of a part) would label
        # and count rows as what they are not.
        if record.get("topic", schema.topic) != schema.topic:
            raise UserError(f"{f}: its provenance record is of topic {record['topic']}, not {schema.topic}")
        if record.get("part", part) != part:
            raise UserError(
                f"{f}: its provenance record is of part {record['part']}, not {part} (a copy under another name? "
                "move it out of the results folder)"
            )
        record.setdefault("part", part)  # the earliest records do not name it
    return frame, records


def same_code(one: dict, other: dict) -> bool:
    """Whether two provenance records measured the same code: their digests of their topic's code
    agree (``harness.code_digest``), or, where either record has none, their commits do. A record
    whose digest does not name all that ran (it loaded suite modules outside its topic's files, or
    they changed during the run) is the same code as no other."""
    incomplete = ("loaded_outside_scope", "changed_during_run")
    if any(key in (record.get("code") or {}) for record in (one, other) for key in incomplete):
        return False
    plugins = [(record.get("code") or {}).get("plugins") for record in (one, other)]
    if plugins[0] != plugins[1]:  # out-of-tree entries of other code (or in one process only)
        return False
    # The parameters a part ran with (repetitions, seeds, sizes beyond the results' columns) change
    # its numbers as code does; the digest covers the config file, not a run's overrides of it.
    for key in ("parameters", "shared_parameters"):
        if key in one and key in other and one[key] != other[key]:
            return False
    digests = [(record.get("code") or {}).get("digest") for record in (one, other)]
    if None not in digests:
        return digests[0] == digests[1]
    return one["git"]["commit"] == other["git"]["commit"]


def same_hardware(one: dict, other: dict) -> bool:
    """Whether two provenance records were measured on the same kind of machine: the same GPUs and
    the same CPU model (a machine name is the user's word; the hardware is what was measured)."""
    return _hardware(one) == _hardware(other)


def _hardware(record: dict) -> tuple:
    # Not harness.machine.kind (GPU models, each once): a re-run on two GPUs of a one-GPU part is
    # other hardware for a range over processes, though the same kind of machine for its folder.
    machine = record.get("machine") or {}
    return tuple(g.get("name") for g in machine.get("gpus", [])), machine.get("cpu_model")


def same_code_reruns(rerun_files: list[str], committed_files: list[str]) -> tuple[list[str], list[str]]:
    """The rerun files (other processes of a part) that measured the same code as the committed
    file of the same part, on the same hardware, and the others: a process of other code, or of
    another machine, says nothing of this code's spread here."""
    # By part and scale: a re-run's fresh ``.csv`` beside a committed ``.csv.gz`` is the same part.
    records = {f: load_provenance(f) for f in [*committed_files, *rerun_files]}  # each read once
    committed = {results_name(f): records[f] for f in committed_files}
    _refuse_copies(records)
    kept, other = [], []
    for f in rerun_files:
        match, record = committed.get(results_name(f)), records[f]
        same = match is not None and same_code(record, match) and same_hardware(record, match)
        (kept if same else other).append(f)
    return kept, other


def _refuse_copies(records: dict[str, dict]) -> None:
    """Refuse, in one line, two files (by path, with their provenance records) of one part with the
    same rows and the same record date: a copy of a process (its record travels with it) is not
    another process, and a range or an "in every process" over it would count one run twice. Two
    processes may write the same rows (a seeded loss curve has no timings), never at the same second."""
    seen: dict[tuple, str] = {}
    for f, record in records.items():
        if not Path(f).is_file():  # the readers refuse it in their own words
            continue
        key = (results_name(f), hashlib.sha256(results_bytes(f)).hexdigest(), record.get("date_utc"))
        if key in seen:
            raise UserError(
                f"{f} holds the same rows as {seen[key]}: a copy of one process, not another process of "
                "the part (remove it, or measure the part again)"
            )
        seen[key] = f


def lacking(tried: dict, ran: dict | None = None, graph: int = -1) -> dict:
    """Of groups keyed by tuples whose item at ``graph`` is the graph (a scalar key: one graph
    each), those whose ``tried`` competitors lack one that ran (``ran``, by default ``tried``) in a
    group that differs only in the graph, with what each lacks. Such a group was measured against a
    slower field (a part measured before that competitor was added): a geomean or a maximum over
    graphs leaves it out, as the claims table and the figures do."""
    ran = tried if ran is None else ran

    def siblings(key) -> tuple:
        if not isinstance(key, tuple):
            return ()
        at = graph % len(key)
        return key[:at] + key[at + 1 :]

    field: dict[tuple, frozenset] = {}
    for key in tried:
        field[siblings(key)] = field.get(siblings(key), frozenset()) | frozenset(ran.get(key, ()))
    missing = {key: field[siblings(key)] - frozenset(tried[key]) for key in tried}
    return {key: lacks for key, lacks in missing.items() if lacks}


def summarize(frame: pd.DataFrame, metric: str, by: list[str]) -> pd.DataFrame:
    """Median and interquartile range over repetitions of ``metric`` for each group ``by``."""
    rows = frame[frame["metric"] == metric]
    grouped = rows.groupby(by, dropna=False)["value"]
    out = grouped.agg(
        median="median", q25=lambda v: v.quantile(0.25), q75=lambda v: v.quantile(0.75), repetitions="count"
    ).reset_index()
    return out


@functools.cache
def _suite_config() -> dict:
    """The config of the workflow run that started this render (config/config.yaml outside one),
    read and validated once per render (every label asks for it)."""
    from harness import config as suite_config

    return suite_config.load(suite_config.announced_config_file())


def parts_not_measured(provenance: list[dict]) -> list[str]:
    """The parts that the suite's config measures, for the one topic of ``provenance`` at its
    scale on a machine with its GPUs, that have no record among ``provenance``: a figure drawn
    from some of a topic's parts says which are missing. Records of several topics (a table that
    reads a few files of each) or too old to name their part: none."""
    from harness import config as suite_config
    from harness.topic import discover

    if not all(key in p for p in provenance for key in ("topic", "part", "scale")):
        return []
    if len({(p["topic"], p["scale"], len(p["machine"]["gpus"])) for p in provenance}) != 1:
        return []
    first = provenance[0]
    topics, config = discover(), _suite_config()
    topic = topics.get(first["topic"])
    if topic is None or first["scale"] not in config["scales"]:
        return []  # another code's topic, or a scale of another config: nothing to compare
    done = {p["part"] for p in provenance}
    return [
        part.name
        # The parts the measuring machine runs, by its GPUs and cores, not by the reader's.
        for part in topic.parts_on(len(first["machine"]["gpus"]), first["machine"].get("usable_cpus"))
        if suite_config.part_configured(config, topic, first["scale"], part.name) and part.name not in done
    ]


def machine_label(provenance: list[dict], *, missing_parts: bool = True) -> str:
    """One line saying where and when the numbers were measured, from the provenance records, and
    (``missing_parts``: the records are all of a topic's results) which of the topic's parts were
    not measured there."""
    first = provenance[0]
    # Every kind of machine the records name (one, where the files are one machine's).
    kinds = {}
    for record in provenance:
        m = record["machine"]
        gpus = ", ".join(f"{g['name']} (driver {g['driver']})" for g in m["gpus"]) or "no GPU"
        kinds.setdefault(_hardware(record), f"{gpus}; {m['cpu_model']}, {m['usable_cpus']} cores")
    machines = ("" if len(kinds) == 1 else "MIXED MACHINES: ") + " | ".join(kinds.values())
    dates = sorted(p["date_utc"][:10] for p in provenance)
    dirty = {True: "+dirty", False: "", None: "+dirty?"}  # None: the record does not say
    commits = sorted({p["git"]["commit"][:8] + dirty[p["git"].get("dirty")] for p in provenance})
    return (
        f"{machines}; measured {dates[0]}"
        + (f" to {dates[-1]}" if dates[-1] != dates[0] else "")
        + f"; commit {', '.join(commits)}; torch {first['packages'].get('torch', '?')}"
        + _contention(provenance)
        + (
            f"; not measured: {', '.join(missing)}"
            if missing_parts and (missing := parts_not_measured(provenance))
            else ""
        )
    )


def _contention(provenance: list[dict]) -> str:
    """Where other processes took a noticeable share of the machine's CPU time while a part was
    measured (harness/contention.py): the numbers may be slower and noisier than the machine's."""
    shares = [p["cpu_share_of_other_processes"] for p in provenance if "cpu_share_of_other_processes" in p]
    if not shares or max(shares) < NOTED_SHARE:
        return ""
    return f"; LOADED MACHINE: other processes used up to {max(shares):.0%} of its CPU time while measuring"


def panel_grid(count: int, width: float, height: float, cols: int = 4):
    """A figure with ``count`` panels, ``cols`` per row; unused grid cells removed."""
    import matplotlib.pyplot as plt

    cols = min(cols, count)
    rows = -(-count // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    axes = list(axes.flat)
    for ax in axes[count:]:
        ax.remove()
    return fig, axes[:count]


def errorbars(
    ax, data: pd.DataFrame, x: str, label, color=None, linestyle="-", marker="o", markersize=3, fillstyle="full", **look
) -> None:
    """Medians against ``x`` with interquartile bars (columns from :func:`summarize`); ``look``:
    more of the line's properties (``linewidth``, ``alpha``, ``zorder``)."""
    data = data.sort_values(x)
    ax.errorbar(
        data[x],
        data["median"],
        yerr=[data["median"] - data["q25"], data["q75"] - data["median"]],
        label=label,
        color=color,
        linestyle=linestyle,
        marker=marker,
        markersize=markersize,
        fillstyle=fillstyle,
        capsize=2,
        **look,
    )


def layout_with_title(fig, title: str) -> None:
    """Tight layout under a two-line ``title`` that keeps a fixed 0.6 inch at any figure height."""
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.6 / height))
    fig.suptitle(title, fontsize=9, y=1 - 0.08 / height, va="top")
