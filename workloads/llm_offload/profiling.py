"""What a part measures to plan and to bound: the blocks' profiles and the stores' bandwidths, each
once per model (systems/ssdtrain/planning.py, bound.py)."""

from __future__ import annotations

from harness.errors import UserError, raised_in
from systems.ssdtrain import planning
from systems.ssdtrain.policies import CompiledBlocks
from workloads.llm_offload import variants as choose


class Profiler:
    """One model's profiles for plans and bounds, each measured once and recorded in ``notes``:
    the blocks' (eager, or compiled: what their compiled forwards save and how long they run, and
    at each of ``planner_budgets``) and the stores' bandwidths. ``batch``: the step profiled;
    ``bandwidths``: stores' bandwidths measured already (:func:`store_bandwidths`), by label."""

    def __init__(self, params, model, layers, batch, device, folder, notes: dict, bandwidths=None):
        if params["keep_last"] > len(layers):  # else the planners refuse it after the others were measured
            raise UserError(
                f"keep_last={params['keep_last']} is more than the model's {len(layers)} blocks: "
                f"give at most {len(layers)} (which keeps every block)"
            )
        self.params, self.model, self.layers, self.batch = params, model, layers, batch
        self.device, self.folder, self.notes = device, folder, notes
        self._profiles: dict[bool, tuple] = {}
        self._bandwidths: dict[str, float] = {}
        for label, measured in (bandwidths or {}).items():
            self._record(label, measured)

    def _step(self):
        # Zeroed in place, as the timed steps do: the profile's peaks leave the gradients out.
        self.model.zero_grad(set_to_none=False)
        self.model(**self.batch).loss.backward()

    def _profile(self, budget=None, compiled=False):
        within = CompiledBlocks(self.layers, budget).installed if compiled else None
        # At the part's min_bytes, as its policies run: storages below it are held whatever the plan.
        min_bytes = self.params["min_bytes"]
        measured = planning.profile(
            self.model, self.layers, self._step, self.device, min_bytes, within=within, compiled=compiled
        )
        self.model.zero_grad(set_to_none=True)
        return measured

    def blocks(self, compiled: bool = False) -> tuple[list[planning.LayerProfile], float, int]:
        """The blocks' profiles, the kept step's seconds and the bytes saved outside the blocks. On
        compiled blocks the warm-up compiles what compiled keep then reuses, and each budget of
        ``planner_budgets`` adds one profile (one compile, whatever the number of blocks)."""
        if compiled not in self._profiles:
            profiles, seconds, fixed = self._profile(compiled=compiled)
            budgets = self.params.get("planner_budgets", []) if compiled else []
            at_budgets = {}
            for budget in budgets:
                at, at_seconds, _ = self._profile(budget, compiled=True)
                at_budgets[budget] = (at, at_seconds)
            profiles = planning.with_budgets(profiles, seconds, at_budgets)
            self._profiles[compiled] = (profiles, seconds, fixed)
            record = planning.record_of_profiles(profiles)
            for budget in budgets:  # each budget's whole step, beside what the alternatives keep of it
                record[f"at_budget_{planning.number_text(budget)}"]["step_seconds"] = at_budgets[budget][1]
            self.notes["profile" + ("_compiled" if compiled else "")] = {
                "keep_step_seconds": seconds,
                **record,
                "bytes_saved_outside_layers": fixed,
            }
        return self._profiles[compiled]

    def bandwidth(self, setup: choose.StoreSetup) -> float:
        """The store's measured write-and-read bandwidth, B/s (a store of its own, made for the probe)."""
        if setup.label not in self._bandwidths:
            self._record(setup.label, store_bandwidths([setup], self.params, self.folder, self.device)[setup.label])
        return self._bandwidths[setup.label]

    def _record(self, label: str, measured: float) -> None:
        self._bandwidths[label] = measured
        self.notes.setdefault("store_gbps", {})[label] = measured / 1e9


def store_bandwidths(setups, params, folder, device) -> dict[str, float]:
    """Each store's measured write-and-read bandwidth, B/s, by label (a store of its own, made for
    the probe, which moves a 64 MiB tensor: measure before a memory cap that a probe would count against)."""
    measured = {}
    for setup in setups:
        if setup.label not in measured:
            with raised_in(f"store {setup.label}, measuring its bandwidth"), setup.make(params, folder) as probe:
                measured[setup.label] = planning.store_bandwidth(probe, device)
    return measured
