"""llm_offload: the policies part end to end at the tiny scale (every policy and store, validated
results, provenance notes), and a policy whose gradients are wrong refused before it is timed."""

import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from harness.entry import main as entry
from harness.results import load, load_provenance
from harness.topic import REPO_ROOT
from workloads.llm_offload import parts
from workloads.llm_offload.schema import SCHEMA

ON_GPU = torch.cuda.is_available()  # the entry trains on the GPU where there is one
VARIANTS = {  # and, on a GPU, offload_all_kvikio and torchtune_offload where those libraries import
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
OFFLOADING = {v for v in VARIANTS if v.startswith(("offload_all", "offload_adaptive", "planner"))}


# The store settings of the tests that call a part's function directly with their own parameters.
HOST_STORE = {
    "stores": ["host"],
    "emulated_gbps": [],
    "keep_last": 1,
    "min_bytes": 0,
    "prefetch": 1,
    "file_threads": 1,
    "file_block_mib": 1,
}


class Rows(list):
    """A results writer that keeps the rows it is given, for calling a part's function directly."""

    def add(self, **row):
        self.append(row)

    def add_measurement(self, measurement, **row):
        self.append(row)


@pytest.fixture
def scratch():
    """A folder on the repository's disk (O_DIRECT refuses tmpfs), under the ignored .scratch/."""
    (REPO_ROOT / ".scratch").mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="test-llm-offload-", dir=REPO_ROOT / ".scratch"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def run(out: Path, scratch: Path) -> None:
    entry(["llm_offload", "--part", "policies", "--scale", "tiny", "--out", str(out), "--scratch-dir", str(scratch)])


def test_policies_tiny_end_to_end(tmp_path, scratch):
    out = tmp_path / "policies-tiny.csv"
    run(out, scratch)
    frame = load([out], SCHEMA)
    assert set(frame.dataset) == {"gpt2-tiny", "llama-tiny"}
    notes = load_provenance(out)
    # kvikio, torchtune and DeepSpeed run only on a GPU, where they import; elsewhere the notes say why not.
    optional = {v: v for v in ("torchtune_offload", "deepspeed_offload")} | {"offload_all_kvikio": "kvikio"}
    for variant, skip_key in optional.items():
        ran = variant in set(frame.variant)
        assert ran != (skip_key in notes["skipped"]), variant
        assert ON_GPU or not ran
    for dataset, rows in frame.groupby("dataset"):
        assert set(rows.variant) - set(optional) == VARIANTS, dataset
        times = rows[rows.metric == "time"]
        assert (times.groupby("variant").size() == 3).all()  # repeat: 3
        assert (times.value > 0).all()
        held = rows[rows.metric == "activation_bytes"].groupby("variant").value.median()
        # Offloading and recomputation hold less than keep; every offload store moved the same bytes.
        assert held["offload_all_host"] < held["keep"] and held["recompute"] < held["keep"]
        written = rows[rows.metric == "bytes_written"].groupby("variant").value.median()
        offloaded = written[[v for v in written.index if v.startswith("offload_all")]]
        assert offloaded.nunique() == 1 and offloaded.iloc[0] > 0
        assert (rows[rows.metric == "bytes_read"].groupby("variant").value.median()[offloaded.index] > 0).all()
        emulated = rows[rows.variant.str.startswith("offload_all_emulated")]
        assert emulated.store_emulated.all() and set(emulated.emulated_gbps) == {0.5, 2.0}
        assert not rows[~rows.variant.str.startswith("offload_all_emulated")].store_emulated.any()
        assert set(rows[rows.role == "optimized"].variant) - {"offload_all_kvikio"} == OFFLOADING
        # The planned policies: their plan's counts and the predictions beside the measurements.
        planned = rows[rows.variant.str.startswith(("offload_adaptive", "planner"))]
        assert planned.planned_gbps.notna().all() and (planned.planned_gbps > 0).all()
        assert (planned.layers_offloaded + planned.layers_recomputed <= 2).all()
        predicted = planned[planned.metric.str.startswith("predicted_")]
        assert set(predicted.metric) == {"predicted_time", "predicted_activation_bytes"}
        assert (predicted.groupby(["variant", "metric"]).size() == 1).all() and (predicted.value > 0).all()
        assert planned[planned.variant.str.startswith("planner")].budget_fraction.eq(0.5).all()
    assert notes["part"] == "policies"
    assert notes["models"]["gpt2-tiny"]["attention"] in ("sdpa", "eager")
    profile = notes["models"]["llama-tiny"]["profile"]
    assert len(profile["saved_bytes"]) == 2 and min(profile["saved_bytes"]) > 0
    assert set(notes["models"]["llama-tiny"]["plans"]) == {"host", "file"}
    assert not list(scratch.iterdir())  # the file store removed its files


def test_a_wrong_policy_is_refused_before_timing(tmp_path, scratch, monkeypatch):
    """save_on_cpu that brings back its tensors slightly changed: the check raises, nothing is written."""

    class Wrong(torch.autograd.graph.saved_tensors_hooks):
        def __init__(self, *args, **kwargs):
            self.packed = self.unpacked = 0
            self.unique = {}
            super().__init__(lambda t: t, lambda t: t * 1.0001 if t.is_floating_point() else t)

    monkeypatch.setattr(parts, "_CountingSaveOnCpu", Wrong)
    timed = []
    monkeypatch.setattr(parts, "measure", lambda *a, **k: timed.append(k) or pytest.fail("timed a wrong path"))
    out = tmp_path / "policies-tiny.csv"
    with pytest.raises(parts.NotBitIdentical, match="save_on_cpu"):
        run(out, scratch)
    assert not out.exists() and not timed


def test_micro_batches_tiny_end_to_end(tmp_path, scratch):
    """Every micro-batch and policy checked and timed at a fixed global batch; activation bytes grow
    with the micro-batch and offloading holds less than keep at each."""
    out = tmp_path / "micro_batches-tiny.csv"
    entry(
        ["llm_offload", "--part", "micro_batches", "--scale", "tiny", "--out", str(out), "--scratch-dir", str(scratch)]
    )
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
    from harness.errors import UserError

    params = {
        "seed": 0,
        "model": {"family": "llama", "preset": "tiny"},
        "global_batch": 4,
        "micro_batches": [3],
        **HOST_STORE,
        "stores": [],
    }
    with pytest.raises(UserError, match="micro-batch 3 does not divide the global batch 4"):
        parts.micro_batches(params, None, repeat=1, warmup=0, device="cpu", scratch_dir=scratch)


def test_a_peer_runs_through_its_own_hooks_and_is_checked(tmp_path, scratch, monkeypatch):
    """The plumbing of another library's offloading (torchtune's on a GPU), with stand-in hooks
    that keep every tensor: checked bit-identical, timed, its packed bytes counted."""
    stand_in = lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)  # noqa: E731
    monkeypatch.setattr(parts.peers, "peers", lambda *a: [("torchtune_offload", parts.peers.Peer(hooks=stand_in))])
    out = tmp_path / "policies-tiny.csv"
    run(out, scratch)
    frame = load([out], SCHEMA)
    peer = frame[frame.variant == "torchtune_offload"]
    assert set(peer.role) == {"baseline"} and set(peer.dataset) == {"gpt2-tiny", "llama-tiny"}
    assert (peer[peer.metric == "time"].groupby("dataset").size() == 3).all()
    packed = peer[peer.metric == "bytes_packed"].value
    assert len(packed) == 6 and (packed > 0).all()


def test_a_checkpointing_peer_recomputes_every_block_and_is_checked(tmp_path, scratch, monkeypatch):
    """The plumbing of a peer that checkpoints each block (DeepSpeed's on a GPU), with torch's own
    checkpoint as the stand-in: every block's forward goes through it, the step is checked
    bit-identical and timed; a checkpoint function that changes a block's output is reported,
    not timed."""
    from torch.utils.checkpoint import checkpoint

    calls = []

    def stand_in(forward, *args, **kwargs):
        calls.append(forward)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    def wrong(forward, *args, **kwargs):  # 1.01: a change that survives bf16 on a GPU
        out = stand_in(forward, *args, **kwargs)
        return tuple(o * 1.01 for o in out) if isinstance(out, tuple) else out * 1.01

    def failing(forward, *args, **kwargs):  # as DeepSpeed does on BERT: an error inside the block
        calls.append(forward)
        raise RuntimeError("both arguments to linear need to be at least 1D")

    resets = []
    for function, timed in ((stand_in, True), (wrong, False), (failing, False)):
        peer = parts.peers.Peer(checkpoint=function, reset=lambda: resets.append(1))
        monkeypatch.setattr(parts.peers, "peers", lambda *a, peer=peer: [("deepspeed_offload", peer)])
        out = tmp_path / function.__name__ / "policies-tiny.csv"
        out.parent.mkdir()
        calls.clear()
        run(out, scratch)
        frame = load([out], SCHEMA)
        ran = frame[frame.variant == "deepspeed_offload"]
        assert (not ran.empty) == timed
        # Every block of both tiny models went through it (the first block of each, for the one
        # that raises at once).
        assert len({id(forward.__self__) for forward in calls}) == (4 if function is not failing else 2)
        if timed:
            assert (ran[ran.metric == "time"].groupby("dataset").size() == 3).all()
            continue
        why = load_provenance(out)["skipped"]["deepspeed_offload (llama-tiny)"]
        assert why.startswith("not bit-identical to keep" if function is wrong else "failed in its checked step")
        assert "keep" in set(frame.variant) and not list(scratch.iterdir())
    assert len(resets) == 4  # after each failed check: two models, two wrong peers


def test_peers_that_do_not_run_here_are_skipped_with_their_reason():
    notes = {"skipped": {}}
    found = parts.peers.peers({"min_bytes": 0}, "cpu", notes)
    assert found == []  # on a CPU neither peer runs, installed or not
    assert set(notes["skipped"]) == set(parts.PEERS) and all(notes["skipped"].values())
    notes = {"skipped": {}}
    assert parts.peers.peers({"min_bytes": 0}, "cpu", notes, wanted=()) == [] and notes["skipped"] == {}
    with pytest.raises(ValueError, match="exactly one"):
        parts.peers.Peer(hooks=lambda: None, checkpoint=lambda forward, *a: forward(*a))
    with pytest.raises(ValueError, match="exactly one"):
        parts.peers.Peer()


def test_models_tiny_runs_bert_and_t5_through_the_host_store(tmp_path, scratch):
    """Part models: the encoder-only and encoder-decoder families, every policy checked and timed."""
    out = tmp_path / "models-tiny.csv"
    entry(["llm_offload", "--part", "models", "--scale", "tiny", "--out", str(out), "--scratch-dir", str(scratch)])
    frame = load([out], SCHEMA)
    assert set(frame.dataset) == {"bert-tiny", "t5-tiny"} and set(frame.family) == {"bert", "t5"}
    expected = {"keep", "recompute", "save_on_cpu", "offload_all_host", "offload_adaptive_host", "planner_host"}
    for dataset, rows in frame.groupby("dataset"):
        assert set(rows.variant) - set(parts.PEERS) == expected, dataset
        held = rows[rows.metric == "activation_bytes"].groupby("variant").value.median()
        assert held["offload_all_host"] < held["keep"] and held["recompute"] < held["keep"]
    # T5 has an encoder and a decoder: its profile has a block of each.
    assert len(load_provenance(out)["models"]["t5-tiny"]["profile"]["saved_bytes"]) == 4


def test_a_peer_that_is_not_bit_identical_is_reported_not_timed(tmp_path, scratch, monkeypatch):
    """Another library's wrong gradients are its own result, recorded with the reason; the suite's
    own policies still run. (A wrong policy of the suite's raises: see above.)"""
    wrong = lambda: torch.autograd.graph.saved_tensors_hooks(  # noqa: E731
        lambda t: t, lambda t: t * 1.0001 if t.is_floating_point() else t
    )
    monkeypatch.setattr(parts.peers, "peers", lambda *a: [("torchtune_offload", parts.peers.Peer(hooks=wrong))])
    out = tmp_path / "policies-tiny.csv"
    run(out, scratch)
    frame = load([out], SCHEMA)
    assert "torchtune_offload" not in set(frame.variant) and "keep" in set(frame.variant)
    skipped = load_provenance(out)["skipped"]
    for dataset in ("gpt2-tiny", "llama-tiny"):
        assert "not bit-identical to keep" in skipped[f"torchtune_offload ({dataset})"]
    assert not list(scratch.iterdir())


def test_convergence_tiny_records_one_curve_per_policy_equal_to_keep(tmp_path, scratch):
    """Part convergence: keep, recompute and offloading to real files train the same steps from the
    same weights; every loss is finite, equal to keep's at every step, and the notes carry the
    losses the curves are read against."""
    out = tmp_path / "convergence-tiny.csv"
    entry(["llm_offload", "--part", "convergence", "--scale", "tiny", "--out", str(out), "--scratch-dir", str(scratch)])
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


def _convergence_params(**changes):
    params = {
        "seed": 0,
        "model": {"family": "llama", "preset": "tiny", "micro_batch": 2},
        "steps": 3,
        "learning_rate": 0.003,
        "variants": ["offload_all_host"],
        **HOST_STORE,
    }
    return params | changes


def test_convergence_stops_at_the_first_step_whose_loss_differs(scratch, monkeypatch):
    """An offloading path that brings a tensor back changed: the curve differs from keep's, and the
    part raises naming the step instead of recording two curves."""
    from systems.ssdtrain import HostStore

    class Drifting(HostStore):
        def get(self, key, out):
            done = super().get(key, out)
            done.result()
            out.reshape(-1).view(torch.uint8)[2] ^= 64  # a high mantissa bit of the first float32
            return done

    monkeypatch.setattr(parts, "HostStore", Drifting)
    rows = Rows()

    with pytest.raises(parts.NotBitIdentical, match="offload_all_host: the loss at step"):
        parts.convergence(_convergence_params(), rows, device="cpu", scratch_dir=scratch)
    assert not rows


def test_convergence_refuses_an_unknown_variant_before_training(scratch, monkeypatch):
    from harness.errors import UserError

    monkeypatch.setattr(parts, "build", lambda *a, **k: pytest.fail("trained before refusing"))
    for variant in ("offload_all_disk", "save_on_cpu", "offload_all_", "offload_all_file"):  # file: not in stores
        with pytest.raises(UserError, match=f"unknown variant '{variant}'"):
            parts.convergence(_convergence_params(variants=[variant]), None, device="cpu", scratch_dir=scratch)


def test_convergence_refuses_a_policy_that_moved_nothing(scratch):
    """min_bytes above every saved tensor: offload_all keeps everything, its curve equals keep's,
    and the part says the check tested nothing instead of recording it as offloading's."""
    from harness.errors import UserError

    rows = Rows()

    with pytest.raises(UserError, match="offload_all_host wrote or read nothing"):
        parts.convergence(_convergence_params(min_bytes=1 << 40), rows, device="cpu", scratch_dir=scratch)
    assert not rows


def test_shapes_runs_the_baselines_its_config_lists(tmp_path, scratch, monkeypatch):
    """Part shapes (GPU-only as configured) is the policies function with a narrower set of
    baselines: here recompute only, so save_on_cpu and the peers are not run."""
    from harness import config

    params = config.topic_params(config.load(), "llm_offload", "tiny")["policies"]
    params = params | {"models": [{"family": "llama", "preset": "tiny"}], "stores": ["host"], "emulated_gbps": []}
    params |= {"planned_stores": [], "baselines": ["recompute"]}
    rows = Rows()

    asked = []

    def stand_in_peers(params, device, notes, wanted=parts.PEERS):  # both peers, as on a GPU
        asked.append(set(wanted))
        hooks = lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)  # noqa: E731
        return [(name, parts.peers.Peer(hooks=hooks)) for name in parts.PEERS if name in wanted]

    monkeypatch.setattr(parts.peers, "peers", stand_in_peers)
    parts.shapes(params, rows, repeat=1, warmup=0, device="cpu", scratch_dir=scratch)
    assert {r["variant"] for r in rows} == {"keep", "recompute", "offload_all_host"}
    assert asked == [{"keep", "recompute"}]
    rows.clear()
    parts.shapes(
        params | {"baselines": ["deepspeed_offload"]}, rows, repeat=1, warmup=0, device="cpu", scratch_dir=scratch
    )
    assert {r["variant"] for r in rows} == {"keep", "offload_all_host", "deepspeed_offload"}


def test_micro_batches_can_check_a_slice_of_a_large_micro_batch(scratch, monkeypatch):
    """check_micro_batch: the bit-identity check runs on the first sequences of the micro-batch (the
    check's math attention can run out of memory where the timed kernels fit); the timed steps
    take the whole micro-batch."""
    checked, trained = [], []
    one_step = parts._one_step

    def counting_step(model, batch, policy):
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
    monkeypatch.setattr(parts, "_one_step", counting_step)
    monkeypatch.setattr(parts, "measure", counting_measure)
    params = {
        "seed": 0,
        "model": {"family": "llama", "preset": "tiny"},
        "global_batch": 4,
        "micro_batches": [4],
        **HOST_STORE,
        "check_micro_batch": 3,
    }
    rows = Rows()

    notes = parts.micro_batches(params, rows, repeat=1, warmup=0, device="cpu", scratch_dir=scratch)
    assert checked == [3, 3, 3, 3]  # the reference, keep, recompute, offload_all_host
    assert {len(ids) for ids in trained if ids is not None} == {4}
    assert notes["checked_micro_batch"] == {"4": 3}
    assert {r["variant"] for r in rows} == {"keep", "recompute", "offload_all_host"}
