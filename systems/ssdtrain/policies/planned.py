"""The planned policies: per block keep, offload or recompute, as a plan made from a profile of
the model and the store's bandwidth says (systems/ssdtrain/planning.py).

- ``offload_adaptive``: SSDTrain's adaptive rule, the longest run of leading blocks whose writes
  end by the end of forward offloaded, the rest kept.
- ``planner``: beyond the paper, the choice per block with the smallest predicted step time whose
  activation bytes fit a budget.
- ``planned_compiled``: the planner on blocks compiled by ``torch.compile``, planned from a profile
  of the compiled blocks (what their compiled forwards save, how long they run). A recomputed
  compiled block is the compiled block under ``torch.utils.checkpoint``: its compiled forward runs
  again in backward, so the step computes what compiled keep computes, bit for bit. Where the
  profile has the blocks at torch's activation memory budgets too (``planning.with_budgets``), a
  block may also run compiled under one of them, what it saves there kept or offloaded; such a
  step recomputes inside the compiled backward and is checked within a tolerance, as
  ``torch_budget`` is.
"""

from harness.errors import UserError
from systems.ssdtrain import planning
from systems.ssdtrain.engine import KEEP, OFFLOAD
from systems.ssdtrain.policies import OffloaderPolicy, PolicyEntry, register


class Planned(OffloaderPolicy):
    """The setting's plan, one decision per block."""

    def __init__(self, setting):
        if len(setting.plan.decisions) != len(setting.layers):
            raise ValueError(f"the plan has {len(setting.plan.decisions)} decisions for {len(setting.layers)} blocks")
        if setting.plan.budgeted and not setting.compiled:
            raise UserError("the plan runs blocks under an activation memory budget: a policy on compiled blocks")
        super().__init__(setting)

    def decide(self, layer):
        return OFFLOAD if planning.offloads(self.setting.plan.decisions[layer]) else KEEP

    def recomputed(self):
        decisions = self.setting.plan.decisions
        return [layer for layer, d in zip(self.setting.layers, decisions) if d == planning.RECOMPUTE]

    def layer_budgets(self):
        plan = self.setting.plan  # read each step: a part may give the policy another plan
        return list(plan.budgets) if plan.budgeted else None


def _adaptive(
    profiles, bandwidth, keep_seconds, *, keep_last, budget_bytes, fixed_bytes, peak_budget_bytes=None, prefetch=1
):
    return planning.adaptive(profiles, bandwidth, keep_seconds, keep_last, fixed_bytes=fixed_bytes, prefetch=prefetch)


def _planner(
    profiles, bandwidth, keep_seconds, *, keep_last, budget_bytes, fixed_bytes, peak_budget_bytes=None, prefetch=1
):
    return planning.plan(
        profiles,
        bandwidth,
        keep_seconds,
        budget_bytes,
        keep_last,
        fixed_bytes=fixed_bytes,
        peak_budget_bytes=peak_budget_bytes,
        prefetch=prefetch,
    )


register(
    PolicyEntry(
        "offload_adaptive",
        "optimized",
        make=Planned,
        uses_store=True,
        planner=_adaptive,
        notes="SSDTrain's adaptive rule: the leading blocks whose writes end with forward offloaded",
    )
)
register(
    PolicyEntry(
        "planner",
        "optimized",
        make=Planned,
        uses_store=True,
        planner=_planner,
        notes="keep, offload or recompute per block: the fastest predicted step within a memory budget",
    )
)
register(
    PolicyEntry(
        "planned_compiled",
        "optimized",
        make=Planned,
        uses_store=True,
        planner=_planner,
        compiled=True,
        notes="the planner on blocks compiled by torch.compile (a recomputed block: the compiled block checkpointed)",
    )
)
