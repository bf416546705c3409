"""The policies on blocks compiled by torch.compile: compiled keep and torch's activation memory
budget give keep's loss and gradients within the tolerance and hold no more than compiled keep,
the saved-tensor hooks see what a compiled block saves (so offload_all on compiled blocks offloads
it, bit-identical to compiled keep), the budget is checked, and the variants' labels and columns
carry it. The compiling tests are ``full``: an inductor compile takes 5-50 s on 2 CPU cores."""

import copy

import pytest
import torch
import transformers

from harness.errors import UserError
from systems.ssdtrain import POLICIES, STORES, HostStore
from systems.ssdtrain.policies._compiled import CompiledBlocks, check_budget, inductor_backend
from tests.kept_rows import Rows
from workloads.llm_offload import parts
from workloads.llm_offload import variants as choose
from workloads.llm_offload.checking import NotBitIdentical, check_close, check_identical, one_step, rounding_spread


def tiny_qwen3(seed=0):
    """A 2-layer Qwen3 of hidden 32 from transformers' config class, random weights."""
    config = transformers.Qwen3Config(
        vocab_size=96, hidden_size=32, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, use_cache=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    return transformers.Qwen3ForCausalLM(config)


def batch_of(seed=1, rows=3, tokens=23):
    ids = torch.randint(0, 96, (rows, tokens), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "labels": ids}


# -- no compile: fast ---------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [0, -0.5, 1.5, float("nan"), "0.5", True])
def test_a_budget_outside_zero_to_one_is_refused_in_one_line(budget):
    model = tiny_qwen3()
    with pytest.raises(UserError) as err:
        POLICIES["torch_budget"].build(model, activation_budget=budget)
    assert "activation_budget" in str(err.value) and "\n" not in str(err.value)
    assert check_budget(1) == 1.0 and check_budget(None) is None


def test_a_budget_on_eager_blocks_is_refused():
    with pytest.raises(UserError, match="applies to compiled blocks"):
        POLICIES["keep"].build(tiny_qwen3(), activation_budget=0.5)


def test_compiled_blocks_are_made_once_and_put_back():
    """One backend per budget (Dynamo reuses compiled code only for the same backend); the blocks'
    own forwards (and another wrapper's) are back after a step, nothing compiled by building."""
    assert inductor_backend(0.5) is inductor_backend(0.5) is not inductor_backend(None)
    model = tiny_qwen3()
    layers = list(model.model.layers)
    other = layers[1].forward
    layers[1].forward = other  # an instance forward of someone else's
    blocks = CompiledBlocks(layers, 0.3)
    with blocks.installed():
        assert [vars(layer)["forward"].run for layer in layers] == blocks.forwards
        # A copy made meanwhile (the best model kept, an EMA started) runs its own weights: the
        # forward it gets is the one the block had before, bound to the copy, not the compiled one.
        copies = copy.deepcopy(layers[:2])
    assert "forward" not in vars(layers[0]) and vars(layers[1])["forward"] is other
    assert vars(copies[0])["forward"].__self__ is copies[0] and vars(copies[1])["forward"].__self__ is copies[1]
    assert vars(copies[0])["forward"].__func__ is type(layers[0]).forward


class DropsOut(torch.nn.Module):
    def __init__(self, p: float):
        super().__init__()
        self.linear, self.drop = torch.nn.Linear(8, 8), torch.nn.Dropout(p)

    def forward(self, x):
        return self.drop(self.linear(x))


def test_a_block_that_drops_out_is_refused_under_a_budget_below_one():
    """torch's budgeted partitioner recomputes dropout in backward with new random numbers: the
    gradients would be another mask's. Refused in training, before anything compiles; a block in
    eval(), of dropout 0, or without a budget (torch's default partitioner keeps random ops' masks)
    runs."""
    blocks = [DropsOut(0.1), DropsOut(0.0)]
    budgeted = CompiledBlocks(blocks, 0.5)
    message = r"block 0 drops out \(drop, p=0.1\) in training, and under activation_budget 0.5 torch recomputes"
    with pytest.raises(UserError, match=message):
        with budgeted.installed():
            pytest.fail("installed a budgeted block that drops out")
    assert all("forward" not in vars(block) for block in blocks)  # nothing left installed
    blocks[0].eval()
    with budgeted.installed():
        pass
    blocks[0].train()
    for fine in (CompiledBlocks(blocks, None), CompiledBlocks(blocks, 1.0), CompiledBlocks(blocks[1:], 0.2)):
        with fine.installed():
            pass


def test_variant_labels_and_columns_carry_the_budget():
    variant = choose.Variant(POLICIES["torch_budget"], setting=(("activation_budget", 0.5),))
    assert variant.label == "torch_budget_0.5" and variant.role == "peer"
    assert variant.columns({}) == {
        "policy": "torch_budget",
        "store_emulated": False,
        "compiled": True,
        "activation_budget": 0.5,
    }
    offload = choose.Variant(POLICIES["offload_all_compiled"], choose.StoreSetup(STORES["host"]))
    assert (
        offload.label == "offload_all_compiled_host" and offload.columns({"keep_last": 1, "min_bytes": 0})["compiled"]
    )
    params = {"budgets": [0.2, 1.0]}
    labels = [v.label for v in choose.variants([POLICIES["keep"], POLICIES["torch_budget"]], [], params)]
    assert labels == ["keep", "torch_budget_0.2", "torch_budget_1"]


def test_compiled_policies_run_only_where_compiled_is_set_and_with_their_reference():
    notes = {"skipped": {}}
    chosen = [e.name for e in choose.policies({}, "cpu", notes)]
    assert not {"compiled_keep", "torch_budget", "offload_all_compiled"} & set(chosen)
    assert "compiled is false" in notes["skipped"]["compiled"]
    with pytest.raises(UserError, match="set compiled: true"):
        choose.policies({"compare": ["torch_budget"]}, "cpu", {"skipped": {}})
    chosen = choose.policies({"compiled": True, "compare": ["offload_all", "offload_all_compiled"]}, "cpu", notes)
    assert [e.name for e in chosen] == ["keep", "compiled_keep", "offload_all", "offload_all_compiled"]
    with pytest.raises(UserError, match="torch_budget: list budgets"):
        choose.variants(chosen + [POLICIES["torch_budget"]], [], {"compiled": True, "compare": ["torch_budget"]})


def test_offloading_on_compiled_blocks_runs_with_the_compiled_stores():
    host, emulated = STORES["host"], STORES["emulated"]
    setups = [choose.StoreSetup(host), *(choose.StoreSetup(emulated, (("gbps", g),)) for g in (2.0, 28.0))]
    params = {"compiled": True, "compiled_stores": ["emulated_28gbps"]}
    notes = {"skipped": {}}
    chosen = choose.policies(params | {"compare": ["offload_all", "offload_all_compiled"]}, "cpu", notes)
    compiled = choose.planned_setups(params, setups, notes, key="compiled_stores")
    labels = [v.label for v in choose.variants(chosen, setups, params, compiled)]
    assert labels == [
        "keep",
        "compiled_keep",
        "offload_all_host",
        "offload_all_emulated_2gbps",
        "offload_all_emulated_28gbps",
        "offload_all_compiled_emulated_28gbps",
    ]
    with pytest.raises(UserError, match="compiled_stores names 'file'"):
        choose.planned_setups({"compiled_stores": ["file"]}, setups, notes, key="compiled_stores")


def test_check_close_passes_rounding_and_catches_a_change():
    torch.manual_seed(3)
    grads = {"w": torch.randn(7, 5), "b": torch.randn(5)[1:]}  # a view with an offset
    reference = (torch.tensor(2.5), grads)
    rounded = (torch.tensor(2.5), {n: g * (1 + 1e-6 * torch.randn_like(g)) for n, g in grads.items()})
    assert 0 < check_close("rounded", reference, rounded, torch.float32) < 1e-4
    with pytest.raises(NotBitIdentical):
        check_identical("rounded", reference, rounded)
    changed = (torch.tensor(2.5), grads | {"b": grads["b"] * 1.01})
    with pytest.raises(NotBitIdentical, match="b differs from keep's by 0.01"):
        check_close("changed", reference, changed, torch.float32)
    assert check_close("changed", reference, changed, torch.bfloat16) == pytest.approx(0.01, rel=1e-5)
    with pytest.raises(NotBitIdentical, match="loss differs"):
        check_close("nan", reference, (torch.tensor(float("nan")), grads), torch.bfloat16)
    with pytest.raises(NotBitIdentical, match="missing or extra"):
        check_close("fewer", reference, (torch.tensor(2.5), {"w": grads["w"]}), torch.float32)


def test_relative_difference_in_pieces_is_the_whole_norm(monkeypatch):
    """The difference is summed piece by piece (no float64 copy of a whole gradient): the same
    number as the norms of the whole tensors, on a strided view, and infinite for a NaN anywhere."""
    from workloads.llm_offload import checking

    monkeypatch.setattr(checking, "PIECE", 7)
    torch.manual_seed(5)
    reference = torch.randn(11, 13, dtype=torch.float64)[:, ::2]
    value = reference + 1e-3 * torch.randn_like(reference)
    want = (torch.linalg.vector_norm(value - reference) / torch.linalg.vector_norm(reference)).item()
    assert checking.relative_difference(value.bfloat16().float(), reference.float()) == pytest.approx(
        (torch.linalg.vector_norm(value.bfloat16().double() - reference.float().double())
         / torch.linalg.vector_norm(reference.float().double())).item(), rel=1e-12
    )  # fmt: skip
    assert checking.relative_difference(value, reference) == pytest.approx(want, rel=1e-12)
    poisoned = value.clone()
    poisoned[-1, -1] = float("nan")  # in the last piece
    assert checking.relative_difference(poisoned, reference) == float("inf")
    assert checking.relative_difference(torch.ones(3), torch.zeros(3)) == pytest.approx(3**0.5)
    with pytest.raises(NotBitIdentical, match="shape"):
        checking.relative_difference(torch.ones(3), torch.ones(4))


@pytest.mark.parametrize("shape", [(9, 10), (4, 3, 5), (2, 3, 4, 2), (40,), ()])
def test_pieces_of_a_strided_tensor_are_cut_before_they_are_copied(monkeypatch, shape):
    """Every piece holds at most PIECE elements, also of a transposed (non-contiguous) tensor,
    and the pieces of two layouts of one tensor line up and cover it in order."""
    from workloads.llm_offload import checking

    monkeypatch.setattr(checking, "PIECE", 7)
    torch.manual_seed(7)
    contiguous = torch.randn(shape)
    transposed = contiguous.mT.contiguous().mT if contiguous.dim() >= 2 else contiguous
    assert contiguous.dim() < 2 or not transposed.is_contiguous()
    pieces = list(checking._pieces(transposed, contiguous))
    assert all(a.numel() <= 7 and torch.equal(a, b) for a, b in pieces)
    for piece, _ in pieces:  # a view of the tensor itself, or a copy of one piece, never of the whole
        storage = piece.untyped_storage()
        assert storage.data_ptr() == transposed.untyped_storage().data_ptr() or storage.nbytes() <= 7 * 4
    assert torch.equal(torch.cat([a for a, _ in pieces]), contiguous.reshape(-1))


def test_equal_in_pieces_finds_one_changed_element_anywhere(monkeypatch):
    """Bit equality piece by piece (no temporary the size of a whole gradient): one element changed
    in any piece, a strided view, another dtype or shape all differ; equal tensors, empty included, do not."""
    from workloads.llm_offload import checking

    monkeypatch.setattr(checking, "PIECE", 7)
    torch.manual_seed(6)
    reference = torch.randn(9, 10)[:, 1::3]  # strided, with an offset: 27 elements, 4 pieces
    assert checking.equal(reference.clone(), reference)
    assert checking.equal(torch.empty(0, 3), torch.empty(0, 3))
    row = torch.randn(1, 9)
    assert checking.equal(row.expand(5, 9), row.repeat(5, 1))  # an expanded view: 45 elements, 7 pieces
    assert not checking.equal(row.expand(5, 9), torch.cat([row.repeat(4, 1), row + 1]))
    for index in [(0, 0), (3, 1), (8, 2)]:  # first, a middle and the last piece
        changed = reference.clone()
        changed[index] = torch.nextafter(changed[index], torch.tensor(float("inf")))
        assert not checking.equal(changed, reference)
    assert not checking.equal(reference.double(), reference.double().float().double() + 1e-12)
    assert not checking.equal(reference.double(), reference)
    assert not checking.equal(reference.reshape(-1), reference)
    nan = reference.clone()
    nan[4, 0] = float("nan")
    assert not checking.equal(nan, nan.clone())  # as torch.equal: NaN is equal to nothing


def test_one_step_takes_the_gradients_from_the_model():
    """The step's gradients are handed over, not copied (a check under a memory cap cannot hold
    another set): the model is left without gradients, and the next step starts from none."""
    model, batch = tiny_qwen3(seed=8), batch_of(seed=8)
    loss, grads = one_step(model, batch)
    assert all(parameter.grad is None for parameter in model.parameters())
    again_loss, again = one_step(model, batch)
    assert torch.equal(loss, again_loss) and grads.keys() == again.keys()
    assert all(torch.equal(grads[name], again[name]) for name in grads)  # not accumulated into
    assert all(grads[name].data_ptr() != again[name].data_ptr() for name in grads)


def test_check_close_allows_twice_the_spread_between_eager_kernels_and_no_more():
    """Where keep's own step moves between two eager kernels (math and fused attention) by more
    than the tolerance, a compiled step may differ by twice that, per gradient, and by no more."""
    torch.manual_seed(4)
    grads = {"w": torch.randn(6, 3), "b": torch.randn(9)[::2]}  # a strided view
    reference = (torch.tensor(1.25), grads)
    changed = (torch.tensor(1.25), grads | {"b": grads["b"] * 1.01})
    assert check_close("compiled", reference, changed, torch.float32, spread={"b": 0.006}) == pytest.approx(
        0.01, rel=1e-5
    )
    with pytest.raises(NotBitIdentical, match=r"b differs from keep's by 0.01 .*above the 0.008 allowed \(2 x keep's"):
        check_close("compiled", reference, changed, torch.float32, spread={"b": 0.004})
    with pytest.raises(NotBitIdentical, match="b differs"):  # another gradient's spread does not cover b
        check_close("compiled", reference, changed, torch.float32, spread={"w": 0.5})
    with pytest.raises(NotBitIdentical, match="loss differs"):
        check_close("nan", reference, (torch.tensor(float("nan")), grads), torch.bfloat16, spread={"loss": 1.0})
    model = torch.nn.Linear(3, 2)
    assert rounding_spread(model, {}, reference, "cpu") == {}  # a CPU runs the same kernels twice


# -- compiling: full ----------------------------------------------------------------------------


def saved_by_hooks(model, batch):
    """The tensors and bytes the saved-tensor hooks see in one forward (then backward)."""
    seen = []

    def pack(tensor):
        seen.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(**batch).loss
    loss.backward()
    return len(seen), sum(seen)


@pytest.mark.full
def test_the_hooks_see_what_a_compiled_block_saves():
    """A compiled block's saved tensors pass through saved-tensor hooks entered around its call:
    the hooks see tensors from the compiled blocks, fewer than the eager blocks save (inductor
    saves fused intermediates), and fewer still under a budget (it recomputes some)."""
    model, batch = tiny_qwen3(), batch_of()
    eager = saved_by_hooks(model, batch)
    outside = saved_by_hooks_outside_layers(model, batch)
    counts = {}
    for budget in (None, 0.2):
        blocks = CompiledBlocks(list(model.model.layers), budget)
        with blocks.installed():
            counts[budget] = saved_by_hooks(model, batch)
    assert outside[1] < counts[0.2][1] < counts[None][1] < eager[1]
    assert counts[None][0] < eager[0]


def saved_by_hooks_outside_layers(model, batch):
    """What the hooks see with the blocks' own saves hidden: the part outside the blocks."""
    layers = list(model.model.layers)

    def no_saves(forward):
        def run(*args, **kwargs):
            with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                return forward(*args, **kwargs)

        return run

    for layer in layers:
        layer.forward = no_saves(layer.forward)
    try:
        return saved_by_hooks(model, batch)
    finally:
        for layer in layers:
            del layer.forward


@pytest.mark.full
def test_budget_and_offloading_on_compiled_blocks_match_keep():
    """Budget 0.5 gives eager keep's loss and gradients within the tolerance and holds no more than
    compiled keep; offload_all on compiled blocks is bit-identical to compiled keep and holds less,
    what it wrote having come back from the store."""
    model, batch = tiny_qwen3(), batch_of()
    keep = one_step(model, batch)
    built = {}
    results = {}
    with HostStore() as store:
        for name, knobs in [
            ("compiled_keep", {}),
            ("torch_budget", {"activation_budget": 0.5}),
            ("offload_all_compiled", {"store": store}),
        ]:
            built[name] = POLICIES[name].build(model, min_bytes=0, **knobs)
            with built[name].reading_back():
                results[name] = one_step(model, batch, built[name])
        held = {name: policy.history[-1]["activation_bytes"] for name, policy in built.items()}
        written = built["offload_all_compiled"].history[-1]
        for policy in built.values():
            policy.close()
    assert check_close("compiled_keep", keep, results["compiled_keep"], torch.float32) < 1e-4
    assert check_close("torch_budget", keep, results["torch_budget"], torch.float32) < 1e-4
    check_close("torch_budget", results["compiled_keep"], results["torch_budget"], torch.float32, "compiled keep")
    check_identical("offload_all_compiled", results["compiled_keep"], results["offload_all_compiled"], "compiled keep")
    assert held["torch_budget"] <= held["compiled_keep"] and held["offload_all_compiled"] < held["compiled_keep"]
    assert written["bytes_written"] > 0 and written["bytes_read"] == written["bytes_written"]


@pytest.mark.full
def test_the_part_runs_compiled_policies_against_compiled_keep(scratch):
    params = {
        "seed": 0,
        "models": [{"family": "llama", "preset": "tiny"}],
        "stores": ["host"],
        "emulated_gbps": [],
        "keep_last": 1,
        "min_bytes": 0,
        "prefetch": 1,
        "file_threads": 1,
        "file_block_mib": 1,
        "compiled": True,
        "budgets": [0.5],
        "compare": ["torch_budget", "offload_all_compiled"],
    }
    rows = Rows()
    notes = parts.policies(params, rows, repeat=1, warmup=1, device="cpu", scratch_dir=scratch)
    timed = {row["variant"]: row["config"] for row in rows if "metric" not in row}
    assert list(timed) == ["keep", "compiled_keep", "torch_budget_0.5", "offload_all_compiled_host"]
    assert timed["torch_budget_0.5"]["activation_budget"] == 0.5 and timed["compiled_keep"]["compiled"]
    assert "compiled" not in timed["keep"]
    model_notes = notes["models"]["llama-tiny"]
    assert model_notes["deviation_from_keep"]["compiled_keep"] < 1e-4
    assert model_notes["deviation_from_compiled_keep"]["torch_budget_0.5"] < 1e-4
    held = {r["variant"]: r["value"] for r in rows if r.get("metric") == "activation_bytes"}
    assert held["torch_budget_0.5"] <= held["compiled_keep"] < held["keep"]


def held_when_forward_ends(model, batch, policy):
    """Bytes the allocator holds when forward ends, above what the step starts from: the saved
    activations and the logits. (The step's overall peak is not used: on a tiny model it is set by
    the backward's transients, which recomputation raises.)"""
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    with policy.step():
        loss = model(**batch).loss
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - start
        loss.backward()
    return held


@pytest.mark.gpu
def test_on_a_gpu_the_budget_lowers_the_measured_activation_peak_within_bf16_tolerance():
    """bf16 on a GPU: compiled keep and budget 0.2 within the bf16 tolerance of eager keep (checked
    with deterministic kernels, as the parts check), the memory the budget holds when forward ends
    (the allocator's, above what the step starts from) below compiled keep's, offloading to pinned host
    memory on compiled blocks bit-identical to compiled keep."""
    from workloads.llm_offload.checking import deterministic

    model = tiny_qwen3().to("cuda", torch.bfloat16)
    batch = {name: tensor.cuda() for name, tensor in batch_of(rows=8, tokens=257).items()}
    with deterministic("cuda"):
        keep = one_step(model, batch)
    peaks, results = {}, {}
    with HostStore() as store:
        for name, knobs in [
            ("compiled_keep", {}),
            ("torch_budget", {"activation_budget": 0.2}),
            ("offload_all_compiled", {"store": store}),
        ]:
            policy = POLICIES[name].build(model, min_bytes=0, **knobs)
            with deterministic("cuda"), policy.reading_back():
                one_step(model, batch, policy)  # compiles
                peaks[name] = held_when_forward_ends(model, batch, policy)
                results[name] = one_step(model, batch, policy)
            policy.close()
    check_close("compiled_keep", keep, results["compiled_keep"], torch.bfloat16)
    check_close("torch_budget", results["compiled_keep"], results["torch_budget"], torch.bfloat16, "compiled keep")
    check_identical("offload_all_compiled", results["compiled_keep"], results["offload_all_compiled"], "compiled keep")
    assert peaks["torch_budget"] < peaks["compiled_keep"]


# -- the planner over compiled blocks ------------------------------------------------------------


def test_the_planner_on_compiled_blocks_is_registered_as_a_compiled_planned_policy():
    entry = POLICIES["planned_compiled"]
    assert entry.compiled and entry.exact and entry.uses_store and entry.planner is not None
    with pytest.raises(UserError, match="set compiled: true"):
        choose.policies({"compare": ["planned_compiled"]}, "cpu", {"skipped": {}})
    with pytest.raises(UserError, match="does not plan for"):
        choose.policies({"compiled": True, "compare": ["planned_compiled"]}, "cpu", {"skipped": {}}, plans=False)
    chosen = choose.policies({"compiled": True, "compare": ["planned_compiled"]}, "cpu", {"skipped": {}})
    assert [e.name for e in chosen] == ["keep", "compiled_keep", "planned_compiled"]


def compiled_profile(model, batch):
    from systems.ssdtrain import planning

    def step():
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()

    layers = list(model.model.layers)
    return planning.profile(model, layers, step, "cpu", within=CompiledBlocks(layers).installed)


# How close a plan's predicted activation bytes come to what its step holds, for plans whose
# offloaded writes end at once (a host store on a CPU, planned for a fast store): the cost model
# counts a recomputed block's inputs, while checkpointing also holds one tensor of the block's
# output size per recomputed block, which on a block of hidden 32 is 5-15% of what the step holds
# (on the paper's shapes a block saves some thirty such tensors).
PREDICTED_BYTES_TOLERANCE = 0.1


@pytest.mark.full
def test_a_plan_over_compiled_blocks_predicts_what_its_step_holds_and_changes_what_is_saved():
    """The profile of the compiled blocks is of what their compiled forwards save (less than the
    eager blocks save), each plan applied to the compiled blocks is bit-identical to compiled keep,
    holds what the plan predicted within the tolerance, and offloads or recomputes what it says:
    recomputing a block holds less than keeping it, offloading it writes its bytes to the store."""
    from systems.ssdtrain import planning

    model, batch = tiny_qwen3(), batch_of()
    profiles, _, fixed = compiled_profile(model, batch)

    def eager_step():
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()

    eager, _, eager_fixed = planning.profile(model, list(model.model.layers), eager_step, "cpu")
    assert all(0 < c.saved_bytes < e.saved_bytes for c, e in zip(profiles, eager, strict=True))
    assert fixed == eager_fixed  # outside the blocks nothing is compiled
    keep_policy = POLICIES["compiled_keep"].build(model, min_bytes=0)
    reference = one_step(model, batch, keep_policy)
    kept = keep_policy.history[-1]["activation_bytes"]
    assert kept == sum(p.saved_bytes for p in profiles) + fixed  # the profile is what compiled keep holds
    keep_policy.close()
    held = {}
    with HostStore() as store:
        for decisions in [("recompute", "keep"), ("offload", "recompute"), ("offload", "keep")]:
            plan = planning.predict(profiles, decisions, 1e12, 1.0, fixed_bytes=fixed)
            policy = POLICIES["planned_compiled"].build(model, store=store, plan=plan, min_bytes=0)
            with policy.reading_back():
                result = one_step(model, batch, policy)
            policy.close()
            check_identical(f"planned_compiled {decisions}", reference, result, "compiled keep")
            counts = held[decisions] = policy.history[-1]
            measured = counts["activation_bytes"]
            assert abs(plan.predicted_activation_bytes - measured) <= PREDICTED_BYTES_TOLERANCE * measured, decisions
            assert counts["bytes_written"] == (profiles[0].saved_bytes if decisions[0] == "offload" else 0)
    assert held[("recompute", "keep")]["activation_bytes"] < kept
    assert held[("offload", "keep")]["activation_bytes"] == kept - profiles[0].saved_bytes
    assert held[("offload", "recompute")]["activation_bytes"] < held[("offload", "keep")]["activation_bytes"]


@pytest.mark.full
def test_the_part_plans_over_compiled_blocks_and_checks_the_plan_against_compiled_keep(scratch):
    """Part policies with planned_compiled: the compiled blocks profiled apart from the eager ones,
    a plan within the budget of compiled keep's bytes, its step bit-identical to compiled keep (or
    the part would stop) and its prediction recorded beside what it held."""
    params = {
        "seed": 0,
        "models": [{"family": "llama", "preset": "tiny"}],
        "stores": ["host"],
        "emulated_gbps": [],
        "keep_last": 1,
        "min_bytes": 0,
        "prefetch": 1,
        "file_threads": 1,
        "file_block_mib": 1,
        "compiled": True,
        "planner_budget": 0.5,
        "planned_stores": ["host"],
        "compiled_stores": ["host"],
        "compare": ["planner", "planned_compiled"],
        "planner_budgets": [0.2],
        "frontier_budgets": [0.25],
    }
    rows = Rows()
    notes = parts.policies(params, rows, repeat=1, warmup=0, device="cpu", scratch_dir=scratch)
    timed = {row["variant"]: row["config"] for row in rows if "metric" not in row}
    assert list(timed) == [
        "keep",
        "compiled_keep",
        "planner_host",
        "planner_0.25_host",
        "planned_compiled_host",
        "planned_compiled_0.25_host",
    ]
    config = timed["planned_compiled_host"]
    assert config["compiled"] and config["budget_fraction"] == 0.5 and "layers_budgeted" in config
    # The frontier's plan, checked against compiled keep like the other, within its own budget.
    assert timed["planned_compiled_0.25_host"]["budget_fraction"] == 0.25
    model_notes = notes["models"]["llama-tiny"]
    eager, compiled = model_notes["profile"], model_notes["profile_compiled"]
    at_budget = compiled["at_budget_0.2"]  # the compiled blocks profiled at the planner's budget too
    assert all(0 < a < k for a, k in zip(at_budget["saved_bytes"], compiled["saved_bytes"], strict=True))
    assert sum(compiled["saved_bytes"]) < sum(eager["saved_bytes"])
    assert model_notes["plans_compiled"]["host"]["planned_compiled"] != ["keep"] * len(compiled["saved_bytes"])
    values = {(r["variant"], r["metric"]): r["value"] for r in rows if "metric" in r}
    held = values[("planned_compiled_host", "activation_bytes")]
    predicted = values[("planned_compiled_host", "predicted_activation_bytes")]
    assert held < values[("compiled_keep", "activation_bytes")]
    assert abs(predicted - held) <= PREDICTED_BYTES_TOLERANCE * held
    assert predicted <= compiled["planner_budget_bytes"]


@pytest.mark.gpu
def test_on_a_gpu_a_plan_over_compiled_blocks_matches_compiled_keep_and_holds_less():
    """bf16 on a GPU: the compiled blocks profiled with CUDA events, a plan that recomputes one
    block and offloads the other to pinned host memory bit-identical to compiled keep under
    deterministic kernels, and holding less than it when forward ends."""
    from systems.ssdtrain import planning
    from workloads.llm_offload.checking import deterministic

    model = tiny_qwen3().to("cuda", torch.bfloat16)
    batch = {name: tensor.cuda() for name, tensor in batch_of(rows=8, tokens=257).items()}
    layers = list(model.model.layers)

    def step():
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()

    profiles, _, fixed = planning.profile(model, layers, step, "cuda", within=CompiledBlocks(layers).installed)
    assert all(p.forward_seconds > 0 and p.saved_bytes > p.input_bytes for p in profiles)
    plan = planning.predict(profiles, ("offload", "recompute"), 50e9, 1.0, fixed_bytes=fixed)
    held, results = {}, {}
    with HostStore() as store:
        for name, knobs in [("compiled_keep", {}), ("planned_compiled", {"store": store, "plan": plan})]:
            policy = POLICIES[name].build(model, min_bytes=0, keep_last=0, **knobs)
            with deterministic("cuda"), policy.reading_back():
                one_step(model, batch, policy)
                held[name] = held_when_forward_ends(model, batch, policy)
                results[name] = one_step(model, batch, policy)
            policy.close()
    check_identical("planned_compiled", results["compiled_keep"], results["planned_compiled"], "compiled keep")
    assert held["planned_compiled"] < held["compiled_keep"]


@pytest.mark.full
def test_a_plan_with_budgeted_blocks_compiles_once_per_budget_and_holds_what_it_predicts(monkeypatch):
    """The planner's fourth choice: a block compiled under an activation memory budget. Profiling
    the blocks at a budget compiles as often as profiling them kept (once for both blocks, not once
    per block); a plan that mixes that budget with kept blocks then compiles nothing new; its step
    is within the tolerance of compiled keep and holds what the plan predicted (the budget's saved
    bytes as profiled), less than compiled keep."""
    import torch._inductor.compile_fx as inductor

    from systems.ssdtrain import planning

    torch._dynamo.reset()  # no code compiled by an earlier test is reused: every compile is counted
    compiles = []
    real = inductor.compile_fx
    monkeypatch.setattr(inductor, "compile_fx", lambda *a, **k: compiles.append(1) or real(*a, **k))
    model, batch = tiny_qwen3(seed=3), batch_of(seed=4, rows=2, tokens=19)
    layers = list(model.model.layers)

    def step():
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()

    profiles, seconds, fixed = planning.profile(model, layers, step, "cpu", within=CompiledBlocks(layers).installed)
    kept_compiles = len(compiles)
    at, at_seconds, _ = planning.profile(model, layers, step, "cpu", within=CompiledBlocks(layers, 0.2).installed)
    assert len(compiles) == 2 * kept_compiles > 0
    profiles = planning.with_budgets(profiles, seconds, {0.2: (at, at_seconds)})
    assert all(p.alternatives[0].saved_bytes == a.saved_bytes < p.saved_bytes for p, a in zip(profiles, at))
    keep_policy = POLICIES["compiled_keep"].build(model, min_bytes=0)
    reference = one_step(model, batch, keep_policy)
    kept = keep_policy.history[-1]["activation_bytes"]
    keep_policy.close()
    with HostStore() as store:
        for decisions in [("budget_0.2", "keep"), ("keep", "budget_0.2"), ("budget_0.2", "budget_0.2")]:
            before = len(compiles)
            plan = planning.predict(profiles, decisions, 1e12, seconds, fixed_bytes=fixed)
            policy = POLICIES["planned_compiled"].build(model, store=store, plan=plan, min_bytes=0)
            result = one_step(model, batch, policy)
            policy.close()
            assert len(compiles) == before, decisions  # the budget's compiled code is reused
            check_close(f"planned_compiled {decisions}", reference, result, torch.float32, "compiled keep")
            held = policy.history[-1]["activation_bytes"]
            assert held == plan.predicted_activation_bytes < kept, decisions
    # The part's variant of such a plan is checked within the tolerance, not bit for bit.
    variant = choose.Variant(POLICIES["planned_compiled"], None, plan)
    assert not variant.exact and variant.columns({"keep_last": 1, "min_bytes": 0})["layers_budgeted"] == 2
