"""What a part runs: the policies and stores its parameters ask for, chosen from the registries of
systems/ssdtrain (``POLICIES``, ``STORES``) and checked against them, and the readable label each
results row carries.

A row's ``variant`` is a label composed here and nowhere else (``offload_all_emulated_7gbps``:
the policy, then the store and its setting; ``torch_budget_0.5``: the policy and its setting);
nothing parses it back, since every row also carries the policy, its setting, the store and the
store's setting in columns of their own (schema.py).

The parameters (config/llm_offload.yaml) that choose:

- ``compare``: the policies run beside ``keep`` (which always runs first); default: every
  registered policy. A policy that cannot run here (no GPU, its library missing) is skipped, the
  reason in the notes.
- ``stores``: the stores the offloading policies run with, or ``all`` (every registered store that
  runs here). A store runs once per setting its entry reads from the parameters (the emulated store
  once per bandwidth of ``emulated_gbps``).
- ``planned_stores``: the stores the planned policies run with, by label (``host``,
  ``emulated_7gbps``), or ``all`` (every store of ``stores``).
- ``compiled``: whether the policies on compiled blocks run (compiling takes seconds to minutes
  per model and budget; default false, and then they are left out with a note). Where any runs,
  ``compiled_keep``, their reference, runs too, right after ``keep``.
- ``budgets``: the activation memory budgets of ``torch_budget``, one variant each.
- ``compiled_stores``: the stores offloading on compiled blocks runs with, by label, or ``all``
  (every store of ``stores``, the default).
- ``frontier_budgets``: more activation budgets (fractions, as ``planner_budget``) that each planned
  policy with a budget (``planner``, ``planned_compiled``) also plans for, one variant each, on the
  stores of ``frontier_stores`` (labels; default: each of its stores): the planner's frontier of
  step time against activation peak, drawn beside ``torch_budget``'s. Such a variant's label gives
  its budget after the policy (``planned_compiled_0.2_host``); the plan at ``planner_budget``
  keeps the plain label (``planned_compiled_host``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import UserError
from harness.registry import ENTRY_ROLES
from systems.ssdtrain import POLICIES, STORES, Policy, PolicyEntry, Store, StoreEntry
from systems.ssdtrain.planning import RECOMPUTE, Plan, number_text
from systems.ssdtrain.stores import one_setting

ALL = "all"
REFERENCE = "keep"  # every policy is checked against it and every ratio taken to it
COMPILED_REFERENCE = "compiled_keep"  # ...every policy on compiled blocks, against this


def _text(value) -> str:
    return number_text(value) if isinstance(value, int | float) else str(value)


@dataclass(frozen=True)
class StoreSetup:
    """One store as a part runs it: its registry entry and its setting (e.g. ``gbps=7.0``)."""

    entry: StoreEntry
    setting: tuple[tuple[str, Any], ...] = ()

    @property
    def label(self) -> str:
        """``host``, ``file``; with a setting its values and names: ``emulated_7gbps``."""
        return self.entry.name + "".join(f"_{_text(value)}{key}" for key, value in self.setting)

    def make(self, params: Mapping, folder: Path | None) -> Store:
        return self.entry.build(params, folder, **dict(self.setting))

    def columns(self) -> dict:
        return {"store": self.entry.name, "store_emulated": self.entry.emulated} | self.entry.columns(
            **dict(self.setting)
        )


@dataclass
class Variant:
    """One measured variant: a policy with one of its settings (``activation_budget=0.5``), with a
    store if it offloads and a plan if it is planned."""

    policy: PolicyEntry
    store: StoreSetup | None = None
    plan: Plan | None = None
    setting: tuple[tuple[str, Any], ...] = ()
    # A plan made for one of frontier_budgets (not the part's planner_budget): that fraction.
    frontier_budget: float | None = None
    # A plan made within what every block compiled at this torch activation budget is predicted to
    # hold (frontier_matched): the planner's point beside that budget's.
    matched_budget: float | None = None
    made: list = field(default_factory=list, repr=False)  # the store made for it, closed by close()

    @property
    def label(self) -> str:
        """The results' ``variant``: the policy's name and its setting's values (a frontier plan's
        budget), then its store's label (the one place a label is composed): ``torch_budget_0.5``,
        ``offload_all_host``, ``planned_compiled_0.2_host``, ``planned_compiled_as_budget_0.5_host``."""
        values = [value for _, value in self.setting]
        if self.frontier_budget is not None:
            values.append(self.frontier_budget)
        if self.matched_budget is not None:
            values.append(f"as_budget_{_text(self.matched_budget)}")
        name = self.policy.name + "".join(f"_{_text(value)}" for value in values)
        return name if self.store is None else f"{name}_{self.store.label}"

    @property
    def role(self) -> str:
        return self.policy.role

    @property
    def exact(self) -> bool:
        """Whether its step is bit-identical to its reference: a plan that runs blocks under an
        activation memory budget recomputes inside the compiled backward, as torch_budget does."""
        return self.policy.exact and (self.plan is None or not self.plan.budgeted)

    def columns(self, params: Mapping) -> dict:
        """The configuration columns of its rows: policy, store and setting, the offloader's knobs
        where it offloads, the plan's counts where it is planned."""
        columns = {"policy": self.policy.name, "store_emulated": False}
        if self.policy.compiled:
            columns |= {"compiled": True} | self.policy.columns(**dict(self.setting))
        if self.store is not None:
            columns |= self.store.columns() | {"keep_last": params["keep_last"], "min_bytes": params["min_bytes"]}
        if self.plan is not None:
            columns |= {
                "layers_offloaded": self.plan.offloaded,
                "layers_recomputed": self.plan.count(RECOMPUTE),
                "layers_budgeted": self.plan.budgeted,
                "planned_gbps": self.plan.bandwidth / 1e9,
                "budget_fraction": self.budget_fraction(params),
            }
            if self.matched_budget is not None:
                columns["matched_budget"] = self.matched_budget
        return columns

    def budget_fraction(self, params: Mapping) -> float | None:
        """The activation budget its plan was made within, a fraction of what keep saves (None:
        not planned, or planned without a budget)."""
        if self.plan is None or self.plan.budget_bytes is None or self.matched_budget is not None:
            return None
        return self.frontier_budget if self.frontier_budget is not None else params.get("planner_budget")

    def build(self, model, layers, params: Mapping, folder: Path | None, **knobs) -> Policy:
        """The policy on ``model``, with a new store where it offloads (closed by :meth:`close`).
        Raises ``systems.ssdtrain.Unavailable`` where its library cannot be set up here."""
        store = self.store.make(params, folder) if self.store is not None else None
        if store is not None:
            self.made.append(store)
        offload = {k: params[k] for k in ("keep_last", "min_bytes", "prefetch")}
        try:
            return self.policy.build(
                model, layers=layers, store=store, plan=self.plan, **offload, **dict(self.setting), **knobs
            )
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        while self.made:
            self.made.pop().close()


def _names(params: Mapping, key: str, everything: tuple[str, ...]) -> list[str]:
    value = params.get(key, ALL)
    return list(everything) if value == ALL else list(value)


def store_setups(params: Mapping, device: str, notes: dict, folder: Path | None) -> list[StoreSetup]:
    """The stores of ``stores`` that run here, each once per setting; the others' reasons go to
    ``notes["skipped"]``. A name that is not a registered store is refused in one line. A store
    that needs a package beyond the suite's is made once first, in ``folder``: where it cannot be
    set up (a library that imports but does not work), it is skipped with its one-line error."""
    chosen = [STORES[name] for name in _names(params, "stores", STORES.names())]
    explicit = params.get("stores", ALL) != ALL
    for entry in STORES:
        if entry not in chosen and entry.settings is not one_setting and entry.settings(params):
            # Parameters that set up a store the list leaves out are a slip, not a choice.
            raise UserError(
                f"the parameters set up {entry.name} stores "
                f"({', '.join(StoreSetup(entry, tuple(s.items())).label for s in entry.settings(params))}), "
                f"but stores does not list {entry.name}"
            )
    setups = []
    for entry in chosen:
        reason = entry.missing(device)
        if reason is None and entry.packages:
            try:
                entry.build(params, folder, **next(iter(entry.settings(params)), {})).close()
            except UserError as err:
                reason = str(err)
        if reason is not None:
            notes["skipped"][entry.name] = reason
            continue
        settings = entry.settings(params)
        if explicit and not settings:
            raise UserError(
                f"stores lists {entry.name}, but the parameters give it no setting (emulated: list emulated_gbps)"
            )
        setups += [StoreSetup(entry, tuple(setting.items())) for setting in settings]
    return setups


def planned_setups(
    params: Mapping, setups: list[StoreSetup], notes: dict, key: str = "planned_stores"
) -> list[StoreSetup]:
    """The stores of ``planned_stores`` (or of another list, ``key``: ``compiled_stores``), by label,
    or ``all``: every store of ``setups``; one that was skipped here is left out with a note, an
    unknown label refused in one line."""
    by_label = {setup.label: setup for setup in setups}
    wanted = _names(params, key, tuple(by_label))
    chosen = []
    for label in wanted:
        if label in by_label:
            chosen.append(by_label[label])
        elif label in STORES and label in notes["skipped"]:
            skipped = notes.setdefault(key.replace("_stores", "_skipped"), {})
            skipped[label] = "this store does not run here (see skipped)"
        else:
            raise UserError(
                f"{key} names {label!r}, which is not one of this part's stores: {', '.join(by_label) or 'none'}"
            )
    return chosen


def policies(params: Mapping, device: str, notes: dict, *, plans: bool = True) -> list[PolicyEntry]:
    """``keep``, then the policies of ``compare`` that run here, by role (baselines, peers, the
    technique) and then in the registry's order; the others' reasons go to ``notes["skipped"]``.
    ``plans``: whether the part makes plans (without them a planned policy is refused). The
    policies on compiled blocks run where ``compiled`` is true, with their reference,
    ``compiled_keep`` (see the module). An unknown name is refused in one line."""
    wanted = _names(params, "compare", POLICIES.names())
    entries = [POLICIES[name] for name in wanted]  # unknown names refused here, before anything runs
    compiled = [e.name for e in entries if e.compiled]
    if compiled and not params.get("compiled", False):
        if "compare" in params:
            raise UserError(
                f"compare lists {', '.join(compiled)}, policies on compiled blocks: set compiled: true "
                "(in parts policies, models and shapes)"
            )
        notes["skipped"]["compiled"] = f"{', '.join(compiled)}: compiled is false at this scale"
        entries = [e for e in entries if not e.compiled]
    elif compiled and COMPILED_REFERENCE not in wanted:
        entries.append(POLICIES[COMPILED_REFERENCE])
    if not plans:
        planned = [e.name for e in entries if e.planner is not None]
        if planned and "compare" in params:
            raise UserError(
                f"compare lists {', '.join(planned)}, planned policies, which this part does not plan for "
                "(they run in parts policies, models and shapes)"
            )
        entries = [e for e in entries if e.planner is None]
    chosen = [POLICIES[REFERENCE]]

    def order(entry):  # compiled keep before the policies checked against it
        return (entry.name != COMPILED_REFERENCE, ENTRY_ROLES.index(entry.role), POLICIES.names().index(entry.name))

    for entry in sorted(entries, key=order):
        if entry.name == REFERENCE:
            continue
        reason = entry.missing(device)
        if reason is not None:
            notes["skipped"][entry.name] = reason
            continue
        chosen.append(entry)
    return chosen


def variants(
    policies: list[PolicyEntry],
    setups: list[StoreSetup],
    params: Mapping | None = None,
    compiled_setups: list[StoreSetup] | None = None,
) -> list[Variant]:
    """Each policy that offloads nothing once per setting it reads from ``params`` (torch_budget
    once per budget), each offloading (unplanned) one with every store of ``setups`` (those on
    compiled blocks with every store of ``compiled_setups``, where given)."""
    out = []
    for entry in policies:
        if entry.planner is not None:
            continue  # made with their plans
        settings = entry.settings(params or {})
        if not settings and entry.name in (params or {}).get("compare", ()):
            raise UserError(
                f"compare lists {entry.name}, but the parameters give it no setting (torch_budget: list budgets)"
            )
        for setting in settings:
            setting = tuple(setting.items())
            stores = [None]
            if entry.uses_store:
                stores = compiled_setups if entry.compiled and compiled_setups is not None else setups
            out += [Variant(entry, setup, setting=setting) for setup in stores]
    refuse_shared_labels(out)
    return out


def refuse_shared_labels(runs: list[Variant]) -> None:
    """Refuse, in one line and before anything is measured, two variants whose results would carry
    one label (a policy named as another's label with its store reads, ``offload_all_host``): their
    rows would be drawn as one variant."""
    seen: dict[str, Variant] = {}
    for variant in runs:
        other = seen.setdefault(variant.label, variant)
        if other is not variant:
            raise UserError(
                f"policies {other.policy.name} and {variant.policy.name} would both be measured as "
                f"{variant.label!r} (a label is the policy's name, then its setting and store): rename one"
            )


def frontier_budgets(params: Mapping) -> list[float]:
    """The fractions of ``frontier_budgets`` other than ``planner_budget`` (a plan already made),
    in increasing order; refused in one line without a ``planner_budget`` to sweep beside."""
    wanted = sorted(set(params.get("frontier_budgets") or ()))
    if wanted and "planner_budget" not in params:
        raise UserError("frontier_budgets needs planner_budget: the plan the frontier is drawn beside")
    return [b for b in wanted if b != params.get("planner_budget")]


def matched_budgets(params: Mapping, planned_compiled: bool = True) -> list[float]:
    """The torch activation budgets of ``frontier_matched``, in increasing order: each planned
    policy on compiled blocks also plans within what every block compiled at that budget is
    predicted to hold. Refused in one line where no planned policy runs on compiled blocks
    (``planned_compiled``: whether one does) and where ``planner_budgets`` does not profile one of
    them (the plan that runs every block at it is the one the planner must be able to choose)."""
    wanted = sorted(set(params.get("frontier_matched") or ()))
    if wanted and not (params.get("compiled") and planned_compiled):
        raise UserError(
            "frontier_matched needs a planned policy on compiled blocks (compiled: true and planned_compiled in "
            "compare): the plans it asks for are made over compiled blocks"
        )
    profiled = set(params.get("planner_budgets") or ())
    if unprofiled := [b for b in wanted if b not in profiled]:
        raise UserError(
            f"frontier_matched names {', '.join(f'{b:g}' for b in unprofiled)}, which planner_budgets "
            f"({', '.join(f'{b:g}' for b in sorted(profiled)) or 'none'}) does not profile"
        )
    return wanted


def check_frontier_stores(params: Mapping, planned: list[StoreSetup], notes: dict) -> None:
    """Refuse, in one line, a label of ``frontier_stores`` that names no store of this part; one
    whose store does not run here is left out with a note, as ``planned_stores`` does. Nothing to
    check where no planned policy runs or no frontier is asked for."""
    if not planned or not frontier_budgets(params):
        return
    labels = {setup.label for setup in planned}
    unknown = []
    for label in params.get("frontier_stores") or ():
        if label in labels:
            continue
        if label in STORES and label in notes["skipped"]:
            notes.setdefault("frontier_skipped", {})[label] = "this store does not run here (see skipped)"
        else:
            unknown.append(label)
    if unknown:
        raise UserError(
            f"frontier_stores names {', '.join(map(repr, unknown))}, not a store a planned policy runs with here: "
            f"{', '.join(sorted(labels))}"
        )
