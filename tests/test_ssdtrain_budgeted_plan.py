"""``offload()`` applying a ``Plan`` that runs some blocks under torch's activation memory budget
(a plan made over compiled blocks' profiles): those blocks are compiled by inductor at their budget
for the block's duration and put back after it; the others keep, offload or recompute as planned.
The losses and gradients equal, bit for bit, the same model with those blocks compiled at the same
budgets by hand (torch's own ``activation_memory_budget`` patch) and trained without offload(); a
block at a low budget saves fewer bytes than at budget 1. Plans that would apply something else
than they say are refused in one line."""

import re

import pytest
import torch
from test_ssdtrain_user_compile import assert_identical as assert_same_training
from test_ssdtrain_user_compile import compile_blocks, qwen3, train

from harness.errors import UserError
from systems.ssdtrain import HostStore, offload
from systems.ssdtrain.planning import KEEP, OFFLOAD, RECOMPUTE, Plan, budget_decision

LOW = 0.1  # the budget that makes torch's partitioner recompute most of a block's activations


def budgeted_plan(budget: float, offloaded: bool = False) -> Plan:
    """Block 0 offloaded, block 1 under ``budget`` (what it saves there offloaded too, given
    ``offloaded``), block 2 recomputed."""
    decisions = (OFFLOAD, budget_decision(budget, offloaded), RECOMPUTE)
    return Plan(decisions, 0.0, 0, 0.0, budgets=(None, budget, None))


def compiled_by_hand(model, index: int, budget: float) -> None:
    """Block ``index`` compiled with inductor under ``budget`` the way a user writes it: torch's
    config patched around the call that compiles (the first), left as it is afterwards."""
    layer = model.model.layers[index]
    compiled = torch.compile(layer.forward)

    def forward(*args, **kwargs):
        with torch._functorch.config.patch(activation_memory_budget=budget):
            return compiled(*args, **kwargs)

    layer.forward = forward


@pytest.fixture
def dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.full
@pytest.mark.parametrize("offloaded", [False, True], ids=["kept", "offloaded"])
def test_a_budgeted_plan_compiles_its_blocks_at_their_budgets_and_matches_them_compiled_by_hand(dynamo, offloaded):
    reference = qwen3()
    compiled_by_hand(reference, 1, LOW)
    want = train(reference)
    torch._dynamo.reset()  # the plan's compile starts from empty caches, as the reference's did

    model = qwen3()
    plan = budgeted_plan(LOW, offloaded)
    session = offload(model, store=HostStore(), policy=plan, min_bytes=0, always_read_back=True)
    got = train(model, session)
    assert_same_training(got, want)  # read back from the store: its bytes are checked too
    assert session.decisions == [OFFLOAD, budget_decision(LOW, offloaded), RECOMPUTE]
    assert session.stats.layers[0].offloaded_bytes > 0
    # What the budgeted block saves goes to the store where the plan says so, and only there.
    budgeted = session.stats.layers[1]
    assert (budgeted.offloaded_bytes > 0) == offloaded and budgeted.unique_bytes > 0
    # After the block, every block runs its class's forward again (eager).
    assert all("forward" not in vars(layer) for layer in model.model.layers)

    # The budget reached the partitioner: block 1 saves less at the low budget than at budget 1.
    saved = {}
    for budget in (LOW, 1.0):
        plan = Plan((KEEP, budget_decision(budget), KEEP), 0.0, 0, 0.0, budgets=(None, budget, None))
        with offload(qwen3(), policy=plan) as probe:
            ids = torch.randint(0, 96, (3, 17), generator=torch.Generator().manual_seed(5))
            probe.model(input_ids=ids, labels=ids).loss.backward()
        saved[budget] = probe.stats.layers[1].packed_bytes
    assert 0 < saved[LOW] < saved[1.0], saved


def test_plans_that_would_apply_something_else_are_refused_in_one_line(dynamo):
    model = qwen3()
    half = budget_decision(0.5)
    cases = [
        (Plan((KEEP, KEEP, KEEP), 0.0, 0, 0.0, budgets=(None, 0.5, None)), "decides 'keep' for a block it budgets"),
        (Plan((KEEP, half, KEEP), 0.0, 0, 0.0), "decides 'budget_0.5' for a block; decisions are one of"),
        (
            Plan((KEEP, half, KEEP), 0.0, 0, 0.0, budgets=(None, 0.25, None)),
            "(expected 'budget_0.25' or 'offload_budget_0.25')",
        ),
        (Plan((KEEP, KEEP, KEEP), 0.0, 0, 0.0, budgets=(None, None)), "2 budgets for the model's 3 blocks"),
        (Plan((KEEP, "budget_2", KEEP), 0.0, 0, 0.0, budgets=(None, 2.0, None)), "activation_budget must be in (0, 1]"),
        (Plan((KEEP, "offload_budget_0.5", KEEP), 0.0, 0, 0.0, budgets=(None, 0.5, None)), "offloads blocks: give"),
        (Plan((KEEP, "offload_budget_0.5", KEEP), 0.0, 0, 0.0), "decides 'offload_budget_0.5' for a block; decisions"),
    ]
    for plan, message in cases:
        with pytest.raises(UserError, match=re.escape(message)) as err:
            offload(model, policy=plan)
        assert "\n" not in str(err.value)
    compile_blocks(model, "method", backend="eager")
    already = r"block 1 under activation memory budget 0\.5, and the block is compiled already"
    with pytest.raises(UserError, match=already):
        offload(model, policy=Plan((KEEP, half, KEEP), 0.0, 0, 0.0, budgets=(None, 0.5, None)))


def test_a_budgeted_block_that_drops_out_is_refused_when_the_block_is_entered(dynamo):
    model = qwen3()
    model.model.layers[1].self_attn.dropout = torch.nn.Dropout(0.1)  # a module, so the check sees it
    session = offload(model, policy=Plan((KEEP, budget_decision(0.5), KEEP), 0.0, 0, 0.0, budgets=(None, 0.5, None)))
    with pytest.raises(UserError, match="block 1 drops out"), session:
        pass
    assert all("forward" not in vars(layer) for layer in model.model.layers)
