"""The papers' headline claims against one machine's results: ``paper_figs/<machine>/claims.md``.

    python -m analysis.claims --machine h200 [--scale h200] [--out paper_figs/h200/claims.md]

Each claim of ``config/claims.yaml`` (validated against ``workflow/schemas/claims.schema.yaml``;
the file's header says how a value and its verdict are computed) is evaluated from the committed
results of ``results/<machine>/``: the files of its parts and the re-runs beside them, each re-run
a separate process. A claim whose files or rows are missing reads "not measured here" with the
reason; nothing about missing results is an error, but a machine with no results folder, or a
scale no results file of it has, is refused. The machine column comes from the machine's
ceilings (``results/<machine>/ceilings/``) and the provenance records.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.common import lacking, load_results, machine_label, same_code_reruns, summarize
from harness.config import ConfigError, _check, _read_yaml, _relative, is_machine_name
from harness.errors import UserError, exit_on_user_error
from harness.results import committed, load_provenance, results_in, results_name
from harness.topic import discover

REPO_ROOT = Path(__file__).resolve().parent.parent
CLAIMS_FILE = REPO_ROOT / "config" / "claims.yaml"
SCHEMA_FILE = REPO_ROOT / "workflow" / "schemas" / "claims.schema.yaml"
HOLDS, PARTLY, FAILS, NOT_MEASURED = "holds", "partly", "does not hold", "not measured here"
RANK = {HOLDS: 0, PARTLY: 1, FAILS: 2}  # the least favourable verdict has the highest rank
COMMITTED = "committed run"
GiB = 2**30


# ---------------------------------------------------------------- the claims file


def load_claims(path: Path | str = CLAIMS_FILE) -> list[dict]:
    """The claims of ``path``, refused in one line if the file breaks its schema or its rules."""
    path = Path(path)
    document = _read_yaml(path, "claims file")
    where = f"{_relative(path)}: "
    _check(document, SCHEMA_FILE, where)
    claims = document["claims"]
    topics = discover()
    seen = set()
    for i, claim in enumerate(claims):
        at = f"{where}key 'claims/{i}' ({claim['id']})"
        if claim["id"] in seen:
            raise ConfigError(f"{at}: the id is used twice")
        seen.add(claim["id"])
        verdict, measure = claim.get("verdict"), claim.get("measure")
        if measure is None:
            continue
        if measure["topic"] not in topics:
            raise ConfigError(f"{at}: unknown topic {measure['topic']!r} (topics: {', '.join(topics)})")
        topic = topics[measure["topic"]]
        unknown = [p for p in measure["parts"] if p not in topic.part_names]
        if unknown:
            raise ConfigError(f"{at}: topic {topic.name} has no parts {unknown} (parts: {', '.join(topic.part_names)})")
        columns = set(topic.schema.columns)
        named = [*measure.get("filters", {}), *measure.get("per", []), measure.get("best_over"), measure.get("column")]
        stray = sorted({c for c in named if c is not None and c not in columns})
        if stray:
            raise ConfigError(f"{at}: {stray} are not columns of topic {topic.name}'s results")
        if _higher_is_better(measure) != (verdict["holds"] >= verdict["partly"]):
            better = "at least" if _higher_is_better(measure) else "at most"
            raise ConfigError(f"{at}: verdict 'holds' must be {better} 'partly' for a {_shown(measure)} value")
    return claims


def _kind(measure: dict) -> str:
    return measure.get("kind", "ratio")


def _shown(measure: dict) -> str:
    """What the shown value is: speedup, ratio or reduction (ratio kind), or the kind itself."""
    return measure["value"] if _kind(measure) == "ratio" else _kind(measure)


def _higher_is_better(measure: dict) -> bool:
    """Of the shown value: a ratio (numerator over baseline) is better lower; all else higher."""
    return _shown(measure) != "ratio"


# ---------------------------------------------------------------- results of one machine


@dataclass
class Processes:
    """What one claim reads of a topic: rows by process, and the files left out."""

    by_process: dict[str, pd.DataFrame]
    missing: list[Path] = field(default_factory=list)  # committed files absent or cut short
    other_runs: list[Path] = field(default_factory=list)  # re-runs of other code or hardware
    cut_short_reruns: list[Path] = field(default_factory=list)  # re-runs stopped before the end


@dataclass
class Folder:
    """The results of one machine at one scale, each file loaded once."""

    root: Path  # results/<machine>
    scale: str
    topics: dict = field(default_factory=discover)
    _loaded: dict = field(default_factory=dict)

    def committed(self, topic: str, part: str) -> Path:
        return committed(self.root / topic / f"{part}-{self.scale}.csv")

    def reruns(self, topic: str, part: str) -> list[Path]:
        return results_in(self.root / topic / "reruns", f"*/{part}-{self.scale}")

    @staticmethod
    def _whole(path: Path) -> bool:
        """The file exists and its part ran to the end (not ``cut_short``)."""
        return path.exists() and not load_provenance(path).get("cut_short")

    def load(self, topic: str, path: Path) -> pd.DataFrame:
        """One results file of ``topic``, validated against its schema (each file read once)."""
        if path not in self._loaded:
            frame, provenance = load_results([str(path)], self.topics[topic].schema)
            self._loaded[path] = (frame, provenance[0])
        return self._loaded[path][0]

    def processes(self, topic: str, parts: list[str]) -> Processes:
        """The rows of ``parts`` by process (the committed run first, then each re-run folder
        of the committed run's code), and the files left out and why."""
        # A part stopped before it ended counts as missing: its rows are not the whole part.
        present, missing = [], []
        for path in (self.committed(topic, p) for p in parts):
            (present if self._whole(path) else missing).append(path)
        if not present:
            return Processes({}, missing)
        whole, cut_short = [], []
        for f in (f for p in parts for f in self.reruns(topic, p)):
            (whole if self._whole(f) else cut_short).append(f)
        kept, other = same_code_reruns([str(f) for f in whole], [str(f) for f in present])
        by_process = {COMMITTED: pd.concat([self.load(topic, f) for f in present], ignore_index=True)}
        for f in map(Path, kept):
            frame = self.load(topic, f)
            name = f.parent.name
            by_process[name] = pd.concat([by_process[name], frame]) if name in by_process else frame
        return Processes(by_process, missing, [Path(f) for f in other], cut_short)

    def provenance(self) -> list[dict]:
        return [record for _, record in self._loaded.values()]


# ---------------------------------------------------------------- computing one claim


@dataclass
class Outcome:
    verdict: str
    value: str = ""  # this machine's value with its range, as shown
    reason: str = ""


class NotMeasured(Exception):
    """A claim this machine's results cannot decide; the message says why."""


def _filtered(rows: pd.DataFrame, filters: dict) -> pd.DataFrame:
    for column, wanted in filters.items():
        rows = rows[rows[column].isin(wanted if isinstance(wanted, list) else [wanted]).fillna(False)]
    return rows


def _named_but_absent(rows: pd.DataFrame, measure: dict) -> str:
    """The values the claim names (filters, and each side's variants or roles) that no row of
    ``rows`` holds, said with what the rows do hold: a typo in the claims file reads as such, not
    as a part this machine did not measure."""
    named = [(column, wanted) for column, wanted in measure.get("filters", {}).items()]
    for side in (measure.get("numerator"), measure.get("baseline")):
        for column, key in (("variant", "variants"), ("role", "roles")):
            if side and key in side:
                named.append((column, side[key]))
    absent = []
    for column, wanted in named:
        held = set(rows[column].dropna().astype(str)) if column in rows else set()
        values = wanted if isinstance(wanted, list) else [wanted]
        # As the filters match (isin: 2 is 2.0), not as the values print.
        missing = [w for w in values if column not in rows or not rows[column].isin([w]).any()]
        if missing:
            absent.append(f"{column} {', '.join(map(repr, missing))} (there: {', '.join(sorted(held)) or 'none'})")
    return f"; in no row here: {'; '.join(absent)}" if absent else ""


def _side(rows: pd.DataFrame, side: dict) -> pd.DataFrame:
    if "variants" in side:
        return rows[rows.variant.isin(side["variants"])]
    return rows[rows.role.isin(side["roles"])]


def _describe_side(side: dict) -> str:
    if "variants" in side:
        return " or ".join(side["variants"])
    return "role " + " or ".join(side["roles"])


def _as_tuple(key) -> tuple:
    """A group's key as a tuple (pandas gives a one-column grouping's keys as scalars)."""
    return key if isinstance(key, tuple) else (key,)


def _group_label(per: list[str], key) -> str:
    return ", ".join(f"{c}={k}" for c, k in zip(per, _as_tuple(key)))


def _best(medians: pd.DataFrame, lower: bool) -> pd.Series:
    return medians.loc[medians["median"].idxmin() if lower else medians["median"].idxmax()]


def _sweep_best(medians: pd.DataFrame, per: list[str], lower: bool) -> pd.DataFrame:
    """Each variant's best median over the swept column, per group, with how many values of the
    column it was measured at (``swept``: 1 says that its best is no choice at all)."""
    order = medians.sort_values("median", ascending=lower)
    best = order.drop_duplicates([*per, "variant"]).reset_index(drop=True)
    counts = medians.groupby([*per, "variant"], dropna=False).size().rename("swept").reset_index()
    return best.merge(counts, on=[*per, "variant"], how="left")


@dataclass
class GroupRatio:
    ratio: float  # numerator over baseline, of the metric
    numerator: str
    baseline: str
    guard: float | None = None
    variants: frozenset = frozenset()  # every variant of either side that the group measured
    competitors: frozenset = frozenset()  # the baseline side's variants with any row in the group (a failure too)
    unswept: tuple = ()  # of the two variants compared, those measured at one value of best_over only
    repetitions: int = 0  # the fewer of the two medians' repetitions (1: a single sample, no median)


def _group_ratios(rows: pd.DataFrame, measure: dict) -> tuple[dict, list]:
    """Per group: the best numerator variant over the best baseline variant (medians); and the
    groups where the numerator was tried (it has rows: it ran out of memory, say) but has none of
    the metric while the baseline has: the technique failed where a baseline ran."""
    per, lower = measure["per"], measure.get("lower_is_better", True)
    keys = [*per, "variant", "role"] + ([measure["best_over"]] if "best_over" in measure else [])
    medians = summarize(rows, measure["metric"], keys)
    if "best_over" in measure:
        medians = _sweep_best(medians, per, lower)
    guard = measure.get("guard")
    guard_medians = summarize(rows, guard["metric"], [*per, "variant"]) if guard else None
    # Every baseline-side variant the group has rows of, whatever the metric: one that ran out of
    # memory there was tried, one without a row was not.
    tried = _side(rows, measure["baseline"]).groupby(per, dropna=False).variant.agg(frozenset)
    numerator_tried = {_as_tuple(k) for k in _side(rows, measure["numerator"]).groupby(per, dropna=False).size().index}
    found, failed = {}, []
    for key, group in medians.groupby(per, dropna=False):
        num, base = _side(group, measure["numerator"]), _side(group, measure["baseline"])
        if num.empty and not base.empty and _as_tuple(key) in numerator_tried:
            failed.append(key)
        if num.empty or base.empty:
            continue
        best_num, best_base = _best(num, lower), _best(base, lower)
        found[key] = GroupRatio(
            best_num["median"] / best_base["median"],
            best_num.variant,
            best_base.variant,
            variants=frozenset(num.variant) | frozenset(base.variant),
            competitors=tried.get(key, frozenset()),
            unswept=tuple(b.variant for b in (best_num, best_base) if b.get("swept", 2) == 1),
            repetitions=int(min(best_num.repetitions, best_base.repetitions)),
        )
        if guard:
            g = guard_medians
            sel = g[(g[per].apply(tuple, axis=1) == _as_tuple(key)).to_numpy()]
            n, b = sel[sel.variant == best_num.variant]["median"], sel[sel.variant == best_base.variant]["median"]
            found[key].guard = float(n.iloc[0] / b.iloc[0]) if len(n) and len(b) else None
    return found, failed


def _show(ratio: float, measure: dict) -> float:
    """The shown value of a numerator-over-baseline ratio."""
    if measure["value"] == "ratio":
        return ratio
    if measure["value"] == "reduction":
        return 1 - ratio
    return 1 / ratio if measure.get("lower_is_better", True) else ratio


def _geomean(values) -> float:
    values = np.asarray(list(values), dtype=float)
    bad = values[~(np.isfinite(values) & (values > 0))]
    if bad.size:  # a metric of 0 on one side (an empty peak): no geometric mean says it
        raise NotMeasured(f"a ratio of {bad[0]:g} among the groups: a geometric mean needs positive, finite ratios")
    return float(np.exp(np.log(values).mean()))


def _format(value: float, shown: str) -> str:
    if shown in ("speedup", "ratio"):
        return f"{value:.2f}x"
    if shown == "reduction":
        return f"−{value:.0%}" if value >= 0 else f"+{-value:.0%}"
    if shown == "no_oom":
        return f"{value:.0%}"
    return f"{value:,.0f}" if abs(value) < 1e6 else f"{value / 1e6:,.1f}M"


def _format_threshold(value: float, shown: str) -> str:
    """A threshold as a bound reads: a reduction's as the share cut."""
    return f"{value:.0%} cut" if shown == "reduction" else _format(value, shown)


def _grade(value: float, verdict: dict, higher: bool) -> str:
    reaches = (lambda t: value >= t) if higher else (lambda t: value <= t)
    return HOLDS if reaches(verdict["holds"]) else PARTLY if reaches(verdict["partly"]) else FAILS


def _baselines_never_measured(rows: pd.DataFrame, measure: dict, noted: set[str]) -> str:
    """A note on the baseline variants a claim lists (the fastest of them is its baseline) that the
    committed run has no row of the claim's metric of, in every group or in some (those ``noted``,
    left out by the config and said already, aside): there the ratio is against the others alone."""
    listed = measure.get("baseline", {}).get("variants", [])
    if _kind(measure) != "ratio" or len(listed) < 2:
        return ""
    per = measure["per"]
    rows = rows[rows.metric == measure["metric"]]
    groups = rows.groupby(per, dropna=False).variant.agg(frozenset)
    groups = groups[groups.map(lambda held: bool(held & set(listed)))]  # groups with some baseline
    notes = []
    for variant in (v for v in listed if v not in noted):
        without = [key for key, held in groups.items() if variant not in held]
        if not without:
            continue
        others = ", ".join(v for v in listed if v != variant and any(v in held for held in groups))
        if len(without) == len(groups):
            notes.append(f"{variant} not measured: against {others} alone")
        else:
            where = "; ".join(_group_label(per, k) for k in without)
            some = f"{len(without)} of {len(groups)} groups ({where})"
            notes.append(f"{variant} not measured in {some}: against {others} alone there")
    return "".join(f" ({n})" for n in notes)


# Columns in which the repetitions of one measurement differ (as in analysis.doc_tables.quoted): rows
# of one group and variant that differ in any other column are two measurements.
REPEATED_IN = ("value", "repetition", "source")


def _with_each_measurement_a_group(rows_by_process: dict, measure: dict) -> dict:
    """``measure`` with ``per`` grown by the columns in which one group's rows of one variant differ
    in some process (two parts that train graphs of one name at two sizes, say): a median over
    them would mix two measurements into a number neither gave, so each becomes a group of its own."""
    cell = [*measure["per"], "variant", "role", "metric"] + ([measure["best_over"]] if "best_over" in measure else [])
    grown: list[str] = []
    for rows in rows_by_process.values():
        rows = rows[rows.metric == measure["metric"]]
        others = [c for c in rows.columns if c not in cell and c not in REPEATED_IN and c not in grown]
        if rows.empty or not others:
            continue
        counts = rows.groupby(cell, dropna=False)[others].nunique(dropna=False)
        grown += [c for c in others if (counts[c] > 1).any()]
    return {**measure, "per": [*measure["per"], *grown]} if grown else measure


def _process_rows(by_process: dict, measure: dict) -> dict[str, pd.DataFrame]:
    rows = {name: _filtered(frame, measure.get("filters", {})) for name, frame in by_process.items()}
    return {name: r for name, r in rows.items() if not r.empty}


@dataclass
class RatioValues:
    values: dict[str, list[tuple]]  # per process, (group, GroupRatio) of every group the verdict reads
    committed: dict  # the committed run's group ratios, those compared
    note: str  # the re-runs and groups left out
    short: str = ""  # why the verdict can be no better than partly ("" where nothing caps it)


def _ratio_values(rows_by_process: dict, measure: dict) -> RatioValues:
    """The group ratios of each process that the verdict reads. A process counts only where it
    measured every group of the committed run, each against the same variants as the committed run
    there: a re-run of some of the parts, or one that lost the fastest competitor somewhere, says
    nothing of a maximum or a geomean over all of them, and no other run's ratio may stand in for
    its missing groups. A re-run that measured a competitor the committed run lacks is left out too,
    and the committed run's value, compared against fewer, is capped at partly; so is a claim whose
    technique failed (no time: ran out of memory) in a group where a baseline ran."""
    found = {name: _group_ratios(rows, measure) for name, rows in rows_by_process.items()}
    ratios = {name: groups for name, (groups, _) in found.items()}
    committed = ratios.get(COMMITTED, {})
    if not committed:
        sides = f"{_describe_side(measure['numerator'])} against {_describe_side(measure['baseline'])}"
        raise NotMeasured(f"no group ({', '.join(measure['per'])}) has both sides ({sides}) with {measure['metric']}")
    committed, uncompared = _comparable(committed, measure["per"])
    values, partial, lacked = {}, [], set()
    for name, groups in ratios.items():
        own = {k: g for k, g in groups.items() if k in committed and g.variants >= committed[k].variants}
        lacked |= {v for k, g in own.items() for v in g.competitors - committed[k].competitors}
        own = {k: g for k, g in own.items() if g.competitors == committed[k].competitors}
        if len(own) < len(committed):
            partial.append(f"{name} {len(own)}")
            continue
        values[name] = [(key, own[key]) for key in committed]
    note, short = "", []
    if partial:
        note = (
            f" ({len(partial)} re-run(s) left out, measuring only some of the {len(committed)} groups, or some "
            f"against other variants than the committed run: {', '.join(partial)} of {len(committed)})"
        )
    if lacked:
        names = ", ".join(sorted(lacked))
        note += f" (the committed run measured without {names}, which re-runs compare against)"
        short.append(f"the committed run lacks {names}, which re-runs measured")
    failed = sorted({_group_label(measure["per"], k) for _, (_, keys) in found.items() for k in keys})
    if failed:
        who = _describe_side(measure["numerator"])
        note += (
            f" ({who} has no {measure['metric']} in {len(failed)} group(s) where a baseline ran: {'; '.join(failed)})"
        )
        short.append(f"{who} failed where a baseline ran")
    return RatioValues(values, committed, note + uncompared, "; ".join(short))


def _left_out_note(names: list[str]) -> str:
    return f" ({len(names)} re-run(s) of only some of the parts left out: {', '.join(names)})" if names else ""


def _comparable(groups: dict, per: list[str]) -> tuple[dict, str]:
    """The groups measured against every competitor their sibling groups (the other graphs of one
    model and mode: :func:`analysis.common.lacking`) tried, and a note on those left out; where no
    group has them all, every group stays and the note says the fields differ. A competitor that
    suits only some models is expected only where it suits. Without a graph column (``dataset``)
    in ``per`` no two groups are graphs of one field."""
    if "dataset" not in per:
        return groups, ""
    missing = lacking({key: g.competitors for key, g in groups.items()}, graph=per.index("dataset"))
    if not missing:
        return groups, ""
    names = ", ".join(sorted(frozenset().union(*missing.values())))
    kept = {k: g for k, g in groups.items() if k not in missing}
    if not kept:
        return groups, f"; the groups' competitors differ ({names} not tried in every group)"
    left_out = f"{len(missing)} of {len(groups)} groups left out"
    return kept, f"; {left_out}, measured without {names}, which the others compare against"


def _aggregate(groups: list[tuple], measure: dict) -> float:
    how = measure["aggregate"]
    if how == "geomean":
        return _show(_geomean(g.ratio for _, g in groups), measure)
    shown = [_show(g.ratio, measure) for _, g in groups]
    if how == "max":
        return max(shown)
    if how == "min":
        return min(shown)
    # per_group: the least favourable group decides the verdict
    return min(shown) if _higher_is_better(measure) else max(shown)


def _extreme_group(groups: list[tuple], measure: dict) -> tuple:
    """The key of the group at which a max or min aggregate is reached."""
    pick = max if measure["aggregate"] == "max" else min
    return pick(groups, key=lambda item: _show(item[1].ratio, measure))[0]


def _spread(values: list[float], shown: str) -> str:
    if len(values) < 2:
        return "one process"
    if _format(min(values), shown) == _format(max(values), shown):
        return f"the same to the shown precision in {len(values)} processes"
    return f"range {_format(min(values), shown)} to {_format(max(values), shown)} over {len(values)} processes"


def _evaluate_ratio(rows_by_process: dict, measure: dict, verdict: dict) -> Outcome:
    if measure.get("requires_baseline_oom"):
        baseline_oom = any(
            (_side(rows, measure["baseline"]).metric == "out_of_memory").any() for rows in rows_by_process.values()
        )
    found = _ratio_values(rows_by_process, measure)
    values, committed, left_out = found.values, found.committed, found.note
    shown, higher = measure["value"], _higher_is_better(measure)
    per_process = {name: _aggregate(groups, measure) for name, groups in values.items()}
    head = per_process[COMMITTED]
    how = measure["aggregate"]
    if how == "per_group":
        cells = [
            f"{_group_label(measure['per'], k)}: {_format(_show(g.ratio, measure), shown)}"
            for k, g in committed.items()
        ]
        text = "; ".join(cells)
    else:
        text = f"{_format(head, shown)} ({how} over {len(committed)} group{'s' * (len(committed) > 1)})"
        if how in ("max", "min"):
            key = _extreme_group(list(committed.items()), measure)
            g = committed[key]
            text += f", at {_group_label(measure['per'], key)}: {g.numerator} vs {g.baseline}"
        elif len({g.baseline for g in committed.values()}) > 1:
            text += f"; baselines picked: {', '.join(sorted({g.baseline for g in committed.values()}))}"
    text += f"; {_spread(list(per_process.values()), shown)}{left_out}"
    if how in ("max", "min") and len(values) > 1:
        where = {_group_label(measure["per"], _extreme_group(groups, measure)) for groups in values.values()}
        if len(where) > 1:  # the range is then no one group's spread over the processes
            text += f" (each process's {how} at another group: {'; '.join(sorted(where))})"
    single = sum(g.repetitions == 1 for g in committed.values())
    if single:  # a "median" of one sample has no spread to show
        text += f" ({measure['metric']} measured once in {single} of {len(committed)} groups: one sample, not a median)"
    unswept = sorted({v for g in committed.values() for v in g.unswept})
    if unswept:  # "each at its fastest" read from runs that timed one value: say what was compared
        text += f" ({', '.join(unswept)} measured at one {measure['best_over']} only: not a best over a sweep)"
    if measure.get("requires_baseline_oom") and not baseline_oom:
        return Outcome(
            NOT_MEASURED,
            text,
            f"{_describe_side(measure['baseline'])} never ran out of memory over {measure['best_over']} here: "
            "the memory limit the claim relies on is absent on this machine",
        )
    grades = {name: _grade(v, verdict, higher) for name, v in per_process.items()}
    result, reason = _verdict_of(grades, verdict, higher, shown)
    if found.short and result == HOLDS:
        result, reason = PARTLY, f"{reason}; but {found.short}"
    guard = measure.get("guard")
    if guard:
        text, result, reason = _apply_guard(guard, values, text, result, reason)
    if measure.get("baseline_is_bound"):
        text, result, reason = _check_bound(committed, measure, text, result, reason)
    return Outcome(result, text, reason)


def _check_bound(committed: dict, measure: dict, text: str, result: str, reason: str) -> tuple[str, str, str]:
    """A claim of parity with an upper bound (all features in GPU memory): where the numerator
    beat the bound in the committed run, the bound bounded nothing there (it ran with other
    handicaps), so parity there says little: named, and the verdict is at best partly."""
    lower = measure.get("lower_is_better", True)
    beaten = [g for g in committed.values() if (g.ratio < 1 if lower else g.ratio > 1)]
    if not beaten:
        return text, result, reason
    names = sorted({(g.numerator, g.baseline) for g in beaten})
    who = "; ".join(f"{n} faster than {b}" for n, b in names)
    text += f"; {who} in {len(beaten)} of {len(committed)} groups: no bound there"
    capped = PARTLY if result == HOLDS else result
    return text, capped, reason + "; but the bound was beaten, so the parity is with a slower run, not a bound"


def _apply_guard(guard: dict, values: dict, text: str, result: str, reason: str) -> tuple[str, str, str]:
    """A second ratio of the same variants (geomean over the groups, per process) that must stay
    at most ``at_most``; out of bounds, or not recorded, the verdict is at best partly."""
    over, unknown = {}, 0
    for name, groups in values.items():
        measured = [g.guard for _, g in groups if g.guard is not None and np.isfinite(g.guard) and g.guard > 0]
        unknown += len(groups) - len(measured)
        if measured:
            over[name] = _geomean(measured)
    bound, metric = guard["at_most"], guard["metric"]
    capped = PARTLY if result == HOLDS else result
    if not over:
        return text, capped, reason + f"; {metric} not recorded: the overhead is unknown"
    if unknown:  # a geomean over the groups that recorded it would say nothing of the others
        where = f"{unknown} group(s)" + (f" of {len(values)} processes" if len(values) > 1 else "")
        return text, capped, reason + f"; {metric} not recorded in {where}: the overhead is unknown there"
    low, high = min(over.values()), max(over.values())
    text += f"; {metric} x baseline: {_format(low, 'ratio')}" + (f" to {_format(high, 'ratio')}" if high > low else "")
    if high > bound:
        return text, capped, reason + f"; but {metric} exceeds {bound:.2f}x the baseline's"
    return text, result, reason + f"; {metric} within {bound:.2f}x the baseline's"


def _verdict_of(grades: dict[str, str], verdict: dict, higher: bool, shown: str) -> tuple[str, str]:
    worst = max(grades.values(), key=RANK.get)
    n = len(grades)
    sign = "≥" if higher else "≤"
    holds, partly = _format_threshold(verdict["holds"], shown), _format_threshold(verdict["partly"], shown)

    alone = " (one process)"  # a verdict from one run says so: it cannot show that it survives a re-run

    def within(short: int) -> str:
        return f" (in {short} of {n} processes)" if n > 1 else alone

    if worst == HOLDS:
        return HOLDS, f"{sign} {holds}" + (f" in every one of {n} processes" if n > 1 else alone)
    if worst == PARTLY:
        return PARTLY, f"{sign} {partly} but not {sign} {holds}" + within(sum(g != HOLDS for g in grades.values()))
    return FAILS, f"not {sign} {partly}" + within(sum(g == FAILS for g in grades.values()))


def _evaluate_no_oom(rows_by_process: dict, measure: dict, verdict: dict) -> Outcome:
    per = measure["per"]
    per_process, counts = {}, {}
    for name, rows in rows_by_process.items():
        oom = rows[rows.metric == "out_of_memory"]
        # The cases where a baseline ran out of memory, and those where the technique itself did
        # (wherever the baselines ran): a failure of its own counts against it.
        cases = _side(oom, measure["baseline"]).groupby(per, dropna=False).size().index
        cases = cases.union(_side(oom, measure["numerator"]).groupby(per, dropna=False).size().index)
        ours = _side(rows, measure["numerator"])
        ran = failed = 0
        for case in cases:
            key = _as_tuple(case)
            mine = ours[(ours[per].apply(tuple, axis=1) == key).to_numpy()] if len(ours) else ours
            if mine.empty:
                continue  # the technique was not run in this case: it counts neither way
            # A variant that ran out of memory left a row saying so; one without a row did not run
            # there (the part's config left it out).
            if (mine.metric == "out_of_memory").any() or not (mine.metric == measure["metric"]).any():
                failed += 1
            else:
                ran += 1
        if ran + failed:
            per_process[name], counts[name] = ran / (ran + failed), (ran, ran + failed)
    if COMMITTED not in per_process:
        raise NotMeasured(f"no case here where {_describe_side(measure['baseline'])} ran out of memory")
    # A re-run of some of the parts met fewer of the cases: no process of this claim.
    partial = [name for name in per_process if counts[name][1] < counts[COMMITTED][1]]
    for name in partial:
        del per_process[name]
    ran, cases = counts[COMMITTED]
    text = (
        f"no out-of-memory failure of {_describe_side(measure['numerator'])} in {ran} of {cases} cases "
        f"({', '.join(per)}) where it or some {_describe_side(measure['baseline'])} ran out of memory; "
        f"{_spread(list(per_process.values()), 'no_oom')}{_left_out_note(partial)}"
    )
    grades = {name: _grade(v, verdict, True) for name, v in per_process.items()}
    result, reason = _verdict_of(grades, verdict, True, "no_oom")
    return Outcome(result, text, reason)


def _evaluate_largest(rows_by_process: dict, measure: dict, verdict: dict) -> Outcome:
    column, per_process, graphs = measure["column"], {}, {}
    for name, rows in rows_by_process.items():
        mine = _side(rows, measure["numerator"])
        mine = mine[mine.metric == measure["metric"]]
        if not mine.empty:
            per_process[name], graphs[name] = float(mine[column].max()), set(mine.dataset)
    if COMMITTED not in per_process:
        raise NotMeasured(f"no {measure['metric']} rows of {_describe_side(measure['numerator'])}")
    # A re-run of some of the parts never measured the largest graph: no process of this claim.
    partial = [name for name in per_process if not graphs[name] >= graphs[COMMITTED]]
    for name in partial:
        del per_process[name]
    text = f"{_format(per_process[COMMITTED], 'largest')} ({column})" + _left_out_note(partial)
    grades = {name: _grade(v, verdict, True) for name, v in per_process.items()}
    result, reason = _verdict_of(grades, verdict, True, "largest")
    return Outcome(result, text, reason)


EVALUATORS = {"ratio": _evaluate_ratio, "no_oom": _evaluate_no_oom, "largest": _evaluate_largest}


def evaluate(claim: dict, folder: Folder) -> Outcome:
    """One claim on one machine's results; "not measured here" with the reason where they
    cannot decide it."""
    if "not_measured" in claim:
        return Outcome(NOT_MEASURED, "", claim["not_measured"])
    measure = claim["measure"]
    topic, parts = measure["topic"], measure["parts"]
    found = folder.processes(topic, parts)
    by_process, missing = found.by_process, found.missing
    if not by_process:
        where = folder.root / topic / f"<part>-{folder.scale}.csv"
        return Outcome(NOT_MEASURED, "", f"no results of parts {', '.join(parts)} ({where})")
    rows = _process_rows(by_process, measure)
    if COMMITTED not in rows:
        filters = ", ".join(f"{k}={v}" for k, v in measure.get("filters", {}).items())
        present = ", ".join(p for p in parts if folder.committed(topic, p).exists())
        absent = _named_but_absent(by_process[COMMITTED], measure) if COMMITTED in by_process else ""
        return Outcome(NOT_MEASURED, "", f"no rows of {topic} ({present}) match {filters}{absent}")
    if _kind(measure) != "largest":
        measure = _with_each_measurement_a_group(rows, measure)
    try:
        outcome = EVALUATORS[_kind(measure)](rows, measure, claim["verdict"])
    except NotMeasured as err:
        return Outcome(NOT_MEASURED, "", f"{err}{_named_but_absent(rows[COMMITTED], measure)}")
    if missing:
        reasons = {
            "no such file": [f.name for f in missing if not f.exists()],
            "cut short": [f.name for f in missing if f.exists()],
        }
        why = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in reasons.items() if names)
        outcome.value += f" (without {why})"
    records = [load_provenance(p) for p in map(functools.partial(folder.committed, topic), parts) if p.exists()]
    left_out = {variant for r in records for variant in r.get("parameters", {}).get("leave_out", [])}
    baseline = measure.get("baseline", {})
    if "variants" in baseline:  # else (roles) any left out may have been a competitor
        left_out &= set(baseline["variants"])
    left_out = sorted(left_out)
    if left_out and outcome.value:
        outcome.value += f" ({', '.join(left_out)} not measured: the config leaves them out of some of its parts)"
    if outcome.value:
        outcome.value += _baselines_never_measured(rows[COMMITTED], measure, set(left_out))
    digests = [(r.get("code") or {}).get("digest") for r in records]
    versions = set(digests) if all(digests) else {(r.get("git") or {}).get("commit") for r in records}
    if len(versions) > 1 and outcome.value:  # one process's parts, measured at different code
        outcome.value += f" (its parts measured at {len(versions)} versions of the code)"
    if found.other_runs:
        outcome.value += f" ({len(found.other_runs)} re-run file(s) of other code or hardware left out)"
    if found.cut_short_reruns:
        outcome.value += f" ({len(found.cut_short_reruns)} re-run file(s) cut short left out)"
    return outcome


# ---------------------------------------------------------------- the machine column


@dataclass
class Ceilings:
    pcie_link: str | None = None
    pcie_gbps: float | None = None
    gpus: list = field(default_factory=list)
    disk: dict = field(default_factory=dict)  # "write"/"read" -> best median GB/s
    gds: bool | None = None


def machine_ceilings(folder: Folder) -> Ceilings:
    """What the claims' machine column shows, from the ceilings results and the provenance."""
    found = Ceilings()
    records = [load_provenance(p) for p in results_in(folder.root, f"*/*-{folder.scale}")]
    for record in records:
        gpus = record.get("machine", {}).get("gpus", [])
        if gpus and not found.gpus:
            found.gpus = gpus
        link = next((g.get("pcie") for g in gpus if g.get("pcie")), None)
        found.pcie_link = found.pcie_link or link
    pcie = folder.committed("ceilings", "pcie_copy")
    if pcie.exists():
        bw = summarize(folder.load("ceilings", pcie), "bandwidth", ["variant", "host_memory", "size_bytes"])
        pinned = bw[(bw.variant == "h2d") & (bw.host_memory == "pinned")]
        if not pinned.empty:
            found.pcie_gbps = float(pinned.loc[pinned.size_bytes.idxmax(), "median"])
    disk = folder.committed("ceilings", "disk")
    if disk.exists():
        bw = summarize(folder.load("ceilings", disk), "bandwidth", ["variant", "block_bytes", "threads"])
        found.disk = {v: float(g["median"].max()) for v, g in bw.groupby("variant")}
        recorded = load_provenance(disk).get("gpudirect_storage")
        found.gds = None if recorded is None else bool(recorded)
    return found


def machine_cell(claim: dict, found: Ceilings) -> str:
    facts = []
    for factor in claim.get("machine", []):
        if factor == "pcie":
            link = f"PCIe {found.pcie_link}" if found.pcie_link else "PCIe link not recorded"
            rate = f"{found.pcie_gbps:.1f} GB/s pinned copy" if found.pcie_gbps else "copy bandwidth not measured"
            facts.append(f"{link}, {rate}")
        elif factor == "gpu_memory":
            if found.gpus:
                sizes = sorted({g["memory_mib"] for g in found.gpus})
                facts.append(f"{len(found.gpus)}x {found.gpus[0]['name']}, {sizes[0] / 1024:.0f} GiB")
            else:
                facts.append("no GPU recorded")
        elif factor == "disk":
            if found.disk:
                best = ", ".join(f"{k} {v:.1f}" for k, v in sorted(found.disk.items(), key=lambda kv: -kv[1]))
                facts.append(f"disk (O_DIRECT, best of the probe's settings): {best} GB/s")
            else:
                facts.append("disk not measured")
        elif factor == "gds":
            facts.append({True: "GDS present", False: "no GDS", None: "GDS not recorded"}[found.gds])
    here = "; ".join(facts)
    paper_gpu = claim["paper"]["conditions"]["gpu"]
    return f"here: {here} · paper: {paper_gpu}" if here else f"paper: {paper_gpu}"


# ---------------------------------------------------------------- the table


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def figure_link(claim: dict, machine_dir: Path, scale: str) -> str:
    if "measure" not in claim:
        return ""
    topic = claim["measure"]["topic"]
    if not (machine_dir / topic).exists():
        return f"[doc](../../docs/{topic}.md)"
    return f"[{topic}]({topic}-{scale}.png), [doc](../../docs/{topic}.md)"


def render(
    machine: str, scale: str, results_root: Path | str = "results", claims_file: Path | str = CLAIMS_FILE
) -> str:
    """The claims table of one machine's results, as markdown."""
    claims = load_claims(claims_file)
    folder = Folder(Path(results_root) / machine, scale)
    outcomes = [(claim, evaluate(claim, folder)) for claim in claims]
    found = machine_ceilings(folder)
    provenance = folder.provenance()
    lines = [
        f"# The thesis's claims on `{machine}` (scale `{scale}`)",
        "",
        f"Generated by `analysis/claims.py` from `config/claims.yaml` and `results/{machine}/`; the config's "
        "header says how each value is computed. Verdicts: **holds** where every process (the committed run "
        "and each same-code re-run) reaches the claim's `holds` threshold, **partly** where every process "
        "reaches `partly`, **does not hold** otherwise; a guard (e.g. step-time overhead) out of bounds "
        "lowers holds to partly. Values: this machine's, from the committed run, with the range over processes.",
        "",
    ]
    if provenance:
        lines += [f"Measured: {machine_label(provenance, missing_parts=False)}", ""]
    lines += [
        "| technique | claim | paper (conditions; source) | this machine | figure | verdict | machine |",
        "|---|---|---|---|---|---|---|",
    ]
    for claim, outcome in outcomes:
        c = claim["paper"]["conditions"]
        paper = (
            f"**{claim['paper']['text']}**; GPU: {c['gpu']}; data: {c['dataset']}; model: {c['model']}; "
            f"baseline: {c['baseline']}; {claim['source']['paper']}, {claim['source']['where']}"
        )
        verdict = f"**{outcome.verdict}**" + (f": {outcome.reason}" if outcome.reason else "")
        cells = [
            claim["technique"],
            f"{claim['claim']} (`{claim['id']}`)",
            paper,
            outcome.value or "–",
            figure_link(claim, folder.root, scale),
            verdict,
            machine_cell(claim, found),
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    tally = pd.Series([o.verdict for _, o in outcomes]).value_counts()
    lines += ["", "Tally: " + ", ".join(f"{v} {tally[v]}" for v in (HOLDS, PARTLY, FAILS, NOT_MEASURED) if v in tally)]
    return "\n".join(lines) + "\n"


def scales_of(root: Path) -> list[str]:
    """The scales a machine folder has results of (files are named <part>-<scale>.csv)."""
    names = [results_name(p) for p in results_in(root, "*/*")]
    return sorted({name.rsplit("-", 1)[-1] for name in names if "-" in name})


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: through a temporary file beside it, removed
    when the write fails (refused in one line)."""
    temporary = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(text)
        os.replace(temporary, path)
    except OSError as err:
        with contextlib.suppress(OSError):  # where the folder itself could not be made, there is none
            temporary.unlink(missing_ok=True)
        where = f" ({err.filename})" if err.filename else ""
        raise UserError(f"cannot write {path}: {err.strerror or err}{where}") from None


def _machines(results_root: Path) -> list[str]:
    """The machines with a results folder under ``results_root``."""
    return sorted(p.name for p in results_root.iterdir() if p.is_dir()) if results_root.is_dir() else []


@exit_on_user_error
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--machine", required=True, help="the folder results/<machine>/")
    parser.add_argument("--scale", help="the results' scale (default: the only one the folder has)")
    parser.add_argument("--results-root", type=Path, default=Path("results"))
    parser.add_argument("--claims", type=Path, default=CLAIMS_FILE)
    parser.add_argument("--out", type=Path, help="default: paper_figs/<machine>/claims.md")
    args = parser.parse_args(argv)
    if not is_machine_name(args.machine):
        raise UserError(f"--machine names one folder of results/ (as h200), not {args.machine!r}")
    out = args.out or Path("paper_figs") / args.machine / "claims.md"
    if out.is_dir():  # refused before anything is read
        raise UserError(f"--out {out} is a folder: name the file to write (e.g. {out / 'claims.md'})")
    # A table of a machine or a scale without results would read "not measured here" throughout.
    root = args.results_root / args.machine
    if not root.is_dir():
        machines = ", ".join(_machines(args.results_root)) or "none"
        raise UserError(f"no results folder {root} (machines with results under {args.results_root}: {machines})")
    scales = scales_of(root)
    found = ", ".join(scales) if scales else "none"
    scale = args.scale
    if scale is None:
        if len(scales) != 1:
            raise UserError(f"{root}: give --scale (scales with results there: {found})")
        scale = scales[0]
    elif scale not in scales:
        raise UserError(f"{root} has no results at scale '{scale}' (scales with results there: {found})")
    text = render(args.machine, scale, args.results_root, args.claims)
    _write_atomically(out, text)


if __name__ == "__main__":
    main()
