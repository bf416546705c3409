"""SSDTrain applied to any model: ``offload(model, store=..., policy=...)``, a context manager
around training. Inside the block every forward and backward of ``model`` runs under the policy;
the losses and gradients are bit-identical to training without it::

    with DirectFileStore("/nvme/scratch") as store, offload(model, store=store) as session:
        for batch in loader:
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    print(session.stats.total)  # what the block saved, and how much of it went to the store

The policies (``policy=``), each per block of the model (``find_layers`` finds them: every block of
the model's repeated class; or pass ``layers=[...]``):

- ``"keep"``: every activation stays where it was made (only counted).
- ``"recompute"``: each block runs through ``torch.utils.checkpoint`` (non-reentrant): only its
  inputs are saved, and its forward runs again in backward.
- ``"save_on_cpu"``: torch's ``torch.autograd.graph.save_on_cpu`` (pinned on a GPU).
- ``"offload_all"``: every block but the last ``keep_last`` offloaded to ``store`` during forward
  and read back, prefetched, in backward (engine.py).
- ``"offload_adaptive"``: SSDTrain's adaptive rule: the leading blocks whose writes end by the end
  of forward are offloaded, the rest kept. ``"planner"``: keep, offload or recompute per block,
  the fastest predicted step whose activation bytes fit ``budget`` (a fraction of what keep
  holds) and whose predicted activation peak fits ``peak_budget`` (bytes; a model on a GPU), each
  where given. Both are planned (planning.py) from a profile of the first forward and backward, which
  keeps everything, and the store's bandwidth (measured then, unless ``bandwidth`` gives it in
  B/s); the plan applies from the next forward on, in this block or, where the block ended after
  that step (a block entered once per step), in the next one, and is kept (``session.plan``). Where
  the model itself is not called (a container whose parts the loop calls, ``model.forward(...)``),
  the next forward's first block plans: offloading from then on, recomputation from the next forward.
  On a GPU the profiled step also traces the allocator's peak per block (``planning.PeakTrace``:
  it resets the device's peak memory statistics as it goes), and the plan predicts the step's
  activation peak (``session.plan.predicted_peak_bytes``).
- a ``planning.Plan``: its decisions, one per block, applied as they are (``keep_last`` does not
  apply: the plan was made with it). A block the plan runs under one of torch's activation memory
  budgets (``Plan.budgets``, a plan over compiled blocks' profiles) is compiled here, with inductor
  under that budget, for the block's duration; such a block must not be compiled already. Its
  decision ``offload_budget_B`` (rather than ``budget_B``) offloads what it saves at that budget.
- a callable ``decide(block_index) -> "keep" | "offload" | "recompute"``, asked for every block
  of the model when the ``with`` block is first entered; its answers hold from then on, but for
  the last ``keep_last`` blocks, which are kept where it says offload (``keep_last=0``: every
  answer holds).

``session.decisions`` says what each block does (with ``keep_last`` applied). ``offload_all`` or
a callable that offloads no block once ``keep_last`` is applied (at or above the block count)
warns when the block is entered; a planner budget below what any plan holds warns when it plans (the plan that holds the
least is taken).

A model whose blocks Hugging Face already checkpoints (``gradient_checkpointing_enable``) is not
checkpointed again; an offloading policy offloads what its checkpoints save, the blocks' inputs.
Where blocks are recomputed, a Hugging Face model's key-value cache (``use_cache``) is off inside
the block, with a warning, as under Hugging Face's own checkpointing (whatever the model's mode
when the block is entered). Recomputation replays the global random generators and each block's
registered buffers, no other state (recompute.py). Planned policies keep a block that did not run in
the profiled step. Two models may each be in its own ``offload()`` at once (engine.py), but not
beside a ``save_on_cpu`` one (torch's hooks would take the other model's tensors too): refused.
A block that offloads nothing while its policy offloads (``min_bytes`` above every saved storage)
says so in one warning.

Blocks the user compiled (``layers[i] = torch.compile(layers[i])``, ``block.compile()``) run compiled
under every policy, as the suite's compiled policies run theirs (user_compiled.py): the hooks
outside the compiled forward, a recomputed block's compiled forward run again in backward; the
planned policies take the first forward and backward of such blocks as a warm-up (it compiles) and
time the second. A model compiled as a whole is refused in one line: its blocks' hooks would run
inside the compiled graph.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import threading
import weakref
from collections.abc import Callable

import torch
from torch import nn

from harness.arguments import real_number, whole_number
from harness.errors import UserError
from systems.ssdtrain import planning
from systems.ssdtrain._warn import warn
from systems.ssdtrain.blocks import checked_blocks
from systems.ssdtrain.engine import (
    CALLERS_CHECKPOINT,
    KEEP,
    OFFLOAD,
    Offloader,
    StepHook,
    active_offloaders,
    in_backward,
)
from systems.ssdtrain.planning import RECOMPUTE, Plan, budget_decision, offloads
from systems.ssdtrain.policies._compiled import CompiledBlocks, check_budget
from systems.ssdtrain.recompute import checkpointed
from systems.ssdtrain.stats import BELOW_MIN_BYTES, EMPTY, NOT_STORABLE, StepStats, why_nothing_moved
from systems.ssdtrain.stores import Store
from systems.ssdtrain.stores.host import HostStore
from systems.ssdtrain.user_compiled import holds_compiled_code, runs_compiled

NAMED = ("keep", "recompute", "save_on_cpu", "offload_all", "offload_adaptive", "planner")
PLANNED = ("offload_adaptive", "planner")
# The save_on_cpu blocks active on this thread: torch's hooks take every tensor saved inside them,
# the other model's too, so such a block is never combined with another offload() (see __enter__).
_save_on_cpu = threading.local()
MIXED_SAVE_ON_CPU = (
    "save_on_cpu's hooks take every tensor saved inside its with block, another model's too: it cannot run "
    "beside another offload(); put each model's step in a block of its own, or use offload_all with a HostStore"
)
DECISIONS = (KEEP, OFFLOAD, RECOMPUTE)
# Per model: the planned offload() (by id) whose plan was made at its block's end and has not run
# yet, and how many such in a row were followed by a new one profiling instead. A loop that makes a
# planned offload() per step profiles with everything kept and plans for a step that never comes,
# every step: said in __enter__ at the third in a row (two planners taking turns, or one made anew
# after a failed step, run their plans in between and reset the count).
_PLAN_NOT_RUN: weakref.WeakKeyDictionary[nn.Module, tuple[int, int]] = weakref.WeakKeyDictionary()
UNUSED_PLAN = (
    "SSDTrain {policy}: the last two offload() objects on this model planned at their block's end, and "
    "neither plan ran: each new offload() profiles a step keeping everything and plans again. Make "
    "offload() once, before the loop, and enter it at every step"
)


class Offloading:
    """One policy applied to one model; enter it (``with``) around the training it covers. Made by
    :func:`offload`, which documents the arguments. After (or during) a block: ``stats`` (what it
    saved and moved, a ``StepStats``; None under ``save_on_cpu``, whose hooks are torch's),
    ``decisions`` (per block: keep, offload, recompute or a Plan's budget; None until a planned policy planned)
    and ``plan`` (a planned policy's ``Plan``)."""

    def __init__(
        self,
        model: nn.Module,
        *,
        store: Store | None,
        policy: str | Plan | Callable[[int], str],
        layers: list[nn.Module] | None,
        keep_last: int,
        min_bytes: int,
        prefetch: int,
        always_read_back: bool,
        budget: float | None,
        bandwidth: float | None,
        peak_budget: int | None = None,
    ):
        if not isinstance(model, nn.Module):
            raise UserError(f"offload() takes an nn.Module, got {type(model).__name__}")
        if store is not None and not isinstance(store, Store):
            raise UserError(f"store must be a systems.ssdtrain Store (HostStore, DirectFileStore...), got {store!r}")
        if store is not None:
            store.refuse_if_closed()
        self.model = model
        self.layers = checked_blocks(model, layers)
        self.policy, self.store = _check_policy(policy, store, len(self.layers)), store
        if peak_budget is not None:
            if self.policy != "planner":
                raise UserError(f"peak_budget= is the planner's; policy {_name(self.policy)} does not take it")
            if not whole_number(peak_budget):
                raise UserError(f"peak_budget must be a positive whole number of bytes, got {peak_budget!r}")
            if planning.meter_for(_device(model)) is None:
                raise UserError(
                    f"peak_budget= needs the model on a CUDA device (the profile traces the allocator's peaks there); "
                    f"it is on {_device(model)}"
                )
        if self.policy == "planner" and budget is None and peak_budget is None:
            raise UserError(
                "policy planner needs budget= (a fraction of keep's activation bytes) or peak_budget= (bytes)"
            )
        if budget is not None and self.policy != "planner":
            raise UserError(f"budget= is the planner's; policy {_name(self.policy)} does not take it")
        if budget is not None and not (real_number(budget) is not None and 0 < budget <= 1):
            raise UserError(
                f"policy planner needs budget= in (0, 1], the fraction of keep's activation bytes; got {budget!r}"
            )
        self.peak_budget = whole_number(peak_budget) if peak_budget is not None else None
        if bandwidth is not None and self.policy not in PLANNED:
            raise UserError(f"bandwidth= is for the planned policies; policy {_name(self.policy)} does not take it")
        if bandwidth is not None and (real_number(bandwidth) is None or bandwidth <= 0):
            raise UserError(f"bandwidth must be the store's speed in B/s, a positive number; got {bandwidth!r}")
        for name, value in (("keep_last", keep_last), ("min_bytes", min_bytes), ("prefetch", prefetch)):
            if whole_number(value) is None:
                raise UserError(f"{name} must be a non-negative integer, got {value!r}")
        if not isinstance(always_read_back, bool):  # "no" would read as True
            raise UserError(f"always_read_back must be True or False, got {always_read_back!r}")
        self.keep_last, self.budget, self.bandwidth = whole_number(keep_last), budget, bandwidth
        self.plan: Plan | None = self.policy if isinstance(self.policy, Plan) else None
        self.decisions: list[str] | None = list(self.plan.decisions) if self.plan else None
        made_for = self.plan.prefetch if self.plan else None
        if made_for is not None and made_for != whole_number(prefetch) and self.plan.offloaded:
            # The decisions apply as they are; the step and peak it predicts are another engine's.
            warn(
                f"SSDTrain: the plan was made for prefetch={made_for} and offload() runs prefetch={prefetch}: "
                f"its predicted step and peak hold for prefetch={made_for} (pass prefetch={made_for})"
            )
        self._budgeted = _budgeted_blocks(self.plan, self.layers) if self.plan else None
        self.offloader: Offloader | None = None
        if self.policy != "save_on_cpu":
            self.offloader = Offloader(
                model,
                store if store is not None else HostStore(),  # nothing is put there: it counts
                policy=self._decide,
                layers=self.layers,
                keep_last=0,  # self.decisions apply keep_last (planned policies: the plan does)
                min_bytes=min_bytes,
                prefetch=prefetch,
                always_read_back=always_read_back,
            )
        self._stack: contextlib.ExitStack | None = None
        # Whether the blocks ran a forward and backward in a profiled block: compiled blocks compile
        # in their first forward, which no later forward's time resembles (_profile_first_step).
        self._warmed_up = False
        self._plans_not_run = 0  # planned offload() objects before this one whose plan never ran (_PLAN_NOT_RUN)

    @property
    def stats(self) -> StepStats | None:
        """What the block saved, per layer, and what went to the store; None under ``save_on_cpu``
        (torch's own hooks save the tensors there, out of the suite's sight)."""
        return None if self.offloader is None else self.offloader.stats

    # -- a block -------------------------------------------------------------------------------
    def __enter__(self) -> Offloading:
        if self._stack is not None:
            raise RuntimeError("this offload() block is already active: blocks do not nest")
        stack = contextlib.ExitStack()
        try:
            active_save_on_cpu = getattr(_save_on_cpu, "count", 0)
            if self.policy == "save_on_cpu":
                if active_offloaders() or active_save_on_cpu:
                    raise UserError(MIXED_SAVE_ON_CPU)
                on_gpu = _device(self.model).type == "cuda"
                stack.enter_context(torch.autograd.graph.save_on_cpu(pin_memory=on_gpu))
                _save_on_cpu.count = active_save_on_cpu + 1
                stack.callback(setattr, _save_on_cpu, "count", active_save_on_cpu)
            else:
                if active_save_on_cpu:
                    raise UserError(MIXED_SAVE_ON_CPU)
                if self.decisions is None and self.policy not in PLANNED:
                    self.decisions = self._first_decisions()
                self._note_a_plan_not_run()
                stack.enter_context(self.offloader)
                if self.decisions is None:
                    self._profile_first_step(stack)
                else:
                    self._recompute(stack)
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def __exit__(self, *exc) -> None:
        stack, self._stack = self._stack, None
        stack.__exit__(*exc)

    def _note_a_plan_not_run(self) -> None:
        """Count planned offload() objects made anew while the last one's plan never ran, and warn at
        the second in a row (see _PLAN_NOT_RUN); a block that runs decisions resets the count."""
        last, self._plans_not_run = _PLAN_NOT_RUN.pop(self.model, None), 0
        if self.decisions is not None or last is None:
            return  # this block runs decisions (a plan, a named policy): none is wasted
        owner, count = last
        if owner != id(self):
            self._plans_not_run = count + 1
            if self._plans_not_run >= 2:
                warn(UNUSED_PLAN.format(policy=self.policy))

    # -- decisions -----------------------------------------------------------------------------
    def _first_decisions(self) -> list[str]:
        """Every block's decision from a named policy or a callable, the last ``keep_last`` blocks kept
        where it says offload; a warning where that leaves nothing offloaded."""
        count = len(self.layers)
        asked = [self._first_decision(i) for i in range(count)]
        decisions = [KEEP if d == OFFLOAD and i >= count - self.keep_last else d for i, d in enumerate(asked)]
        if OFFLOAD in asked and OFFLOAD not in decisions:
            warn(
                f"SSDTrain offloads nothing: keep_last={self.keep_last} keeps the last {min(self.keep_last, count)} "
                f"of the model's {count} blocks, every block policy {_name(self.policy)} offloads; lower keep_last"
            )
        return decisions

    def _first_decision(self, index: int) -> str:
        policy = self.policy
        if policy in ("keep", "recompute", "offload_all"):
            return {"keep": KEEP, "recompute": RECOMPUTE, "offload_all": OFFLOAD}[policy]
        decision = policy(index)
        if decision not in DECISIONS:
            raise UserError(f"the policy returned {decision!r} for block {index}; expected one of {DECISIONS}")
        if decision == OFFLOAD and self.store is None:
            raise UserError(f"the policy offloads block {index}: give offload() a store (systems.ssdtrain.stores)")
        return decision

    def _decide(self, index: int) -> str:
        """The engine's question for one block: offload it, or keep what it saves (a recomputed
        block keeps its inputs)."""
        return OFFLOAD if self.decisions is not None and offloads(self.decisions[index]) else KEEP

    def _recomputed(self) -> list[nn.Module]:
        """The blocks the decisions recompute, but those Hugging Face checkpoints already:
        checkpointing them twice only costs."""
        return [
            layer
            for layer, decision in zip(self.layers, self.decisions)
            if decision == RECOMPUTE and not getattr(layer, "gradient_checkpointing", False)
        ]

    def _recompute(self, stack: contextlib.ExitStack) -> None:
        blocks = self._recomputed()
        if blocks:
            _no_key_value_cache(self.model, stack)
        stack.enter_context(checkpointed(blocks))
        if self._budgeted is not None:
            stack.enter_context(self._budgeted.installed())

    # -- planned policies ----------------------------------------------------------------------
    def _profile_first_step(self, stack: contextlib.ExitStack) -> None:
        """Keep everything in the first forward and backward while timing each block; plan at the
        start of the next forward, before any block runs (so a recomputed block is wrapped in time).
        Compiled blocks not yet run: the first forward and backward warm up, their saved bytes are
        the profile's, and the plan waits for the second forward's times (the first one's are of
        the compiler), made at the start of the third forward or where the block ends after the
        second backward; a block ended after the warm-up plans in the next one, from its first step."""
        timer = planning.LayerTimer(self.layers, _device(self.model))
        stack.callback(timer.remove)
        cold = not self._warmed_up and any(holds_compiled_code(layer) for layer in self.layers)
        profiled_backwards = 2 if cold else 1  # the backward after which the plan is made
        warm_bytes: list[StepStats] = []  # the saved bytes at the end of the warm-up, once it ended
        peaks = self._trace_peaks(stack, start=not cold)

        def profiled_stats() -> StepStats:
            return warm_bytes[0] if warm_bytes else self.offloader.stats

        # The plan is made when the next forward starts: in the model's pre-hook, or in the first
        # block's where the model itself is not called (its forward called directly, a container
        # without a forward whose parts the loop calls, blocks the loop runs itself). A block's
        # forward is looked up before its pre-hooks run, so every block the plan may recompute is
        # wrapped now and recomputes once the plan says so (``live``).
        index = {id(layer): i for i, layer in enumerate(self.layers)}
        live, planned_at = [], []  # planned_at: the backward count when a block's pre-hook planned

        def recomputes(layer: nn.Module) -> bool:
            return bool(live) and self.decisions[index[id(layer)]] == RECOMPUTE

        wrapped = [layer for layer in self.layers if not getattr(layer, "gradient_checkpointing", False)]
        stack.enter_context(checkpointed(wrapped, when=recomputes))

        def plan_before_forward(module, *args):
            if live or in_backward():
                return
            if self.decisions is None:
                if self.offloader.backwards < profiled_backwards:
                    new_forward = module is self.model or module is self.layers[0]
                    if new_forward and not self.offloader.backwards and torch.is_grad_enabled() and timer.starts:
                        # The last forward with gradients had no backward (a validation loss taken
                        # outside torch.no_grad): the profile is of a forward and its backward, so
                        # what that one saved and took is not part of it.
                        self.offloader.stats = StepStats()
                        timer.forget()
                    if self.offloader.backwards and not warm_bytes:  # the warm-up's backward ended
                        warm_bytes.append(_layer_bytes(self.offloader.stats))
                        if peaks is not None:
                            peaks.start()  # the profiled step begins
                    return  # still the profiled step
                timer.stop()  # its hooks go with the with block's end (see LayerTimer.stop)
                self._make_plan(timer, profiled_stats(), peaks)
                if self._recomputed():
                    _no_key_value_cache(self.model, stack)
                if module is not self.model:
                    # A forward has begun (a Hugging Face key-value cache may be on in it, which a
                    # recomputed block would find filled): the plan offloads from this block on and
                    # recomputes from the next forward.
                    planned_at.append(self.offloader.backwards)
                    return
            elif self.offloader.backwards <= planned_at[0]:
                return
            live.append(True)
            for hook in hooks:
                hook.remove()

        # Prepended: before the offloader's hooks ask a block's decision for this forward.
        hooks = [self.model.register_forward_pre_hook(StepHook(plan_before_forward))]
        hooks += [layer.register_forward_pre_hook(StepHook(plan_before_forward), prepend=True) for layer in self.layers]
        for hook in hooks:
            stack.callback(hook.remove)

        def plan_at_exit(exc_type, exc, tb) -> bool:
            if self.offloader.backwards:
                self._warmed_up = True  # compiled blocks have compiled: the next block profiles at once
            # A block entered once per step ends after the profiled step: plan now, for the next block.
            if exc_type is None and self.decisions is None and self.offloader.backwards >= profiled_backwards:
                self._make_plan(timer, profiled_stats(), peaks)
                _PLAN_NOT_RUN[self.model] = (id(self), self._plans_not_run)  # until a block runs a plan
            elif exc_type is None and self.decisions is None and self._hooks_saw_nothing(timer):
                warn(
                    f"SSDTrain {self.policy}: the blocks ran with gradients but saved no tensor through this "
                    "offload() block (another saved-tensor hook holds them: an offload() inside this one?), so "
                    "nothing was profiled or planned"
                )
            return False

        stack.push(plan_at_exit)

    def _trace_peaks(self, stack: contextlib.ExitStack, start: bool) -> planning.PeakTrace | None:
        """The allocator's peaks per block in the profiled step's forward and backward (GPU; None
        elsewhere), for the plan's predicted peak: started now (``start``) or by the caller when the
        profiled step begins; it stops when that step's backward ends (before the optimizer's step,
        whose first call allocates its state)."""
        meter = planning.meter_for(_device(self.model))
        if meter is None:
            return None
        peaks = planning.PeakTrace(self.layers, meter, self.model)
        stack.callback(peaks.remove)
        self.offloader.backward_listeners.append(peaks.backward_reached)
        stack.callback(self.offloader.backward_listeners.remove, peaks.backward_reached)
        if start:
            peaks.start()
        return peaks

    def _hooks_saw_nothing(self, timer: planning.LayerTimer) -> bool:
        ran = any(timer.ran(i) for i in range(len(self.layers)))
        return ran and not self.offloader.stats.total.packed_tensors

    def _make_plan(self, timer: planning.LayerTimer, stats: StepStats, peaks: planning.PeakTrace | None) -> None:
        # What blocks run inside their caller's checkpoint save is the checkpoint's: none profiled.
        ran = [i for i in range(len(self.layers)) if timer.ran(i)]
        checkpointed = sorted(self.offloader.checkpointed_by_caller)
        if ran and all(i in checkpointed for i in ran):
            raise UserError(f"SSDTrain {_name(self.policy)} cannot plan: {CALLERS_CHECKPOINT}")
        if checkpointed:
            warn(
                f"SSDTrain {_name(self.policy)}: blocks {', '.join(map(str, checkpointed))} ran inside a "
                "torch.utils.checkpoint their caller runs, which holds what they save: the plan leaves them to it"
            )
        # Blocks the user compiled hand their saved tensors over as they end.
        at_end = [runs_compiled(layer) for layer in self.layers]
        profiles, fixed = planning.profiles_of(stats, timer, len(self.layers), peaks, saved_at_end=at_end)
        packed = any(stats.layers[i].packed_tensors for i in range(len(profiles)) if i in stats.layers)
        if packed and not any(p.movable_bytes for p in profiles):  # nothing offloading could move
            largest = max((stats.largest.get(i, 0) for i in range(len(profiles))), default=0)
            saved = "every storage the profiled step's blocks saved"
            why = {
                EMPTY: (
                    f"{saved} was empty (a batch of 0 rows?), so the plan made from it offloads and recomputes "
                    "nothing; profile on a real batch"
                ),
                BELOW_MIN_BYTES: (
                    f"{saved} is below min_bytes={self.offloader.min_bytes} (the largest is {largest} B), so no "
                    "block can offload anything (a plan can only keep or recompute): lower min_bytes"
                ),
                # Tensors without a storage of their own (subclasses): nothing to hand to a store.
                NOT_STORABLE: (
                    "the profiled step's blocks saved no tensor with a storage of its own, so no block can offload"
                ),
            }[why_nothing_moved(largest, self.offloader.min_bytes)]
            warn(f"SSDTrain {_name(self.policy)}: {why}")
        bandwidth = self.bandwidth
        if bandwidth is None:
            probe = min(max(max(p.movable_bytes for p in profiles), 1 << 20), 64 << 20)  # about a block's writes
            # The probe's random bytes must not draw from the model's generators: dropout after the
            # plan would draw other masks than training without offloading.
            device = _device(self.model)
            before = self.store.counters
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                bandwidth = planning.store_bandwidth(self.store, device, nbytes=probe)
            self.offloader.leave_out_of_stats(self.store.counters - before)  # the probe is not training's
        # Every candidate's predicted time shares this term; it sets the plan's predicted_seconds only.
        keep_seconds = (1 + 2) * sum(p.forward_seconds for p in profiles)
        keep_last = min(self.keep_last, len(profiles))
        if keep_last == len(profiles) and self.policy == "offload_adaptive":  # (the planner may still recompute)
            warn(
                f"SSDTrain offload_adaptive offloads nothing: keep_last={self.keep_last} keeps every one of the "
                f"model's {len(profiles)} blocks; lower keep_last"
            )
        if self.policy == "offload_adaptive":
            self.plan = planning.adaptive(
                profiles, bandwidth, keep_seconds, keep_last, fixed_bytes=fixed, prefetch=self.offloader.prefetch
            )
            if keep_last < len(profiles) and OFFLOAD not in self.plan.decisions:
                forward = sum(p.forward_seconds for p in profiles)
                warn(
                    f"SSDTrain offload_adaptive offloads nothing: the first block's writes "
                    f"({profiles[0].movable_bytes} B at the store's {bandwidth / 1e9:.3g} GB/s) would not end "
                    f"within the profiled forward ({forward * 1e3:.3g} ms), so every block is kept; a faster "
                    "store, or the planner with a budget, saves memory here"
                )
        else:
            kept = sum(p.saved_bytes for p in profiles) + fixed
            budget = int(self.budget * kept) if self.budget is not None else kept
            if self.peak_budget is not None and not planning.has_peaks(profiles):
                raise UserError(
                    "SSDTrain planner: the profiled step traced no peaks (a block ran twice in it, or it ran no "
                    "backward), so peak_budget= cannot be planned for; plan with budget= instead"
                )
            self.plan = planning.plan(
                profiles,
                bandwidth,
                keep_seconds,
                budget,
                keep_last,
                fixed_bytes=fixed,
                peak_budget_bytes=self.peak_budget,
                prefetch=self.offloader.prefetch,  # the engine's reads, as the model times them
            )
            if self.peak_budget is not None and self.plan.predicted_peak_bytes > self.peak_budget:
                warn(
                    f"SSDTrain planner: no plan fits peak_budget={self.peak_budget} B; the plan with the lowest "
                    f"predicted peak, {self.plan.predicted_peak_bytes} B, is used: raise the budget"
                )
            elif self.plan.predicted_activation_bytes > budget:
                warn(
                    f"SSDTrain planner: no plan fits budget={self.budget} ({budget} B of activations); the plan that "
                    f"holds the least, {self.plan.predicted_activation_bytes} B, is used: raise the budget"
                )
        # A block that did not run in the profiled step (LayerDrop, a conditional block) is kept: its
        # empty profile costs nothing whatever it is decided, and nothing is known of what it saves.
        idle = [i for i in range(len(profiles)) if not timer.ran(i)]
        if idle:
            decisions = tuple(KEEP if i in idle else d for i, d in enumerate(self.plan.decisions))
            self.plan = dataclasses.replace(self.plan, decisions=decisions)
        self.decisions = list(self.plan.decisions)


def _layer_bytes(stats: StepStats) -> StepStats:
    """A copy of ``stats``'s counts per layer (what a profile reads), as they are now."""
    copy = StepStats()
    copy.layers = {layer: dataclasses.replace(counts) for layer, counts in stats.layers.items()}
    copy.largest = dict(stats.largest)
    return copy


def _no_key_value_cache(model: nn.Module, stack: contextlib.ExitStack) -> None:
    """Turn a Hugging Face model's key-value cache off while blocks are recomputed, as its own
    gradient checkpointing does in training: a recomputed block would find the cache its forward
    filled (T5's cross-attention then skips work, and the recomputation saves other tensors than
    the forward did). The cache only serves generation; losses and gradients are the model's with
    ``use_cache=False``, which on some models (T5 with dropout) differ from ``use_cache=True``'s in
    the last bits, as under Hugging Face's own checkpointing. Off whatever the model's mode when
    the block is entered: a model entered in eval mode may train inside it (``model.train()``), and
    a forward in eval mode with gradients recomputes too; a forward without gradients (generation)
    recomputes nothing and may still ask for the cache."""
    # Each sub-model may hold its own copy of the config (T5's decoder does).
    holders = [m for m in model.modules() if hasattr(getattr(m, "config", None), "use_cache")]
    configs = {id(m.config): m.config for m in holders}
    if not configs:
        return
    said = []

    def say_once() -> None:
        if not said:
            said.append(True)
            warn(
                f"{type(model).__name__}: use_cache is off inside the offload() block, as blocks are recomputed "
                "(a recomputed block cannot reuse the key-value cache its forward filled): results are the model's "
                "with use_cache=False"
            )

    for config in configs.values():
        if config.use_cache is True:
            try:
                config.use_cache = False
            except AttributeError:
                # A config of the user's own that cannot change (a frozen dataclass, a named tuple):
                # not Hugging Face's, whose cache this is about; left as it is.
                continue
            say_once()
            stack.callback(setattr, config, "use_cache", True)

    def no_cache_asked(module, args, kwargs):  # model(..., use_cache=True) in a call
        if kwargs.get("use_cache") is True and torch.is_grad_enabled():
            say_once()
            return args, kwargs | {"use_cache": False}
        return None

    # On every module with a config, not only the model: a call of ``model.forward`` (no hook of
    # the model's runs) or of one stack (``model.decoder(...)``) passes use_cache down through them.
    for holder in holders:
        stack.callback(holder.register_forward_pre_hook(StepHook(no_cache_asked), with_kwargs=True).remove)


def offload(
    model: nn.Module,
    *,
    store: Store | None = None,
    policy: str | Plan | Callable[[int], str] = "offload_all",
    layers: list[nn.Module] | None = None,
    keep_last: int = 1,
    min_bytes: int = 1 << 20,
    prefetch: int = 1,
    always_read_back: bool = False,
    budget: float | None = None,
    bandwidth: float | None = None,
    peak_budget: int | None = None,
) -> Offloading:
    """``policy`` (see the module) applied to ``model`` within a ``with`` block.

    ``store``: where offloaded activations go (an open Store; the caller closes it); needed by the
    policies that offload, refused by the others. ``layers``: the blocks (default: ``find_layers``).
    ``keep_last``: how many of the last blocks are never offloaded (their backward comes first; a
    callable's offload answers for them are overridden, a Plan's decisions are applied as they are).
    ``min_bytes``: saved tensors of smaller storages are kept. ``prefetch``: how many blocks ahead backward
    reads back. ``always_read_back``: backward waits for each write and reads it back (checks of
    the stored bytes). ``budget``: the planner's activation budget, a fraction of keep's bytes.
    ``peak_budget``: the planner's budget for the step's predicted activation peak, in bytes above
    what the model's forward starts with (a model on a CUDA device, whose profile traces the peaks).
    ``bandwidth``: the store's B/s for the planned policies (default: measured)."""
    return Offloading(
        model,
        store=store,
        policy=policy,
        layers=layers,
        keep_last=keep_last,
        min_bytes=min_bytes,
        prefetch=prefetch,
        always_read_back=always_read_back,
        budget=budget,
        bandwidth=bandwidth,
        peak_budget=peak_budget,
    )


def _check_policy(policy, store: Store | None, blocks: int):
    """``policy`` checked against the store it was given and the model's block count."""
    if isinstance(policy, Plan):
        if len(policy.decisions) != blocks:
            raise UserError(f"the plan has {len(policy.decisions)} decisions for the model's {blocks} blocks")
        budgets = policy.budgets or (None,) * blocks
        if len(budgets) != blocks:
            raise UserError(f"the plan has {len(budgets)} budgets for the model's {blocks} blocks")
        for decision, budget in zip(policy.decisions, budgets, strict=True):
            # Any other word would silently keep the block; a budget its decision does not name
            # would compile a block the plan keeps (or leave eager one it budgets).
            if budget is None and decision not in DECISIONS:
                raise UserError(f"the plan decides {decision!r} for a block; decisions are one of {DECISIONS}")
            if budget is not None:
                named = [budget_decision(check_budget(budget), offloaded) for offloaded in (False, True)]
                if decision not in named:
                    raise UserError(
                        f"the plan decides {decision!r} for a block it budgets at {budget!r} "
                        f"(expected {' or '.join(map(repr, named))})"
                    )
        if any(map(offloads, policy.decisions)) and store is None:
            raise UserError("the plan offloads blocks: give offload() a store (systems.ssdtrain.stores)")
        return policy
    if callable(policy):
        try:
            inspect.signature(policy).bind(0)
        except TypeError:
            raise UserError(
                f"a callable policy is called with a block's index and returns its decision "
                f"(policy(i) -> one of {DECISIONS}); {getattr(policy, '__name__', 'this one')} cannot take one argument"
            ) from None
        except ValueError:  # no signature to read (some builtins): asked as it is
            pass
        return policy
    if policy not in NAMED:
        raise UserError(f"unknown policy {policy!r}: choose one of {', '.join(NAMED)}, a Plan or a callable")
    offloading = policy in ("offload_all", *PLANNED)
    if offloading and store is None:
        raise UserError(f"policy {policy} offloads: give offload() a store (systems.ssdtrain.stores)")
    if not offloading and store is not None:
        raise UserError(f"policy {policy} offloads nothing: it takes no store")
    return policy


def _budgeted_blocks(plan: Plan, layers: list[nn.Module]) -> CompiledBlocks | None:
    """The blocks ``plan`` runs under an activation memory budget, compiled at their budgets when
    first called (None: the plan budgets no block). A block compiled already would run the user's
    compiled code, not the plan's budget: refused."""
    budgets = plan.budgets or (None,) * len(layers)
    chosen = [i for i, budget in enumerate(budgets) if budget is not None]
    if not chosen:
        return None
    for index in chosen:
        if holds_compiled_code(layers[index]):
            raise UserError(
                f"the plan runs block {index} under activation memory budget {budgets[index]:g}, and the block is "
                "compiled already: pass the block uncompiled (offload() compiles it at the plan's budget)"
            )
    return CompiledBlocks([layers[i] for i in chosen], numbers=chosen, budgets=[budgets[i] for i in chosen])


def _name(policy) -> str:
    return policy if isinstance(policy, str) else type(policy).__name__


def _device(model: nn.Module) -> torch.device:
    tensor = next(model.parameters(), None)
    return tensor.device if tensor is not None else torch.device("cpu")
