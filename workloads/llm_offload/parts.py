"""The measuring functions of the llm_offload topic: ``policies``, ``models``, ``shapes``,
``micro_batches`` and ``convergence``.

For each model of the scale: one seeded batch; a reference step with no hooks at all (``keep``'s
losses and gradients), taken twice to show it reproduces; then every policy's step on the same
weights and batch, checked bit-identical to the reference (a difference raises
:class:`NotBitIdentical`: a wrong path is never timed); then each policy timed over ``repeat``
training steps (forward, backward, AdamW) after ``warmup``. On a GPU the checked steps run in
deterministic mode (:func:`deterministic`): fused attention's backward and some reductions
accumulate with atomics, so two identical keep steps would otherwise differ in their last bits;
the timed steps run the fast kernels. Every policy runs under saved-tensor hooks that count what
it saves: ``keep`` and ``recompute`` under an Offloader whose policy keeps everything (the
counter), ``save_on_cpu`` under torch's own hooks with a byte count, ``offload_all`` under the
Offloader with its store. For each store in ``planned_stores``, ``offload_adaptive`` and ``planner``
run the per-layer decisions of a plan (systems/ssdtrain/planning.py) made from a profile of the
model and the store's measured bandwidth; their predictions are recorded beside the measurements.
Other libraries' mechanisms (torchtune's offloading hooks, DeepSpeed's CPU checkpointing) run as
peers where they import (peers.py); a peer that is wrong or fails is reported, not timed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import logging
import os
from collections.abc import Callable, Iterator

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from harness.errors import UserError
from harness.progress import progress
from harness.timing import measure
from systems.ssdtrain import DirectFileStore, EmulatedStore, HostStore, KvikioStore, Offloader, Store, planning
from workloads.llm.cost import block_costs, training_flops
from workloads.llm.data import batches
from workloads.llm.layers import blocks
from workloads.llm.models import ModelSpec, build, spec
from workloads.llm_offload import peers
from workloads.llm_offload.schema import SCHEMA

logging.getLogger("transformers").setLevel(logging.ERROR)  # tiny configs draw warnings about token ids
# cuBLAS reads this when its first handle is made (this module is imported before any model runs);
# deterministic mode needs it for reproducible matrix products.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@contextlib.contextmanager
def deterministic(device: str):
    """Reproducible kernels on a GPU for the bit-identity check: attention through SDPA's math
    backend, torch's deterministic algorithms (a warning, not an error, for an op that has none:
    the check itself then tells whether the step reproduces)."""
    if device != "cuda":
        yield
        return
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


class NotBitIdentical(AssertionError):
    """A policy's loss or gradients differ from keeping every activation: that path is wrong."""


def _counting(hooks, parameters: set[int]):
    """Wrap the pack and unpack hooks of a ``saved_tensors_hooks`` object (before it is entered)
    so that it counts the bytes it packs (``packed``), unpacks (``unpacked``) and the unique
    storages it saw, parameters left out (``unique``: storage address -> bytes)."""
    hooks.packed = hooks.unpacked = 0
    hooks.unique = {}
    pack, unpack = hooks.pack_hook, hooks.unpack_hook

    def counting_pack(tensor):
        hooks.packed += tensor.numel() * tensor.element_size()
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            hooks.unique[storage.data_ptr()] = storage.nbytes()
        return pack(tensor)

    def counting_unpack(packed):
        tensor = unpack(packed)
        hooks.unpacked += tensor.numel() * tensor.element_size()
        return tensor

    hooks.pack_hook, hooks.unpack_hook = counting_pack, counting_unpack
    return hooks


class _CountingSaveOnCpu(torch.autograd.graph.save_on_cpu):
    """``torch.autograd.graph.save_on_cpu`` that counts the bytes it copies to and from the host."""

    def __init__(self, pin_memory: bool, parameters: set[int]):
        super().__init__(pin_memory=pin_memory)
        _counting(self, parameters)


PEERS = peers.NAMES  # other libraries' ways to save activation memory, where they run (peers.py)
BASELINES = ("recompute", "save_on_cpu", *PEERS)  # what a part runs beside keep unless its config narrows it


def _add(writer, dataset: str, role: str, variant: str, config: dict, metric: str, value, repetition: int) -> None:
    """One row of a topic metric, in the unit the schema gives it."""
    writer.add(
        role=role,
        variant=variant,
        config=config,
        metric=metric,
        value=value,
        unit=SCHEMA.units[metric],
        repetition=repetition,
        dataset=dataset,
    )


def _tensors(values) -> Iterator[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, tuple | list):
            yield from _tensors(value)


PLANNED = ("offload_adaptive", "planner")  # policies that decide per layer from a profile and a plan


class Policy:
    """One variant: a policy (and a store for the offloading ones) around a training step's forward
    and backward; ``history`` has each step's counts (metric -> bytes, or seconds of store I/O). The planned policies
    take their per-layer decisions from a :class:`planning.Plan`."""

    def __init__(
        self,
        name: str,
        model,
        layers,
        device: str,
        *,
        store: Store | None = None,
        plan: planning.Plan | None = None,
        peer: peers.Peer | None = None,
        **offload,
    ):
        self.name, self.layers, self.device = name, layers, device
        self.parameters = [*model.parameters(), *model.buffers()]
        self.store, self.plan, self.peer = store, plan, peer
        # Recomputed blocks: every one for recompute and a checkpointing peer, the plan's for the planned.
        recomputes = name == "recompute" or (peer is not None and peer.checkpoint is not None)
        self.recomputed = list(layers) if recomputes else []
        self.checkpoint = peer.checkpoint if recomputes and peer else functools.partial(checkpoint, use_reentrant=False)
        if name == "offload_all":
            self.offloader = Offloader(model, store, policy="offload_all", layers=layers, **offload)
        elif name in PLANNED:
            decisions = plan.decisions
            self.recomputed = [layer for layer, d in zip(layers, decisions) if d == planning.RECOMPUTE]
            decide = lambda i: "offload" if decisions[i] == planning.OFFLOAD else "keep"  # noqa: E731
            self.offloader = Offloader(model, store, policy=decide, layers=layers, **offload)
        elif name in ("keep", "recompute"):
            self.offloader = Offloader(model, HostStore(), policy="keep", layers=layers)  # counts only
        elif name in PEERS:
            if peer is None:
                raise UserError(
                    f"{name} needs its library's hooks or checkpoint function (workloads/llm_offload/peers.py)"
                )
        elif name != "save_on_cpu":
            raise UserError(
                f"unknown policy {name!r}; one of keep, recompute, save_on_cpu, offload_all, "
                f"{', '.join(PLANNED + PEERS)}"
            )
        self.history: list[dict[str, int]] = []

    @contextlib.contextmanager
    def step(self):
        if self.name == "save_on_cpu":
            on_gpu = self.device == "cuda"
            hooks = _CountingSaveOnCpu(on_gpu, {p.untyped_storage().data_ptr() for p in self.parameters})
            with hooks:
                yield
            # On a GPU every saved tensor is copied to the host; on a CPU, tensor.cpu() is the
            # tensor itself: nothing moves and the activations stay where keep holds them.
            self.history.append(
                {
                    "activation_bytes": 0 if on_gpu else sum(hooks.unique.values()),
                    "bytes_packed": hooks.packed,
                    "bytes_unique": sum(hooks.unique.values()),
                    "bytes_written": hooks.packed if on_gpu else 0,
                    "bytes_read": hooks.unpacked if on_gpu else 0,
                }
            )
            return
        if self.name in PEERS and self.peer.hooks is not None:
            # Another library's hooks: what they pack is counted; what they keep on the device
            # is theirs to decide, so the memory figure is the measured activation peak.
            hooks = _counting(self.peer.hooks(), {p.untyped_storage().data_ptr() for p in self.parameters})
            with hooks:
                yield
            self.history.append({"bytes_packed": hooks.packed, "bytes_unique": sum(hooks.unique.values())})
            return
        if self.name in PEERS:
            # Another library's checkpointing of every block: where it keeps each block's input is
            # its own (DeepSpeed's on the host), so the measured activation peak is the memory figure.
            with self._checkpointed({}):
                yield
            self.history.append({})
            return
        inputs: dict[int, int] = {}
        with self.offloader, self._checkpointed(inputs):
            yield
        stats = self.offloader.stats
        counts = {
            "activation_bytes": stats.total.kept_bytes + sum(inputs.values()),
            "bytes_packed": stats.total.packed_bytes,
            "bytes_unique": stats.total.unique_bytes,
        }
        if self.name == "offload_all" or self.name in PLANNED:
            store = stats.store
            counts |= {
                "bytes_written": store.bytes_written,
                "bytes_read": store.bytes_read,
                "write_seconds": store.write_seconds,
                "read_seconds": store.read_seconds,
            }
        self.history.append(counts)

    @contextlib.contextmanager
    def _checkpointed(self, inputs: dict[int, int]):
        """The recomputed blocks' forwards (all for ``recompute``, the plan's for the planned
        policies) through ``torch.utils.checkpoint`` (non-reentrant); ``inputs`` collects the
        storages of their tensor inputs, which checkpointing holds."""
        if not self.recomputed:
            yield
            return

        def hold(module, args, kwargs):
            for tensor in _tensors([*args, *kwargs.values()]):
                storage = tensor.untyped_storage()
                inputs[storage.data_ptr()] = storage.nbytes()

        hooks = [layer.register_forward_pre_hook(hold, with_kwargs=True) for layer in self.recomputed]
        for layer in self.recomputed:
            layer.forward = functools.partial(self.checkpoint, layer.forward)
        try:
            yield
        finally:
            for layer in self.recomputed:
                del layer.forward  # the class's forward again
            for hook in hooks:
                hook.remove()

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


def _one_step(model, batch, policy: Policy | None):
    """Loss and gradients of one forward and backward (no optimizer step), under ``policy``."""
    model.zero_grad(set_to_none=True)
    with policy.step() if policy else contextlib.nullcontext():
        loss = model(**batch).loss
        loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach().clone(), grads


def _check_identical(name: str, reference, result) -> None:
    (loss0, grads0), (loss1, grads1) = reference, result
    if not torch.equal(loss0, loss1):
        raise NotBitIdentical(f"{name}: loss {loss1.item()!r} differs from keep's {loss0.item()!r}")
    if grads0.keys() != grads1.keys():
        raise NotBitIdentical(f"{name}: gradients of {sorted(grads0.keys() ^ grads1.keys())} missing or extra")
    wrong = [n for n in grads0 if not torch.equal(grads0[n], grads1[n])]
    if wrong:
        raise NotBitIdentical(f"{name}: gradients of {len(wrong)} parameters differ from keep's, e.g. {wrong[0]}")


def _stores(
    params, device: str, scratch_dir, notes: dict, names=("host", "file", "kvikio")
) -> list[tuple[str, float | None, Callable[[], Store]]]:
    """(store name, emulated GB/s or None, a factory) for each of the real stores in ``names`` that
    applies here, then an emulated store per bandwidth in ``emulated_gbps``."""
    block_bytes = params["file_block_mib"] << 20
    threads = params["file_threads"]
    stores = [
        (name, None, factory)
        for name, factory in (
            ("host", HostStore),
            ("file", lambda: DirectFileStore(scratch_dir, threads=threads, block_bytes=block_bytes)),
        )
        if name in names
    ]
    stores += [
        (f"emulated_{g:g}gbps", float(g), functools.partial(EmulatedStore, float(g))) for g in params["emulated_gbps"]
    ]
    if "kvikio" in names:
        if device != "cuda":
            notes["skipped"]["kvikio"] = "KvikioStore moves GPU memory; this run trains on the CPU"
            return stores
        try:
            KvikioStore(scratch_dir, threads=threads).close()
            stores.append(("kvikio", None, lambda: KvikioStore(scratch_dir, threads=threads)))
        except UserError as err:
            notes["skipped"]["kvikio"] = str(err)
    return stores


def _planned_variants(params, model, layers, batch, device, stores, notes: dict) -> list[tuple]:
    """The planned policies for each store in ``planned_stores``: the layers profiled once, each
    store's bandwidth measured, then SSDTrain's adaptive rule and the planner (within
    ``planner_budget`` of what keep saves). The profile and the plans go into ``notes``."""
    names = params.get("planned_stores", [])
    if not names:
        return []

    def step():
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()

    profiles, keep_seconds, fixed = planning.profile(model, layers, step, device)
    model.zero_grad(set_to_none=True)
    budget = int(params["planner_budget"] * (sum(p.saved_bytes for p in profiles) + fixed))
    notes["profile"] = {
        "keep_step_seconds": keep_seconds,
        "saved_bytes": [p.saved_bytes for p in profiles],
        "input_bytes": [p.input_bytes for p in profiles],
        "forward_seconds": [p.forward_seconds for p in profiles],
        "bytes_saved_outside_layers": fixed,
        "planner_budget_bytes": budget,
    }
    by_name = {name: (gbps, factory) for name, gbps, factory in stores}
    variants = []
    for name in names:
        if name not in by_name:
            notes.setdefault("planned_skipped", {})[name] = "no such store in this run (see skipped)"
            continue
        gbps, factory = by_name[name]
        with factory() as probe:
            bandwidth = planning.store_bandwidth(probe, device)
        plans = {
            "offload_adaptive": planning.adaptive(
                profiles, bandwidth, keep_seconds, params["keep_last"], fixed_bytes=fixed
            ),
            "planner": planning.plan(profiles, bandwidth, keep_seconds, budget, params["keep_last"], fixed_bytes=fixed),
        }
        notes.setdefault("plans", {})[name] = {"bandwidth_gbps": bandwidth / 1e9} | {
            policy: list(plan.decisions) for policy, plan in plans.items()
        }
        for policy, plan in plans.items():
            variants.append((f"{policy}_{name}", "optimized", policy, name, gbps, factory, plan))
    return variants


def _plan_config(policy: Policy, params) -> dict:
    if policy.plan is None:
        return {}
    plan = policy.plan
    return {
        "layers_offloaded": plan.count(planning.OFFLOAD),
        "layers_recomputed": plan.count(planning.RECOMPUTE),
        "planned_gbps": plan.bandwidth / 1e9,
        "budget_fraction": params["planner_budget"] if policy.name == "planner" else None,
    }


def _model_spec(entry: dict) -> tuple[str, ModelSpec]:
    entry = dict(entry)
    family, preset = entry.pop("family"), entry.pop("preset")
    s = spec(family, preset, **entry)
    name = f"{family}-{preset}" if not entry else f"{family}-{s.hidden}x{s.layers}-s{s.sequence}b{s.micro_batch}"
    return name, s


def policies(params, writer, *, repeat, warmup, device, scratch_dir, **_):
    """Every policy and store on every model of the scale: checked, then timed (see the module)."""
    if "models" not in params:
        raise UserError("this part has no block for this scale in config/llm_offload.yaml")
    notes = {"skipped": {}, "models": {}}
    for entry in params["models"]:
        _policies_of_model(
            entry, params, writer, notes, repeat=repeat, warmup=warmup, device=device, scratch_dir=scratch_dir
        )
        # The model, its gradients and optimizer state go before the next model is built.
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return notes


def _policies_of_model(entry, params, writer, notes: dict, *, repeat, warmup, device, scratch_dir) -> None:
    """Every policy of :func:`policies` on one model; its rows go to ``writer``, its notes to ``notes``."""
    dataset, s = _model_spec(entry)
    built = build(s, device=device, seed=params["seed"])
    model = built.model
    layers = [block for _, block in blocks(model)]
    batch = next(batches(s, seed=params["seed"], device=device))
    notes["models"][dataset] = {
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
        reference = _one_step(model, batch, None)
        # The reference must reproduce itself, or no comparison with it means anything.
        _check_identical("keep (a second reference step)", reference, _one_step(model, batch, None))
    if not torch.isfinite(reference[0]) or not any(g.any() for g in reference[1].values()):
        raise NotBitIdentical(f"{dataset}: the reference step has a non-finite loss or all-zero gradients")
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
    offload = {"keep_last": params["keep_last"], "min_bytes": params["min_bytes"], "prefetch": params["prefetch"]}
    # keep is every ratio's denominator; the other baselines and peers run where the config lists them.
    wanted = {"keep", *params.get("baselines", BASELINES)}
    variants = [
        (name, "baseline", name, None, None, None, None)
        for name in ("keep", "recompute", "save_on_cpu")
        if name in wanted
    ]
    stores = _stores(params, device, scratch_dir, notes, params["stores"])
    for store_name, gbps, factory in stores:
        variants.append((f"offload_all_{store_name}", "optimized", "offload_all", store_name, gbps, factory, None))
    variants += _planned_variants(params, model, layers, batch, device, stores, notes["models"][dataset])
    peer_of = {name: peer for name, peer in peers.peers(params, device, notes, wanted)}
    variants += [(name, "baseline", name, None, None, None, None) for name in peer_of]
    runs, failed_peer = [], None
    try:
        for variant, role, policy_name, store_name, gbps, factory, plan in variants:
            store = factory() if factory else None
            policy = Policy(
                policy_name, model, layers, device, store=store, plan=plan, peer=peer_of.get(variant), **offload
            )
            runs.append((variant, role, policy, store_name, gbps))  # closed in finally, whatever happens
            try:
                with deterministic(device):
                    _check_identical(variant, reference, _one_step(model, batch, policy))
            except Exception as err:
                if variant not in peer_of or isinstance(err, torch.cuda.OutOfMemoryError):
                    raise
                # Another library's result, a wrong gradient or an error of its own (DeepSpeed
                # empties a float tensor that a model hands each block positionally): reported,
                # not timed, and not a failure of the suite.
                runs.pop()[2].close()
                peer_of[variant].reset()
                failed_peer = variant
                what = "not bit-identical to keep" if isinstance(err, NotBitIdentical) else "failed in its checked step"
                notes["skipped"][f"{variant} ({dataset})"] = f"{what}: {peers.first_line(err)}"
        if failed_peer is not None:
            # A library that raised half-way may have left the model changed (DeepSpeed rebinds the
            # data of the tensors it moves): keep must still give the reference before anything is timed.
            with deterministic(device):
                _check_identical(f"keep after {failed_peer} failed", reference, _one_step(model, batch, None))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        flops = training_flops(s)
        for variant, role, policy, store_name, gbps in runs:
            policy.history.clear()
            allocated, peaks = [], []

            def train_step(policy=policy, allocated=allocated, peaks=peaks):
                # Gradients stay allocated (zeroed, not freed): they are part of the memory the
                # step starts from, so the peak above it is the activations' alone.
                optimizer.zero_grad(set_to_none=False)
                if device == "cuda":
                    allocated.append(torch.cuda.memory_allocated())
                with policy.step():
                    model(**batch).loss.backward()
                if device == "cuda":
                    # The peak of forward and backward, read before the optimizer step: AdamW's
                    # temporaries (the size of the weights, twice over) would otherwise set it.
                    peaks.append(torch.cuda.max_memory_allocated())
                optimizer.step()

            m = measure(
                train_step,
                device=device,
                repeat=repeat,
                warmup=warmup,
                track_memory=device == "cuda",
                desc=f"{dataset} {variant}",
            )
            offloading = policy.name == "offload_all" or policy.name in PLANNED
            config = (
                base
                | _plan_config(policy, params)
                | {
                    "policy": policy.name,
                    "store": store_name.split("_")[0] if store_name else None,
                    "store_emulated": gbps is not None,
                    "emulated_gbps": gbps,
                    "keep_last": params["keep_last"] if offloading else None,
                    "min_bytes": params["min_bytes"] if offloading else None,
                }
            )
            writer.add_measurement(m, role=role, variant=variant, config=config, flops=flops, dataset=dataset)
            row = functools.partial(_add, writer, dataset, role, variant, config)
            if policy.plan is not None:  # what the cost model predicted, beside what was measured
                row("predicted_time", policy.plan.predicted_seconds, 0)
                row("predicted_activation_bytes", policy.plan.predicted_activation_bytes, 0)
            for rep in range(repeat):
                counts = dict(policy.history[warmup + rep])
                if peaks:
                    counts["activation_peak"] = peaks[warmup + rep] - allocated[warmup + rep]
                for metric, value in counts.items():
                    row(metric, value, rep)
    finally:
        for _, _, policy, _, _ in runs:
            policy.close()


def models(params, writer, **kwargs):
    """The same policies as :func:`policies` on more models (the other families, a deeper
    configuration), usually with fewer stores: the main comparison per model."""
    return policies(params, writer, **kwargs)


def shapes(params, writer, **kwargs):
    """The same policies as :func:`policies` at the paper's three (hidden, layers) shapes and its
    micro-batch, usually with fewer stores and baselines: how the trade-off moves with the shape."""
    return policies(params, writer, **kwargs)


def micro_batches(params, writer, *, repeat, warmup, device, scratch_dir, **_):
    """The memory a policy frees, spent on a larger micro-batch at a fixed global batch.

    One model; for each micro-batch, ``keep``, ``recompute`` and ``offload_all`` to each store in
    ``stores`` train ``global_batch`` sequences per optimizer step (gradient accumulation over
    global_batch / micro_batch micro-steps). Each policy's first micro-step (its first
    ``check_micro_batch`` sequences, where that is set and smaller) is checked bit-identical to
    keep's at that micro-batch before it is timed. A micro-batch that does not fit in GPU memory
    is recorded as ``out_of_memory`` (value 1), not a failure of the part."""
    notes = {"skipped": {}, "models": {}}
    dataset, shape = _model_spec(params["model"])
    built = build(shape, device=device, seed=params["seed"])
    model = built.model
    layers = [block for _, block in blocks(model)]
    notes["models"][dataset] = {"attention": built.attention, "parameters": sum(p.numel() for p in model.parameters())}
    stores = {name: factory for name, _, factory in _stores(params, device, scratch_dir, notes)}
    offload = {"keep_last": params["keep_last"], "min_bytes": params["min_bytes"], "prefetch": params["prefetch"]}
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
                reference = _one_step(model, check_batch, None)
        except torch.cuda.OutOfMemoryError:
            _out_of_memory(writer, dataset, base | {"policy": "keep"}, "keep", notes, "check")
            continue
        # Every policy is checked before any is timed: timing trains, and changes the weights.
        checked = []
        for variant in ("keep", "recompute", *(f"offload_all_{name}" for name in params["stores"])):
            store_name = variant.removeprefix("offload_all_") if variant.startswith("offload_all_") else None
            if store_name is not None and store_name not in stores:
                notes["skipped"][variant] = "no such store in this run"
                continue
            name = "offload_all" if store_name else variant
            policy = Policy(name, model, layers, device, store=stores[store_name]() if store_name else None, **offload)
            config = base | {"policy": name, "store": store_name, "store_emulated": False}
            if store_name:
                config |= {"keep_last": params["keep_last"], "min_bytes": params["min_bytes"]}
            try:
                with deterministic(device):
                    _check_identical(
                        f"{variant} at micro-batch {micro}", reference, _one_step(model, check_batch, policy)
                    )
            except torch.cuda.OutOfMemoryError:
                policy.close()
                _out_of_memory(writer, dataset, config, variant, notes, "check")
                continue
            except BaseException:
                policy.close()
                raise
            checked.append((variant, policy, config, store_name))
        for variant, policy, config, store_name in checked:
            policy.history.clear()

            def train_step(policy=policy, steps=steps):
                optimizer.zero_grad(set_to_none=True)
                for batch in steps:
                    with policy.step():
                        model(**batch).loss.backward()
                optimizer.step()

            try:
                m = measure(train_step, device=device, repeat=repeat, warmup=warmup, desc=f"b={micro} {variant}")
            except torch.cuda.OutOfMemoryError:
                _out_of_memory(writer, dataset, config, variant, notes, "timed")
                continue
            finally:
                policy.close()
            role = "baseline" if store_name is None else "optimized"
            flops = training_flops(s) * len(steps)
            writer.add_measurement(m, role=role, variant=variant, config=config, flops=flops, dataset=dataset)
            for rep in range(repeat):
                first = policy.history[(warmup + rep) * len(steps)]  # every micro-step holds the same
                _add(writer, dataset, role, variant, config, "activation_bytes", first["activation_bytes"], rep)
    return notes


def _convergence_variant(variant: str, stores: dict, notes: dict) -> tuple[str, str | None] | None:
    """(policy, store) of one of the convergence part's ``variants``; None for a store that does
    not run here (the notes say why); a name that is neither is refused before anything trains."""
    if variant == "recompute":
        return "recompute", None
    store = variant.removeprefix("offload_all_") if variant.startswith("offload_all_") else None
    if store in stores:
        return "offload_all", store
    if store is not None and store in notes["skipped"]:
        return None
    raise UserError(
        f"convergence: unknown variant {variant!r}; recompute or offload_all_<store> with a store of its "
        f"config's stores and emulated_gbps ({', '.join(stores) or 'none'})"
    )


def convergence(params, writer, *, device, scratch_dir, **_):
    """The convergence check: ``steps`` AdamW steps of one model on the generated Markov language
    (workloads.llm.data.MarkovLanguage), from the same weights and batches, with no hooks (keep)
    and under each policy of ``variants`` (``recompute``, ``offload_all_<store>``). Each policy's
    loss at every step and its weights after the last must equal keep's bit for bit, or the part
    stops (:class:`NotBitIdentical`); an offloading policy must also have written and read back
    bytes in every step, or the check would have tested nothing. The curves it records (metric
    ``loss``, ``repetition`` = the step; ``bytes_written`` and ``bytes_read`` per step for the
    offloading ones) are then one curve, and the notes give the two losses it is read against: the
    language's entropy rate (the floor a model that learned the chain reaches) and the loss of
    uniform guessing. On a GPU every step runs in deterministic mode (:func:`deterministic`), as
    the other parts' checked steps do."""
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
    stores = {
        name: (gbps, factory) for name, gbps, factory in _stores(params, device, scratch_dir, notes, params["stores"])
    }
    offload = {"keep_last": params["keep_last"], "min_bytes": params["min_bytes"], "prefetch": params["prefetch"]}
    chosen = {v: _convergence_variant(v, stores, notes) for v in params["variants"]}  # refused before training
    variants = {"keep": ("keep", None)} | {v: c for v, c in chosen.items() if c is not None}

    def train(variant: str) -> tuple[torch.Tensor, list[dict], list[torch.Tensor]]:
        """The losses, the policy's per-step counts and the weights after the last step."""
        policy_name, store_name = variants[variant]
        built = build(s, device=device, seed=params["seed"])
        model = built.model
        notes["dtype"] = str(built.dtype).removeprefix("torch.")
        layers = [block for _, block in blocks(model)]
        policy = None
        if variant != "keep":  # keep: no hooks at all, the reference
            store = stores[store_name][1]() if store_name else None
            policy = Policy(policy_name, model, layers, device, store=store, **offload)
        optimizer = torch.optim.AdamW(model.parameters(), lr=params["learning_rate"])
        stream = batches(s, "markov", seed=params["seed"] + 1, device=device, language=language)
        losses = []
        try:
            with deterministic(device):
                for _ in progress(range(params["steps"]), f"{dataset} {variant}"):
                    optimizer.zero_grad(set_to_none=True)
                    with policy.step() if policy else contextlib.nullcontext():
                        loss = model(**next(stream)).loss
                        loss.backward()
                    optimizer.step()
                    losses.append(loss.detach())
        finally:
            if policy is not None:
                policy.close()
        weights = [p.detach().clone() for p in model.parameters()]
        return torch.stack(losses).float().cpu(), policy.history if policy else [], weights

    keep, _, keep_weights = train("keep")
    if not torch.isfinite(keep).all():
        raise NotBitIdentical(f"{dataset}: keep's loss is not finite on the generated corpus")
    curves, counts = {"keep": keep}, {}
    for variant in list(variants)[1:]:
        curves[variant], counts[variant], weights = train(variant)
        different = (curves[variant] != keep).nonzero()
        if len(different):
            step = int(different[0])
            raise NotBitIdentical(
                f"{variant}: the loss at step {step} is {curves[variant][step].item()!r}, keep's {keep[step].item()!r}"
            )
        if not all(torch.equal(a, b) for a, b in zip(weights, keep_weights, strict=True)):
            raise NotBitIdentical(f"{variant}: the weights after the last step differ from keep's")
        if variants[variant][1] and not all(c["bytes_written"] > 0 and c["bytes_read"] > 0 for c in counts[variant]):
            raise UserError(
                f"convergence: {variant} wrote or read nothing in some step (min_bytes {params['min_bytes']} "
                "above every saved tensor, or one block kept as the last?): the check would test nothing"
            )
    config = {"device": device, "family": s.family, "preset": params["model"]["preset"], "hidden": s.hidden}
    config |= {"layers": s.layers, "sequence": s.sequence, "micro_batch": s.micro_batch, "dtype": notes["dtype"]}
    for variant, losses in curves.items():
        policy_name, store_name = variants[variant]
        row_config = config | {"policy": policy_name, "store": store_name.split("_")[0] if store_name else None}
        if store_name:
            gbps = stores[store_name][0]
            row_config |= {"store_emulated": gbps is not None, "emulated_gbps": gbps}
            row_config |= {"keep_last": params["keep_last"], "min_bytes": params["min_bytes"]}
        role = "optimized" if store_name else "baseline"
        for step, value in enumerate(losses.tolist()):
            _add(writer, dataset, role, variant, row_config, "loss", value, step)
            if store_name:
                for metric in ("bytes_written", "bytes_read"):
                    _add(writer, dataset, role, variant, row_config, metric, counts[variant][step][metric], step)
    return notes


def _out_of_memory(writer, dataset: str, config: dict, variant: str, notes: dict, phase: str) -> None:
    """Record that ``variant`` did not fit, and give its memory back. ``phase`` says where, in the
    notes: the ``check`` step runs deterministic kernels (math attention holds the whole attention
    matrix), so it can run out of memory where the ``timed`` steps' kernels would not."""
    notes.setdefault("out_of_memory", {})[f"{variant} at micro-batch {config['micro_batch']}"] = phase
    torch.cuda.empty_cache()
    role = "optimized" if variant.startswith("offload") else "baseline"
    _add(writer, dataset, role, variant, config, "out_of_memory", 1, 0)
