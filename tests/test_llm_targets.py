"""llm_offload's targets: the bound target on compiled blocks against compiled keep (and, labelled, on
eager ones against keep), and the planner's predictions against the measured activation peak and step
time; from synthetic results, and the part recording what they need (compiled bounds, AdamW's seconds)."""

from __future__ import annotations

import types

import pandas as pd
import pytest

from analysis.doc_tables import llm_offload as tables
from systems.ssdtrain.bound import bound_of_profile
from systems.ssdtrain.planning import LayerProfile
from tests.kept_rows import Rows
from tests.test_llm_offload import one_model
from workloads.llm_offload import parts

GIB = 2**30
EAGER = {"saved_bytes": [4 * GIB, 4 * GIB, 4 * GIB], "input_bytes": [GIB] * 3, "forward_seconds": [0.02] * 3}
COMPILED = {"saved_bytes": [2 * GIB, 2 * GIB, 2 * GIB], "input_bytes": [GIB] * 3, "forward_seconds": [0.01] * 3}


def _layers(profile):
    return [LayerProfile(*v) for v in zip(profile["saved_bytes"], profile["input_bytes"], profile["forward_seconds"])]


def frame(values: dict) -> pd.DataFrame:
    """Rows of one model, ``values``: variant -> {metric: value} (three repetitions each)."""
    rows = []
    for variant, metrics in values.items():
        policy = variant.removesuffix("_host").removesuffix("_0.5")
        store = "host" if variant.endswith("_host") else ""
        for metric, value in metrics.items():
            for rep in range(3 if metric in ("time", "activation_peak") else 1):
                rows.append(
                    dict(dataset="m", variant=variant, role="optimized", policy=policy, store=store, metric=metric)
                    | dict(value=value, repetition=rep, emulated_gbps=float("nan"), keep_last=1)
                    | dict(activation_budget=float("nan"), budget_fraction=0.5 if policy == "planner" else None)
                )
    return pd.DataFrame(rows)


RECORD = {"models": {"m": {"profile": EAGER, "profile_compiled": COMPILED, "store_gbps": {"host": 50.0}}}}


def test_the_compiled_offloader_is_bounded_by_the_compiled_profile_against_compiled_keep():
    runs = frame(
        {
            "keep": {"time": 1.0, "activation_peak": 10 * GIB},
            "offload_all_host": {"time": 1.2, "activation_peak": 9 * GIB},
            "compiled_keep": {"time": 0.8, "activation_peak": 6 * GIB},
            "offload_all_compiled_host": {"time": 0.82, "activation_peak": 5 * GIB},
        }
    )
    found = {r.variant: r for r in tables.bound_rows_of(runs, RECORD)}
    compiled = found["offload_all_compiled_host"]
    assert compiled.compiled and not found["offload_all_host"].compiled
    assert compiled.bound == pytest.approx(bound_of_profile(_layers(COMPILED), 50e9).activation_bytes)
    assert compiled.reduction == GIB and compiled.slower == pytest.approx(0.82 / 0.8)
    assert found["offload_all_host"].bound == pytest.approx(bound_of_profile(_layers(EAGER), 50e9).activation_bytes)
    assert found["offload_all_host"].slower == pytest.approx(1.2)
    # A run's own recorded bound wins over the one recomputed from the profile.
    recorded = pd.concat([runs, frame({"offload_all_compiled_host": {"bound_activation_bytes": 2 * GIB}})])
    assert {r.variant: r.bound for r in tables.bound_rows_of(recorded, RECORD)}["offload_all_compiled_host"] == 2 * GIB
    # Without compiled keep, or without a compiled profile, the compiled row is not measured (no row).
    no_keep = runs[runs.variant != "compiled_keep"]
    assert [r.variant for r in tables.bound_rows_of(no_keep, RECORD)] == ["offload_all_host"]
    eager_only = {"models": {"m": {"profile": EAGER, "store_gbps": {"host": 50.0}}}}
    assert [r.variant for r in tables.bound_rows_of(runs, eager_only)] == ["offload_all_host"]


def test_the_bound_target_is_met_missed_or_not_measured_per_model_over_processes():
    def row(compiled, share, slower):
        variant = "offload_all_compiled_host" if compiled else "offload_all_host"
        return tables.BoundRow("m", variant, variant, compiled, 1.0, share, slower)

    met = tables.bound_target_rows("M", [[row(True, 0.9, 1.01)], [row(True, 0.86, 1.04)]], "m")
    assert "0.86–0.90 of the bound" in met[0] and met[0].endswith("| yes |") and "2 of 2 processes" in met[0]
    assert "eager blocks" in met[1] and "not measured" in met[1]
    slow = tables.bound_target_rows("M", [[row(True, 0.9, 1.01)], [row(True, 0.9, 1.06)]], "m")
    assert slow[0].endswith("| no |")
    eager = tables.bound_target_rows("M", [[row(False, 0.5, 1.0)]], "m")
    assert "compiled blocks" in eager[0] and "not measured" in eager[0]
    assert "eager blocks" in eager[1] and eager[1].endswith("| no |")


def test_the_planner_s_predictions_are_set_against_the_allocator_peak_and_the_step_less_adamw():
    runs = frame(
        {
            "planner_host": {
                "time": 1.1,
                "activation_peak": 4 * GIB,
                "activation_bytes": 2 * GIB,  # the hooks' count: not what the target compares with
                "predicted_time": 1.0,
                "predicted_activation_bytes": 3 * GIB,
            }
        }
    )
    with_adamw = {"models": {"m": {"optimizer_seconds": {"planner_host": [0.1, 0.1, 0.1]}}}}
    peak, timing = tables.prediction_errors(runs, with_adamw)[("m", "planner_host")]
    assert peak == pytest.approx(-0.25) and timing == pytest.approx(0.0)
    assert tables.prediction_errors(runs, {"models": {}})[("m", "planner_host")][1] is None  # not recorded
    labels = {"planner_host": "planner within 0.5, host"}
    close = {("m", "planner_host"): (0.05, -0.08)}
    assert tables.prediction_rows("M", [close], labels, "m")[0].endswith("| yes |")
    assert tables.prediction_rows("M", [close, {("m", "planner_host"): (-0.25, 0.0)}], labels, "m")[0].endswith(
        "| no |"
    )
    unknown = tables.prediction_rows("M", [{("m", "planner_host"): (0.05, None)}], labels, "m")[0]
    assert "time not measured" in unknown and unknown.endswith("| not measured |")


def test_offload_all_compiled_gets_its_bound_from_the_compiled_blocks_profile():
    notes = {}

    class Profiler:
        def __init__(self):
            self.notes = notes

        def blocks(self, compiled=False):
            return _layers(COMPILED if compiled else EAGER), 1.0, 0

        def bandwidth(self, setup):
            return 50e9

    store = types.SimpleNamespace(label="host")
    eager = types.SimpleNamespace(label="offload_all_host", store=store, policy=types.SimpleNamespace(compiled=False))
    compiled = types.SimpleNamespace(
        label="offload_all_compiled_host", store=store, policy=types.SimpleNamespace(compiled=True)
    )
    bounds = parts._bounds({"keep_last": 1}, Profiler(), [eager, compiled])
    assert bounds["offload_all_compiled_host"] == bound_of_profile(_layers(COMPILED), 50e9).activation_bytes
    assert bounds["offload_all_host"] == bound_of_profile(_layers(EAGER), 50e9).activation_bytes
    assert set(notes) == {"bounds", "bounds_compiled"}
    assert "offload_all_compiled" in parts.BOUNDED


def test_the_part_records_each_run_s_optimizer_seconds(scratch):
    notes = one_model(
        scratch, Rows(), stores=["host"], compare=["planner"], planned_stores=["host"], planner_budget=0.5
    )
    seconds = notes["models"]["llama-tiny"]["optimizer_seconds"]
    assert set(seconds) >= {"keep", "planner_host"}
    assert all(len(v) == 1 and v[0] > 0 for v in seconds.values())
