"""llm_offload: the parts at the tiny scale (every registered policy and store, validated results,
provenance notes), a new store or policy entry measured without an edit, names checked against the
registries, a wrong policy refused before it is timed, peers reported rather than timed when they
are wrong, and the convergence check deterministic however loaded the machine is."""

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from doctored_results import rewrite_rows

from harness.entry import main as entry
from harness.errors import UserError
from harness.results import load, load_provenance
from harness.topic import REPO_ROOT
from systems.ssdtrain import POLICIES, STORES, HostStore, PolicyEntry, StoreEntry
from systems.ssdtrain.policies import HooksPolicy, OffloaderPolicy, Policy
from systems.ssdtrain.recompute import TORCH_CHECKPOINT, checkpointed
from tests.kept_rows import Rows
from workloads.llm_offload import parts
from workloads.llm_offload import variants as choose
from workloads.llm_offload.schema import SCHEMA

ON_GPU = torch.cuda.is_available()  # the entry trains on the GPU where there is one
VARIANTS = {  # and, on a GPU, offload_all_kvikio and the peers where those libraries import
    "keep",
    "recompute",
    "save_on_cpu",
    "offload_all_host",
    "offload_all_file",
    "offload_all_emulated_0.5gbps",
    "offload_all_emulated_2gbps",
    "offload_adaptive_host",
    "offload_adaptive_file",
    "planner_host",
    "planner_file",
}
GPU_ONLY = {"torchtune_offload": "torchtune_offload", "deepspeed_offload": "deepspeed_offload"}
GPU_ONLY["offload_all_kvikio"] = "kvikio"  # variant -> its key in the notes' skipped


# The settings of the tests that call a part's function directly with their own parameters: one
# tiny model, keep and what the test names.
ONE_MODEL = {
    "seed": 0,
    "models": [{"family": "llama", "preset": "tiny"}],
    "stores": [],
    "emulated_gbps": [],
    "keep_last": 1,
    "min_bytes": 0,
    "prefetch": 1,
    "file_threads": 1,
    "file_block_mib": 1,
}
HOST_STORE = {k: v for k, v in ONE_MODEL.items() if k not in ("seed", "models")} | {"stores": ["host"]}


@contextlib.contextmanager
def registered(registry, entry):
    """``entry`` in ``registry`` for the block: a test's own store or policy, as a new file adds one."""
    registry.register(entry)
    try:
        yield entry
    finally:
        registry.unregister(entry.name)


def run(part: str, out: Path, scratch: Path) -> None:
    entry(["llm_offload", "--part", part, "--scale", "tiny", "--out", str(out), "--scratch-dir", str(scratch)])


def one_model(scratch, rows, **changes):
    """Part policies on the tiny Llama alone, one timed step, with ``changes`` to its parameters."""
    return parts.policies(ONE_MODEL | changes, rows, repeat=1, warmup=0, device="cpu", scratch_dir=scratch)


def test_policies_tiny_end_to_end(tmp_path, scratch):
    out = tmp_path / "policies-tiny.csv"
    run("policies", out, scratch)
    frame = load([out], SCHEMA)
    assert set(frame.dataset) == {"gpt2-tiny", "llama-tiny"}
    notes = load_provenance(out)
    # kvikio and the peers run only on a GPU, where they import; elsewhere the notes say why not.
    for variant, skip_key in GPU_ONLY.items():
        ran = variant in set(frame.variant)
        assert ran != (skip_key in notes["skipped"]), variant
        assert ON_GPU or not ran
    for dataset, rows in frame.groupby("dataset"):
        assert set(rows.variant) - set(GPU_ONLY) == VARIANTS, dataset
        times = rows[rows.metric == "time"]
        assert (times.groupby("variant").size() == 3).all()  # repeat: 3
        assert (times.value > 0).all()
        # Each row says what ran in its own columns; the label is composed of them.
        for _, v in rows.drop_duplicates("variant").iterrows():
            assert v.policy in POLICIES and v.role == POLICIES[v.policy].role
            assert pd.isna(v.store) != POLICIES[v.policy].uses_store
        held = rows[rows.metric == "activation_bytes"].groupby("variant").value.median()
        # Offloading and recomputation hold less than keep; every offload store moved the same bytes.
        assert held["offload_all_host"] < held["keep"] and held["recompute"] < held["keep"]
        offloading = rows[rows.policy == "offload_all"]
        written = offloading[offloading.metric == "bytes_written"].groupby("variant").value.median()
        assert written.nunique() == 1 and written.iloc[0] > 0
        # What is read back depends on timing (a tensor whose write still runs is served from
        # memory): never more than was written.
        read = offloading[offloading.metric == "bytes_read"].groupby("variant").value.max()
        assert (read <= written.iloc[0]).all()
        emulated = rows[rows.store == "emulated"]
        assert emulated.store_emulated.all() and set(emulated.emulated_gbps) == {0.5, 2.0}
        assert not rows[rows.store != "emulated"].store_emulated.any()
        assert set(rows[rows.role == "optimized"].variant) - {"offload_all_kvikio"} == VARIANTS - {
            "keep",
            "recompute",
            "save_on_cpu",
        }
        # The planned policies: their plan's counts and the predictions beside the measurements.
        planned = rows[rows.policy.isin(["offload_adaptive", "planner"])]
        assert planned.planned_gbps.notna().all() and (planned.planned_gbps > 0).all()
        assert (planned.layers_offloaded + planned.layers_recomputed <= 2).all()
        predicted = planned[planned.metric.str.startswith("predicted_")]
        expected = {"predicted_time", "predicted_activation_bytes"} | (
            {"predicted_activation_peak"} if ON_GPU else set()
        )
        assert set(predicted.metric) == expected
        assert (predicted.groupby(["variant", "metric"]).size() == 1).all() and (predicted.value > 0).all()
        assert planned[planned.policy == "planner"].budget_fraction.eq(0.5).all()
        assert planned[planned.policy == "offload_adaptive"].budget_fraction.isna().all()
    assert notes["part"] == "policies"
    assert notes["models"]["gpt2-tiny"]["attention"] in ("sdpa", "eager")
    profile = notes["models"]["llama-tiny"]["profile"]
    assert len(profile["saved_bytes"]) == 2 and min(profile["saved_bytes"]) > 0
    # The traced peaks, the head's too, so that a record's plans can be predicted again offline.
    assert all(len(profile[k]) == 2 for k in ("forward_peaks", "backward_peaks", "head_peaks"))
    assert set(notes["models"]["llama-tiny"]["plans"]) == {"host", "file"}
    assert not list(scratch.iterdir())  # the file store removed its files


def test_a_new_store_and_a_new_policy_are_measured_from_their_entries_alone(scratch):
    """What one new file registers runs in the comparison with no other edit: a store (here a host
    store under another name) with every offloading policy, a policy with every store; each is
    checked bit-identical to keep and its rows carry its names in the policy and store columns."""

    class EveryOther(OffloaderPolicy):
        def decide(self, layer):
            return "offload" if layer % 2 == 0 else "keep"

    store = StoreEntry("test_host_copy", "optimized", make=lambda params, folder: HostStore())
    policy = PolicyEntry("test_every_other", "optimized", make=EveryOther, uses_store=True)
    rows = Rows()
    with registered(STORES, store), registered(POLICIES, policy):
        one_model(scratch, rows, stores=choose.ALL, compare=["offload_all", "test_every_other"])
    labels = {(r["variant"], r["config"]["policy"], r["config"].get("store")) for r in rows}
    assert ("offload_all_test_host_copy", "offload_all", "test_host_copy") in labels
    assert ("test_every_other_host", "test_every_other", "host") in labels
    assert ("test_every_other_test_host_copy", "test_every_other", "test_host_copy") in labels
    moved = [
        r for r in rows if r["variant"] == "test_every_other_test_host_copy" and r.get("metric") == "bytes_written"
    ]
    assert moved and moved[0]["value"] > 0 and moved[0]["role"] == "optimized"
    assert "test_host_copy" not in STORES and "test_every_other" not in POLICIES  # gone with the block


def test_a_policy_that_decides_to_offload_without_a_store_is_refused_not_measured_as_keep(scratch):
    """Registered without uses_store, its decide() would never be asked (no store, nothing to
    offload to) and its rows would be keep's under its name."""

    class EveryOther(OffloaderPolicy):
        def decide(self, layer):
            return "offload" if layer % 2 == 0 else "keep"

    forgot = PolicyEntry("test_forgot_uses_store", "optimized", make=EveryOther)
    rows = Rows()
    with registered(POLICIES, forgot), pytest.raises(UserError) as error:
        one_model(scratch, rows, compare=["test_forgot_uses_store"])
    assert str(error.value) == (
        "EveryOther decides which blocks to offload (it overrides decide()) but has no store: "
        "register its PolicyEntry with uses_store=True"
    )
    assert not any(r["variant"] == "test_forgot_uses_store" for r in rows)


def test_a_policy_named_as_another_variant_s_label_is_refused_before_measuring(scratch):
    """``offload_all_host`` is offload_all's label on the host store: a policy of that name would
    share its rows and its line in the figures."""
    clash = PolicyEntry("offload_all_host", "optimized", make=OffloaderPolicy)
    rows = Rows()
    with registered(POLICIES, clash), pytest.raises(UserError) as error:
        one_model(scratch, rows, stores=["host"], compare=["offload_all", "offload_all_host"])
    assert str(error.value) == (
        "policies offload_all and offload_all_host would both be measured as 'offload_all_host' "
        "(a label is the policy's name, then its setting and store): rename one"
    )
    assert not rows


def test_keep_last_above_the_block_count_is_refused_before_measuring(scratch):
    rows = Rows()
    with pytest.raises(UserError, match=r"^keep_last=5 is more than the model's 2 blocks: give at most 2"):
        one_model(scratch, rows, keep_last=5)
    assert not rows


def test_a_stores_make_of_another_signature_is_refused_in_one_line_naming_the_store(tmp_path):
    entry = StoreEntry("test_one_argument", "optimized", make=lambda params: HostStore())
    with pytest.raises(UserError, match=r"^offload store test_one_argument: make\(params\) cannot be called as make"):
        entry.build({}, tmp_path)


def test_names_are_checked_against_the_registries_in_one_line(scratch):
    notes = {"skipped": {}}
    with pytest.raises(UserError, match=r"unknown offloading policy 'nope'; one of .*offload_all"):
        choose.policies({"compare": ["nope"]}, "cpu", notes)
    with pytest.raises(UserError, match=r"unknown offload store 'disk'; one of host, file"):
        choose.store_setups({"stores": ["disk"]}, "cpu", notes, scratch)
    with pytest.raises(UserError, match="emulated stores .*emulated_7gbps.*, but stores does not list emulated"):
        choose.store_setups({"stores": ["host"], "emulated_gbps": [7]}, "cpu", notes, scratch)
    with pytest.raises(UserError, match="stores lists emulated, but the parameters give it no setting"):
        choose.store_setups({"stores": ["emulated"], "emulated_gbps": []}, "cpu", notes, scratch)
    setups = choose.store_setups({"stores": ["host", "emulated"], "emulated_gbps": [7.0]}, "cpu", notes, scratch)
    assert [s.label for s in setups] == ["host", "emulated_7gbps"]
    with pytest.raises(UserError, match="planned_stores names 'emulated_5gbps'.*: host, emulated_7gbps"):
        choose.planned_setups({"planned_stores": ["emulated_5gbps"]}, setups, notes)
    with pytest.raises(UserError, match="planner, planned policies, which this part does not plan"):
        choose.policies({"compare": ["recompute", "planner"]}, "cpu", notes, plans=False)


def test_the_planner_s_frontier_plans_at_each_budget_on_its_stores_only(scratch):
    """frontier_budgets: one more planner variant per budget (not the planner_budget's again) on the
    stores of frontier_stores, each labelled and recorded with its fraction, its plan within it."""
    rows = Rows()
    params = dict(
        stores=["host", "emulated"],
        emulated_gbps=[2.0],
        compare=["planner", "offload_adaptive"],
        planned_stores=["host", "emulated_2gbps"],
        planner_budget=0.5,
        frontier_budgets=[0.8, 0.5, 0.2],
        frontier_stores=["emulated_2gbps"],
    )
    notes = one_model(scratch, rows, **params)
    fractions = {r["variant"]: r["config"]["budget_fraction"] for r in rows if r["config"].get("policy") == "planner"}
    assert fractions == {
        "planner_host": 0.5,
        "planner_emulated_2gbps": 0.5,
        "planner_0.2_emulated_2gbps": 0.2,
        "planner_0.8_emulated_2gbps": 0.8,
    }
    assert not any(r["variant"].startswith("offload_adaptive_0.") for r in rows)  # no budget: no frontier
    predicted = {r["variant"]: r["value"] for r in rows if r.get("metric") == "predicted_activation_bytes"}
    assert predicted["planner_0.2_emulated_2gbps"] <= predicted["planner_emulated_2gbps"]
    assert predicted["planner_emulated_2gbps"] <= predicted["planner_0.8_emulated_2gbps"]
    plans = notes["models"]["llama-tiny"]["plans"]["emulated_2gbps"]
    assert {"planner", "planner_0.2_emulated_2gbps", "planner_0.8_emulated_2gbps"} <= set(plans)
    with pytest.raises(UserError, match="frontier_stores names 'file', not a store a planned policy runs with"):
        one_model(scratch, Rows(), **params | {"frontier_stores": ["file"]})
    # A store that does not run here is left out with a note, as planned_stores leaves it out.
    skipped = {"skipped": {"kvikio": "kvikio does not import here"}}
    host = [choose.StoreSetup(STORES["host"])]
    choose.check_frontier_stores(params | {"frontier_stores": ["host", "kvikio"]}, host, skipped)
    assert "kvikio" in skipped["frontier_skipped"]
    choose.check_frontier_stores(params | {"frontier_stores": ["nosuch"]}, [], {"skipped": {}})  # nothing plans
    with pytest.raises(UserError, match="frontier_budgets needs planner_budget"):
        choose.frontier_budgets({"frontier_budgets": [0.2]})


class _SyntheticProfiler:
    """What parts._planned asks of a Profiler, from given compiled-block profiles (no model run)."""

    def __init__(self, profiles, keep_seconds=0.1, fixed=1000, bandwidth=1e12):
        self.profiles, self.keep_seconds, self.fixed, self.gbps = profiles, keep_seconds, fixed, bandwidth
        self.notes = {"profile_compiled": {}}

    def blocks(self, compiled):
        assert compiled
        return self.profiles, self.keep_seconds, self.fixed

    def bandwidth(self, setup):
        return self.gbps


def _compiled_profiles(extra_at_0_2=0.004):
    """Four compiled blocks profiled kept and at budgets 0.2 and 0.5 (saved bytes shrinking, extra
    seconds growing), with traced peaks."""
    from systems.ssdtrain.planning import Alternative, LayerProfile

    return [
        LayerProfile(
            saved_bytes=10_000,
            input_bytes=500,
            forward_seconds=0.01,
            forward_peak=12_000 * (i + 1),
            backward_peak=13_000 * (i + 1),
            alternatives=(Alternative(0.2, 2_000, extra_at_0_2), Alternative(0.5, 5_000, 0.001)),
        )
        for i in range(4)
    ]


@pytest.mark.parametrize("bandwidth", [1e12, 2e5])
def test_a_matched_plan_holds_at_most_what_torch_s_budget_is_predicted_to_and_is_no_slower(bandwidth):
    """frontier_matched: beside each torch budget, a plan within what every block compiled at it is
    predicted to hold (bytes and peak), never predicted slower than that uniform plan; with a fast
    store it offloads instead of recomputing and is predicted faster; labelled and recorded as
    matched, not as a fraction."""
    from systems.ssdtrain import planning

    params = {
        "planner_budget": 0.5,
        "planner_budgets": [0.2, 0.5],
        "frontier_matched": [0.5, 0.2],
        "compiled": True,
        "keep_last": 1,
        "prefetch": 1,
    }
    profiler = _SyntheticProfiler(_compiled_profiles(), bandwidth=bandwidth)
    host = choose.StoreSetup(STORES["host"])
    variants = parts._planned(params, profiler, [POLICIES["planned_compiled"]], [host], compiled=True)
    by_label = {v.label: v for v in variants}
    assert list(by_label) == [
        "planned_compiled_host",
        "planned_compiled_as_budget_0.2_host",
        "planned_compiled_as_budget_0.5_host",
    ]
    for budget in (0.2, 0.5):
        variant = by_label[f"planned_compiled_as_budget_{budget}_host"]
        alike = planning.predict(
            profiler.profiles, [planning.budget_decision(budget)] * 4, bandwidth, 0.1, fixed_bytes=1000, prefetch=1
        )
        plan = variant.plan
        assert plan.predicted_activation_bytes <= alike.predicted_activation_bytes
        assert plan.predicted_peak_bytes <= alike.predicted_peak_bytes
        assert plan.predicted_seconds <= alike.predicted_seconds
        columns = variant.columns(params | {"min_bytes": 0})
        assert columns["matched_budget"] == budget and columns["budget_fraction"] is None
        if bandwidth == 1e12 and budget == 0.2:  # offloading is free: a better plan than torch's own point
            assert plan.predicted_seconds < alike.predicted_seconds and plan.offloaded > 0
        notes = profiler.notes["plans_compiled"]["host"]
        assert notes[variant.label] == list(plan.decisions)
    # Eager blocks have no torch budgets: no matched plan; a budget not profiled is refused.
    eager = parts._planned(params, _EagerProfiler(), [POLICIES["planner"]], [host], compiled=False)
    assert [v.label for v in eager] == ["planner_host"]
    with pytest.raises(UserError, match="frontier_matched needs a planned policy on compiled blocks"):
        choose.matched_budgets(params | {"compiled": False}, planned_compiled=True)
    with pytest.raises(UserError, match="frontier_matched needs a planned policy on compiled blocks"):
        choose.matched_budgets(params, planned_compiled=False)
    assert choose.matched_budgets(params) == [0.2, 0.5]
    assert choose.matched_budgets({"compiled": False}, planned_compiled=False) == []  # none asked for
    with pytest.raises(UserError, match=r"frontier_matched names 0.3, which planner_budgets \(0.2, 0.5\) does not"):
        parts._planned(params | {"frontier_matched": [0.3]}, profiler, [POLICIES["planned_compiled"]], [host], True)


class _EagerProfiler(_SyntheticProfiler):
    def __init__(self):
        from systems.ssdtrain.planning import LayerProfile

        super().__init__([LayerProfile(10_000, 500, 0.01) for _ in range(3)])
        self.notes = {"profile": {}}

    def blocks(self, compiled):
        assert not compiled
        return self.profiles, self.keep_seconds, self.fixed


def test_a_variant_label_is_composed_of_its_columns():
    host, emulated = STORES["host"], STORES["emulated"]
    variant = choose.Variant(POLICIES["offload_all"], choose.StoreSetup(emulated, (("gbps", 0.5),)))
    assert variant.label == "offload_all_emulated_0.5gbps" and variant.role == "optimized"
    params = {"keep_last": 1, "min_bytes": 0, "planner_budget": 0.5}
    assert variant.columns(params) == {
        "policy": "offload_all",
        "store": "emulated",
        "store_emulated": True,
        "emulated_gbps": 0.5,
        "keep_last": 1,
        "min_bytes": 0,
    }
    assert choose.Variant(POLICIES["offload_all"], choose.StoreSetup(host)).label == "offload_all_host"
    matched = choose.Variant(POLICIES["planned_compiled"], choose.StoreSetup(host), matched_budget=0.5)
    assert matched.label == "planned_compiled_as_budget_0.5_host"
    assert choose.Variant(POLICIES["recompute"]).columns(params) == {"policy": "recompute", "store_emulated": False}


def wrong_hooks():
    """Saved-tensor hooks that bring every float tensor back slightly changed."""
    return torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t * 1.0001 if t.is_floating_point() else t)


class WrongHooks(HooksPolicy):
    def hooks(self):
        return wrong_hooks()


class KeepAll(HooksPolicy):
    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)


def test_a_wrong_policy_is_refused_before_timing(scratch, monkeypatch):
    """A policy of the suite's (not a peer) that brings its tensors back changed: the check raises
    and nothing is timed."""
    monkeypatch.setattr(parts, "measure", lambda *a, **k: pytest.fail("timed a wrong path"))
    rows = Rows()
    with registered(POLICIES, PolicyEntry("test_wrong", "baseline", make=WrongHooks)):
        with pytest.raises(parts.NotBitIdentical, match="test_wrong"):
            one_model(scratch, rows, compare=["test_wrong"])
    assert not rows


def test_micro_batches_tiny_end_to_end(tmp_path, scratch):
    """Every micro-batch and policy checked and timed at a fixed global batch; activation bytes grow
    with the micro-batch and offloading holds less than keep at each."""
    out = tmp_path / "micro_batches-tiny.csv"
    run("micro_batches", out, scratch)
    frame = load([out], SCHEMA)
    assert set(frame.micro_batch) == {2, 4} and set(frame.global_batch) == {4}
    assert set(frame.variant) == {"keep", "recompute", "offload_all_host"}
    assert not (frame.metric == "out_of_memory").any()  # nothing runs out of memory on a CPU
    held = frame[frame.metric == "activation_bytes"].groupby(["micro_batch", "variant"]).value.median()
    for variant in ("keep", "recompute", "offload_all_host"):
        assert held[(4, variant)] > held[(2, variant)]
    for micro in (2, 4):
        assert held[(micro, "offload_all_host")] < held[(micro, "keep")]
    assert not list(scratch.iterdir())


def test_a_micro_batch_that_does_not_divide_the_global_batch_is_refused(scratch):
    params = {"seed": 0, "model": {"family": "llama", "preset": "tiny"}, "global_batch": 4, "micro_batches": [3]}
    with pytest.raises(UserError, match="micro-batch 3 does not divide the global batch 4"):
        parts.micro_batches(params | HOST_STORE, None, repeat=1, warmup=0, device="cpu", scratch_dir=scratch)


def test_a_peer_runs_through_its_own_hooks_and_is_checked(scratch):
    """The plumbing of another library's offloading (torchtune's on a GPU), with stand-in hooks
    that keep every tensor: checked bit-identical, timed, its packed bytes counted, role peer."""
    rows = Rows()
    with registered(POLICIES, PolicyEntry("test_peer_hooks", "peer", make=KeepAll)):
        one_model(scratch, rows, compare=["test_peer_hooks"])
    peer = [r for r in rows if r["variant"] == "test_peer_hooks"]
    assert {r["role"] for r in peer} == {"peer"}
    assert [r.get("metric") for r in peer if r.get("metric") in ("bytes_packed", "bytes_unique")] == [
        "bytes_packed",
        "bytes_unique",
    ]
    assert all(r["value"] > 0 for r in peer if r.get("metric") == "bytes_packed")


class StandInCheckpoint(Policy):
    """A checkpointing peer (DeepSpeed's on a GPU) with torch's checkpoint, or a wrong or failing one."""

    calls: list = []
    resets: list = []
    how = "right"

    def checkpoint(self, forward, *args, **kwargs):
        self.calls.append(forward)
        if self.how == "failing":  # as DeepSpeed does on BERT: an error inside the block
            raise RuntimeError("both arguments to linear need to be at least 1D")
        out = TORCH_CHECKPOINT(forward, *args, **kwargs)
        if self.how == "wrong":  # 1.01: a change that survives bf16 on a GPU
            return tuple(o * 1.01 for o in out) if isinstance(out, tuple) else out * 1.01
        return out

    def around(self, counts):
        return checkpointed(self.setting.layers, self.checkpoint)

    def reset(self):
        self.resets.append(1)


@pytest.mark.parametrize("how", ["right", "wrong", "failing"])
def test_a_checkpointing_peer_is_checked_and_a_wrong_one_reported_not_timed(how, scratch, monkeypatch):
    """Every block's forward goes through the peer's checkpoint; its step is checked bit-identical
    and timed. A peer whose step differs, or raises, is reported with the reason (its library's
    result, not the suite's failure), reset, and keep still gives the reference after it."""
    monkeypatch.setattr(StandInCheckpoint, "how", how)
    monkeypatch.setattr(StandInCheckpoint, "calls", [])
    monkeypatch.setattr(StandInCheckpoint, "resets", [])
    rows = Rows()
    with registered(POLICIES, PolicyEntry("test_peer_checkpoint", "peer", make=StandInCheckpoint)):
        notes = one_model(scratch, rows, compare=["test_peer_checkpoint"])
    ran = [r for r in rows if r["variant"] == "test_peer_checkpoint"]
    # Both blocks of the tiny Llama went through it (the first alone, for the one that raises at once).
    blocks = {id(forward.__wrapped__.__self__) for forward in StandInCheckpoint.calls}
    assert len(blocks) == (2 if how != "failing" else 1)
    assert {r["variant"] for r in rows} == ({"keep", "test_peer_checkpoint"} if how == "right" else {"keep"})
    if how == "right":
        assert ran and not StandInCheckpoint.resets  # timed
        return
    why = notes["skipped"]["test_peer_checkpoint (llama-tiny)"]
    assert why.startswith("not bit-identical to keep" if how == "wrong" else "failed in its checked step")
    assert StandInCheckpoint.resets == [1] and not list(scratch.iterdir())


def test_peers_that_do_not_run_here_are_skipped_with_their_reason():
    notes = {"skipped": {}}
    chosen = choose.policies({}, "cpu", notes)
    assert [p.name for p in chosen][0] == "keep"
    peers = set(POLICIES.names("peer"))
    assert peers == {"torchtune_offload", "deepspeed_offload", "compiled_keep", "torch_budget"}
    assert not peers & {p.name for p in chosen}  # on a CPU no peer runs, installed or not
    assert all("needs a CUDA GPU" in notes["skipped"][p] for p in ("torchtune_offload", "deepspeed_offload"))
    # torch.compile's peers run where the parameters set compiled (compiling is slow on a CPU).
    assert "compiled_keep, torch_budget" in notes["skipped"]["compiled"]
    notes = {"skipped": {}}
    assert [p.name for p in choose.policies({"compare": []}, "cpu", notes)] == ["keep"] and not notes["skipped"]


@pytest.mark.full
def test_models_tiny_runs_bert_and_t5_through_the_host_store(tmp_path, scratch):
    """Part models: the encoder-only and encoder-decoder families, every policy checked and timed."""
    out = tmp_path / "models-tiny.csv"
    run("models", out, scratch)
    frame = load([out], SCHEMA)
    assert set(frame.dataset) == {"bert-tiny", "t5-tiny"} and set(frame.family) == {"bert", "t5"}
    expected = {"keep", "recompute", "save_on_cpu", "offload_all_host", "offload_adaptive_host", "planner_host"}
    for dataset, rows in frame.groupby("dataset"):
        assert set(rows.variant) - set(GPU_ONLY) == expected, dataset
        held = rows[rows.metric == "activation_bytes"].groupby("variant").value.median()
        assert held["offload_all_host"] < held["keep"] and held["recompute"] < held["keep"]
    # T5 has an encoder and a decoder: its profile has a block of each.
    assert len(load_provenance(out)["models"]["t5-tiny"]["profile"]["saved_bytes"]) == 4


def test_a_peer_that_is_not_bit_identical_is_reported_not_timed(scratch):
    """Another library's wrong gradients are its own result, recorded with the reason; the suite's
    own policies still run. (A wrong policy of the suite's raises: see above.)"""
    rows = Rows()
    with registered(POLICIES, PolicyEntry("test_peer_wrong", "peer", make=WrongHooks)):
        notes = one_model(scratch, rows, compare=["recompute", "test_peer_wrong"])
    assert {r["variant"] for r in rows} == {"keep", "recompute"}
    assert "not bit-identical to keep" in notes["skipped"]["test_peer_wrong (llama-tiny)"]


def test_convergence_tiny_records_one_curve_per_policy_equal_to_keep(tmp_path, scratch):
    """Part convergence: keep, recompute and offloading to real files train the same steps from the
    same weights; every loss is finite, equal to keep's at every step, the offloading one wrote and
    read back bytes in every step, and the notes carry the losses the curves are read against."""
    out = tmp_path / "convergence-tiny.csv"
    run("convergence", out, scratch)
    frame = load([out], SCHEMA)
    assert set(frame.variant) == {"keep", "recompute", "offload_all_file"}
    assert set(frame.metric) == {"loss", "bytes_written", "bytes_read"}
    moved = frame[frame.metric != "loss"]
    assert set(moved.variant) == {"offload_all_file"} and len(moved) == 24 and (moved.value > 0).all()
    losses = frame[frame.metric == "loss"]
    curves = {v: g.sort_values("repetition").value.to_numpy() for v, g in losses.groupby("variant")}
    assert all(len(c) == 12 for c in curves.values())
    assert (curves["keep"] == curves["offload_all_file"]).all() and (curves["keep"] == curves["recompute"]).all()
    assert curves["keep"][-1] < curves["keep"][0]  # it trains: twelve steps already lower the loss
    assert set(frame[frame.variant == "offload_all_file"].role) == {"optimized"}
    notes = load_provenance(out)
    assert 0 < notes["entropy_rate"] < notes["uniform_loss"] and notes["steps"] == 12
    assert not list(scratch.iterdir())


@contextlib.contextmanager
def busy_cores(count: int):
    """``count`` processes that keep a core busy each, for the block: a loaded machine."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


@pytest.mark.full
def test_convergence_is_the_same_on_a_loaded_machine(tmp_path, scratch):
    """With two busy processes beside it (two cores' worth: the writes land late, after backward
    has started), the convergence part still reads every offloaded tensor back from the files in
    every step and records the same curve: what it checks does not depend on timing."""
    out = tmp_path / "convergence-tiny.csv"
    with busy_cores(2):
        run("convergence", out, scratch)
    frame = load([out], SCHEMA)
    moved = frame[(frame.variant == "offload_all_file") & (frame.metric != "loss")]
    per_step = moved.pivot(index="repetition", columns="metric", values="value")
    assert len(per_step) == 12 and (per_step.bytes_read > 0).all()
    # Every step writes the same tensors and reads each back once, loaded or not.
    assert per_step.bytes_written.nunique() == 1 and per_step.bytes_read.nunique() == 1


def _convergence_params(**changes):
    params = {
        "seed": 0,
        "model": {"family": "llama", "preset": "tiny", "micro_batch": 2},
        "steps": 3,
        "learning_rate": 0.003,
        "compare": ["offload_all"],
        **HOST_STORE,
    }
    return params | changes


class Drifting(HostStore):
    """A host store that brings a tensor back with one bit flipped."""

    def get(self, key, out):
        done = super().get(key, out)
        done.result()
        out.reshape(-1).view(torch.uint8)[2] ^= 64  # a high mantissa bit of the first float32
        return done


class GoesWrong(HostStore):
    """A host store that brings tensors back with one bit flipped once ``wrong`` is set (as a buffer
    pool handing out a buffer still in use does, from its second step on)."""

    made: list = []

    def __init__(self):
        super().__init__()
        self.wrong = False
        GoesWrong.made.append(self)

    def get(self, key, out):
        done = super().get(key, out)
        if self.wrong:
            done.result()
            out.reshape(-1).view(torch.uint8)[2] ^= 64
        return done


def test_a_store_right_on_its_checked_step_and_wrong_in_its_timed_steps_is_not_recorded(scratch, monkeypatch):
    """The store goes wrong while it is timed (after the check before timing passed): the check
    after its timed steps refuses it, and none of its timed rows is written."""
    timed = parts._time

    def time_then_go_wrong(*args, **kwargs):
        timed(*args, **kwargs)
        for store in GoesWrong.made:
            store.wrong = True

    monkeypatch.setattr(parts, "_time", time_then_go_wrong)
    rows = Rows()
    entry = StoreEntry("test_goes_wrong", "optimized", make=lambda params, folder: GoesWrong())
    with registered(STORES, entry):
        with pytest.raises(parts.NotBitIdentical, match="offload_all_test_goes_wrong after its timed steps"):
            one_model(scratch, rows, stores=["test_goes_wrong"], compare=["offload_all"])
    assert not [r for r in rows if r["variant"] == "offload_all_test_goes_wrong"]
    assert GoesWrong.made


def test_convergence_stops_at_the_first_step_whose_loss_differs(scratch):
    """An offloading path that brings a tensor back changed: the curve differs from keep's, and the
    part raises naming the step instead of recording two curves."""
    rows = Rows()
    with registered(STORES, StoreEntry("test_drifting", "optimized", make=lambda params, folder: Drifting())):
        with pytest.raises(parts.NotBitIdentical, match="offload_all_test_drifting: the loss at step"):
            parts.convergence(_convergence_params(stores=["test_drifting"]), rows, device="cpu", scratch_dir=scratch)
    assert not rows


def test_convergence_refuses_unknown_or_planned_names_before_training(scratch, monkeypatch):
    monkeypatch.setattr(parts, "build", lambda *a, **k: pytest.fail("trained before refusing"))
    for changes, message in (
        ({"compare": ["offload_everything"]}, "unknown offloading policy 'offload_everything'"),
        ({"stores": ["disk"]}, "unknown offload store 'disk'"),
        ({"compare": ["planner"]}, "planned policies, which this part does not plan for"),
    ):
        with pytest.raises(UserError, match=message):
            parts.convergence(_convergence_params(**changes), None, device="cpu", scratch_dir=scratch)


def test_convergence_refuses_a_policy_that_moved_nothing(scratch):
    """min_bytes above every saved tensor: offload_all keeps everything, its curve equals keep's,
    and the part says the check tested nothing instead of recording it as offloading's."""
    rows = Rows()
    with pytest.raises(UserError, match="offload_all_host wrote or read nothing"):
        parts.convergence(_convergence_params(min_bytes=1 << 40), rows, device="cpu", scratch_dir=scratch)
    assert not rows


def test_shapes_runs_the_policies_its_config_lists(scratch):
    """Part shapes (GPU-only as configured) is the policies function with a narrower comparison:
    here recompute and the offloading, so save_on_cpu and the peers are not run."""
    rows = Rows()
    with registered(POLICIES, PolicyEntry("test_peer_hooks", "peer", make=KeepAll)):
        parts.shapes(
            ONE_MODEL | {"stores": ["host"], "compare": ["recompute", "offload_all"]},
            rows,
            repeat=1,
            warmup=0,
            device="cpu",
            scratch_dir=scratch,
        )
    assert {r["variant"] for r in rows} == {"keep", "recompute", "offload_all_host"}


def test_micro_batches_can_check_a_slice_of_a_large_micro_batch(scratch, monkeypatch):
    """check_micro_batch: the bit-identity check runs on the first sequences of the micro-batch (the
    check's math attention can run out of memory where the timed kernels fit); the timed steps
    take the whole micro-batch."""
    checked, trained = [], []
    one_step = parts.one_step

    def counting_step(model, batch, policy=None):
        checked.append(len(batch["input_ids"]))
        return one_step(model, batch, policy)

    def counting_measure(fn, **kwargs):
        forward = parts.torch.nn.Module.__call__
        with pytest.MonkeyPatch.context() as m:
            m.setattr(
                parts.torch.nn.Module,
                "__call__",
                lambda self, *a, **k: trained.append(k.get("input_ids")) or forward(self, *a, **k),
            )
            return measure(fn, **kwargs)

    measure = parts.measure
    monkeypatch.setattr(parts, "one_step", counting_step)
    monkeypatch.setattr(parts, "measure", counting_measure)
    params = {
        "seed": 0,
        "model": {"family": "llama", "preset": "tiny"},
        "global_batch": 4,
        "micro_batches": [4],
        "compare": ["recompute", "offload_all"],
        **HOST_STORE,
        "check_micro_batch": 3,
    }
    rows = Rows()

    notes = parts.micro_batches(params, rows, repeat=1, warmup=0, device="cpu", scratch_dir=scratch)
    assert checked == [3, 3, 3, 3]  # the reference, keep, recompute, offload_all_host
    assert {len(ids) for ids in trained if ids is not None} == {4}
    assert notes["checked_micro_batch"] == {"4": 3}
    assert {r["variant"] for r in rows} == {"keep", "recompute", "offload_all_host"}


# --- memory_bound: the largest micro-batch under a memory cap -----------------------------------------


@pytest.mark.parametrize(
    "candidates, limit",
    [([1, 2, 4, 8, 16, 32], 5), ([12, 3, 7, 5, 3], 7), ([1, 2, 4], 0), ([1, 2, 4], 99), ([6], 6), ([6], 5)],
)
def test_the_search_finds_the_largest_micro_batch_that_fits_asking_each_once(candidates, limit):
    from workloads.llm_offload.memory_bound import largest_fitting

    asked = []
    search = largest_fitting(candidates, lambda micro: asked.append(micro) or micro <= limit)
    fitting = [c for c in candidates if c <= limit]
    assert search.largest == (max(fitting) if fitting else None)
    assert len(asked) == len(set(asked)) and list(search.tried) == asked
    assert all(fit == (micro <= limit) for micro, fit in search.tried.items())
    distinct = len(set(candidates))
    assert len(asked) <= distinct.bit_length()  # bisection: about log2 of the candidates' count


@pytest.mark.parametrize("candidates", [[], [0, 2], [2, -1], [1.5], [True], ["4"]])
def test_the_search_refuses_what_is_not_a_list_of_micro_batches(candidates):
    from workloads.llm_offload.memory_bound import largest_fitting

    with pytest.raises(UserError, match="positive integers"):
        largest_fitting(candidates, lambda micro: True)


MEMORY_BOUND = {
    "seed": 0,
    "model": {"family": "llama", "preset": "tiny"},
    "global_batch": 8,
    "micro_batches": [1, 2, 4, 8],
    "compare": ["recompute", "offload_all"],
    **HOST_STORE,
    "min_bytes": 1024,
    # The tiny Llama's state (weights, gradients, AdamW's moments: 2.2 MB in float32) and about
    # 0.45 MB of keep's activations per sequence: keep fits 2 sequences, offloading 4, recompute 8.
    "memory_cap_gib": 0.0031,
}


def test_memory_bound_finds_each_policys_largest_micro_batch_under_an_emulated_cap(scratch):
    """On a CPU the cap is a byte limit on the model's state plus what a step holds for backward:
    each policy's largest micro-batch is the largest whose counted bytes stay under it (checked
    against the counts of the part's own rows), the memory freed buys keep's micro-batch 2 four
    times over under recompute, and tokens per second are recorded at every micro-batch up to each
    policy's largest (its fastest may be a smaller one), and at none above it."""
    from workloads.llm_offload.memory_bound import GIB

    rows = Rows()
    notes = parts.memory_bound(MEMORY_BOUND, rows, repeat=1, warmup=0, device="cpu", scratch_dir=scratch)
    largest = {label: search["largest"] for label, search in notes["searches"].items()}
    assert largest == {"keep": 2, "recompute": 8, "offload_all_host": 4}
    fits = {(r["variant"], r["config"]["micro_batch"]): r["value"] for r in rows if r.get("metric") == "fits"}
    assert fits[("keep", 2)] == 1 and fits[("keep", 4)] == 0 and fits[("offload_all_host", 8)] == 0
    state = 4 * notes["models"]["llama-tiny"]["parameters"] * 4  # float32 weights, gradients, two moments
    cap = MEMORY_BOUND["memory_cap_gib"] * GIB
    for row in rows:
        if row.get("metric") == "activation_bytes":
            assert row["config"]["micro_batch"] <= largest[row["variant"]]
            assert state + row["value"] <= cap
            if row["config"]["micro_batch"] == largest[row["variant"]]:
                # Twice the micro-batch holds about twice the bytes: past the cap, as the search found.
                assert state + 2 * row["value"] > cap or largest[row["variant"]] == 8
    timed_at = {}
    for r in rows:
        if r.get("metric") == "tokens_per_second":
            timed_at.setdefault(r["variant"], set()).add(r["config"]["micro_batch"])
    candidates = MEMORY_BOUND["micro_batches"]
    assert timed_at == {variant: {b for b in candidates if b <= top} for variant, top in largest.items()}
    timed = [r for r in rows if "metric" not in r]
    assert {r["config"]["memory_cap_gib"] for r in timed} == {0.0031}


def test_memory_bound_records_an_out_of_memory_as_not_fitting_and_frees_before_the_next_try(scratch, monkeypatch):
    """An OutOfMemoryError in a step (raised here for micro-batches above 2, as a GPU under the cap
    would) is a micro-batch that does not fit: recorded, its memory given back, the search goes on;
    nothing but that error is caught."""
    from workloads.llm_offload import memory_bound

    freed = []
    real_free = memory_bound.free
    monkeypatch.setattr(memory_bound, "free", lambda: freed.append(1) or real_free())
    forward = torch.nn.Module.__call__

    def running_out_above_two(self, *args, **kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and len(ids) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (a test's)")
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "__call__", running_out_above_two)
    params = MEMORY_BOUND | {"memory_cap_gib": 1.0, "compare": ["recompute"]}
    rows = Rows()
    notes = parts.memory_bound(params, rows, repeat=1, warmup=0, device="cpu", scratch_dir=scratch)
    assert notes["searches"]["keep"] == {"tried": {"4": False, "2": True}, "largest": 2}
    assert notes["searches"]["recompute"]["largest"] == 2 and len(freed) >= 4

    def failing(self, *args, **kwargs):
        raise RuntimeError("not a memory error")

    monkeypatch.setattr(torch.nn.Module, "__call__", failing)
    with pytest.raises(RuntimeError, match="not a memory error"):
        parts.memory_bound(params, Rows(), repeat=1, warmup=0, device="cpu", scratch_dir=scratch)


def test_memory_bound_times_what_fits_and_records_a_timed_micro_batch_that_ran_out_after_all(scratch, monkeypatch):
    """The search reads fitting as monotone: a smaller micro-batch that runs out of memory when
    timed after all (memory fragmented by the larger ones) is recorded as out of memory and named
    in the notes; the others are timed."""
    from workloads.llm_offload import memory_bound

    real_measure = memory_bound.measure

    def measure(step, *, desc, **kwargs):
        if desc == "b=1 recompute":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (a test's)")
        return real_measure(step, desc=desc, **kwargs)

    monkeypatch.setattr(memory_bound, "measure", measure)
    params = MEMORY_BOUND | {"compare": ["recompute"]}
    rows = Rows()
    notes = parts.memory_bound(params, rows, repeat=1, warmup=0, device="cpu", scratch_dir=scratch)
    assert notes["out_of_memory"] == {
        "recompute": "its timed steps at micro-batch 1 ran out of memory (its search found 8 to fit)"
    }
    timed = {(r["variant"], r["config"]["micro_batch"]) for r in rows if r.get("metric") == "tokens_per_second"}
    assert timed == {("keep", 1), ("keep", 2), ("recompute", 2), ("recompute", 4), ("recompute", 8)}
    out = {(r["variant"], r["config"]["micro_batch"]) for r in rows if r.get("metric") == "out_of_memory"}
    assert ("recompute", 1) in out and not {key for key in out if key[0] == "recompute" and key[1] != 1}


def test_memory_bound_refuses_a_bad_cap_and_micro_batches_that_do_not_divide(scratch, monkeypatch):
    def run_with(**changes):
        parts.memory_bound(MEMORY_BOUND | changes, Rows(), repeat=1, warmup=0, device="cpu", scratch_dir=scratch)

    with pytest.raises(UserError, match="memory_cap_gib must be positive"):
        run_with(memory_cap_gib=0)
    with pytest.raises(UserError, match="does not divide the global batch 8"):
        run_with(micro_batches=[3])

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (a test's)")

    from workloads.llm_offload import memory_bound

    with monkeypatch.context() as m:
        m.setattr(memory_bound, "build", out_of_memory)
        with pytest.raises(UserError, match="AdamW state alone do not fit under memory_cap_gib 0.0031"):
            run_with()
    monkeypatch.setattr(torch.nn.Module, "__call__", out_of_memory)
    with pytest.raises(UserError, match="keep's checked step on 1 sequences does not fit"):
        run_with()


def test_memory_bound_takes_the_second_profile_where_the_first_traced_peaks(scratch, monkeypatch):
    """The part's path for a GPU's profile, run on a CPU with the check for traced peaks answered
    yes: the kept blocks profiled once more at twice the check's micro-batch (recorded beside the
    plans), the plans made, checked and timed as before."""
    from systems.ssdtrain import planning

    monkeypatch.setattr(planning, "has_peaks", lambda profiles: True)
    params = MEMORY_BOUND | {"compare": ["recompute", "planner"], "planned_stores": ["host"]}
    rows = Rows()
    notes = parts.memory_bound(params, rows, repeat=1, warmup=0, device="cpu", scratch_dir=scratch)
    planning_notes = notes["models"]["llama-tiny"]["planning"]
    at_twice = planning_notes["at_twice"]
    assert at_twice["micro_batch"] == 2 * planning_notes["profiled_micro_batch"] == 2
    first, second = planning_notes["profile"], at_twice["profile"]
    assert len(second["saved_bytes"]) == len(first["saved_bytes"])
    assert all(s > f for s, f in zip(second["saved_bytes"], first["saved_bytes"], strict=True))  # twice the rows
    assert "did_not_fit" not in at_twice
    assert notes["searches"]["planner_host"]["largest"] is not None


def test_memory_bound_plans_per_micro_batch_within_the_caps_room(scratch):
    """The planner under the cap: one plan per micro-batch, from the profile at the check's
    micro-batch scaled, each the fastest whose predicted bytes fit 0.8 of the room the model's state
    leaves; every distinct plan checked bit-identical to keep before the search; at its largest
    micro-batch the plan's prediction recorded beside what the step held."""
    from workloads.llm_offload.memory_bound import GIB

    params = MEMORY_BOUND | {"compare": ["recompute", "offload_all", "planner"], "planned_stores": ["host"]}
    rows = Rows()
    notes = parts.memory_bound(params, rows, repeat=1, warmup=0, device="cpu", scratch_dir=scratch)
    largest = {label: search["largest"] for label, search in notes["searches"].items()}
    assert largest["planner_host"] >= largest["offload_all_host"] > largest["keep"]
    plans = notes["models"]["llama-tiny"]["planning"]["plans"]["planner_host"]
    state = 4 * notes["models"]["llama-tiny"]["parameters"] * 4
    assert plans["room_bytes"] == int(0.8 * (params["memory_cap_gib"] * GIB - state))
    decisions = [tuple(plans[str(micro)]) for micro in params["micro_batches"]]
    assert decisions[0] != decisions[-1]  # a larger micro-batch needs a plan that holds less
    values = {(r["variant"], r["metric"]): r["value"] for r in rows if "metric" in r}
    held = values[("planner_host", "activation_bytes")]
    predicted = values[("planner_host", "predicted_activation_bytes")]
    assert predicted <= plans["room_bytes"] and abs(predicted - held) <= 0.2 * held
    timed = next(r for r in rows if r["variant"] == "planner_host" and "metric" not in r)
    offloaded = decisions[params["micro_batches"].index(largest["planner_host"])].count("offload")
    assert timed["config"]["layers_offloaded"] == offloaded


def _profiles_with_peaks(rows_factor, fixed=(700, 500, 900), per_row=(40, 60, 80)):
    """Three kept layers whose traced peaks are affine in the micro-batch: a part that stays
    (``fixed``: weight-sized transients) and a part per sequence (``per_row``)."""
    from systems.ssdtrain.planning import LayerProfile

    return [
        LayerProfile(
            saved_bytes=30 * rows_factor,
            input_bytes=5 * rows_factor,
            forward_seconds=0.01 * rows_factor,
            forward_peak=f + r * rows_factor,
            backward_peak=2 * f + 3 * r * rows_factor,
            head_peak=None if i < 2 else 3 * f + r * rows_factor,
        )
        for i, (f, r) in enumerate(zip(fixed, per_row))
    ]


@pytest.mark.parametrize("micro", [1, 3, 4, 7, 32])
def test_scaled_peaks_follow_the_line_through_the_profiles_at_one_and_twice_the_micro_batch(micro):
    """Peaks that hold a part independent of the micro-batch are extrapolated exactly from the
    profiles at 1 and 2 sequences (a proportional scaling would multiply the fixed part too); bytes
    and seconds still grow in proportion; without the second profile the peaks scale in proportion."""
    from workloads.llm_offload.memory_bound import scaled

    one, two, truth = _profiles_with_peaks(1), _profiles_with_peaks(2), _profiles_with_peaks(micro)
    grown, seconds, fixed = scaled(one, 0.5, 11, float(micro), two)
    for got, want in zip(grown, truth, strict=True):
        assert (got.forward_peak, got.backward_peak, got.head_peak) == (
            want.forward_peak,
            want.backward_peak,
            want.head_peak,
        )
        assert (got.saved_bytes, got.input_bytes) == (want.saved_bytes, want.input_bytes)
        assert got.forward_seconds == pytest.approx(want.forward_seconds)
    assert (seconds, fixed) == (pytest.approx(0.5 * micro), 11 * micro)
    proportional, _, _ = scaled(one, 0.5, 11, float(micro))
    assert [p.backward_peak for p in proportional] == [p.backward_peak * micro for p in one]
    if micro > 2:  # the fixed part multiplied: the proportional scaling overstates every peak
        assert all(p.backward_peak > t.backward_peak for p, t in zip(proportional, truth))


def test_scaled_peaks_never_go_below_zero_never_fall_and_refuse_a_profile_of_other_layers():
    """Extrapolated down (a micro-batch below the profiled one) a line that crosses zero stops at
    zero; a peak lower at twice the micro-batch (noise, another kernel) reads as a flat line, never
    one that falls with more sequences; a second profile of another number of layers is refused; a
    layer without a peak at twice the micro-batch is scaled in proportion."""
    import dataclasses

    from workloads.llm_offload.memory_bound import scaled

    # forward: -100 + 500 per sequence, backward: -200 + 1500: both cross zero below one sequence
    one = _profiles_with_peaks(1, fixed=(-100, -100, -100), per_row=(500, 500, 500))
    two = _profiles_with_peaks(2, fixed=(-100, -100, -100), per_row=(500, 500, 500))
    grown, _, _ = scaled(one, 0.5, 0, 0.1, two)
    assert [(p.forward_peak, p.backward_peak) for p in grown] == [(0, 0)] * 3  # -50 and -50: clamped
    grown, _, _ = scaled(one, 0.5, 0, 0.5, two)
    assert (grown[0].forward_peak, grown[0].backward_peak) == (150, 550)  # on the line, above zero
    falling = [dataclasses.replace(p, backward_peak=p.backward_peak - 100) for p in one]
    for factor in (0.5, 2.0, 8.0, 32.0):
        grown, _, _ = scaled(one, 0.5, 0, factor, falling)
        assert [p.backward_peak for p in grown] == [p.backward_peak for p in one]
    with pytest.raises(ValueError, match="has 2 layers, not 3"):
        scaled(one, 0.5, 0, 2.0, two[:2])
    partial = [dataclasses.replace(two[0], backward_peak=None), *two[1:]]
    grown, _, _ = scaled(one, 0.5, 0, 4.0, partial)
    assert grown[0].backward_peak == one[0].backward_peak * 4  # that peak: in proportion
    four = _profiles_with_peaks(4, fixed=(-100, -100, -100), per_row=(500, 500, 500))
    assert grown[1].backward_peak == four[1].backward_peak


def test_the_second_profile_is_taken_only_for_traced_peaks_and_a_profile_that_does_not_fit_is_noted(monkeypatch):
    """On a CPU (no traced peaks) no second profile is taken; with peaks it is taken once per kind
    of block (eager, compiled); one that runs out of memory gives None (peaks scaled in
    proportion) and the notes say which."""
    import dataclasses

    from workloads.llm_offload import memory_bound

    asked = []

    class FakeProfiler:
        def __init__(self, params, model, layers, batch, device, folder, notes):
            assert params["planner_budgets"] == [] and batch["input_ids"].shape[0] == 6
            self.notes = notes

        def blocks(self, compiled):
            asked.append(compiled)
            if compiled:
                raise RuntimeError("compile failed") from torch.cuda.OutOfMemoryError("CUDA out of memory (a test's)")
            return _profiles_with_peaks(2), 1.0, 0

    monkeypatch.setattr(memory_bound, "Profiler", FakeProfiler)
    monkeypatch.setattr(
        memory_bound, "batches", lambda shape, **kw: iter([{"input_ids": torch.ones(shape.micro_batch, 4)}])
    )

    @dataclasses.dataclass
    class Shape:
        micro_batch: int

    notes = {}
    shape = Shape(3)
    at_twice = memory_bound._twice_profiler(
        {"seed": 0, "planner_budgets": [0.5]}, None, [], shape, 3, "cpu", None, notes
    )
    without = [dataclasses.replace(p, forward_peak=None, backward_peak=None) for p in _profiles_with_peaks(1)]
    assert at_twice(False, without) is None and asked == []
    with_peaks = _profiles_with_peaks(1)
    assert at_twice(False, with_peaks) == _profiles_with_peaks(2)
    assert at_twice(False, with_peaks) == _profiles_with_peaks(2) and asked == [False]  # taken once
    assert at_twice(True, with_peaks) is None and at_twice(True, with_peaks) is None and asked == [False, True]
    assert notes["at_twice"] == {"micro_batch": 6, "did_not_fit": ["compiled"]}


def test_the_part_records_offload_alls_bound_from_its_profile_and_store(scratch):
    """Part policies writes, beside offload_all's measured rows, the activation-peak reduction its
    store's measured bandwidth allows at no time overhead: the bound of the recorded profile."""
    from systems.ssdtrain.bound import offload_bound

    params = ONE_MODEL | {"stores": ["host"], "compare": ["offload_all"]}
    rows = Rows()
    notes = parts.policies(params, rows, repeat=1, warmup=0, device="cpu", scratch_dir=scratch)
    model_notes = notes["models"]["llama-tiny"]
    profile, gbps = model_notes["profile"], model_notes["store_gbps"]["host"]
    forward = profile["forward_seconds"]
    expected = offload_bound(profile["saved_bytes"], forward, [2 * f for f in forward], gbps * 1e9)
    bounds = [r for r in rows if r.get("metric") == "bound_activation_bytes"]
    assert [(r["variant"], r["repetition"]) for r in bounds] == [("offload_all_host", 0)]
    assert bounds[0]["value"] == pytest.approx(expected.activation_bytes)
    assert 0 < bounds[0]["value"] <= sum(profile["saved_bytes"][:-1])


@pytest.mark.gpu
def test_on_a_gpu_the_cap_is_the_allocators_and_is_lifted_afterwards(scratch):
    """On a GPU the cap is enforced by the allocator: keep runs out of memory at the larger
    micro-batches, recompute fits at least keep's largest, and the cap is gone after the part."""
    from workloads.llm_offload.memory_bound import GIB

    params = MEMORY_BOUND | {
        "model": {"family": "llama", "preset": "tiny", "sequence": 512},
        "global_batch": 128,
        "micro_batches": [1, 2, 4, 8, 16, 32, 64, 128],
        "min_bytes": 1 << 16,
        "memory_cap_gib": 0.25,
    }
    rows = Rows()
    notes = parts.memory_bound(params, rows, repeat=1, warmup=0, device="cuda", scratch_dir=scratch)
    searches = notes["searches"]
    assert False in searches["keep"]["tried"].values() and searches["keep"]["largest"] is not None
    assert searches["recompute"]["largest"] >= searches["keep"]["largest"]
    big = torch.empty(int(0.5 * GIB), dtype=torch.uint8, device="cuda")  # above the cap: allowed again
    del big


@pytest.mark.full
def test_memory_bound_compares_the_compiled_peers_under_the_emulated_cap(scratch):
    """With compiled set: compiled keep (checked within the tolerance of keep), torch's budget
    (within the tolerance of compiled keep) and the planner over compiled blocks, free to run a
    block under the budget, each searched; what a budget frees buys a larger micro-batch than
    compiled keep's, and the planner's plans say which blocks it runs under the budget."""
    params = MEMORY_BOUND | {
        "compare": ["torch_budget", "planned_compiled"],
        "compiled": True,
        "budgets": [0.2],
        "planner_budgets": [0.2],
        "compiled_stores": ["host"],
        "planner_budget": 0.5,  # the other parts' setting, which these plans do not use
    }
    rows = Rows()
    notes = parts.memory_bound(params, rows, repeat=1, warmup=0, device="cpu", scratch_dir=scratch)
    largest = {label: search["largest"] for label, search in notes["searches"].items()}
    assert set(largest) == {"keep", "compiled_keep", "torch_budget_0.2", "planned_compiled_host"}
    assert largest["torch_budget_0.2"] >= largest["compiled_keep"] >= largest["keep"]
    assert largest["planned_compiled_host"] >= largest["compiled_keep"]
    assert "compiled_keep" in notes["deviation_from_keep"]
    # its plans fill the room the cap leaves, not planner_budget of keep's bytes: no fraction recorded
    planned = [r for r in rows if r.get("variant") == "planned_compiled_host"]
    assert planned and all(r["config"].get("budget_fraction") is None for r in planned)
    plans = notes["models"]["llama-tiny"]["planning"]["plans"]["planned_compiled_host"]
    assert {d for micro in params["micro_batches"] for d in plans[str(micro)]} <= {
        "keep",
        "offload",
        "recompute",
        "budget_0.2",
        "offload_budget_0.2",
    }


def test_memory_bound_skips_a_peer_off_its_reference_and_stops_on_its_own(scratch, monkeypatch):
    """A peer whose checked step is off its reference (compiled keep here, made to fail) is noted
    and left out with what depends on it, the other policies searched; the suite's own policy off
    its reference stops the part."""
    from workloads.llm_offload import memory_bound
    from workloads.llm_offload.checking import NotBitIdentical

    def failing(name, *args, **kwargs):
        raise NotBitIdentical(f"{name}: q_proj.weight differs from keep's by 0.5")

    monkeypatch.setattr(memory_bound, "check_close", failing)
    params = MEMORY_BOUND | {"compare": ["recompute", "torch_budget"], "compiled": True, "budgets": [0.2]}
    notes = parts.memory_bound(params, Rows(), repeat=1, warmup=0, device="cpu", scratch_dir=scratch)
    assert set(notes["searches"]) == {"keep", "recompute"}
    assert "off its reference: compiled_keep: q_proj.weight differs" in notes["skipped"]["compiled_keep"]
    assert "did not run, fit or pass its check" in notes["skipped"]["torch_budget_0.2"]

    def wrong(name, *args, **kwargs):
        raise NotBitIdentical(f"{name}: a gradient differs")

    monkeypatch.setattr(memory_bound, "check_identical", wrong)
    with pytest.raises(NotBitIdentical, match="under the memory cap: a gradient differs"):
        parts.memory_bound(
            MEMORY_BOUND | {"compare": ["offload_all"]}, Rows(), repeat=1, warmup=0, device="cpu", scratch_dir=scratch
        )


@pytest.mark.gpu
def test_on_a_gpu_memory_bound_runs_every_peer_under_the_cap(scratch):
    """Compiled keep, torch's budgets, the eager planner and the planner over compiled blocks (with a
    budget to choose) each get a search under the allocator's cap, checked first against their
    references; the cap is lifted afterwards."""
    params = MEMORY_BOUND | {
        "model": {"family": "llama", "preset": "tiny", "sequence": 512},
        "global_batch": 64,
        "micro_batches": [1, 4, 16, 64],
        "min_bytes": 1 << 16,
        "memory_cap_gib": 0.25,
        "compare": ["recompute", "offload_all", "planner", "torch_budget", "planned_compiled"],
        "compiled": True,
        "budgets": [0.5],
        "planner_budgets": [0.5],
        "planned_stores": ["host"],
        "compiled_stores": ["host"],
    }
    rows = Rows()
    notes = parts.memory_bound(params, rows, repeat=1, warmup=0, device="cuda", scratch_dir=scratch)
    searched = set(notes["searches"])
    assert searched == {
        "keep", "recompute", "offload_all_host", "compiled_keep", "torch_budget_0.5", "planner_host",
        "planned_compiled_host",
    }, notes["skipped"]  # fmt: skip
    assert all(search["largest"] is not None for search in notes["searches"].values())
    # A GPU's profile traces peaks: the kept blocks were profiled at twice the check's rows too.
    (model_notes,) = notes["models"].values()
    at_twice = model_notes["planning"]["at_twice"]
    assert at_twice["micro_batch"] == 2 and "did_not_fit" not in at_twice
    assert {"profile", "profile_compiled"} <= set(at_twice)
    assert notes["searches"]["planner_host"]["largest"] >= notes["searches"]["keep"]["largest"]


# --- the notebook ----------------------------------------------------------------------------------


def test_the_notebook_shows_a_store_and_a_policy_it_has_never_seen(tmp_path, scratch):
    """Rows of a store and of a policy that no registry knows (a plugin's, say): each is in the
    summary's main table and in the figure's legend, labelled from its columns; the bandwidth what-if
    names the processor the machine has."""
    pytest.importorskip("jupytext", reason="notebook rendering needs jupytext (the CPU environment has it)")
    from analysis.render import main as render
    from harness import provenance
    from harness.results import ResultsWriter

    params = ONE_MODEL | {"stores": ["host"], "compare": ["recompute", "offload_all"]}
    writer = ResultsWriter(SCHEMA, "tiny")
    notes = parts.policies(params, writer, repeat=2, warmup=0, device="cpu", scratch_dir=scratch)
    out = tmp_path / "policies-tiny.csv"
    writer.write(out, provenance.collect("tiny", topic="llm_offload", part="policies", parameters=params, **notes))
    rows = pd.read_csv(out, keep_default_na=False, dtype=str)
    unseen_store = rows[rows.variant == "offload_all_host"].assign(variant="offload_all_ramdisk", store="ramdisk")
    unseen_policy = rows[rows.variant == "recompute"].assign(variant="half_recompute", policy="half_recompute")
    rewrite_rows(out, pd.concat([rows, unseen_store, unseen_policy.assign(role="optimized")]))
    # A store-using variant whose checked step wrote nothing (it ran as keep there) is named above the table.
    record_path = out.with_name("policies-tiny.provenance.json")
    record = json.loads(record_path.read_text())
    record["models"]["llama-tiny"]["checked_without_offloading"] = ["offload_all_ramdisk"]
    record_path.write_text(json.dumps(record))
    figure, summary = tmp_path / "llm.png", tmp_path / "llm.md"
    render(
        ["analysis/llm_offload.py", "--executed", str(tmp_path / "nb.ipynb"), "-p", "machine=test"]
        + ["-p", "scale=tiny", "--topic", "llm_offload", "--topic", "llm_offload_reruns"]
        + ["--results", f"llm_offload={out}", "--figure", str(figure), "--summary", str(summary)]
    )
    table = summary.read_text().split("\n\n## ")[0]
    assert (
        "Wrote nothing to their store in the checked step (ran as keep there): offload_all_ramdisk (llama-tiny)."
        in table
    )
    legend = json.loads((tmp_path / "nb.text.json").read_text())[0]  # the figure's words
    for label, legend_entry in (("offload_all, ramdisk", "store: ramdisk"), ("half_recompute", "half_recompute")):
        assert f"| llama-tiny | {label} |" in table
        assert legend_entry in legend  # a policy's colour and a store's marker, each an entry of its own
    # The what-if's throughput axis names the processor the steps ran on: a CPU where there is no GPU.
    processor = "GPU" if load_provenance(out)["machine"]["gpus"] else "CPU"
    assert f"compute throughput of the {processor} " in (tmp_path / "nb-bandwidth.text.json").read_text()


@pytest.mark.full
def test_the_notebook_shows_each_policys_largest_micro_batch_under_the_cap(tmp_path, scratch):
    """Part memory_bound beside part policies on the same model: its own table (largest micro-batch,
    those that did not fit, tokens/s and the ratio to keep's) and panel, its rows kept out of the
    per-model comparison (the same model in two parts of that comparison stops the notebook)."""
    pytest.importorskip("jupytext", reason="notebook rendering needs jupytext (the CPU environment has it)")
    from analysis.render import main as render
    from harness import provenance
    from harness.results import ResultsWriter

    files = []
    for part, params in [
        ("policies", ONE_MODEL | {"stores": ["host"], "compare": ["recompute", "offload_all"]}),
        ("memory_bound", MEMORY_BOUND),
    ]:
        writer = ResultsWriter(SCHEMA, "tiny")
        notes = getattr(parts, part)(params, writer, repeat=2, warmup=0, device="cpu", scratch_dir=scratch)
        out = tmp_path / f"{part}-tiny.csv"
        writer.write(out, provenance.collect("tiny", topic="llm_offload", part=part, parameters=params, **notes))
        files.append(out)
    figure, summary = tmp_path / "llm.png", tmp_path / "llm.md"
    render(
        ["analysis/llm_offload.py", "--executed", str(tmp_path / "nb.ipynb"), "-p", "machine=test"]
        + ["-p", "scale=tiny", "--topic", "llm_offload", "--topic", "llm_offload_reruns"]
        + [arg for out in files for arg in ("--results", f"llm_offload={out}")]
        + ["--figure", str(figure), "--summary", str(summary)]
    )
    text = summary.read_text()
    table = text.split("## The largest micro-batch under a memory cap (part memory_bound)")[1]
    assert "| llama-tiny | 0.0031 | keep | 2 | 4 |" in table
    assert "| llama-tiny | 0.0031 | recompute | 8 | none tried |" in table
    assert "| llama-tiny | 0.0031 | offload_all, host | 4 | 8 |" in table
    assert "llama-tiny: the fastest SSDTrain configuration, offload_all, host, reaches" in table
    assert "x the tokens/s of recompute" in table
    assert "under a 0.0031 GiB cap" in (tmp_path / "nb-training.text.json").read_text()  # the panel


# --- the figures' own colours and the comparisons' tables -------------------------------------------


def notebook_constants(*names: str) -> dict:
    """The constants ``names`` of analysis/llm_offload.py (a notebook, run for its figures rather
    than imported), each its assignment's expression evaluated on the constants before it."""
    import ast

    tree = ast.parse((REPO_ROOT / "analysis" / "llm_offload.py").read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) in names:
            expression = compile(ast.Expression(node.value), "analysis/llm_offload.py", "eval")
            found[node.targets[0].id] = eval(expression, {"__builtins__": {"dict": dict}}, dict(found))
    return found


def test_the_stores_lines_are_in_colours_no_variant_has_and_an_emulated_ssd_is_not_host_memory():
    """Host memory's line was the first colour of the palette of a user's own variants, and the
    emulated SSDs' dotted lines, in the same colour, lay on it at the same bandwidth."""
    import math

    from test_style import _lab

    from analysis import style

    found = notebook_constants("FRONTIER", "STORE_LINE", "UNKNOWN_STORE")
    lines = [*found["STORE_LINE"].values(), found["UNKNOWN_STORE"]]
    assert {"host", "emulated"} <= set(found["STORE_LINE"])
    assert len(set(lines)) == len(lines)  # host memory, each file store and the emulated SSDs apart
    variants = {colour for colour, _ in style.VARIANT_STYLE.values()} | set(style.UNSEEN_PALETTE)
    for colour in [*lines, found["FRONTIER"]]:
        nearest = min(variants, key=lambda other: math.dist(_lab(colour), _lab(other)))
        assert math.dist(_lab(colour), _lab(nearest)) >= 25, (colour, nearest)


def test_the_frontiers_mark_is_a_ring_that_leaves_its_point_in_view():
    """A filled yellow disc under each frontier point hid DeepSpeed's olive and the planner's orange."""
    ring = notebook_constants("FRONTIER", "FRONTIER_RING")["FRONTIER_RING"]
    assert ring["mfc"] == "none" and ring["markersize"] > 8  # open, and wider than a point's hollow markers


def test_each_comparison_against_recompute_says_what_both_hold():
    """Offloading is compared with recompute, the fastest baseline that saves memory, and not only
    with the slowest peers; every speedup comes with both policies' activation peaks over keep's."""
    from analysis.doc_tables import llm_offload as tables

    for table in (tables.peers(), tables.shape_peers()):
        rows = [line for line in table.lines[2:] if line.startswith("| offload_all, host | recompute |")]
        assert len(rows) == 1
        for line in table.lines[2:]:
            cells = [cell for cell in line.strip("|").split(" | ")[2:] if cell.strip()]
            assert cells and all(" (peaks " in cell and " and " in cell for cell in cells), line


def test_a_profile_scaled_to_a_larger_micro_batch_scales_what_offloading_cannot_move_too():
    from systems.ssdtrain.planning import LayerProfile
    from workloads.llm_offload.memory_bound import scaled

    grown, seconds, fixed = scaled([LayerProfile(100, 10, 1.0, unoffloadable_bytes=40)], 3.0, 5, 2.0)
    layer = grown[0]
    assert (layer.saved_bytes, layer.unoffloadable_bytes, layer.input_bytes, seconds, fixed) == (200, 80, 20, 6.0, 10)


@pytest.mark.gpu
def test_on_a_gpu_the_allocator_at_the_end_of_forward_sees_what_offloading_frees(scratch):
    """Part policies on a GPU records, beside the hooks' count of what a step keeps when forward ends
    (activation_bytes), what the allocator then holds above the step's start: keep's holds at least
    the hooks' count (the logits and loss beside it) less the token ids, allocated before the step,
    and no more than its own peak; offloading every
    block but the last keeps less by the hooks' count and never more than keep by the allocator's
    (how much less there depends on how far the copies got when the host returned from forward:
    not asserted, recorded)."""
    params = ONE_MODEL | {
        "models": [{"family": "llama", "preset": "tiny", "sequence": 512, "micro_batch": 8}],
        "stores": ["host"],
        "compare": ["offload_all"],
        "min_bytes": 1 << 16,
    }
    rows = Rows()
    parts.policies(params, rows, repeat=2, warmup=1, device="cuda", scratch_dir=scratch)
    value = {}
    for r in rows:
        if r.get("metric") in ("activation_bytes", "activation_peak", "allocated_at_forward_end"):
            value.setdefault((r["variant"], r["metric"]), []).append(r["value"])
    keep, offloaded = "keep", "offload_all_host"
    for variant in (keep, offloaded):
        assert len(value[(variant, "allocated_at_forward_end")]) == 2  # one a timed step
        assert max(value[(variant, "allocated_at_forward_end")]) <= min(value[(variant, "activation_peak")])
    # The hooks count the token ids the embedding saves, which the batch held before the step began.
    ids_bytes = 8 * 8 * 512  # int64, micro-batch 8 of sequence 512
    assert min(value[(keep, "allocated_at_forward_end")]) >= max(value[(keep, "activation_bytes")]) - ids_bytes
    kept_bytes = min(value[(keep, "activation_bytes")])
    assert max(value[(offloaded, "activation_bytes")]) < kept_bytes
    assert max(value[(offloaded, "allocated_at_forward_end")]) <= max(value[(keep, "allocated_at_forward_end")])
