"""Which layers to keep, offload or recompute: a cost model, SSDTrain's adaptive rule and a planner.

A step is modelled from a profile of its layers (``LayerProfile``: the bytes each layer saves for
backward, of which those in storages below the offloader's ``min_bytes`` no decision but
recomputation frees, the bytes of its input, its forward time) and the store's bandwidth:

* Forward runs the layers in order; layer i runs from S_i to E_i. The engine starts a tensor's
  write when the tensor is saved, so an offloaded layer's bytes join one write queue (first in,
  first out, drained at the store's bandwidth B) as a steady stream over its forward: its write
  ends at W_i = max(E_i, max(W_{i-1}, S_i) + bytes_i / B), bytes_i being what it can move (its
  storages below ``min_bytes`` stay in memory, held like a kept layer's). At a time T after E_i, the bytes of
  layer i not yet written are min(bytes_i, (W_i - T) B), at least 0: the queue runs at B from T on.
* Backward runs the layers in reverse, each taking ``backward_ratio`` times its forward. When it
  reaches layer i + ``prefetch`` (the engine's prefetch: one layer ahead by default; the start of
  backward for the last ``prefetch`` layers; layer i itself at 0; the engine asks at a layer's
  first unpacked tensor, so past layers that save no tensor at all, the highest layer up to
  i + ``prefetch`` that saves one, a parameter included) the part of layer i already
  written is read back (one read queue, in the order asked), the rest stays in memory (its
  tensors were never freed); backward waits at layer i if the read is late.
* A recomputed layer keeps only its input and runs its forward again in backward.
* A compiled layer may also run under one of torch's activation memory budgets (an
  :class:`Alternative` of its profile, measured by compiling the blocks at that budget): it holds
  what its compiled forward saves there and costs the extra seconds measured for it (recomputation
  inside its compiled backward). It may be offloaded at that budget too (``offload_budget_B``):
  what it saves there is written and read back as an offloaded layer's is, at the budget's cost.
* Step time = the measured keep step + recomputed forwards + read stalls + writes still running
  when backward ends (a step waits for its transfers). Activation bytes = what is held on the
  device when forward ends: kept layers, recomputed layers' inputs, and of offloaded layers the
  bytes not yet written and those they cannot move.
* Activation peak (on a GPU, where the profile measured the allocator's peak in each segment of a
  kept step: each layer's forward, to the next layer's start; the head's backward, from the end of
  forward to the first layer backward reaches; each layer's backward): per segment, keep's
  measured peak less what the plan holds below it that keep holds. In layer k's forward the
  layers below hold what they saved (an offloaded one: its bytes not yet written when layer k
  ends); in the head's backward every layer, the top one too (its backward has not begun), holds
  what it held when forward ended, except those the prefetch reads back from the start of backward,
  read back in full; in
  layer i's backward the layers below do too, except those asked for by then (layers i -
  ``prefetch`` to i - 1, where each saves a tensor). The
  running layer itself counts as keep's (a recomputed layer saves its tensors again in its
  backward), and so do the transients of the head and of each backward (the logits' gradient, a
  block's workspace), which keep's peaks hold and no plan moves. The step's peak is the largest
  segment's.

``adaptive`` is SSDTrain's rule: offload the longest run of leading layers whose writes finish
by the end of forward (so offloading frees memory and costs no time), keep the rest. ``plan``
goes beyond the paper: it picks per layer keep, offload, recompute (or, for compiled layers
profiled at torch's activation memory budgets, one of those budgets) to minimise the predicted
step time within an activation budget. Both return a :class:`Plan` whose predictions are
recorded next to the measured step (workloads/llm_offload).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import statistics
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from harness import timing
from harness.errors import UserError
from systems.ssdtrain.cache import storage_key
from systems.ssdtrain.engine import Offloader, StepHook, has_storage_identity
from systems.ssdtrain.recompute import tensors_in
from systems.ssdtrain.stores import StoreCorrupted
from systems.ssdtrain.stores.host import HostStore
from systems.ssdtrain.user_compiled import runs_compiled

KEEP, OFFLOAD, RECOMPUTE = "keep", "offload", "recompute"
DECISIONS = (KEEP, OFFLOAD, RECOMPUTE)  # for any layer; a compiled one may also take a profiled budget
OFFLOADED_BUDGET = f"{OFFLOAD}_budget_"  # the prefix of a budget's decision with its saved tensors offloaded
EXHAUSTIVE = 3**10  # the most candidate plans plan() predicts one by one


@dataclass(frozen=True)
class Alternative:
    """A compiled layer run under torch's ``activation_memory_budget``: what it then saves and
    what that costs over its kept step (measured: :func:`with_budgets`)."""

    budget: float
    saved_bytes: int
    extra_seconds: float
    unoffloadable_bytes: int = 0  # of saved_bytes, in storages below the offloader's min_bytes

    @property
    def decision(self) -> str:
        return budget_decision(self.budget)

    @property
    def offloaded_decision(self) -> str:
        return budget_decision(self.budget, offloaded=True)

    @property
    def movable_bytes(self) -> int:
        return self.saved_bytes - self.unoffloadable_bytes


def budget_decision(budget: float, offloaded: bool = False) -> str:
    """The plan's decision for a layer compiled under activation memory budget ``budget`` (with
    what it saves there offloaded, given ``offloaded``)."""
    return f"{OFFLOAD + '_' if offloaded else ''}budget_{number_text(budget)}"


def offloads(decision: str) -> bool:
    """Whether ``decision`` sends the layer's saved tensors to the store (at a budget or not)."""
    return decision == OFFLOAD or decision.startswith(OFFLOADED_BUDGET)


def number_text(value: float) -> str:
    """The shortest text that names ``value`` exactly (``0.5``, ``1``, ``0.1234567``): names built
    from numbers must not merge two settings that six significant digits cannot tell apart."""
    if isinstance(value, bool | int):
        return str(value)
    short = f"{value:g}"
    return short if float(short) == value else repr(float(value))


@dataclass(frozen=True)
class LayerProfile:
    saved_bytes: int  # what the layer saves for backward (no parameters): what keep holds
    input_bytes: int  # its input: what recomputation keeps instead
    forward_seconds: float
    alternatives: tuple[Alternative, ...] = ()  # compiled layers: the budgets it was profiled at
    # The allocator's peak above the step's starting allocation in a kept step while the layer's
    # forward ran (to the next layer's start) and while backward ran through it (None: unmeasured,
    # as on a CPU; see PeakTrace).
    forward_peak: int | None = None
    backward_peak: int | None = None
    head_peak: int | None = None  # the head's backward's (on the layer backward reaches first, else None)
    # Of saved_bytes, what offloading never moves (storages below min_bytes): held when offloaded too.
    unoffloadable_bytes: int = 0
    # Whether its backward unpacks a tensor it saved, parameters included (a frozen layer saves its
    # weight and nothing else): the engine asks for reads there. None: where it saves bytes.
    packs: bool | None = None
    # Whether its saved tensors reach the hooks only when its forward ends, all at once: a compiled
    # block (AOTAutograd saves for backward when its graph returns), whose writes can start no sooner.
    saved_at_end: bool = False

    @property
    def movable_bytes(self) -> int:
        """What offloading the layer writes to the store and reads back."""
        return self.saved_bytes - self.unoffloadable_bytes

    def writes_arrive(self, start: float, end: float) -> float:
        """When the layer's writes can start, its forward running from ``start`` to ``end``: as its
        tensors are saved (from its start), or all at its end (``saved_at_end``)."""
        return end if self.saved_at_end else start

    def alternative(self, decision: str) -> Alternative | None:
        """The budget ``decision`` runs the layer at (offloaded there or not), or None."""
        return next((a for a in self.alternatives if decision in (a.decision, a.offloaded_decision)), None)

    def options(self, offloadable: bool) -> tuple[str, ...]:
        """The decisions open to this layer (the last ``keep_last`` layers are not offloadable)."""
        eager = (KEEP, OFFLOAD, RECOMPUTE) if offloadable else (KEEP, RECOMPUTE)
        offloaded = tuple(a.offloaded_decision for a in self.alternatives) if offloadable else ()
        return eager + tuple(a.decision for a in self.alternatives) + offloaded

    def moved(self, decision: str) -> tuple[int, int] | None:
        """Where ``decision`` offloads the layer, the bytes it writes and those it holds all the
        same (storages below ``min_bytes``), as it runs kept or at its budget; else None."""
        if not offloads(decision):
            return None
        ran = self if decision == OFFLOAD else self.alternative(decision)
        return ran.movable_bytes, ran.unoffloadable_bytes

    def asks(self, decision: str) -> bool:
        """Whether backward through the layer run as ``decision`` asks for reads: the engine asks at
        the first tensor of a layer it unpacks (a recomputed layer's: its input)."""
        if decision == RECOMPUTE:
            return self.input_bytes > 0
        return self.packs if self.packs is not None else self.held_and_extra(decision)[0] > 0

    def held_and_extra(self, decision: str) -> tuple[int, float]:
        """What a kept, recomputed or budgeted layer holds, and the seconds that adds to the step
        (an offloaded layer: what it saves, kept or at its budget, before any of it is written)."""
        if decision == RECOMPUTE:
            return self.input_bytes, self.forward_seconds
        alternative = self.alternative(decision)
        if alternative is not None:
            return alternative.saved_bytes, alternative.extra_seconds
        return self.saved_bytes, 0.0


@dataclass(frozen=True)
class Plan:
    decisions: tuple[str, ...]  # per layer: keep, offload or recompute (a budgeted layer: budget_B, offload_budget_B)
    predicted_seconds: float  # the step
    predicted_activation_bytes: int  # held on the device when forward ends
    stall_seconds: float  # read stalls and the wait for writes at the step's end
    bandwidth: float = 0.0  # the store's B/s the plan was made for
    budget_bytes: int | None = None  # the activation budget it was made within (plan()); None: no budget
    budgets: tuple[float | None, ...] = ()  # per layer: the activation memory budget it is compiled under
    predicted_peak_bytes: int | None = None  # the step's activation peak (None: the profile has no peaks)
    peak_budget_bytes: int | None = None  # the peak budget it was made within (plan()), where given one
    prefetch: int | None = None  # the engine's prefetch its prediction is for (None: a plan made by hand)

    def count(self, decision: str) -> int:
        return self.decisions.count(decision)

    @property
    def budgeted(self) -> int:
        """Layers the plan runs under an activation memory budget."""
        return sum(b is not None for b in self.budgets)

    @property
    def offloaded(self) -> int:
        """Layers whose saved tensors the plan offloads (kept or at a budget)."""
        return sum(map(offloads, self.decisions))


def _check(profiles: list[LayerProfile], bandwidth: float, keep_last: int) -> None:
    if not profiles:
        raise ValueError("no layers to plan")
    if not bandwidth > 0:
        raise ValueError(f"the store's bandwidth must be positive, got {bandwidth!r} B/s")
    if not 0 <= keep_last <= len(profiles):
        raise ValueError(f"keep_last must be between 0 and {len(profiles)}, got {keep_last}")


def predict(
    profiles: list[LayerProfile],
    decisions: tuple[str, ...] | list[str],
    bandwidth: float,
    keep_seconds: float,
    backward_ratio: float = 2.0,
    fixed_bytes: int = 0,
    prefetch: int = 1,
) -> Plan:
    """The modelled step (see the module) of ``decisions`` with a store of ``bandwidth`` B/s;
    ``fixed_bytes`` are saved outside the layers (embeddings, the loss) and always held;
    ``prefetch``: how many layers ahead backward reads back (the engine's ``prefetch``)."""
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"prefetch must be a whole number of layers, got {prefetch!r}")
    if len(decisions) != len(profiles) or any(
        d not in DECISIONS and p.alternative(d) is None for p, d in zip(profiles, decisions)
    ):
        raise ValueError(f"one decision of {DECISIONS} or a profiled budget per layer expected, got {decisions!r}")
    starts, ends = _timeline(profiles)
    forward_end = ends[-1]
    moved = {i: m for i, (p, d) in enumerate(zip(profiles, decisions)) if (m := p.moved(d)) is not None}
    written, queue = {}, 0.0  # layer -> when its write finishes
    for i, (movable, _) in moved.items():
        arrives = profiles[i].writes_arrive(starts[i], ends[i])
        queue = written[i] = _write_end(queue, arrives, ends[i], movable, bandwidth)

    def unwritten(i: int, at: float) -> float:
        # Tested first: an infinite bandwidth times the zero time left is no number.
        return 0.0 if written[i] <= at else min(moved[i][0], (written[i] - at) * bandwidth)

    # What each layer holds when forward ends (its peak segments start from these too).
    holds = [
        unwritten(i, forward_end) + moved[i][1] if i in moved else p.held_and_extra(d)[0]
        for i, (p, d) in enumerate(zip(profiles, decisions))
    ]
    held = sum(holds, float(fixed_bytes))
    # Backward, from the last layer down; `clock` includes the stalls so far, `reached` is when
    # backward reached each layer above (its computation began), from when the engine asks for
    # the layer `prefetch` below it.
    n = len(profiles)
    asker = _askers(profiles, decisions, prefetch)
    clock, reached = forward_end, {}
    reads = stall = 0.0
    for i in reversed(range(n)):
        if i in written:
            asked = forward_end if asker[i] == n else reached[asker[i]] if asker[i] != i else clock
            back = moved[i][0] - unwritten(i, asked)  # what the read finds written
            if back > 0:
                reads = max(reads, asked) + back / bandwidth
                if reads > clock:
                    stall += reads - clock
                    clock = reads
        reached[i] = clock
        clock += backward_ratio * profiles[i].forward_seconds + profiles[i].held_and_extra(decisions[i])[1]
    tail = max(0.0, max(written.values(), default=0.0) - clock)
    extra = sum(p.held_and_extra(d)[1] for p, d in zip(profiles, decisions))
    budgets = tuple(a.budget if (a := p.alternative(d)) else None for p, d in zip(profiles, decisions))
    seconds = keep_seconds + extra + stall + tail
    peak = _peak(profiles, holds, ends, {i: (functools.partial(unwritten, i), moved[i]) for i in written}, asker)
    return Plan(
        tuple(decisions),
        seconds,
        round(held),
        stall + tail,
        bandwidth,
        budgets=budgets,
        predicted_peak_bytes=peak,
        prefetch=prefetch,
    )


def has_peaks(profiles: list[LayerProfile]) -> bool:
    """Whether the profile traced the allocator's peaks of every layer that ran (forward and
    backward), as a step profiled on a CUDA device does: what a peak prediction needs."""
    ran = [p for p in profiles if p.forward_seconds or p.saved_bytes]
    return bool(ran) and all(p.forward_peak is not None and p.backward_peak is not None for p in ran)


def _askers(profiles: list[LayerProfile], decisions, prefetch: int) -> list[int]:
    """Per layer i, the layer whose backward asks for its read (len(profiles): the start of
    backward). The engine asks at the first tensor a layer's backward unpacks, for the layers up to
    ``prefetch`` below it: a layer that saves nothing asks for none, so layer i is asked by the
    highest layer from i to i + ``prefetch`` that asks (:meth:`LayerProfile.asks`; i itself, at worst)."""
    n = len(profiles)
    asks = [p.asks(d) for p, d in zip(profiles, decisions)]
    return [
        n if i + prefetch >= n else max(j for j in range(i, i + prefetch + 1) if j == i or asks[j]) for i in range(n)
    ]


def _peak(
    profiles: list[LayerProfile], holds: list[float], ends: list[float], offloaded: dict, asker: list[int]
) -> int | None:
    """The step's activation peak (see the module) from keep's measured segment peaks: ``holds``,
    what each layer holds when forward ends; ``offloaded``, per offloaded layer, its bytes not yet
    written at a time and (the bytes it writes, those it holds all the same); ``asker``, per layer,
    the layer whose backward asks for its read (``_askers``). None where a layer that ran has no
    measured peaks."""
    if not has_peaks(profiles):
        return None
    n = len(profiles)

    def read_back(below: int, since: int) -> float:
        # Of the layers below ``below`` asked for by ``since`` or above, what was written, read back
        # in full (their unwritten and small bytes are in holds).
        return sum(sum(offloaded[j][1]) - holds[j] for j in range(below) if j in offloaded and asker[j] >= since)

    peak = 0.0
    freed = 0.0  # what the layers below the segment's hold less than keep's, when forward ends
    in_flight: list[int] = []  # offloaded layers below, whose writes may still run
    for k, p in enumerate(profiles):
        if p.forward_peak is not None:
            in_flight = [j for j in in_flight if offloaded[j][0](ends[k]) > 0]
            unwritten_now = sum(offloaded[j][0](ends[k]) + offloaded[j][1][1] - holds[j] for j in in_flight)
            peak = max(peak, p.forward_peak - freed + unwritten_now)
        if p.head_peak is not None:  # the head's backward, before this (the top) layer's: which holds
            # what it held when forward ended (a recomputed one, its input), less what was read back
            peak = max(peak, p.head_peak - freed - (p.saved_bytes - holds[k]) + read_back(k + 1, n))
        if p.backward_peak is not None:
            peak = max(peak, p.backward_peak - freed + read_back(k, k))
        freed += p.saved_bytes - holds[k]
        if k in offloaded:
            in_flight.append(k)
    return round(max(peak, 0.0))


def _timeline(profiles: list[LayerProfile]) -> tuple[list[float], list[float]]:
    """When each layer's forward starts and ends, from the start of forward."""
    starts, ends, t = [], [], 0.0
    for p in profiles:
        starts.append(t)
        t += p.forward_seconds
        ends.append(t)
    return starts, ends


def _write_end(queue: float, start: float, end: float, nbytes: int, bandwidth: float) -> float:
    """When a layer's write ends: its bytes arrive steadily from ``start`` to ``end`` (``start`` =
    ``end``: all at once, as a compiled block's) into a queue busy until ``queue``; the last byte
    cannot leave before it arrives."""
    return max(end, max(queue, start) + nbytes / bandwidth)


def adaptive(profiles: list[LayerProfile], bandwidth: float, keep_seconds: float, keep_last: int = 1, **model) -> Plan:
    """SSDTrain's adaptive keep: offload the longest run of leading layers (the last ``keep_last``
    never) whose writes all finish by the end of forward; keep the rest."""
    _check(profiles, bandwidth, keep_last)
    best = predict(profiles, [KEEP] * len(profiles), bandwidth, keep_seconds, **model)
    starts, ends = _timeline(profiles)
    queue = 0.0
    for k in range(1, len(profiles) - keep_last + 1):
        layer = profiles[k - 1]
        arrives = layer.writes_arrive(starts[k - 1], ends[k - 1])
        queue = _write_end(queue, arrives, ends[k - 1], layer.movable_bytes, bandwidth)
        if queue > ends[-1]:
            break
        best = predict(profiles, [OFFLOAD] * k + [KEEP] * (len(profiles) - k), bandwidth, keep_seconds, **model)
    return best


def plan(
    profiles: list[LayerProfile],
    bandwidth: float,
    keep_seconds: float,
    budget_bytes: int,
    keep_last: int = 1,
    *,
    peak_budget_bytes: int | None = None,
    **model,
) -> Plan:
    """The keep / offload / recompute choice per layer (or a profiled activation memory budget,
    for compiled layers) with the smallest predicted step time whose activation bytes fit
    ``budget_bytes`` and, given ``peak_budget_bytes``, whose predicted activation peak fits that
    (the memory a GPU must have room for: the profile must hold peaks, as a GPU's does); if none
    fits, the one that holds the least (the lowest peak, given a peak budget). The last
    ``keep_last`` layers are never offloaded (the engine keeps them). Exhaustive up to
    ``EXHAUSTIVE`` choices (3^10: ten layers of three choices); beyond that, every plan without a
    layer offloaded at a budget where those are within ``EXHAUSTIVE``, and greedily: offloading a
    leading run (kept, or at one of the budgets) and trading memory for time in the rest."""
    _check(profiles, bandwidth, keep_last)
    n = len(profiles)
    options = [p.options(offloadable=i < n - keep_last) for i, p in enumerate(profiles)]
    if math.prod(map(len, options)) <= EXHAUSTIVE:
        candidates = _all(options)
    else:
        # Every plan that offloads no budgeted layer where those are few enough to try, and the
        # greedy's: never a worse plan than the search had before offloading at a budget was a choice.
        plain = [tuple(o for o in choices if not o.startswith(OFFLOADED_BUDGET)) for choices in options]
        tried = _all(plain) if math.prod(map(len, plain)) <= EXHAUSTIVE else []
        candidates = list(dict.fromkeys(tried + _greedy(profiles, options)))
    if peak_budget_bytes is not None and not has_peaks(profiles):
        raise UserError(
            "a peak budget needs a profile with the layers' peaks (planning.profile on a CUDA device traces them); "
            "this one has none"
        )
    plans = [predict(profiles, c, bandwidth, keep_seconds, **model) for c in candidates]

    def held(p: Plan) -> int:  # what a budget bounds: the activation bytes, or the peak given a peak budget
        return p.predicted_activation_bytes if peak_budget_bytes is None else p.predicted_peak_bytes

    fitting = [
        p
        for p in plans
        if p.predicted_activation_bytes <= budget_bytes
        and (peak_budget_bytes is None or p.predicted_peak_bytes <= peak_budget_bytes)
    ]
    if fitting:
        best = min(fitting, key=lambda p: (p.predicted_seconds, held(p), p.predicted_activation_bytes))
    else:
        best = min(plans, key=lambda p: (held(p), p.predicted_activation_bytes, p.predicted_seconds))
    return dataclasses.replace(best, budget_bytes=budget_bytes, peak_budget_bytes=peak_budget_bytes)


def _all(options):
    plans = [()]
    for choices in options:
        plans = [p + (c,) for p in plans for c in choices]
    return plans


def _greedy(profiles, options):
    """For each way of running every layer alike (kept, or at a budget every layer was profiled
    at): offload layers 0..k-1 run that way (k from 0 up), then, one move at a time, change the
    rest's decision to the one (recompute or a budget) that frees the most bytes per added second
    over what the layer holds now: every step of each sequence is a candidate."""
    n, candidates = len(profiles), {}
    offloadable = sum(1 for o in options if OFFLOAD in o)
    shared = [a for a in profiles[0].alternatives if all(p.alternative(a.decision) for p in profiles)]
    for alike, offloaded in [(KEEP, OFFLOAD)] + [(a.decision, a.offloaded_decision) for a in shared]:
        for k in range(offloadable + 1):
            base = [offloaded] * k + [alike] * (n - k)
            candidates[tuple(base)] = None
            while True:
                moves = []
                for i in range(k, n):
                    held, extra = profiles[i].held_and_extra(base[i])
                    for option in options[i]:
                        if offloads(option):
                            continue
                        option_held, option_extra = profiles[i].held_and_extra(option)
                        if option_held < held:
                            rate = (held - option_held) / max(option_extra - extra, 1e-12)
                            moves.append((rate, i, option))
                if not moves:
                    break
                _, i, option = max(moves, key=lambda m: (m[0], -m[1]))  # ties: the lowest layer first
                base[i] = option
                candidates[tuple(base)] = None
    return list(candidates)


def with_budgets(
    profiles: list[LayerProfile], keep_seconds: float, at_budgets: dict[float, tuple[list[LayerProfile], float]]
) -> list[LayerProfile]:
    """``profiles`` (of the compiled blocks, kept) with an :class:`Alternative` per budget of
    ``at_budgets``: budget -> the profile and step seconds of the blocks compiled at that budget
    (:func:`profile` within ``CompiledBlocks(layers, budget).installed``). A layer's saved bytes at
    a budget are its own; its extra seconds are its own forward's change plus a share of the
    backward's change (the step's change less the forwards'), shared in proportion to the layers'
    forward times, since backward is not timed per layer. A change below zero (a budget is never
    faster than keeping, only noisier) counts as none."""
    total_forward = sum(p.forward_seconds for p in profiles) or 1.0
    out = []
    for i, p in enumerate(profiles):
        alternatives = []
        for budget, (budgeted, seconds) in sorted(at_budgets.items()):
            if len(budgeted) != len(profiles):
                raise ValueError(f"the profile at budget {budget:g} has {len(budgeted)} layers, not {len(profiles)}")
            forward_change = sum(b.forward_seconds for b in budgeted) - total_forward
            backward_change = (seconds - keep_seconds) - forward_change
            share = p.forward_seconds / total_forward
            extra = budgeted[i].forward_seconds - p.forward_seconds + backward_change * share
            at = budgeted[i]
            alternatives.append(Alternative(budget, at.saved_bytes, max(0.0, extra), at.unoffloadable_bytes))
        out.append(dataclasses.replace(p, alternatives=tuple(alternatives)))
    return out


# -- measuring what the model needs -------------------------------------------------------------


def device_of(device) -> torch.device:
    """``device`` given any way torch accepts it (``"cuda"``, ``"cuda:0"``, ``torch.device``, an
    index), checked to be a CPU or a CUDA device."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise UserError(f"{device!r} is not a device torch knows ({err})") from None
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"profiling runs on a CPU or a CUDA device, not {device}")
    return device


def _mark(device: torch.device):
    """A point in time on ``device``'s clock: a CUDA event on its current stream, or the host clock."""
    if device.type != "cuda":
        return timing.mark("cpu")
    with torch.cuda.device(device):
        return timing.mark("cuda")


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class LayerTimer:
    """Forward hooks on ``layers`` that record, for the last forward, each layer's input storages
    (of its positional and keyword tensors) and the marks around its forward. A layer run again in
    backward (recomputation) is not recorded, nor one run without gradients (evaluation under
    ``torch.no_grad`` or ``torch.inference_mode``: not a training step's forward). Input tensors
    without a storage identity (sparse, nested, inference tensors) are not counted."""

    def __init__(self, layers, device):
        self.device = device_of(device)
        self.starts, self.ends, self.inputs = {}, {}, {}
        self.ran_without_gradients = False  # a layer ran in forward with gradients off (told when none ran)
        self.stopped = False
        self._hooks = []
        for index, layer in enumerate(layers):
            before = StepHook(functools.partial(self._before, index))
            self._hooks.append(layer.register_forward_pre_hook(before, with_kwargs=True))
            self._hooks.append(layer.register_forward_hook(StepHook(functools.partial(self._after, index))))

    @staticmethod
    def _recorded() -> bool:
        return torch._C._current_graph_task_id() == -1 and torch.is_grad_enabled()

    def _before(self, index, module, args, kwargs):
        if self.stopped:
            return
        if not self._recorded():
            if torch._C._current_graph_task_id() == -1:
                self.ran_without_gradients = True
            return
        # Storage identity -> (bytes, a reference that keeps the identity unique while it is held).
        self.inputs[index] = {
            key: (tensor.untyped_storage().nbytes(), reference)
            for tensor in tensors_in([*args, *kwargs.values()])
            if has_storage_identity(tensor)
            for key, reference in [storage_key(tensor)]
        }
        self.starts[index] = _mark(self.device)

    def _after(self, index, module, args, output):
        if self._recorded() and not self.stopped:
            self.ends[index] = _mark(self.device)

    def forget(self) -> None:
        """Drop what was recorded: the forward it was of will have no backward."""
        self.starts, self.ends, self.inputs = {}, {}, {}

    def input_bytes(self, count: int) -> list[int]:
        """The first ``count`` layers' input bytes, each storage counted in the first layer given it:
        recomputing several layers holds a storage they share (the rotary tables, the attention
        mask) once, as the step's count of what it holds does (recompute.checkpointed)."""
        seen, out = set(), []
        for index in range(count):
            inputs = self.inputs.get(index, {})  # a layer that did not run holds nothing
            fresh = inputs.keys() - seen
            seen |= fresh
            out.append(sum(inputs[key][0] for key in fresh))
        return out

    def ran(self, index: int) -> bool:
        """Whether layer ``index``'s forward was recorded (it ran in a forward with gradients)."""
        return index in self.starts and index in self.ends

    def forward_seconds(self) -> dict[int, float]:
        """Each recorded layer's forward time (waits for the device first)."""
        _synchronize(self.device)
        return {i: timing.elapsed(self.starts[i], self.ends[i]) for i in self.starts if i in self.ends}

    def stop(self) -> None:
        """Record nothing more. Unlike :meth:`remove`, safe inside a hook of the layers: torch calls
        the hooks it has collected for a call even once removed, a keyword one then without its keywords."""
        self.stopped = True

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


class PeakTrace:
    """The allocator's peak in each segment of one step, above what was allocated when it started
    (:meth:`start`; given ``model``, when the model's forward starts: a step that frees gradients
    before its forward and allocates them again in backward counts them, one that zeroes them in
    place does not), until the step's first backward ends: layer i's forward runs from its start
    to the next layer's (the embeddings before layer 0 count with layer 0's), its backward from
    backward's first unpack of its tensors to the next layer's (what runs below layer 0 counts
    with layer 0's); the head's backward runs from backward's first unpack until the first
    layer's (``head``, of layer ``head_layer``). Forward is told by forward pre-hooks on the layers
    (a recomputation in backward belongs to backward), backward by the Offloader's
    ``backward_listeners``. A layer whose forward runs twice in the step (a block shared by two
    places) cannot be told apart in backward: the trace then measures nothing (``measured`` stays
    False). Reading the peak resets the device's peak statistics
    (``torch.cuda.reset_peak_memory_stats``) at every segment.

    ``meter``: ``allocated()``, ``peak()`` (since the last ``reset()``) and ``reset()``: the CUDA
    allocator's (:class:`CudaMeter`) in :func:`profile`, another in a test."""

    def __init__(self, layers, meter, model=None):
        self.meter = meter
        self.forward: dict[int, int] = {}
        self.backward: dict[int, int] = {}
        self.head, self.head_layer = 0, None
        self.measured = False  # whether a step was traced through its backward (and has stopped)
        self._armed = self._awaiting_model = False
        self._hooks = [
            layer.register_forward_pre_hook(StepHook(functools.partial(self._forward_started, index)))
            for index, layer in enumerate(layers)
        ]
        if model is not None:
            self._hooks.append(model.register_forward_pre_hook(StepHook(self._model_started)))
        self._model = model

    def start(self) -> None:
        """Measure from now on (the segments of the step that starts now)."""
        self.forward, self.backward, self.measured = {}, {}, False
        self.head, self.head_layer = 0, None
        self.meter.reset()
        self._base = self.meter.allocated()
        self._segment: tuple[str, int | None] = ("forward", 0)
        self._forwards: set[int] = set()  # the layers whose forward ran in the step
        self._repeated = self._stopping = False
        self._armed = True
        self._awaiting_model = self._model is not None

    def _model_started(self, module, args) -> None:
        if self._armed and self._awaiting_model and torch._C._current_graph_task_id() == -1:
            self._awaiting_model = False
            self.meter.reset()
            self._base = self.meter.allocated()

    def stop(self) -> None:
        """The step has ended: close its last segment and measure nothing more."""
        if self._armed:
            self._close()
            self._armed = False
            self.measured = bool(self.backward) and not self._repeated

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def backward_reached(self, layer: int | None) -> None:
        """Backward unpacked a tensor of ``layer`` (None: saved outside the layers) for the first
        time: an Offloader's listener (an unpack outside a backward is not one)."""
        if not self._armed or torch._C._current_graph_task_id() == -1:
            return
        if not self._stopping:  # the step's first backward: the trace ends with it
            self._stopping = True
            torch.autograd.Variable._execution_engine.queue_callback(self.stop)
        if layer is None:
            if self._segment[0] == "forward":  # the first unpack: forward is over, the head's backward runs
                self._close()
                self._segment = ("head", None)
            return
        self._close()
        self._segment = ("backward", layer)
        if self.head_layer is None:
            self.head_layer = layer

    def _forward_started(self, index, module, args) -> None:
        if self._armed and torch._C._current_graph_task_id() == -1 and torch.is_grad_enabled():
            self._repeated |= index in self._forwards
            self._forwards.add(index)
            self._close()
            self._segment = ("forward", index)

    def _close(self) -> None:
        peak = max(0, self.meter.peak() - self._base)
        kind, index = self._segment
        if kind == "head":
            self.head = max(self.head, peak)
        else:
            table = self.forward if kind == "forward" else self.backward
            table[index] = max(table.get(index, 0), peak)
        self.meter.reset()


def meter_for(device: torch.device):
    """What measures the allocator's bytes on ``device`` for a :class:`PeakTrace`: a
    :class:`CudaMeter` on a CUDA device, None elsewhere (no allocator statistics)."""
    return CudaMeter(device) if device.type == "cuda" else None


class CudaMeter:
    """The CUDA caching allocator's bytes on ``device``, for :class:`PeakTrace`."""

    def __init__(self, device: torch.device):
        self.device = device

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def reset(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)


def profiles_of(
    stats, timer: LayerTimer, count: int, peaks: PeakTrace | None = None, saved_at_end: Sequence[bool] = ()
) -> tuple[list[LayerProfile], int]:
    """The ``count`` layers' profiles from one step's ``StepStats`` (under an Offloader that keeps
    everything), its ``LayerTimer`` and its ``PeakTrace`` (where one measured the step), and the
    bytes saved outside the layers. A layer that did not
    run in the step (LayerDrop, a block run on some inputs only) saved nothing and took no time: its
    profile is empty (:meth:`LayerTimer.ran` tells it apart); if none ran, the layers are not the model's."""
    forward = timer.forward_seconds()
    if count and not forward and timer.ran_without_gradients:
        raise UserError(
            f"none of the {count} blocks ran with gradients in the profiled step's forward, so there is nothing "
            "to plan (a reentrant checkpoint, use_reentrant=True, or an autograd.Function such as a reversible "
            "layer's runs its blocks under no_grad): the planned policies recompute blocks themselves; call the "
            "blocks directly, or checkpoint with use_reentrant=False"
        )
    if count and not forward:
        raise UserError(
            f"none of the {count} blocks ran in the profiled step: the blocks (layers=) must be modules the "
            "model's forward calls"
        )
    profiles = []
    for i, input_bytes in enumerate(timer.input_bytes(count)):
        layer = stats.layers.get(i)
        saved = 0 if layer is None else layer.unique_bytes - layer.parameter_bytes
        unoffloadable = 0 if layer is None else layer.unoffloadable_bytes
        measured = peaks is not None and peaks.measured and timer.ran(i)
        forward_peak = peaks.forward.get(i, 0) if measured else None
        backward_peak = peaks.backward.get(i, 0) if measured else None
        head_peak = peaks.head if measured and i == peaks.head_layer else None
        profiles.append(
            LayerProfile(
                saved,
                input_bytes,
                forward.get(i, 0.0),
                (),
                forward_peak,
                backward_peak,
                head_peak,
                unoffloadable,
                packs=layer is not None and layer.packed_tensors > 0,
                saved_at_end=i < len(saved_at_end) and saved_at_end[i],
            )
        )
    outside = stats.layers.get(None)
    return profiles, 0 if outside is None else outside.unique_bytes - outside.parameter_bytes


def record_of_profiles(profiles: list[LayerProfile]) -> dict:
    """``profiles`` as plain lists, as a part records them (:func:`profiles_of_record` reads them back)."""
    budgets = sorted({a.budget for p in profiles for a in p.alternatives})
    at_budgets = {}
    for budget in budgets:
        at = [p.alternative(budget_decision(budget)) for p in profiles]
        at_budgets[f"at_budget_{number_text(budget)}"] = {
            "saved_bytes": [a.saved_bytes for a in at],
            "unoffloadable_bytes": [a.unoffloadable_bytes for a in at],
            "extra_seconds": [a.extra_seconds for a in at],
        }
    return {
        "saved_bytes": [p.saved_bytes for p in profiles],
        "unoffloadable_bytes": [p.unoffloadable_bytes for p in profiles],
        "packs": [p.packs for p in profiles],  # where backward asks for reads (_askers)
        "input_bytes": [p.input_bytes for p in profiles],
        "forward_seconds": [p.forward_seconds for p in profiles],
        # The allocator's peaks per layer of the kept step (GPU; None on a CPU): PeakTrace.
        "forward_peaks": [p.forward_peak for p in profiles],
        "backward_peaks": [p.backward_peak for p in profiles],
        # The head's backward's, on the layer backward reaches first (None elsewhere).
        "head_peaks": [p.head_peak for p in profiles],
        "saved_at_end": [p.saved_at_end for p in profiles],  # compiled blocks: writes start at their end
    } | at_budgets


def profiles_of_record(record: dict) -> list[LayerProfile]:
    """The blocks' profiles as a part records them (its provenance's ``profile``: saved and input
    bytes, forward seconds; the unoffloadable bytes, the traced peaks and, of compiled blocks, the
    budgets they were profiled at, where the record has them), so that a record's plans can be
    predicted again offline as the part predicted them."""
    saved = record["saved_bytes"]
    n = len(saved)
    unoffloadable = record.get("unoffloadable_bytes") or [0] * n
    packs = record.get("packs") or [None] * n  # older records: where a block saves bytes
    peaks = [record.get(key) or [None] * n for key in ("forward_peaks", "backward_peaks", "head_peaks")]
    at_end = record.get("saved_at_end") or [False] * n  # older records: as eager blocks
    at_budgets = {
        float(key.removeprefix("at_budget_")): at for key, at in record.items() if key.startswith("at_budget_")
    }
    # older records' budgets: nothing below min_bytes
    unoffloadable_at = {budget: at.get("unoffloadable_bytes") or [0] * n for budget, at in at_budgets.items()}
    alternatives = [
        tuple(
            Alternative(budget, at["saved_bytes"][i], at["extra_seconds"][i], unoffloadable_at[budget][i])
            for budget, at in sorted(at_budgets.items())
        )
        for i in range(n)
    ]
    columns = (
        saved,
        record["input_bytes"],
        record["forward_seconds"],
        unoffloadable,
        packs,
        *peaks,
        alternatives,
        at_end,
    )
    return [
        LayerProfile(
            s,
            i,
            f,
            unoffloadable_bytes=u,
            packs=k,
            forward_peak=fp,
            backward_peak=bp,
            head_peak=hp,
            alternatives=a,
            saved_at_end=e,
        )
        for s, i, f, u, k, fp, bp, hp, a, e in zip(*columns, strict=True)
    ]


def profile(
    model,
    layers,
    run_step,
    device,
    min_bytes: int = 0,
    within: Callable[[], AbstractContextManager] | None = None,
    compiled: bool = False,
) -> tuple[list[LayerProfile], float, int]:
    """Each layer's saved bytes, input bytes and forward time, the step's time and the bytes saved
    outside the layers, from one ``run_step()`` (forward and backward) under a counting,
    keep-everything Offloader, after one warm-up step. ``device``: any way torch names one. Forward
    times come from CUDA events (GPU) or the host clock (CPU) around each layer; saved bytes are the
    layer's unique saved storages less parameters, of which those below ``min_bytes`` offloading never moves.

    ``within``: a context each step runs in, such as the blocks' compiled forwards installed
    (policies/_compiled.py). The layer hooks and the saved-tensor hooks stay outside the compiled
    code, so the profile is then of the compiled blocks: what their compiled forwards save for
    backward (AOTAutograd's choice, not eager autograd's) and how long they run; the warm-up step
    compiles them. ``compiled``: the blocks run compiled within it (a block the user compiled
    is found as such): their saved tensors reach the hooks
    when each block's forward ends, and the plans' writes start no sooner
    (:attr:`LayerProfile.saved_at_end`).

    On a CUDA device the measured step also traces the allocator's peak per layer above what was
    allocated when the model's forward started (:class:`PeakTrace`, which resets the device's peak
    memory statistics), from which plans predict their activation peak: a ``run_step`` that zeroes
    the gradients in place (``zero_grad(set_to_none=False)``) leaves them out of it."""
    device = device_of(device)
    within = within or contextlib.nullcontext
    timer = LayerTimer(layers, device)
    meter = meter_for(device)
    peaks = PeakTrace(layers, meter, model) if meter is not None else None
    counter = Offloader(model, HostStore(), policy="keep", layers=layers, min_bytes=min_bytes, keep_last=0)
    if peaks is not None:
        counter.backward_listeners.append(peaks.backward_reached)
    try:
        seconds = 0.0
        for step in range(2):  # the first step warms up
            if peaks is not None and step == 1:
                peaks.start()
            started = _mark(device)
            with within(), counter:
                run_step()
            stopped = _mark(device)
            if peaks is not None:
                peaks.stop()
            _synchronize(device)
            seconds = timing.elapsed(started, stopped)
        at_end = [compiled or runs_compiled(layer) for layer in layers]
        profiles, outside = profiles_of(counter.stats, timer, len(layers), peaks, saved_at_end=at_end)
    finally:
        timer.remove()
        if peaks is not None:
            peaks.remove()
    return profiles, seconds, outside


def store_bandwidth(store, device, nbytes: int = 64 << 20, repeat: int = 3) -> float:
    """The store's write-and-read bandwidth in B/s (median of ``repeat`` rounds: put a tensor of
    ``nbytes`` from ``device``, read it back), the figure the plans use for both directions."""
    device = device_of(device)
    tensor = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    out = torch.empty_like(tensor)
    rates = []
    for round_ in range(repeat + 1):  # one warm-up round
        key = -1 - round_
        started = timing.mark("cpu")  # the futures complete once the bytes have arrived
        try:
            store.put(key, tensor).result()
            store.get(key, out).result()
        except Exception:  # a write that failed (a disk briefly full) must not hold its key for the next probe
            with contextlib.suppress(KeyError):  # a put refused before it stored anything
                store.free(key)
            raise
        seconds = timing.elapsed(started, timing.mark("cpu"))
        store.free(key)
        if round_:
            rates.append(2 * nbytes / seconds)
    if not torch.equal(out, tensor):
        raise StoreCorrupted(
            f"{type(store).__name__} returned other bytes than it was given in a {nbytes}-byte round trip"
        )
    return statistics.median(rates)
