"""The policies the llm_offload topic compares: one registry, :data:`POLICIES`, that every module
of this package adds to. A policy decides what happens to the activations a training step saves
for backward: kept on the device, offloaded to a store, or recomputed.

The suite's policies, by module: ``keep`` (every activation kept: the reference every ratio is
taken against), ``recompute`` (each block recomputed in backward, ``torch.utils.checkpoint``),
``save_on_cpu`` (torch's ``save_on_cpu`` hooks), ``offload_all`` (SSDTrain: every block but the
last offloaded to the store), ``planned`` (``offload_adaptive``, SSDTrain's adaptive rule, and
``planner``: keep, offload or recompute per block within a memory budget, both from a plan made
from a profile of the model and the store's bandwidth), and the peers, each in its own module and
run where its library imports: ``torchtune_offload`` (torchtune's ``OffloadActivations``) and
``deepspeed_offload`` (DeepSpeed's activation checkpointing with its inputs on the host). On
blocks compiled by ``torch.compile`` (``compiled``): ``compiled_keep`` (the reference of the
compiled policies), ``torch_budget`` (torch's own rematerialization under an activation memory
budget, one variant per budget), ``offload_all_compiled`` (SSDTrain's offloading of what the
compiled blocks save) and ``planned_compiled`` (in ``planned``: the planner on a profile of the
compiled blocks).

A new policy is one new module here (or a module of your own named in ``SUITE_PLUGINS``): a
:class:`Policy` subclass, usually of :class:`OffloaderPolicy` (override ``decide`` and
``recomputed``) or :class:`HooksPolicy` (give ``hooks``), and a :class:`PolicyEntry`. A model of
one's own is best served by ``systems.ssdtrain.offload`` (one ``with`` block around training); a
registry policy wraps one step and records its counts::

    policy = POLICIES["offload_all"].build(model, store=DirectFileStore("/nvme/scratch"))
    with policy.step():
        model(**batch).loss.backward()
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from torch import nn

from harness.errors import UserError
from harness.registry import Entry, Registry
from systems.ssdtrain.layers import find_layers
from systems.ssdtrain.planning import Plan
from systems.ssdtrain.policies._base import (
    HooksPolicy,
    OffloaderPolicy,
    Policy,
    Setting,
    Unavailable,
    counting,
    first_line,
)
from systems.ssdtrain.policies._compiled import CompiledBlocks
from systems.ssdtrain.stores import Store

__all__ = [
    "POLICIES",
    "CompiledBlocks",
    "HooksPolicy",
    "OffloaderPolicy",
    "Policy",
    "PolicyEntry",
    "Setting",
    "Unavailable",
    "counting",
    "first_line",
    "register",
]


@dataclass(frozen=True)
class PolicyEntry(Entry):
    """One policy: ``make(setting)`` returns a :class:`Policy` for a :class:`Setting`.

    ``uses_store``: it offloads, so it runs with a store (a comparison runs it once per store).
    ``planner``: a planned policy's plan maker, ``planner(profiles, bandwidth, keep_seconds, *,
    keep_last, budget_bytes, fixed_bytes, peak_budget_bytes=None, prefetch=1) -> Plan``
    (systems/ssdtrain/planning.py; the peak budget is given only where the plan must fit a
    memory cap, and a plan maker without budgets may ignore both; ``prefetch``: the engine's, how
    many blocks ahead backward reads back); such a policy
    is built with the plan. ``make`` may raise :class:`Unavailable` with the reason it cannot run
    here beyond ``needs_gpu`` and ``packages`` (see :meth:`missing`).

    ``compiled``: its blocks run compiled by ``torch.compile``; its reference is compiled keep
    (``compiled_keep``), not eager keep, since compiled code rounds differently. ``exact``: its
    step is bit-identical to its reference (false where it computes differently, as torch's
    rematerialization does: then it is checked within a tolerance). ``settings(params)``: one dict
    of :class:`Setting` fields per variant the part's parameters ask for (default one variant, no
    field), e.g. ``{"activation_budget": 0.5}``; ``columns(**setting)``: the results columns that
    say which (``{"activation_budget": 0.5}``).
    """

    make: Callable[[Setting], Policy] | None = None
    uses_store: bool = False
    planner: Callable[..., Plan] | None = None
    compiled: bool = False
    exact: bool = True
    settings: Callable[[Mapping], list[dict]] = lambda params: [{}]
    columns: Callable[..., dict] = lambda **setting: {}

    def __post_init__(self):
        super().__post_init__()
        if self.make is None:
            raise ValueError(f"offloading policy {self.name}: give make(setting)")
        if self.planner is not None and not self.uses_store:
            raise ValueError(f"offloading policy {self.name}: a planned policy offloads, so it uses a store")

    def build(
        self,
        model: nn.Module,
        *,
        layers: list[nn.Module] | None = None,
        store: Store | None = None,
        plan: Plan | None = None,
        **knobs,
    ) -> Policy:
        """This policy applied to ``model`` (its blocks found by ``find_layers`` unless given), with
        ``store`` if it offloads and ``plan`` if it is planned; ``knobs``: the Setting's
        ``keep_last``, ``min_bytes``, ``prefetch``, ``always_read_back`` and the fields of one of
        its ``settings`` (``activation_budget``)."""
        if self.uses_store and store is None:
            raise UserError(f"policy {self.name} offloads: give it a store (systems.ssdtrain.stores)")
        if not self.uses_store and store is not None:
            raise UserError(f"policy {self.name} offloads nothing: it takes no store")
        if self.planner is not None and plan is None:
            raise UserError(f"policy {self.name} follows a plan: give it one (systems.ssdtrain.planning)")
        layers = list(layers) if layers is not None else find_layers(model)
        return self.make(Setting(model, layers, store=store, plan=plan, compiled=self.compiled, **knobs))


POLICIES: Registry[PolicyEntry] = Registry("offloading policy", __name__)


def register(entry: PolicyEntry) -> PolicyEntry:
    return POLICIES.register(entry)
