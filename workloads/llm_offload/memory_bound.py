"""Part ``memory_bound``: the memory a policy frees, spent on the largest micro-batch that fits
under a cap on device memory, and the throughput that buys (SSDTrain's second claim: up to 31%
more than keeping every activation at keep's own largest micro-batch).

Each policy trains ``global_batch`` sequences per optimizer step in micro-batches of one of
``micro_batches`` (each dividing the global batch, gradient accumulation over the rest), under a
cap of ``memory_cap_gib`` GiB on what the device may hold. :func:`largest_fitting` searches the
micro-batches for the largest whose training steps run under the cap: a try that runs out of
memory is recorded as not fitting, its memory given back before the next. At every micro-batch up
to each policy's largest its steps are timed (the largest is not always the fastest: a plan for it
may recompute blocks that a plan for a smaller one keeps or offloads); tokens per second at a policy's fastest over
keep's at keep's fastest is the claim's number.

The cap. On a GPU it is the caching allocator's limit (``torch.cuda.set_per_process_memory_fraction``:
an allocation that would take the process's allocated and cached memory past it raises
``OutOfMemoryError``), set before the model is built, so weights, gradients and optimizer state
count against it, as they do on a GPU of that size. Without a GPU no allocation fails, so the cap
is emulated: a micro-batch fits where the model's state (weights, gradients, AdamW's two moments:
four times the weights' bytes) plus the activation bytes the step holds for backward (as the
policies count them) stay under it. The search is the same either way; only ``fits`` differs.

The search assumes that a micro-batch that fits makes every smaller one fit (memory grows with the
micro-batch), so it halves the candidates at each try: about log2 of their count tries per policy.

Every peer runs here where the parameters ask for it, so that the claim's numbers come out of one
part: recompute, offloading, the eager planner, and where ``compiled`` is set compiled keep,
torch's activation memory budget at each of ``budgets`` (the best of them is torch's number) and
the planner over compiled blocks. A planned policy is planned per micro-batch: the blocks are
profiled once at the check's micro-batch and the profile scaled to each candidate (bytes and
seconds grow with the micro-batch), and each plan is the fastest predicted one whose activation
bytes and, on a GPU, predicted activation peak fit ``planner_headroom`` of what the cap leaves
after the model's state (the rest for the allocator's fragmentation and what the peak model does
not see). A GPU profile's traced peaks do not grow in proportion: backward's transients include
buffers that do not grow with the micro-batch (a weight's new gradient, before it is added to the
one kept, is the weight's size), and a proportional scaling multiplies them with the rest (on the
8192-wide Llama profiled at one sequence, it put compiled keep's peak at four sequences above the
whole room the cap left, and compiled keep ran there). So on a GPU the kept blocks are profiled at
twice the check's micro-batch as well, and each peak is extrapolated along the line through the
two (:func:`scaled`); where that second profile does not fit under the cap, its peaks are scaled in
proportion and the notes (``at_twice``) say so. Every distinct plan is checked against its
reference before anything is timed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from harness.arguments import whole_number
from harness.errors import UserError
from harness.timing import measure
from systems.ssdtrain import Unavailable, planning
from workloads.llm.cost import training_flops
from workloads.llm.data import batches
from workloads.llm.layers import blocks
from workloads.llm.models import build
from workloads.llm_offload import variants as choose
from workloads.llm_offload.checking import (
    NotBitIdentical,
    check_close,
    check_identical,
    deterministic,
    one_step,
    rounding_spread,
)
from workloads.llm_offload.profiling import Profiler, store_bandwidths

GIB = 1 << 30
HEADROOM = 0.8  # planner_headroom's default: the share of the cap's room for activations a plan may fill


@dataclass
class Search:
    """What :func:`largest_fitting` found: the largest candidate that fit (None: not even the
    smallest), and each candidate tried, in the order tried, with whether it fit."""

    largest: int | None
    tried: dict[int, bool] = field(default_factory=dict)


def largest_fitting(candidates: Iterable[int], fits: Callable[[int], bool]) -> Search:
    """The largest of ``candidates`` (positive integers) for which ``fits`` is true, by bisection:
    ``fits`` is asked about one candidate at a time, never twice about one, and is assumed monotone
    (true for a candidate, true for every smaller one)."""
    given = list(candidates)
    if not given or any(whole_number(c, at_least=1) is None for c in given):
        raise UserError(f"the micro-batches to search must be positive integers, got {given!r}")
    ordered = sorted({whole_number(c) for c in given})
    search = Search(None)
    low, high = 0, len(ordered)  # ordered[:low] fit; ordered[high:] do not
    while low < high:
        middle = (low + high) // 2
        fit = bool(fits(ordered[middle]))
        search.tried[ordered[middle]] = fit
        if fit:
            low = middle + 1
        else:
            high = middle
    search.largest = ordered[low - 1] if low else None
    return search


class MemoryCap:
    """A cap of ``cap_bytes`` on ``device``'s memory, within a ``with`` block (see the module): on a
    GPU the allocator's limit, set on entry and lifted on exit; on a CPU :meth:`over` tells whether a
    step's counted bytes go past it."""

    def __init__(self, cap_bytes: int, device: str):
        if not cap_bytes > 0:
            raise UserError(f"memory_cap_gib must be positive, got {cap_bytes / GIB!r} GiB")
        self.cap_bytes, self.device = int(cap_bytes), device
        self.state_bytes = 0  # CPU: what the model holds whatever the micro-batch (set once it is built)

    def __enter__(self) -> MemoryCap:
        if self.device == "cuda":
            total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            if self.cap_bytes > total:
                cap, here = self.cap_bytes / GIB, total / GIB
                raise UserError(f"memory_cap_gib {cap:g} is above this GPU's {here:.1f} GiB: no cap to enforce")
            free()
            torch.cuda.set_per_process_memory_fraction(self.cap_bytes / total)
        return self

    def __exit__(self, *exc) -> None:
        if self.device == "cuda":
            torch.cuda.set_per_process_memory_fraction(1.0)
            free()

    def hold_state_of(self, model: torch.nn.Module) -> None:
        """Count ``model``'s weights, gradients and AdamW's two moments against the emulated cap."""
        self.state_bytes = 4 * sum(p.numel() * p.element_size() for p in model.parameters())

    def over(self, activation_bytes: int) -> bool:
        """Whether a step holding ``activation_bytes`` for backward goes past the emulated cap (always
        false on a GPU, where the allocator enforces the cap itself)."""
        return self.device != "cuda" and self.state_bytes + activation_bytes > self.cap_bytes


def free() -> None:
    """Give back what a step left: the garbage of an interrupted step, then the allocator's cache, so
    that the next try starts from the same memory as the first."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def runs_out_of_memory(step: Callable[[], object]) -> bool:
    """Run ``step``; whether it ran out of device memory. What the failed step held (its exception's
    frames hold its tensors) is given back before this returns."""
    try:
        step()
    except Exception as err:  # noqa: BLE001 - only running out of memory is an answer; the rest re-raised
        if not _is_out_of_memory(err):
            raise
        # the exception, and the frames that hold the step's tensors, go when this clause ends
    else:
        return False
    free()
    return True


def _is_out_of_memory(err: BaseException | None) -> bool:
    """Whether ``err`` is running out of device memory, or an error raised because of it (a compile
    that ran out while tuning its kernels for a new micro-batch wraps it in a compiler error)."""
    while err is not None:
        if isinstance(err, torch.cuda.OutOfMemoryError):
            return True
        err = err.__cause__ or err.__context__
    return False


def memory_bound(params, writer, *, repeat, warmup, device, scratch_dir, add_row, model_spec, **_):
    """The part (see the module). ``add_row`` writes one metric row (parts._add); ``model_spec``
    reads the model entry (parts._model_spec)."""
    notes = {"skipped": {}, "models": {}, "memory_cap_gib": params["memory_cap_gib"], "searches": {}}
    chosen = choose.policies(params, device, notes)
    setups = choose.store_setups(params, device, notes, scratch_dir)
    compiled_setups = choose.planned_setups(params, setups, notes, key="compiled_stores")
    runs = choose.variants(chosen, setups, params, compiled_setups)
    planned = [
        (entry, choose.planned_setups(params, setups, notes))
        for entry in chosen
        if entry.planner and not entry.compiled
    ]
    planned += [(entry, compiled_setups) for entry in chosen if entry.planner and entry.compiled]
    dataset, shape = model_spec(params["model"])
    global_batch, candidates = params["global_batch"], sorted(params["micro_batches"])
    for micro in candidates:
        if global_batch % micro:
            raise UserError(f"micro-batch {micro} does not divide the global batch {global_batch}")
    checked_rows = min(params.get("check_micro_batch") or candidates[0], global_batch)
    # The stores' probes move tensors of their own: measured before the cap, which they are not part of.
    bandwidths = store_bandwidths([setup for _, where in planned for setup in where], params, scratch_dir, device)
    with MemoryCap(int(params["memory_cap_gib"] * GIB), device) as cap:
        too_small = UserError(
            f"the model's weights, gradients and AdamW state alone do not fit under memory_cap_gib "
            f"{params['memory_cap_gib']}: raise the cap or choose a smaller model"
        )
        try:
            built = build(shape, device=device, seed=params["seed"])
        except torch.cuda.OutOfMemoryError:
            raise too_small from None
        model = built.model
        cap.hold_state_of(model)
        if cap.over(0):  # a CPU's emulated cap: no allocation fails, so say what a GPU's build would
            raise too_small
        parameters = sum(p.numel() for p in model.parameters())
        notes["models"][dataset] = {"attention": built.attention, "parameters": parameters}
        base = {
            "device": device,
            "family": shape.family,
            "preset": params["model"]["preset"],
            "hidden": shape.hidden,
            "layers": shape.layers,
            "sequence": shape.sequence,
            "global_batch": global_batch,
            "memory_cap_gib": float(params["memory_cap_gib"]),
            "dtype": str(built.dtype).removeprefix("torch."),
        }
        if planned:
            layers = [block for _, block in blocks(model)]
            batch = next(
                batches(dataclasses.replace(shape, micro_batch=checked_rows), seed=params["seed"], device=device)
            )
            # Apart from the other parts' "profile": this one is at the check's micro-batch, scaled per plan.
            planning_notes = notes["models"][dataset]["planning"] = {"profiled_micro_batch": checked_rows}
            profiler = Profiler(params, model, layers, batch, device, scratch_dir, planning_notes, bandwidths)
            twice = _twice_profiler(params, model, layers, shape, checked_rows, device, scratch_dir, planning_notes)
            room = params.get("planner_headroom", HEADROOM) * (cap.cap_bytes - cap.state_bytes)
            for entry, where in planned:
                try:
                    runs += _scheduled(entry, where, profiler, params, checked_rows, candidates, int(room), twice)
                except Exception as err:
                    if not _is_out_of_memory(err):
                        raise
                    raise UserError(
                        f"the planners' profile on {checked_rows} sequences does not fit under memory_cap_gib "
                        f"{params['memory_cap_gib']}: raise the cap or lower check_micro_batch"
                    ) from None
        # The checks come before the optimizer's state: they hold keep's gradients and a policy's
        # (copies, compared), as much memory as the moments would take.
        checked = _checked(runs, model, shape, params, checked_rows, device, scratch_dir, notes, built.dtype)
        try:
            optimizer = _optimizer_with_its_state(model, device)
        except torch.cuda.OutOfMemoryError:
            for variant, policy in checked:
                policy.close()
                variant.close()
            raise too_small from None
        trials = Trials(model, optimizer, shape, params, cap, device, repeat, warmup)
        try:
            for variant, policy in checked:
                search = largest_fitting(candidates, functools.partial(trials.fits, variant, policy))
                tried = {str(micro): fit for micro, fit in search.tried.items()}
                notes["searches"][variant.label] = {"tried": tried, "largest": search.largest}
                failed = trials.record(variant, policy, search, candidates, writer, dataset, base, add_row)
                if failed:
                    notes.setdefault("out_of_memory", {})[variant.label] = failed
        finally:
            for variant, policy in checked:
                policy.close()
                variant.close()
    return notes


@dataclass
class Scheduled(choose.Variant):
    """A planned variant with a plan per micro-batch (``plans``): :meth:`at` puts the plan of a
    micro-batch in place, on the variant (its columns) and on its built policy."""

    plans: dict[int, planning.Plan] = field(default_factory=dict)

    def at(self, micro: int, policy=None) -> None:
        self.plan = self.plans[micro]
        if policy is not None:
            policy.setting.plan = self.plan  # the planned policies read their plan at every step

    def distinct(self) -> list[int]:
        """One micro-batch per distinct plan (the smallest that has it)."""
        seen, out = set(), []
        for micro, plan in sorted(self.plans.items()):
            if plan.decisions not in seen:
                seen.add(plan.decisions)
                out.append(micro)
        return out


def scaled(profiles, keep_seconds: float, fixed: int, factor: float, at_twice=None):
    """A profile taken at one micro-batch, as it would be at ``factor`` times it: bytes and seconds
    grow with the sequences. The traced peaks: along the line through each peak and the same
    layer's peak in ``at_twice`` (the profiles of the same blocks, kept, at twice the micro-batch),
    never below zero, and never falling with more sequences (a lower peak at twice the micro-batch,
    noise or another kernel's choice, reads as a flat line); in proportion where ``at_twice`` is
    None or a layer's peak is missing there."""
    if at_twice is not None and len(at_twice) != len(profiles):
        raise ValueError(f"the profile at twice the micro-batch has {len(at_twice)} layers, not {len(profiles)}")

    def peak(p, q, name: str) -> int | None:
        one, two = getattr(p, name), None if q is None else getattr(q, name)
        if one is None:
            return None
        if two is None:
            return round(one * factor)
        return max(0, round(one + max(0, two - one) * (factor - 1)))

    twins = at_twice if at_twice is not None else [None] * len(profiles)
    grow = [
        dataclasses.replace(
            p,
            saved_bytes=round(p.saved_bytes * factor),
            unoffloadable_bytes=round(p.unoffloadable_bytes * factor),
            input_bytes=round(p.input_bytes * factor),
            forward_seconds=p.forward_seconds * factor,
            forward_peak=peak(p, q, "forward_peak"),
            backward_peak=peak(p, q, "backward_peak"),
            head_peak=peak(p, q, "head_peak"),
            alternatives=tuple(
                dataclasses.replace(
                    a, saved_bytes=round(a.saved_bytes * factor), extra_seconds=a.extra_seconds * factor
                )
                for a in p.alternatives
            ),
        )
        for p, q in zip(profiles, twins)
    ]
    return grow, keep_seconds * factor, round(fixed * factor)


def _columns(variant, params) -> dict:
    """The variant's columns, but no ``budget_fraction``: this part's plans fill ``planner_headroom``
    of the room the cap leaves (``room_bytes`` in the notes), not ``planner_budget`` of keep's bytes."""
    columns = variant.columns(params)
    return columns | {"budget_fraction": None} if "budget_fraction" in columns else columns


def _twice_profiler(params, model, layers, shape, rows: int, device, folder, notes: dict) -> Callable:
    """``at_twice(compiled, profiles)``: the kept blocks' profiles (eager, or compiled) at twice
    ``rows`` sequences, the second point of :func:`scaled`'s lines, each taken once when first asked
    for and only where ``profiles`` (at ``rows``) traced peaks, as a GPU's do; else None. None too
    where it does not fit under the cap: those peaks are then scaled in proportion, and the notes
    (``at_twice``) say so beside the profiles taken."""
    rows_twice = 2 * rows
    record = notes.setdefault("at_twice", {"micro_batch": rows_twice})
    taken: dict[bool, list | None] = {}
    second: list[Profiler] = []  # made when first asked for: never where profiles trace no peaks

    def at_twice(compiled: bool, profiles) -> list | None:
        if not planning.has_peaks(profiles):
            return None
        if not second:
            shape_twice = dataclasses.replace(shape, micro_batch=rows_twice)
            batch = next(batches(shape_twice, seed=params["seed"], device=device))
            second.append(Profiler(params | {"planner_budgets": []}, model, layers, batch, device, folder, record))
        if compiled not in taken:
            try:
                taken[compiled] = second[0].blocks(compiled)[0]
            except Exception as err:  # noqa: BLE001 - only running out of memory is an answer
                if not _is_out_of_memory(err):
                    raise
                taken[compiled] = None
                record.setdefault("did_not_fit", []).append("compiled" if compiled else "eager")
            free()
        return taken[compiled]

    return at_twice


def _scheduled(
    entry, setups, profiler, params, rows: int, candidates: list[int], room: int, at_twice: Callable | None = None
) -> list[Scheduled]:
    """The planned policy ``entry`` on each store of ``setups``, with a plan per candidate
    micro-batch made from the profile at ``rows`` sequences, scaled (its peaks along the lines to
    ``at_twice``'s profile, where it gives one: :func:`_twice_profiler`), within ``room`` bytes."""
    profiles, keep_seconds, fixed = profiler.blocks(entry.compiled)
    twice = at_twice(entry.compiled, profiles) if at_twice is not None else None
    out = []
    for setup in setups:
        bandwidth = profiler.bandwidth(setup)
        plans = {}
        # On a GPU the profile holds the blocks' traced peaks: a plan must fit its predicted
        # activation peak (backward's transients included), not only what forward leaves, in the room.
        peak_room = room if any(p.forward_peak is not None for p in profiles) else None
        for micro in candidates:
            at = scaled(profiles, keep_seconds, fixed, micro / rows, twice)
            plans[micro] = entry.planner(
                at[0],
                bandwidth,
                at[1],
                keep_last=params["keep_last"],
                budget_bytes=room,
                fixed_bytes=at[2],
                peak_budget_bytes=peak_room,
                prefetch=params["prefetch"],
            )
        variant = Scheduled(entry, setup, plans=plans)
        variant.at(candidates[0])
        profiler.notes.setdefault("plans", {})[variant.label] = {
            str(micro): list(plan.decisions) for micro, plan in plans.items()
        } | {"room_bytes": room, "bandwidth_gbps": bandwidth / 1e9}
        out.append(variant)
    return out


def _checked(runs, model, shape, params, rows, device, folder, notes, dtype) -> list:
    """Each variant built and its step on ``rows`` sequences checked against its reference (keep's
    step bit for bit; compiled keep within the tolerance of keep; a policy on compiled blocks against
    compiled keep, bit for bit or, where it recomputes inside the compiled backward, within the
    tolerance), every distinct plan of a planned variant, under the cap (a variant whose check does
    not fit is skipped, with a note)."""
    layers = [block for _, block in blocks(model)]
    batch = next(batches(dataclasses.replace(shape, micro_batch=rows), seed=params["seed"], device=device))
    results = {}

    def check(name, policy=None):
        with deterministic(device), policy.reading_back() if policy else contextlib.nullcontext():
            results[name] = one_step(model, batch, policy)

    if runs_out_of_memory(functools.partial(check, None)):
        raise UserError(
            f"keep's checked step on {rows} sequences does not fit under memory_cap_gib {params['memory_cap_gib']}: "
            "raise the cap or lower check_micro_batch"
        )
    # How far keep's step moves between eager kernels: the room compiled keep's rounding gets.
    spread = {}
    if any(variant.policy.compiled for variant in runs):
        if runs_out_of_memory(lambda: spread.update(rounding_spread(model, batch, results[None], device))):
            notes["keep_spread_between_eager_kernels"] = "its step on the default kernels does not fit under the cap"
        elif spread:
            notes["keep_spread_between_eager_kernels"] = max(spread.values())
    checked, failed_peer = [], None
    for variant in runs:
        compiled = variant.policy.compiled and variant.policy.name != choose.COMPILED_REFERENCE
        if compiled and choose.COMPILED_REFERENCE not in results:
            notes["skipped"][variant.label] = "its reference, compiled keep, did not run, fit or pass its check"
            continue
        try:
            policy = variant.build(model, layers, params, folder)
        except Unavailable as err:
            notes["skipped"][variant.label] = str(err)
            continue
        try:
            fitted = True
            for micro in variant.distinct() if isinstance(variant, Scheduled) else [None]:
                if micro is not None:
                    variant.at(micro, policy)
                if runs_out_of_memory(functools.partial(check, variant.label, policy)):
                    fitted = False
                    break
                _compare(variant, results, dtype, notes, micro, spread)
            if not fitted:
                notes["skipped"][variant.label] = f"its checked step on {rows} sequences does not fit under the cap"
                policy.reset()
                policy.close()
                variant.close()
                continue
        except NotBitIdentical as err:
            policy.close()
            variant.close()
            if variant.role != "peer":
                raise
            # Another library's result off its reference: reported, not searched, not the suite's failure.
            notes["skipped"][variant.label] = f"its checked step is off its reference: {err}"
            failed_peer = variant.label
            continue
        except BaseException:
            policy.close()
            variant.close()
            raise
        checked.append((variant, policy))
    if failed_peer is not None:  # keep must still give the reference before anything is searched
        with deterministic(device):
            again = one_step(model, batch)
        check_identical(f"keep after {failed_peer} failed its check", results[None], again)
    model.zero_grad(set_to_none=True)
    results.clear()
    free()
    return checked


def _compare(variant, results: dict, dtype, notes: dict, micro: int | None, spread: dict) -> None:
    """``results[variant.label]`` against its reference (see :func:`_checked`); compiled keep's step
    is kept as the reference of the compiled policies, checked within keep's ``spread`` between
    eager kernels (checking.rounding_spread)."""
    label = variant.label if micro is None else f"{variant.label} (the plan of micro-batch {micro})"
    result = results.pop(variant.label)
    if variant.policy.name == choose.COMPILED_REFERENCE:
        deviation = check_close(label, results[None], result, dtype, spread=spread)
        notes.setdefault("deviation_from_keep", {})[label] = deviation
        results[choose.COMPILED_REFERENCE] = result
    elif variant.policy.compiled and not variant.exact:
        deviation = check_close(label, results[choose.COMPILED_REFERENCE], result, dtype, "compiled keep", spread)
        notes.setdefault("deviation_from_compiled_keep", {})[label] = deviation
    elif variant.policy.compiled:
        check_identical(f"{label} under the memory cap", results[choose.COMPILED_REFERENCE], result, "compiled keep")
    else:
        check_identical(f"{label} under the memory cap", results[None], result)


def _optimizer_with_its_state(model, device: str) -> torch.optim.Optimizer:
    """AdamW with its moments and the gradients allocated (as after a first step), so that they count
    against the cap from the first try on. Fused on a GPU: the unfused step allocates temporaries the
    size of the weights, memory a training loop short of memory would not spend."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    return optimizer


@dataclass
class Trials:
    """One policy's training steps at one micro-batch at a time: :meth:`fits` (the search's
    question: one optimizer step, under the cap or not) and :meth:`record` (a row per micro-batch
    tried, and the steps timed at every micro-batch up to the largest that fit)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    shape: object  # the model's ModelSpec
    params: dict
    cap: MemoryCap
    device: str
    repeat: int
    warmup: int

    def _train_step(self, policy, micro: int) -> Callable[[], None]:
        """One optimizer step over the global batch in micro-batches of ``micro`` sequences."""
        data = batches(dataclasses.replace(self.shape, micro_batch=micro), seed=self.params["seed"], device=self.device)
        steps = [next(data) for _ in range(self.params["global_batch"] // micro)]

        def train_step():
            self.optimizer.zero_grad(set_to_none=False)  # gradients stay allocated, as in training
            for batch in steps:
                with policy.step():
                    self.model(**batch).loss.backward()
            self.optimizer.step()

        return train_step

    def fits(self, variant, policy, micro: int) -> bool:
        """Whether ``policy``'s optimizer step at micro-batch ``micro`` runs under the cap (a planned
        variant's with its plan for that micro-batch)."""
        if isinstance(variant, Scheduled):
            variant.at(micro, policy)
        policy.history.clear()
        step = self._train_step(policy, micro)
        if runs_out_of_memory(step):
            policy.reset()
            return False
        # A peer's hooks may not say what they keep on the device: then every byte they saved counts.
        held = max(c.get("activation_bytes", c.get("bytes_unique", 0)) for c in policy.history)
        free()
        return not self.cap.over(held)

    def record(
        self, variant, policy, search: Search, candidates: list[int], writer, dataset: str, base: dict, add_row
    ) -> str | None:
        """A ``fits`` row per micro-batch tried (and ``out_of_memory`` where it did not fit); then, at
        every candidate up to the largest that fit (the search's monotone reading: each smaller one
        fits too), the timed steps, their tokens per second and the activation bytes a micro-step
        held: a policy's fastest micro-batch need not be its largest (a plan for a larger one may
        recompute blocks that one for a smaller keeps or offloads). Returns why a micro-batch was not timed where
        its timed steps ran out of memory after all (None where every one was timed)."""
        for micro, fit in search.tried.items():
            if isinstance(variant, Scheduled):
                variant.at(micro, policy)
            config = base | {"micro_batch": micro} | _columns(variant, self.params)
            add_row(writer, dataset, variant, config, "fits", int(fit), 0)
            if not fit:  # as part micro_batches records it, where the claims look for it
                add_row(writer, dataset, variant, config, "out_of_memory", 1, 0)
        if search.largest is None:
            return None
        failed = []
        for micro in sorted((c for c in set(candidates) if c <= search.largest), reverse=True):  # the largest first
            if not self._time_at(variant, policy, micro, writer, dataset, base, add_row):
                failed.append(micro)
        if failed:
            shown = ", ".join(map(str, failed))
            return (
                f"its timed steps at micro-batch {shown} ran out of memory (its search found {search.largest} to fit)"
            )
        return None

    def _time_at(self, variant, policy, micro: int, writer, dataset: str, base: dict, add_row) -> bool:
        """The timed steps at micro-batch ``micro`` and their rows; False where they ran out of memory
        (an ``out_of_memory`` row then)."""
        if isinstance(variant, Scheduled):
            variant.at(micro, policy)
        step = self._train_step(policy, micro)
        policy.history.clear()
        timed = {}

        def time_steps():
            desc = f"b={micro} {variant.label}"
            timed["m"] = measure(step, device=self.device, repeat=self.repeat, warmup=self.warmup, desc=desc)

        config = base | {"micro_batch": micro} | _columns(variant, self.params)
        if runs_out_of_memory(time_steps):
            policy.reset()
            add_row(writer, dataset, variant, config, "out_of_memory", 1, 0)
            return False
        m, history = timed["m"], list(policy.history)
        free()
        micro_steps = base["global_batch"] // micro
        flops = training_flops(dataclasses.replace(self.shape, micro_batch=micro)) * micro_steps
        writer.add_measurement(m, role=variant.role, variant=variant.label, config=config, flops=flops, dataset=dataset)
        row = functools.partial(add_row, writer, dataset, variant, config)
        if variant.plan is not None:  # scaled from the check's micro-batch: per micro-step
            row("predicted_time", variant.plan.predicted_seconds, 0)
            row("predicted_activation_bytes", variant.plan.predicted_activation_bytes, 0)
            if variant.plan.predicted_peak_bytes is not None:
                row("predicted_activation_peak", variant.plan.predicted_peak_bytes, 0)
        first_timed = len(history) - len(m.seconds) * micro_steps  # the warm-up steps come first
        for rep, seconds in enumerate(m.seconds):
            row("tokens_per_second", base["global_batch"] * self.shape.sequence / seconds, rep)
            counts = history[first_timed + rep * micro_steps]
            if "activation_bytes" in counts:
                row("activation_bytes", counts["activation_bytes"], rep)
        return True
