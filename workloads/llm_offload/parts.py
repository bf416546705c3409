"""The measuring functions of the llm_offload topic: ``policies``, ``models``, ``shapes``,
``frontier_models``, ``micro_batches``, ``memory_bound`` (memory_bound.py) and ``convergence``. They choose what to run
from the registries of systems/ssdtrain (variants.py) and measure it; the policies and stores
themselves live there.

For each model of the scale: one seeded batch; a reference step with no hooks at all (``keep``'s
losses and gradients), taken twice to show it reproduces; then every variant's step on the same
weights and batch, checked bit-identical to the reference (checking.py: a difference raises
:class:`NotBitIdentical`, so a wrong path is never timed); then each variant timed over ``repeat``
training steps (forward, backward, AdamW) after ``warmup``, and checked again after them from
the weights of the first check (its rows are written only if that passes). Every policy counts what its steps
save and move (systems/ssdtrain/policies). The planned policies run the per-block decisions of a
plan made from a profile of the model and each store's measured bandwidth; their predictions are
recorded beside the measurements. A peer (another library's mechanism) that is wrong or fails is
reported, not timed; any other variant that is wrong stops the part. The policies on compiled
blocks (where ``compiled`` is set) are checked against compiled keep, which is checked against
keep within a tolerance (checking.py); the differences found go to the notes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import logging
import sys
import time

import torch

from harness.errors import UserError, raised_in
from harness.progress import progress
from harness.timing import measure
from systems.ssdtrain import Unavailable, planning
from systems.ssdtrain.bound import bound_of_profile
from systems.ssdtrain.policies import first_line
from workloads.llm.cost import block_costs, training_flops
from workloads.llm.data import batches
from workloads.llm.layers import blocks
from workloads.llm.models import ModelSpec, build, spec
from workloads.llm_offload import variants as choose
from workloads.llm_offload.checking import (
    NotBitIdentical,
    check_close,
    check_identical,
    deterministic,
    one_step,
    rounding_spread,
)
from workloads.llm_offload.profiling import Profiler
from workloads.llm_offload.schema import SCHEMA

logging.getLogger("transformers").setLevel(logging.ERROR)  # tiny configs draw warnings about token ids

__all__ = [
    "NotBitIdentical",
    "compiled_models",
    "convergence",
    "frontier_models",
    "memory_bound",
    "micro_batches",
    "models",
    "policies",
    "shapes",
]


def _add(writer, dataset: str, variant: choose.Variant, config: dict, metric: str, value, repetition: int) -> None:
    """One row of a topic metric, in the unit the schema gives it."""
    writer.add(
        role=variant.role,
        variant=variant.label,
        config=config,
        metric=metric,
        value=value,
        unit=SCHEMA.units[metric],
        repetition=repetition,
        dataset=dataset,
    )


def _model_spec(entry: dict) -> tuple[str, ModelSpec]:
    entry = dict(entry)
    family, preset = entry.pop("family"), entry.pop("preset")
    s = spec(family, preset, **entry)
    name = f"{family}-{preset}" if not entry else f"{family}-{s.hidden}x{s.layers}-s{s.sequence}b{s.micro_batch}"
    return name, s


def _check_model_names(entries) -> None:
    """Refuse, before anything is built, an entry that is not a valid model, one listed twice and two models
    under one dataset name (the name shows hidden, layers, sequence and micro-batch, not heads,
    kv_heads or vocab): their rows and notes would be taken for one model's."""
    seen: dict[str, ModelSpec] = {}
    for entry in entries:
        name, s = _model_spec(entry)
        if name in seen and seen[name] == s:
            raise UserError(f"the model {name!r} is listed twice in the config: its rows would be recorded twice")
        if name in seen:
            differ = [f.name for f in dataclasses.fields(s) if getattr(s, f.name) != getattr(seen[name], f.name)]
            raise UserError(
                f"two models of the config are both named {name!r} (they differ in {', '.join(differ)}): "
                "measure them in separate runs or change a field the name shows"
            )
        seen[name] = s


def policies(params, writer, *, repeat, warmup, device, scratch_dir, **_):
    """Every policy and store on every model of the scale: checked, then timed (see the module)."""
    if "models" not in params:
        raise UserError("this part has no block for this scale in config/llm_offload.yaml")
    notes = {"skipped": {}, "models": {}}
    _check_model_names(params["models"])
    for entry in params["models"]:
        _policies_of_model(
            entry, params, writer, notes, repeat=repeat, warmup=warmup, device=device, scratch_dir=scratch_dir
        )
        # The model, its gradients and optimizer state go before the next model is built.
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return notes


def models(params, writer, **kwargs):
    """The same policies as :func:`policies` on more models (the other families, a deeper
    configuration), usually with fewer stores: the main comparison per model."""
    return policies(params, writer, **kwargs)


def shapes(params, writer, **kwargs):
    """The same policies as :func:`policies` at the paper's three (hidden, layers) shapes and its
    micro-batch, usually with fewer stores and baselines: how the trade-off moves with the shape."""
    return policies(params, writer, **kwargs)


def frontier_models(params, writer, **kwargs):
    """The same policies as :func:`policies`, usually the compiled ones at several budgets, on
    models of other families and shapes: the planner's frontier against torch's budgets there."""
    return policies(params, writer, **kwargs)


def compiled_models(params, writer, **kwargs):
    """The same policies as :func:`policies`, the compiled ones at several budgets, on part
    ``models``' families: torch's frontier and the planner's beside that part's policies."""
    return policies(params, writer, **kwargs)


def _policies_of_model(entry, params, writer, notes: dict, *, repeat, warmup, device, scratch_dir) -> None:
    """Every variant of :func:`policies` on one model; its rows go to ``writer``, its notes to ``notes``."""
    dataset, s = _model_spec(entry)
    built = build(s, device=device, seed=params["seed"])
    model = built.model
    layers = [block for _, block in blocks(model)]
    batch = next(batches(s, seed=params["seed"], device=device))
    model_notes = notes["models"][dataset] = {
        "attention": built.attention,
        "attention_note": built.attention_note,
        "parameters": sum(p.numel() for p in model.parameters()),
        # The formulas' per-block costs (workloads/llm/cost.py), for the required-bandwidth what-if.
        "blocks": {
            "saved_bytes": [c.saved_bytes for c in block_costs(s, built.dtype.itemsize)],
            "forward_flops": [c.forward_flops for c in block_costs(s, built.dtype.itemsize)],
        },
    }
    with deterministic(device):
        reference = one_step(model, batch)
        # Before the reproduction check: a NaN loss never equals itself, and that check would blame
        # the reproduction instead of the step.
        if not torch.isfinite(reference[0]) or not any(g.any() for g in reference[1].values()):
            raise NotBitIdentical(f"{dataset}: the reference step has a non-finite loss or all-zero gradients")
        # The reference must reproduce itself, or no comparison with it means anything.
        check_identical("keep (a second reference step)", reference, one_step(model, batch))
    base = {
        "device": device,
        "family": s.family,
        "preset": entry["preset"],
        "hidden": s.hidden,
        "layers": s.layers,
        "sequence": s.sequence,
        "micro_batch": s.micro_batch,
        "dtype": str(built.dtype).removeprefix("torch."),
    }
    chosen = choose.policies(params, device, notes)
    setups = choose.store_setups(params, device, notes, scratch_dir)
    compiled_setups = choose.planned_setups(params, setups, notes, key="compiled_stores")
    runs = choose.variants(chosen, setups, params, compiled_setups)
    profiler = Profiler(params, model, layers, batch, device, scratch_dir, model_notes)
    planned = [p for p in chosen if p.planner is not None and not p.compiled]
    planned_setups = choose.planned_setups(params, setups, notes) if planned else []
    planned_compiled = [p for p in chosen if p.planner is not None and p.compiled]
    choose.check_frontier_stores(params, planned_setups + (compiled_setups if planned_compiled else []), notes)
    choose.matched_budgets(params, planned_compiled=bool(planned_compiled))  # refused before any profile
    if planned:
        runs += _planned(params, profiler, planned, planned_setups)
    if planned_compiled:
        runs += _planned(params, profiler, planned_compiled, compiled_setups, compiled=True)
    choose.refuse_shared_labels(runs)
    bounds = _bounds(params, profiler, [v for v in runs if v.policy.name in BOUNDED])
    checked, failed_peer = [], None
    compiled_reference = None  # compiled keep's step, once it passed its own check
    # How far keep's step moves between eager kernels: the room compiled keep's rounding gets.
    spread = rounding_spread(model, batch, reference, device) if any(v.policy.compiled for v in runs) else {}
    if spread:
        model_notes["keep_spread_between_eager_kernels"] = max(spread.values())

    def verify(label, variant, result):
        """``result`` against its reference: compiled keep's (within its rounding, for a compiled
        policy that need not match it exactly; the deviation is returned), else bit-identical."""
        if variant.policy.name == choose.COMPILED_REFERENCE:
            return check_close(label, reference, result, built.dtype, spread=spread)
        if variant.policy.compiled and not variant.exact:
            # Within keep's own rounding too: a gradient that is rounding noise (a key projection's bias,
            # to which softmax is blind) differs between any two valid kernels by about its own size.
            return check_close(label, compiled_reference, result, built.dtype, "compiled keep", spread=spread)
        against = ("compiled keep", compiled_reference) if variant.policy.compiled else ("keep", reference)
        check_identical(label, against[1], result, against[0])
        return None

    try:
        for variant in runs:
            needs_compiled_reference = variant.policy.compiled and variant.policy.name != choose.COMPILED_REFERENCE
            if needs_compiled_reference and compiled_reference is None:
                notes["skipped"][f"{variant.label} ({dataset})"] = "its reference, compiled keep, did not run or pass"
                continue
            try:
                with raised_in(f"variant {variant.label} ({dataset})"):
                    policy = variant.build(model, layers, params, scratch_dir)
            except Unavailable as err:
                notes["skipped"][variant.label] = str(err)
                continue
            checked.append((variant, policy))  # closed in finally, whatever happens
            notes.setdefault("libraries", {}).update(policy.about)
            try:
                with deterministic(device), policy.reading_back(), raised_in(f"variant {variant.label} ({dataset})"):
                    result = one_step(model, batch, policy)  # the store's bytes are checked too
                deviation = verify(variant.label, variant, result)
                if variant.store is not None and not (policy.history and policy.history[-1].get("bytes_written")):
                    # Its check compared keep with keep (min_bytes above every tensor, or every block
                    # kept): say so, where the rows alone would count it among the checked offloaders.
                    model_notes.setdefault("checked_without_offloading", []).append(variant.label)
                    print(
                        f"note: {variant.label} ({dataset}) wrote nothing to its store in the checked step",
                        file=sys.stderr,
                    )
                if variant.policy.name == choose.COMPILED_REFERENCE:
                    model_notes.setdefault("deviation_from_keep", {})[variant.label] = deviation
                    compiled_reference = result
                elif deviation is not None:
                    model_notes.setdefault("deviation_from_compiled_keep", {})[variant.label] = deviation
            except Exception as err:
                if variant.role != "peer" or isinstance(err, torch.cuda.OutOfMemoryError):
                    raise
                # Another library's result, a wrong gradient or an error of its own (DeepSpeed
                # empties a float tensor that a model hands each block positionally): reported,
                # not timed, and not a failure of the suite.
                checked.pop()
                policy.reset()
                policy.close()
                variant.close()
                failed_peer = variant.label
                what = "not bit-identical to keep" if isinstance(err, NotBitIdentical) else "failed in its checked step"
                notes["skipped"][f"{variant.label} ({dataset})"] = f"{what}: {first_line(err)}"
        if failed_peer is not None:
            # A library that raised half-way may have left the model changed (DeepSpeed rebinds the
            # data of the tensors it moves): keep must still give the reference before anything is timed.
            with deterministic(device):
                check_identical(f"keep after {failed_peer} failed", reference, one_step(model, batch))
        # The weights the checked steps started from (timing steps the optimizer): each policy is
        # checked again after its timed steps, from these weights, so that a policy right on its
        # first step and wrong on later ones (a store reusing a buffer still in use) is not recorded.
        checked_weights = {name: t.detach().to("cpu", copy=True) for name, t in model.state_dict().items()}
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for variant, policy in checked:
            held = _HeldRows()  # written only once the check after timing passes
            timed = (variant, policy, model, batch, optimizer, held, dataset, base, params, s)
            with raised_in(f"variant {variant.label} ({dataset}), timed"):
                optimizer_seconds = _time(*timed, repeat, warmup, device, bounds.get(variant.label))
            # The measured ``time`` holds AdamW's step, the plans' predicted time does not: its own
            # seconds let a prediction be set against the forward and backward it predicts.
            model_notes.setdefault("optimizer_seconds", {})[variant.label] = optimizer_seconds
            model.load_state_dict(checked_weights)
            try:
                with deterministic(device), policy.reading_back():
                    verify(f"{variant.label} after its timed steps", variant, one_step(model, batch, policy))
            except Exception as err:
                if variant.role != "peer" or isinstance(err, torch.cuda.OutOfMemoryError):
                    raise
                notes["skipped"][f"{variant.label} ({dataset})"] = f"wrong after its timed steps: {first_line(err)}"
                continue
            held.write_to(writer)
    finally:
        for variant, policy in checked:
            policy.close()
            variant.close()


class _HeldRows:
    """A writer's ``add`` and ``add_measurement``, held until :meth:`write_to`."""

    def __init__(self):
        self._calls = []

    def add(self, **row) -> None:
        self._calls.append((None, row))

    def add_measurement(self, measurement, **row) -> None:
        self._calls.append((measurement, row))

    def write_to(self, writer) -> None:
        for measurement, row in self._calls:
            writer.add(**row) if measurement is None else writer.add_measurement(measurement, **row)


def _time(variant, policy, model, batch, optimizer, writer, dataset, base, params, s, repeat, warmup, device, bound):
    """Time ``policy``'s training steps and record them with what each step saved and moved (and
    ``bound``, the offloading bound of its store, where given). Returns the seconds of each timed
    step's optimizer step (AdamW), which the recorded ``time`` includes."""
    policy.history.clear()
    allocated, forward_ends, peaks, optimizer_spans = [], [], [], []

    def train_step():
        # Gradients stay allocated (zeroed, not freed): they are part of the memory the step starts
        # from, so the peak above it is the activations' alone.
        optimizer.zero_grad(set_to_none=False)
        if device == "cuda":
            allocated.append(torch.cuda.memory_allocated())
        with policy.step():
            loss = model(**batch).loss
            if device == "cuda":
                # What the allocator holds when forward returns (a host-side count: no wait for the
                # GPU), beside the hooks' own count of what they keep (activation_bytes).
                forward_ends.append(torch.cuda.memory_allocated())
            loss.backward()
            del loss
        if device == "cuda":
            # The peak of forward and backward, read before the optimizer step: AdamW's temporaries
            # (the size of the weights, twice over) would otherwise set it.
            peaks.append(torch.cuda.max_memory_allocated())
        optimizer_spans.append(_span_start(device))
        optimizer.step()
        optimizer_spans[-1] = _span_end(device, optimizer_spans[-1])

    m = measure(
        train_step,
        device=device,
        repeat=repeat,
        warmup=warmup,
        track_memory=device == "cuda",
        desc=f"{dataset} {variant.label}",
    )
    config = base | variant.columns(params)
    writer.add_measurement(
        m, role=variant.role, variant=variant.label, config=config, flops=training_flops(s), dataset=dataset
    )
    row = functools.partial(_add, writer, dataset, variant, config)
    if variant.plan is not None:  # what the cost model predicted, beside what was measured
        row("predicted_time", variant.plan.predicted_seconds, 0)
        row("predicted_activation_bytes", variant.plan.predicted_activation_bytes, 0)
        if variant.plan.predicted_peak_bytes is not None:
            row("predicted_activation_peak", variant.plan.predicted_peak_bytes, 0)
    if bound is not None:  # the most its store could free at no time overhead, beside what it freed
        row("bound_activation_bytes", bound, 0)
    for rep in range(repeat):
        counts = dict(policy.history[warmup + rep])
        if peaks:
            counts["activation_peak"] = peaks[warmup + rep] - allocated[warmup + rep]
            counts["allocated_at_forward_end"] = forward_ends[warmup + rep] - allocated[warmup + rep]
        for metric, value in counts.items():
            row(metric, value, rep)
    return [_span_seconds(span) for span in optimizer_spans[warmup : warmup + repeat]]


def _span_start(device):
    """The start of a span of the step: a CUDA event on a GPU (no synchronization inside the timed
    step), the host clock elsewhere."""
    if device == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def _span_end(device, start):
    if device == "cuda":
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        return (start, end)
    return time.perf_counter() - start


def _span_seconds(span) -> float:
    if isinstance(span, tuple):
        start, end = span
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    return float(span)


def _planned(params, profiler: Profiler, entries, setups, compiled: bool = False) -> list[choose.Variant]:
    """The planned policies ``entries`` on each store of ``setups``: each policy's plan from the
    blocks' profile and the store's bandwidth (within ``planner_budget`` of what keep saves, for
    those with a budget; those also at each of ``frontier_budgets`` on the stores of
    ``frontier_stores``, and on compiled blocks within what every block compiled at each torch budget
    of ``frontier_matched`` is predicted to hold, its bytes and peak: the planner's point beside
    that budget's). ``compiled``: the policies run on compiled blocks, so the profile is of
    the compiled blocks (with their ``planner_budgets`` alternatives) and the budget a fraction of
    what compiled keep saves. The plans go into the notes (``plans_compiled`` for compiled blocks)."""
    profiles, keep_seconds, fixed = profiler.blocks(compiled)
    saved = sum(p.saved_bytes for p in profiles) + fixed
    budget = int(params["planner_budget"] * saved)
    suffix = "_compiled" if compiled else ""
    profiler.notes["profile" + suffix]["planner_budget_bytes"] = budget
    frontier = choose.frontier_budgets(params)
    matched = choose.matched_budgets(params) if compiled else []
    frontier_stores = params.get("frontier_stores")
    out = []
    for setup in setups:
        bandwidth = profiler.bandwidth(setup)

        def plan(entry, budget_bytes):
            return entry.planner(
                profiles, bandwidth, keep_seconds, keep_last=params["keep_last"], budget_bytes=budget_bytes,
                fixed_bytes=fixed, prefetch=params["prefetch"],
            )  # fmt: skip

        plans = {entry.name: plan(entry, budget) for entry in entries}
        notes = profiler.notes.setdefault("plans" + suffix, {})
        notes[setup.label] = {"bandwidth_gbps": bandwidth / 1e9} | {n: list(p.decisions) for n, p in plans.items()}
        out += [choose.Variant(entry, setup, plans[entry.name]) for entry in entries]
        if frontier_stores is not None and setup.label not in frontier_stores:
            continue
        for entry in entries:
            if plans[entry.name].budget_bytes is None:
                continue  # a plan without a budget (offload_adaptive): the same at every fraction
            for fraction in frontier:
                variant = choose.Variant(entry, setup, plan(entry, int(fraction * saved)), frontier_budget=fraction)
                notes[setup.label][variant.label] = list(variant.plan.decisions)
                out.append(variant)
            for budget in matched:
                alike = [planning.budget_decision(budget)] * len(profiles)
                every_block_at_it = planning.predict(
                    profiles, alike, bandwidth, keep_seconds, fixed_bytes=fixed, prefetch=params["prefetch"]
                )
                matched_plan = entry.planner(
                    profiles, bandwidth, keep_seconds, keep_last=params["keep_last"],
                    budget_bytes=every_block_at_it.predicted_activation_bytes, fixed_bytes=fixed,
                    peak_budget_bytes=every_block_at_it.predicted_peak_bytes, prefetch=params["prefetch"],
                )  # fmt: skip
                variant = choose.Variant(entry, setup, matched_plan, matched_budget=budget)
                notes[setup.label][variant.label] = list(variant.plan.decisions)
                out.append(variant)
    return out


# The policies that offload every block but the last keep_last: each gets the bound of its store.
BOUNDED = ("offload_all", "offload_all_compiled")


def _bounds(params, profiler: Profiler, offloading: list[choose.Variant]) -> dict[str, float]:
    """Per variant of a :data:`BOUNDED` policy, the activation-peak reduction its store's bandwidth
    allows at no time overhead (systems/ssdtrain/bound.py), from the profile of the blocks it runs:
    eager, or compiled for ``offload_all_compiled`` (a compiled forward saves other tensors over
    another time); recorded in the notes (``bounds``, ``bounds_compiled``)."""
    out = {}
    for variant in offloading:
        compiled = bool(variant.policy.compiled)
        profiles, _, _ = profiler.blocks(compiled)
        found = bound_of_profile(profiles, profiler.bandwidth(variant.store), keep_last=params["keep_last"])
        out[variant.label] = found.activation_bytes
        profiler.notes.setdefault("bounds_compiled" if compiled else "bounds", {})[variant.store.label] = {
            "activation_bytes": found.activation_bytes,
            "read_limited": found.read_limited,
        }
    return out


def micro_batches(params, writer, *, repeat, warmup, device, scratch_dir, **_):
    """The memory a policy frees, spent on a larger micro-batch at a fixed global batch.

    One model; for each micro-batch, ``keep`` and the policies of ``compare`` (the offloading ones
    with each store of ``stores``) train ``global_batch`` sequences per optimizer step (gradient
    accumulation over global_batch / micro_batch micro-steps). Each variant's first micro-step (its
    first ``check_micro_batch`` sequences, where that is set and smaller) is checked bit-identical to
    keep's at that micro-batch before it is timed. A micro-batch that does not fit in GPU memory
    is recorded as ``out_of_memory`` (value 1), not a failure of the part."""
    notes = {"skipped": {}, "models": {}}
    chosen = choose.policies(params, device, notes, plans=False)
    runs = choose.variants(chosen, choose.store_setups(params, device, notes, scratch_dir), params)
    dataset, shape = _model_spec(params["model"])
    built = build(shape, device=device, seed=params["seed"])
    model = built.model
    layers = [block for _, block in blocks(model)]
    notes["models"][dataset] = {"attention": built.attention, "parameters": sum(p.numel() for p in model.parameters())}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    global_batch = params["global_batch"]
    for micro in params["micro_batches"]:
        if global_batch % micro:
            raise UserError(f"micro-batch {micro} does not divide the global batch {global_batch}")
        s = dataclasses.replace(shape, micro_batch=micro)
        data = batches(s, seed=params["seed"], device=device)
        steps = [next(data) for _ in range(global_batch // micro)]
        base = {
            "device": device,
            "family": s.family,
            "preset": params["model"]["preset"],
            "hidden": s.hidden,
            "layers": s.layers,
            "sequence": s.sequence,
            "micro_batch": micro,
            "global_batch": global_batch,
            "dtype": str(built.dtype).removeprefix("torch."),
        }
        # The check's batch: the first micro-batch, or its first ``check_micro_batch`` sequences where
        # that is smaller (the check's deterministic math attention holds the whole attention matrix,
        # which can run out of memory where the timed steps' kernels fit). Same code path, fewer rows.
        checked_rows = min(micro, params.get("check_micro_batch") or micro)
        check_batch = {name: tensor[:checked_rows] for name, tensor in steps[0].items()}
        notes.setdefault("checked_micro_batch", {})[str(micro)] = checked_rows
        try:
            with deterministic(device):
                reference = one_step(model, check_batch)
        except torch.cuda.OutOfMemoryError:
            _out_of_memory(writer, dataset, base, runs[0], params, notes, "check")
            continue
        # Every variant is checked before any is timed: timing trains, and changes the weights.
        checked = []
        for variant in runs:
            try:
                with raised_in(f"variant {variant.label} ({dataset})"):
                    policy = variant.build(model, layers, params, scratch_dir)
            except Unavailable as err:
                notes["skipped"][variant.label] = str(err)
                continue
            try:
                with deterministic(device), policy.reading_back():
                    check_identical(
                        f"{variant.label} at micro-batch {micro}", reference, one_step(model, check_batch, policy)
                    )
            except torch.cuda.OutOfMemoryError:
                policy.close()
                variant.close()
                _out_of_memory(writer, dataset, base, variant, params, notes, "check")
                continue
            except BaseException:
                policy.close()
                variant.close()
                raise
            checked.append((variant, policy))
        for variant, policy in checked:
            policy.history.clear()

            def train_step(policy=policy, steps=steps):
                optimizer.zero_grad(set_to_none=True)
                for batch in steps:
                    with policy.step():
                        model(**batch).loss.backward()
                optimizer.step()

            try:
                m = measure(train_step, device=device, repeat=repeat, warmup=warmup, desc=f"b={micro} {variant.label}")
            except torch.cuda.OutOfMemoryError:
                _out_of_memory(writer, dataset, base, variant, params, notes, "timed")
                continue
            finally:
                policy.close()
                variant.close()
            config = base | variant.columns(params)
            flops = training_flops(s) * len(steps)
            writer.add_measurement(
                m, role=variant.role, variant=variant.label, config=config, flops=flops, dataset=dataset
            )
            for rep in range(repeat):
                first = policy.history[(warmup + rep) * len(steps)]  # every micro-step holds the same
                _add(writer, dataset, variant, config, "activation_bytes", first["activation_bytes"], rep)
    return notes


def memory_bound(params, writer, **kwargs):
    """Each policy's largest micro-batch under a cap on device memory and its throughput there
    (workloads/llm_offload/memory_bound.py)."""
    from workloads.llm_offload import memory_bound as part

    return part.memory_bound(params, writer, add_row=_add, model_spec=_model_spec, **kwargs)


def convergence(params, writer, *, device, scratch_dir, **_):
    """The convergence check: ``steps`` AdamW steps of one model on the generated Markov language
    (workloads.llm.data.MarkovLanguage), from the same weights and batches, with no hooks (keep)
    and under each policy of ``compare`` (the offloading ones with each store of ``stores``). Each
    variant's loss at every step and its weights after the last must equal keep's bit for bit, or the
    part stops (:class:`NotBitIdentical`).

    The offloaders run with ``always_read_back``: backward waits for each write and reads every
    offloaded tensor back from the store, so each step's bytes really made the round trip, however
    fast or loaded the machine (otherwise a tensor whose write is still running is served from
    memory). The part checks exactly that: an offloading variant wrote and read back bytes in every
    step, or the check would have tested nothing (``min_bytes`` above every saved tensor, every
    block kept). The curves it records (metric ``loss``, ``repetition`` = the step; ``bytes_written``
    and ``bytes_read`` per step for the offloading ones) are then one curve, and the notes give the
    two losses it is read against: the language's entropy rate (the floor a model that learned the
    chain reaches) and the loss of uniform guessing. On a GPU every step runs in deterministic mode
    (:func:`deterministic`), as the other parts' checked steps do."""
    from workloads.llm.data import MarkovLanguage, uniform_loss

    dataset, s = _model_spec(params["model"])
    language = MarkovLanguage(s.vocab, seed=params["seed"])
    notes = {
        "skipped": {},
        "entropy_rate": language.entropy_rate(),
        "uniform_loss": uniform_loss(s.vocab),
        "steps": params["steps"],
        "learning_rate": params["learning_rate"],
    }
    # Unknown names are refused here, before anything trains.
    chosen = choose.policies(params, device, notes, plans=False)
    runs = choose.variants(chosen, choose.store_setups(params, device, notes, scratch_dir), params)

    def train(variant: choose.Variant) -> tuple[torch.Tensor, list[dict], list[torch.Tensor]] | None:
        """The losses, the policy's per-step counts and the weights after the last step."""
        built = build(s, device=device, seed=params["seed"])
        model = built.model
        notes["dtype"] = str(built.dtype).removeprefix("torch.")
        layers = [block for _, block in blocks(model)]
        policy = None
        if variant.policy.name != choose.REFERENCE:  # keep: no hooks at all, the reference
            try:
                policy = variant.build(model, layers, params, scratch_dir, always_read_back=True)
            except Unavailable as err:
                notes["skipped"][variant.label] = str(err)
                return None
        optimizer = torch.optim.AdamW(model.parameters(), lr=params["learning_rate"])
        stream = batches(s, "markov", seed=params["seed"] + 1, device=device, language=language)
        losses = []
        try:
            with deterministic(device):
                for _ in progress(range(params["steps"]), f"{dataset} {variant.label}"):
                    optimizer.zero_grad(set_to_none=True)
                    with policy.step() if policy else contextlib.nullcontext():
                        loss = model(**next(stream)).loss
                        loss.backward()
                    optimizer.step()
                    losses.append(loss.detach())
        finally:
            if policy is not None:
                policy.close()
            variant.close()
        weights = [p.detach().clone() for p in model.parameters()]
        return torch.stack(losses).float().cpu(), policy.history if policy else [], weights

    keep, _, keep_weights = train(runs[0])
    if not torch.isfinite(keep).all():
        raise NotBitIdentical(f"{dataset}: keep's loss is not finite on the generated corpus")
    curves = {runs[0].label: (runs[0], keep, [])}
    for variant in runs[1:]:
        trained = train(variant)
        if trained is None:
            continue
        losses, counts, weights = trained
        different = (losses != keep).nonzero()
        if len(different):
            step = int(different[0])
            raise NotBitIdentical(
                f"{variant.label}: the loss at step {step} is {losses[step].item()!r}, keep's {keep[step].item()!r}"
            )
        if not all(torch.equal(a, b) for a, b in zip(weights, keep_weights, strict=True)):
            raise NotBitIdentical(f"{variant.label}: the weights after the last step differ from keep's")
        if variant.store is not None and not all(c["bytes_written"] > 0 and c["bytes_read"] > 0 for c in counts):
            raise UserError(
                f"convergence: {variant.label} wrote or read nothing in some step (min_bytes {params['min_bytes']} "
                "above every saved tensor, or every block kept?): the check would test nothing"
            )
        curves[variant.label] = (variant, losses, counts)
    config = {"device": device, "family": s.family, "preset": params["model"]["preset"], "hidden": s.hidden}
    config |= {"layers": s.layers, "sequence": s.sequence, "micro_batch": s.micro_batch, "dtype": notes["dtype"]}
    for variant, losses, counts in curves.values():
        row = functools.partial(_add, writer, dataset, variant, config | variant.columns(params))
        for step, value in enumerate(losses.tolist()):
            row("loss", value, step)
            if variant.store is not None:
                for metric in ("bytes_written", "bytes_read"):
                    row(metric, counts[step][metric], step)
    return notes


def _out_of_memory(writer, dataset: str, base: dict, variant, params, notes: dict, phase: str) -> None:
    """Record that ``variant`` did not fit, and give its memory back. ``phase`` says where, in the
    notes: the ``check`` step runs deterministic kernels (math attention holds the whole attention
    matrix), so it can run out of memory where the ``timed`` steps' kernels would not."""
    notes.setdefault("out_of_memory", {})[f"{variant.label} at micro-batch {base['micro_batch']}"] = phase
    torch.cuda.empty_cache()
    _add(writer, dataset, variant, base | variant.columns(params), "out_of_memory", 1, 0)
