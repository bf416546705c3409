"""The claims table (analysis/claims.py): each verdict, the range over re-runs, the fastest-peer
baseline, the missing inputs, the schema's refusals, and the committed H200 results rendered."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis import claims
from harness.config import ConfigError
from harness.results import ResultsWriter
from harness.topic import discover

REPO = Path(__file__).resolve().parent.parent
TOPICS = discover()
SCALE = "tiny"
GRAPHS = ("aifb-like", "bgs-like", "am-like")  # odd count: a geomean, not a mean, decides
COMPETITORS = {"segment_mm": "baseline", "pyg": "peer"}


def provenance(commit: str) -> dict:
    return {
        "scale": SCALE,
        "git": {"commit": commit, "dirty": False},
        "machine": {
            "gpus": [{"name": "Test GPU", "memory_mib": 81920, "driver": "1", "pcie": "gen4 x16"}],
            "cpu_model": "test cpu",
            "usable_cpus": 3,
        },  # fmt: skip
        "date_utc": "2026-01-01T00:00:00+00:00",
        "packages": {"torch": "test"},
    }


def write_part(root: Path, topic: str, part: str, rows: list[dict], commit="c0ffee", rerun=None) -> Path:
    writer = ResultsWriter(TOPICS[topic].schema, SCALE)
    for row in rows:
        writer.add(**row)
    folder = root / topic / "reruns" / rerun if rerun else root / topic
    path = folder / f"{part}-{SCALE}.csv"
    writer.write(path, provenance(commit))
    return path


def layer_rows(times: dict, model="rgcn", mode="training") -> list[dict]:
    """relational_gnn rows: ``times[(graph, variant)]`` = the repetitions' seconds."""
    rows = []
    for (graph, variant), seconds in times.items():
        role = COMPETITORS.get(variant, "optimized")
        config = {"device": "cuda", "model": model, "mode": mode, "in_dim": 64, "precision": "float32"}
        for rep, s in enumerate(seconds):
            rows.append(dict(role=role, variant=variant, config=config, metric="time", value=s, unit="s",
                             repetition=rep, dataset=graph))  # fmt: skip
    return rows


def random_times(rng, speedup: float, pyg_faster_on=(), graphs=GRAPHS) -> dict:
    """Three repetitions per graph and variant: hector_best ``speedup`` times faster than the
    segment_mm form (with noise), PyG slower than it except on ``pyg_faster_on``."""
    times = {}
    for graph in graphs:
        base = rng.uniform(1e-3, 5e-3)
        pyg = base * (rng.uniform(0.3, 0.6) if graph in pyg_faster_on else rng.uniform(1.5, 3.0))
        for variant, centre in (("segment_mm", base), ("pyg", pyg), ("hector_best", base / speedup)):
            times[(graph, variant)] = list(centre * rng.uniform(0.95, 1.05, size=3))
    return times


def reference_geomean(times: dict, competitors: list[str]) -> float:
    """Independent of the module: medians, the fastest competitor per graph, their geomean."""
    ratios = []
    for graph in GRAPHS:
        fastest = min(np.median(times[(graph, v)]) for v in competitors)
        ratios.append(fastest / np.median(times[(graph, "hector_best")]))
    return float(np.exp(np.mean(np.log(ratios))))


def claim(cid: str, holds: float, partly: float, **measure) -> dict:
    base = {
        "topic": "relational_gnn",
        "parts": ["datasets"],
        "filters": {"device": "cuda", "in_dim": 64},
        "metric": "time",
        "numerator": {"variants": ["hector_best"]},
        "baseline": {"roles": ["baseline", "peer"]},
        "per": ["model", "mode", "dataset"],
        "value": "speedup",
        "aggregate": "geomean",
    }
    conditions = {"gpu": "a GPU", "dataset": "graphs", "model": "RGCN", "baseline": "the best"}
    return {
        "id": cid,
        "technique": "Hector",
        "claim": f"claim {cid}",
        "source": {"paper": "a paper", "where": "abstract"},
        "paper": {"value": 2.0, "text": "2x", "conditions": conditions},
        "measure": {**base, **measure},
        "verdict": {"holds": holds, "partly": partly},
    }


def render(tmp_path, entries: list[dict], machine="m") -> dict[str, str]:
    """Each claim's table row, by id."""
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": entries}))
    text = claims.render(machine, SCALE, tmp_path / "results", path)
    return {c["id"]: next(line for line in text.splitlines() if f"(`{c['id']}`)" in line) for c in entries}


def verdict_of(row: str) -> str:
    """The verdict cell's word (the cells: technique, claim, paper, value, figure, verdict, machine)."""
    return row.split(" | ")[5].split("**")[1]


@pytest.fixture
def machine(tmp_path):
    rng = np.random.default_rng(7)
    times = random_times(rng, speedup=rng.uniform(2.0, 3.0), pyg_faster_on=("bgs-like",))
    write_part(tmp_path / "results" / "m", "relational_gnn", "datasets", layer_rows(times))
    return times


def test_a_machine_that_is_not_one_folder_name_is_refused(tmp_path, capsys):
    from analysis.claims import main

    for bad in ("../results/h200", "h200/x", ""):
        with pytest.raises(SystemExit):
            main(["--machine", bad, "--results-root", str(tmp_path), "--out", str(tmp_path / "c.md")])
        assert f"--machine names one folder of results/ (as h200), not {bad!r}" in capsys.readouterr().err
    assert not (tmp_path / "c.md").exists()


def test_each_verdict_from_its_thresholds(tmp_path, machine):
    g = reference_geomean(machine, list(COMPETITORS))
    rows = render(
        tmp_path,
        [
            claim("holds", holds=g * 0.9, partly=g * 0.5),
            claim("partly", holds=g * 1.1, partly=g * 0.9),
            claim("fails", holds=g * 1.5, partly=g * 1.1),
        ],
    )
    assert {cid: verdict_of(row) for cid, row in rows.items()} == {
        "holds": "holds",
        "partly": "partly",
        "fails": "does not hold",
    }
    assert f"{g:.2f}x (geomean over 3 groups)" in rows["holds"]


def test_the_fastest_peer_is_the_baseline(tmp_path, machine):
    """PyG is faster than the segment_mm form on one graph: with peers among the competitors the
    speedup there is over PyG, so the geomean is lower than over the baseline role alone."""
    over_all = reference_geomean(machine, list(COMPETITORS))
    over_baseline = reference_geomean(machine, ["segment_mm"])
    assert over_all < over_baseline * 0.99  # the fixture makes a difference the test can see
    rows = render(
        tmp_path,
        [
            claim("fastest", holds=1e3, partly=1.0),
            claim("baseline_only", holds=1e3, partly=1.0, baseline={"roles": ["baseline"]}),
        ],
    )
    assert f"{over_all:.2f}x" in rows["fastest"] and "baselines picked: pyg, segment_mm" in rows["fastest"]
    assert f"{over_baseline:.2f}x" in rows["baseline_only"]


def test_a_listed_baseline_never_measured_is_named_and_the_others_stand_alone(tmp_path, machine):
    """A baseline of several variants (the faster of them) whose committed run lacks one: the
    ratio is against the others, and the value says so; with all of them there, no note."""
    over_pyg = reference_geomean(machine, ["pyg"])
    rows = render(
        tmp_path,
        [
            claim("one_missing", holds=1e3, partly=0.1, baseline={"variants": ["pyg", "my_loader"]}),
            claim("both_there", holds=1e3, partly=0.1, baseline={"variants": ["pyg", "segment_mm"]}),
        ],
    )
    assert f"{over_pyg:.2f}x" in rows["one_missing"]
    assert "(my_loader not measured: against pyg alone)" in rows["one_missing"]
    assert "not measured: against" not in rows["both_there"]


def test_a_bound_the_technique_beat_is_named_and_caps_the_verdict(tmp_path, machine):
    """Parity with an upper bound: hector_best is faster than segment_mm everywhere in the
    fixture, so segment_mm "bounds" nothing: the groups are named and holds becomes partly. A
    bound faster everywhere (hector_best over PyG) is left alone."""
    bound = {"value": "ratio", "aggregate": "min", "baseline_is_bound": True}
    rows = render(
        tmp_path,
        [
            claim("beaten", holds=10.0, partly=20.0, baseline={"variants": ["segment_mm"]}, **bound),
            claim(
                "plain", holds=10.0, partly=20.0, baseline={"variants": ["segment_mm"]}, value="ratio", aggregate="min"
            ),
        ],
    )
    assert "hector_best faster than segment_mm in 3 of 3 groups: no bound there" in rows["beaten"]
    assert verdict_of(rows["beaten"]) == "partly" and verdict_of(rows["plain"]) == "holds"
    assert "no bound there" not in rows["plain"]
    kept = claim("kept", holds=100.0, partly=200.0, numerator={"variants": ["pyg"]},
                 baseline={"variants": ["hector_best"]}, **bound)  # fmt: skip
    slower = render(tmp_path, [kept])
    assert "no bound there" not in slower["kept"] and verdict_of(slower["kept"]) == "holds"


def test_a_bound_beaten_in_some_groups_or_with_higher_better_is_judged_by_the_metric_s_direction(tmp_path, machine):
    """PyG beats the segment_mm form on bgs-like only: 1 of 3 groups named. With a metric where
    higher is better, the sides swap: hector_best's lower times 'beat' nothing, segment_mm's
    higher ones beat hector_best everywhere."""
    bound = {"value": "ratio", "aggregate": "min", "baseline_is_bound": True}
    some = claim("some", holds=100.0, partly=200.0, numerator={"variants": ["pyg"]},
                 baseline={"variants": ["segment_mm"]}, **bound)  # fmt: skip
    higher = {"lower_is_better": False, **bound}
    none = claim("none", holds=100.0, partly=200.0, baseline={"variants": ["segment_mm"]}, **higher)
    every = claim("every", holds=100.0, partly=200.0, numerator={"variants": ["segment_mm"]},
                  baseline={"variants": ["hector_best"]}, **higher)  # fmt: skip
    rows = render(tmp_path, [some, none, every])
    assert "pyg faster than segment_mm in 1 of 3 groups: no bound there" in rows["some"]
    assert "no bound there" not in rows["none"]
    assert "segment_mm faster than hector_best in 3 of 3 groups: no bound there" in rows["every"]


def test_a_baseline_variant_the_config_left_out_is_named_once_and_never_as_measured(tmp_path, machine):
    """A variant the part's config leaves out is said so once, and the others are the ones the
    ratio is against (the left-out one was listed as measured)."""
    import json

    from harness.results import provenance_path

    path = tmp_path / "results" / "m" / "relational_gnn" / f"datasets-{SCALE}.csv"
    record = provenance_path(path)
    data = json.loads(record.read_text())
    data["parameters"] = {"leave_out": ["dgl"]}
    record.write_text(json.dumps(data))
    listed = {"variants": ["dgl", "my_loader", "pyg"]}
    (row,) = render(tmp_path, [claim("listed", holds=1e3, partly=0.1, baseline=listed)]).values()
    assert "(dgl not measured: the config leaves them out of some of its parts)" in row
    assert "(my_loader not measured: against pyg alone)" in row and row.count("dgl") == 1


def test_range_over_reruns_of_the_same_code(tmp_path, machine):
    rng = np.random.default_rng(11)
    again = random_times(rng, speedup=5.0)
    root = tmp_path / "results" / "m"
    write_part(root, "relational_gnn", "datasets", layer_rows(again), rerun="run2")
    write_part(root, "relational_gnn", "datasets", layer_rows(random_times(rng, 50.0)), rerun="run3", commit="other")
    first, second = reference_geomean(machine, list(COMPETITORS)), reference_geomean(again, list(COMPETITORS))
    row = render(tmp_path, [claim("ranged", holds=4.0, partly=1.5)])["ranged"]
    low, high = sorted((first, second))
    assert f"range {low:.2f}x to {high:.2f}x over 2 processes" in row  # run3 measured other code
    assert "1 re-run file(s) of other code or hardware left out" in row
    assert verdict_of(row) == "partly"  # holds in run2 alone: the least favourable process decides


def test_missing_file_and_unmatched_filter_are_not_measured(tmp_path, machine):
    rows = render(
        tmp_path,
        [
            claim("no_file", holds=2.0, partly=1.0, parts=["large_datasets"]),
            claim("no_rows", holds=2.0, partly=1.0, filters={"model": "hgt"}),
        ],
    )
    assert verdict_of(rows["no_file"]) == claims.NOT_MEASURED
    assert "large_datasets" in rows["no_file"]
    assert verdict_of(rows["no_rows"]) == claims.NOT_MEASURED and "match model=hgt" in rows["no_rows"]


def test_a_part_cut_short_counts_as_missing_and_is_named(tmp_path, machine):
    import json

    rng = np.random.default_rng(13)
    root = tmp_path / "results" / "m"
    cut = write_part(root, "relational_gnn", "large_datasets", layer_rows(random_times(rng, 9.0)))
    record = cut.with_suffix(".provenance.json")
    record.write_text(json.dumps(json.loads(record.read_text()) | {"cut_short": "stopped by SIGTERM"}))
    g = reference_geomean(machine, list(COMPETITORS))  # the whole part alone: the cut one adds nothing
    row = render(tmp_path, [claim("both", holds=1e3, partly=1.0, parts=["datasets", "large_datasets"])])["both"]
    assert f"{g:.2f}x (geomean over 3 groups)" in row
    assert "(without large_datasets-test.csv: cut short)" in row.replace(f"-{SCALE}.csv", "-test.csv")


def test_a_rerun_cut_short_is_left_out_and_named(tmp_path, machine):
    import json

    rng = np.random.default_rng(17)
    cut = write_part(tmp_path / "results" / "m", "relational_gnn", "datasets", layer_rows(random_times(rng, 50.0)),
                     rerun="run2")  # fmt: skip
    record = cut.with_suffix(".provenance.json")
    record.write_text(json.dumps(json.loads(record.read_text()) | {"cut_short": "stopped by SIGTERM"}))
    row = render(tmp_path, [claim("cut", holds=1e3, partly=1.0)])["cut"]
    assert f"{reference_geomean(machine, list(COMPETITORS)):.2f}x" in row and "one process" in row
    assert "1 re-run file(s) cut short left out" in row


def test_a_rerun_without_the_fastest_competitor_is_not_compared_with_a_slower_one(tmp_path, machine):
    """PyG is the fastest competitor on bgs-like; a re-run whose PyG rows there are missing (it
    failed) would compare Hector with the slower segment_mm form. No other run's ratio may stand in
    for that group either: the re-run is left out of the verdict, and the row names it."""
    rng = np.random.default_rng(19)
    again = random_times(rng, speedup=2.5, pyg_faster_on=("bgs-like",))
    partial = {key: value for key, value in again.items() if key != ("bgs-like", "pyg")}
    write_part(tmp_path / "results" / "m", "relational_gnn", "datasets", layer_rows(partial), rerun="run2")
    row = render(tmp_path, [claim("partial", holds=1e3, partly=1.0)])["partial"]
    assert f"{reference_geomean(machine, list(COMPETITORS)):.2f}x (geomean over 3 groups)" in row
    assert "; one process (1 re-run(s) left out" in row and "run2 2 of 3" in row, row


def test_a_rerun_of_some_of_the_parts_does_not_reach_a_maximum_it_never_measured(tmp_path, machine):
    """The maximum is on a graph of one part; a re-run of the other part alone never measured it.
    Counting the re-run with the committed run's ratio standing in for that graph would say the
    maximum held in two processes: the re-run is left out, and the verdict rests on one."""
    rng = np.random.default_rng(29)
    write_part(tmp_path / "results" / "m", "relational_gnn", "large_datasets",
               layer_rows(random_times(rng, speedup=9.0, graphs=("biokg-like",))))  # fmt: skip
    slower = random_times(rng, speedup=1.5)
    write_part(tmp_path / "results" / "m", "relational_gnn", "datasets", layer_rows(slower), rerun="run2")
    row = render(tmp_path, [claim("max", holds=5.0, partly=1.0, aggregate="max",
                                  parts=["datasets", "large_datasets"])])["max"]  # fmt: skip
    assert "at model=rgcn, mode=training, dataset=biokg-like" in row, row
    assert "; one process (1 re-run(s) left out" in row and "run2 3 of 4" in row, row
    assert "**holds**: ≥ 5.00x (one process) |" in row, row


@pytest.mark.parametrize("per", [["model", "mode", "dataset"], ["dataset", "model", "mode"]])
def test_a_group_measured_without_a_competitor_the_others_had_is_left_out_and_named(tmp_path, per):
    """PyG was not measured on bgs-like (a part measured before it was added), where it would be
    the fastest competitor: that group is left out of the geomean (its ratio would be against the
    slower field), and the row names it, wherever the key holds the graph; a PyG that ran out of
    memory there was tried, and stays."""
    rng = np.random.default_rng(23)
    times = random_times(rng, speedup=2.5, pyg_faster_on=("bgs-like",))
    without = {key: value for key, value in times.items() if key != ("bgs-like", "pyg")}
    write_part(tmp_path / "results" / "m", "relational_gnn", "datasets", layer_rows(without))
    kept = [g for g in GRAPHS if g != "bgs-like"]
    expected = float(np.exp(np.mean(np.log([
        min(np.median(times[(g, v)]) for v in COMPETITORS) / np.median(times[(g, "hector_best")]) for g in kept
    ]))))  # fmt: skip
    row = render(tmp_path, [claim("field", holds=1e3, partly=1.0, per=per)])["field"]
    assert f"{expected:.2f}x (geomean over {len(kept)} groups)" in row, row
    assert f"1 of {len(GRAPHS)} groups left out, measured without pyg, which the others compare against" in row

    oom = dict(role="peer", variant="pyg", metric="out_of_memory", value=1.0, unit="1", repetition=0,
               dataset="bgs-like", config={"device": "cuda", "model": "rgcn", "mode": "training", "in_dim": 64,
                                           "precision": "float32"})  # fmt: skip
    write_part(tmp_path / "results" / "m", "relational_gnn", "datasets", layer_rows(without) + [oom])
    row = render(tmp_path, [claim("field", holds=1e3, partly=1.0, per=per)])["field"]
    assert f"(geomean over {len(GRAPHS)} groups)" in row and "left out" not in row, row


@pytest.mark.parametrize("case", ["over the bound", "recorded on one graph only"])
def test_a_guard_out_of_bounds_or_unknown_lowers_holds_to_partly(tmp_path, case):
    """Activation peak cut by half, at a random step-time overhead above the guard's bound; or
    within it where time was recorded, and not recorded at all on the other graph (an overhead
    unknown there is no overhead within the bound)."""
    rng = np.random.default_rng(3)
    overhead = rng.uniform(1.2, 1.4) if case == "over the bound" else rng.uniform(1.0, 1.02)
    rows = []
    for dataset in ("llama-a", "llama-b"):
        peak, step = rng.uniform(1e9, 3e9), rng.uniform(0.1, 0.5)
        for variant, role, peak_x, step_x in (("keep", "baseline", 1.0, 1.0), ("offload", "optimized", 0.5, overhead)):
            for rep in range(3):
                common = dict(role=role, variant=variant, config={"device": "cuda"}, repetition=rep, dataset=dataset)
                rows.append(dict(**common, metric="activation_peak", value=float(int(peak * peak_x)), unit="B"))
                if case == "over the bound" or dataset == "llama-a":
                    rows.append(dict(**common, metric="time", value=step * step_x * rng.uniform(0.99, 1.01), unit="s"))
    write_part(tmp_path / "results" / "m", "llm_offload", "shapes", rows)
    peak = claim(
        "peak",
        holds=0.4,
        partly=0.2,
        topic="llm_offload",
        parts=["shapes"],
        filters={"device": "cuda"},
        metric="activation_peak",
        numerator={"variants": ["offload"]},
        baseline={"variants": ["keep"]},
        per=["dataset"],
        value="reduction",
        guard={"metric": "time", "at_most": 1.05},
    )
    row = render(tmp_path, [peak])["peak"]
    assert "−50%" in row and verdict_of(row) == "partly", row
    assert ("exceeds 1.05x" if case == "over the bound" else "time not recorded in 1 group(s)") in row, row


def test_a_malformed_claims_file_is_refused_in_one_line(tmp_path):
    entry = claim("bad", holds=2.0, partly=1.0, aggregate="mean")
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": [entry]}))
    with pytest.raises(ConfigError) as err:
        claims.load_claims(path)
    message = str(err.value)
    assert "\n" not in message and "claims/0/measure/aggregate" in message and "claims.schema.yaml" in message
    path.write_text(yaml.safe_dump({"claims": [claim("upside_down", holds=1.0, partly=2.0)]}))
    with pytest.raises(ConfigError, match="'holds' must be at least 'partly'"):
        claims.load_claims(path)


def test_the_committed_claims_file_is_valid():
    ids = [c["id"] for c in claims.load_claims()]
    assert len(ids) == len(set(ids)) > 0


@pytest.mark.full
def test_committed_h200_results_render_every_claim():
    if not (REPO / "results" / "h200").is_dir():
        pytest.skip("no committed H200 results in this checkout")
    text = claims.render("h200", "h200", REPO / "results")
    for entry in claims.load_claims():
        row = next(line for line in text.splitlines() if f"(`{entry['id']}`)" in line)
        assert verdict_of(row) in (claims.HOLDS, claims.PARTLY, claims.FAILS, claims.NOT_MEASURED)


def run_main(capsys, *argv) -> tuple[int, str]:
    """``python -m analysis.claims ARGV``: its exit status and what it wrote to stderr."""
    with pytest.raises(SystemExit) as ended:
        claims.main(list(argv))
    return ended.value.code, capsys.readouterr().err.strip()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--machine", "nosuch"], "no results folder {root}/nosuch (machines with results under {root}: m)"),
        (
            ["--machine", "m", "--scale", "nosuch"],
            "{root}/m has no results at scale 'nosuch' (scales with results there: tiny)",
        ),
    ],
)
def test_a_machine_or_a_scale_without_results_is_refused_not_tabled_as_unmeasured(
    tmp_path, machine, capsys, argv, message
):
    root, out = tmp_path / "results", tmp_path / "table" / "claims.md"
    code, err = run_main(capsys, *argv, "--results-root", str(root), "--out", str(out))
    assert code == 2 and err == "error: " + message.format(root=root)
    assert not out.parent.exists()


def test_an_output_that_is_a_folder_is_refused_and_nothing_is_left(tmp_path, machine, capsys):
    folder = tmp_path / "table"
    folder.mkdir()
    given = ["--machine", "m", "--results-root", str(tmp_path / "results")]
    code, err = run_main(capsys, *given, "--out", str(folder))
    assert code == 2 and err == f"error: --out {folder} is a folder: name the file to write (e.g. {folder}/claims.md)"
    assert list(folder.iterdir()) == [] and not list(tmp_path.glob("**/.*.tmp*"))
    # A file in the way of the output's folder: refused in one line, no temporary file left.
    (folder / "file").write_text("")
    code, err = run_main(capsys, *given, "--out", str(folder / "file" / "claims.md"))
    assert code == 2 and err.startswith(f"error: cannot write {folder}/file/claims.md: ") and "\n" not in err
    assert [p.name for p in folder.iterdir()] == ["file"] and not list(tmp_path.glob("**/.*.tmp*"))


def test_a_case_counts_as_run_only_where_no_variant_of_the_technique_ran_out_of_memory(tmp_path):
    """Where a competitor ran out of memory, one of the technique's variants timed there does not
    speak for another that ran out of memory too; a variant without a row there did not run."""
    rng = np.random.default_rng(31)
    times = random_times(rng, speedup=2.0)
    for graph in GRAPHS:
        times[(graph, "hector_unopt")] = list(rng.uniform(1e-3, 2e-3, size=3))
    del times[("am-like", "hector_best")]  # hector_best ran out of memory on am-like (its row below)
    del times[("bgs-like", "hector_best")]  # and was not run on bgs-like (no row)
    rows = layer_rows(times)
    config = {"device": "cuda", "model": "rgcn", "mode": "training", "in_dim": 64, "precision": "float32"}
    oom = dict(metric="out_of_memory", value=1.0, unit="1", repetition=0, config=config)
    rows.append(dict(role="optimized", variant="hector_best", dataset="am-like", **oom))
    for graph in ("bgs-like", "am-like"):  # PyG ran out of memory on two graphs
        rows = [r for r in rows if (r["dataset"], r["variant"]) != (graph, "pyg")]
        rows.append(dict(role="peer", variant="pyg", dataset=graph, **oom))
    write_part(tmp_path / "results" / "m", "relational_gnn", "datasets", rows)
    entry = claim("oom", holds=1.0, partly=0.5, kind="no_oom",
                  numerator={"variants": ["hector_unopt", "hector_best"]})  # fmt: skip
    for key in ("value", "aggregate"):
        entry["measure"].pop(key)
    row = render(tmp_path, [entry])["oom"]
    assert "in 1 of 2 cases" in row and verdict_of(row) == "partly", row
    # A re-run of bgs-like alone met one of the two cases: it is no process of the claim.
    write_part(tmp_path / "results" / "m", "relational_gnn", "datasets",
               [r for r in rows if r["dataset"] == "bgs-like"], rerun="run2")  # fmt: skip
    row = render(tmp_path, [entry])["oom"]
    assert "; one process (1 re-run(s) of only some of the parts left out: run2)" in row, row


def test_a_name_no_row_holds_is_said_with_what_the_rows_hold(tmp_path, machine):
    """A typo in the claims file (a variant, a filter's value) reads "not measured here" with the
    name that matched nothing and what the rows hold, not as a part this machine did not run."""
    rows = render(
        tmp_path,
        [
            claim("variant", holds=2.0, partly=1.0, numerator={"variants": ["hector_bset"]}),
            claim("filter", holds=2.0, partly=1.0, filters={"device": "cuda", "in_dim": 46}),
        ],
    )
    assert verdict_of(rows["variant"]) == verdict_of(rows["filter"]) == "not measured here"
    assert "in no row here: variant 'hector_bset' (there: hector_best, pyg, segment_mm)" in rows["variant"]
    assert "in no row here: in_dim 46 (there: 64)" in rows["filter"]


def test_a_best_over_a_sweep_names_the_variants_measured_at_one_value_only(tmp_path):
    """``best_over`` takes each variant's best median over the swept column; a compared variant
    timed at one value of it has no best to choose, and the value says so (runs that predate a
    sweep), while a full sweep adds nothing."""
    rng = np.random.default_rng(43)
    rows = []
    for in_dim, scale in ((32, 1.0), (64, 1.3)):
        times = random_times(rng, speedup=2.0)
        for row in layer_rows({k: [s * scale for s in v] for k, v in times.items()}):
            row["config"] = {**row["config"], "in_dim": in_dim}
            rows.append(row)
    entry = claim("swept", holds=1.5, partly=1.1, filters={"device": "cuda"}, best_over="in_dim", aggregate="max")
    write_part(tmp_path / "results" / "m", "relational_gnn", "datasets", rows)
    row = render(tmp_path, [entry])["swept"]
    assert "measured at one in_dim only" not in row, row
    # segment_mm timed at 64 alone (its slower width), as in a run before the sweep.
    kept = [r for r in rows if not (r["variant"] == "segment_mm" and r["config"]["in_dim"] == 32)]
    write_part(tmp_path / "results" / "m", "relational_gnn", "datasets", kept)
    frame = pd.DataFrame([{**r, **r["config"]} for r in kept])
    medians = frame.groupby(["dataset", "variant", "in_dim"]).value.median()
    best = medians.groupby(["dataset", "variant"]).min()
    expected = max(min(best[g, "segment_mm"], best[g, "pyg"]) / best[g, "hector_best"] for g in GRAPHS)
    row = render(tmp_path, [entry])["swept"]
    assert f"{expected:.2f}x (max over 3 groups)" in row, row
    # PyG is slower than segment_mm on every graph (random_times), so segment_mm is the baseline.
    assert "(segment_mm measured at one in_dim only: not a best over a sweep)" in row, row


def test_a_range_of_maxima_reached_at_different_groups_says_so(tmp_path, machine):
    """A max over groups taken per process may come from another group in each process: the range
    is then no one group's spread, and the value names where each process's max was."""
    root = tmp_path / "results" / "m"
    entry = claim("top", holds=9.0, partly=1.1, aggregate="max")
    slower = {k: [t * 1.01 for t in v] for k, v in machine.items()}  # another process, the same maxima
    write_part(root, "relational_gnn", "datasets", layer_rows(slower), rerun="run2")
    row = render(tmp_path, [entry])["top"]
    assert "at another group" not in row, row
    ratios = {g: min(np.median(machine[(g, v)]) for v in COMPETITORS) / np.median(machine[(g, "hector_best")])
              for g in GRAPHS}  # fmt: skip
    top = max(ratios, key=ratios.get)
    other = next(g for g in GRAPHS if g != top)
    moved = dict(machine)
    moved[(other, "hector_best")] = [t / 10 for t in machine[(other, "hector_best")]]  # run2's max moves
    write_part(root, "relational_gnn", "datasets", layer_rows(moved), rerun="run2")
    row = render(tmp_path, [entry])["top"]
    assert f"(each process's max at another group: model=rgcn, mode=training, dataset={min(top, other)}; " in row, row
    assert f"dataset={max(top, other)})" in row, row


def test_two_parts_measuring_graphs_of_one_name_at_two_sizes_are_two_groups(tmp_path, machine):
    """A second part trains graphs of the same names at 4x the size (as papers and papers_full do):
    a median over both sizes of one graph is a number neither run gave. Each size is a group of its
    own, named by the column that tells them apart, and the maximum is one of the sizes' own ratios."""
    rng = np.random.default_rng(37)
    bigger = random_times(rng, speedup=6.0)
    for part, times, nodes in (("datasets", machine, 1_000), ("large_datasets", bigger, 4_000)):
        rows = [dict(r, config=r["config"] | {"nodes": nodes}) for r in layer_rows(times)]
        write_part(tmp_path / "results" / "m", "relational_gnn", part, rows)
    entry = claim("max", holds=1e3, partly=0.1, aggregate="max", parts=["datasets", "large_datasets"])
    row = render(tmp_path, [entry])["max"]
    ratios = []
    for times in (machine, bigger):
        for graph in GRAPHS:
            fastest = min(np.median(times[(graph, v)]) for v in COMPETITORS)
            ratios.append(fastest / np.median(times[(graph, "hector_best")]))
    assert f"{max(ratios):.2f}x (max over 6 groups)" in row, row
    assert "nodes=4000" in row, row


def test_groups_where_the_technique_ran_out_of_memory_are_named_and_cap_the_verdict(tmp_path, machine):
    """hector_best ran out of memory on am-like where every competitor ran: left out of the geomean,
    its absence would read as a better claim. The group is named and holds becomes partly; the
    no-out-of-memory claim counts the failure though no baseline failed there."""
    rows = [r for r in layer_rows(machine) if (r["dataset"], r["variant"]) != ("am-like", "hector_best")]
    config = {"device": "cuda", "model": "rgcn", "mode": "training", "in_dim": 64, "precision": "float32"}
    rows.append(dict(role="optimized", variant="hector_best", dataset="am-like", metric="out_of_memory", value=1.0,
                     unit="1", repetition=0, config=config))  # fmt: skip
    write_part(tmp_path / "results" / "m", "relational_gnn", "datasets", rows)
    no_oom = claim("no_oom", holds=1.0, partly=0.5, kind="no_oom")
    for key in ("value", "aggregate"):
        no_oom["measure"].pop(key)
    found = render(tmp_path, [claim("geomean", holds=1e-3, partly=1e-4), no_oom])
    assert "(geomean over 2 groups)" in found["geomean"], found["geomean"]
    assert (
        "hector_best has no time in 1 group(s) where a baseline ran: model=rgcn, mode=training, dataset=am-like"
        in (found["geomean"])
    )
    assert (
        verdict_of(found["geomean"]) == "partly" and "but hector_best failed where a baseline ran" in found["geomean"]
    )
    assert "in 0 of 1 cases" in found["no_oom"] and verdict_of(found["no_oom"]) == "does not hold", found["no_oom"]


def test_a_committed_run_without_a_competitor_its_reruns_measured_is_capped_and_named(tmp_path):
    """The re-runs measured PyG (the fastest competitor on bgs-like); the committed run did not. Its
    geomean, against the slower segment_mm form alone, may not stand as the claim's value with a
    range over processes that compared against more: the re-runs are left out, the missing
    competitor named, and holds becomes partly."""
    rng = np.random.default_rng(41)
    times = random_times(rng, speedup=2.5, pyg_faster_on=("bgs-like",))
    root = tmp_path / "results" / "m"
    write_part(root, "relational_gnn", "datasets", layer_rows({k: v for k, v in times.items() if k[1] != "pyg"}))
    for run in ("run2", "run3"):
        again = {k: [t * rng.uniform(0.99, 1.01) for t in v] for k, v in times.items()}
        write_part(root, "relational_gnn", "datasets", layer_rows(again), rerun=run)
    row = render(tmp_path, [claim("fewer", holds=1e-3, partly=1e-4)])["fewer"]
    assert "(the committed run measured without pyg, which re-runs compare against)" in row, row
    assert "one process (2 re-run(s) left out" in row and verdict_of(row) == "partly", row


def test_a_listed_baseline_measured_in_some_groups_only_is_named_where_it_is_missing(tmp_path):
    """The faster baseline was run for RGCN but not for RGAT: the RGAT groups are against the other
    baseline alone, and the value names them (a note for the whole run would be wrong both ways)."""
    rng = np.random.default_rng(43)
    rgcn, rgat = random_times(rng, speedup=2.0), random_times(rng, speedup=2.0)
    rows = layer_rows(rgcn) + layer_rows({k: v for k, v in rgat.items() if k[1] != "pyg"}, model="rgat")
    write_part(tmp_path / "results" / "m", "relational_gnn", "datasets", rows)
    row = render(tmp_path, [claim("some", holds=1e3, partly=0.1, baseline={"variants": ["segment_mm", "pyg"]})])
    assert "(pyg not measured in 3 of 6 groups (model=rgat, mode=training, dataset=aifb-like; " in row["some"]
    assert ": against segment_mm alone there)" in row["some"], row["some"]


def test_a_ratio_read_from_single_samples_says_so(tmp_path):
    """A metric timed once per group (an instrumented epoch) has no median to quote: the value says
    how many groups rest on one sample; with three repetitions everywhere, nothing is said."""
    rng = np.random.default_rng(47)
    times = random_times(rng, speedup=2.0)
    once = {k: v[:1] if k[0] == "am-like" else v for k, v in times.items()}
    write_part(tmp_path / "results" / "m", "relational_gnn", "datasets", layer_rows(once))
    row = render(tmp_path, [claim("once", holds=1e3, partly=0.1)])["once"]
    assert "(time measured once in 1 of 3 groups: one sample, not a median)" in row, row
    write_part(tmp_path / "results" / "m", "relational_gnn", "datasets", layer_rows(times))
    assert "measured once" not in render(tmp_path, [claim("thrice", holds=1e3, partly=0.1)])["thrice"]
