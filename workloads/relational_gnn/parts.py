"""The measuring functions of the relational_gnn topic: ``knowledge_graphs`` and
``more_knowledge_graphs``, ``datasets``, ``large_datasets``, ``width_sweep``, ``shapes`` and
``large_shapes`` (graphs of shapes the config names) and ``gemm_template`` (in gemm.py).

The models are those of the registry systems/rgnn/models named in ``models``; the forms are those
of the registry systems/rgnn/forms that compute each model (PyG's layers, the dense form and the
compiled forms, role ``peer``; the plain forms, ``baseline``; Hector's variants, ``optimized``),
but those in ``leave_out``. Each row says its form's entry name (``variant``), the computation
(``form``) and its products' precision (``precision``). A form that cannot run here (no GPU, a
package missing) is not attempted, and a form that does not compile
(systems/rgnn/forms/compiled.py) is not timed: the notes say why.

For each graph, model and width (``dims``: in = out): seeded features and weights; every form's
output (forward, no gradients) compared with the model's reference form's (``segment_mm``), within
its precision's tolerance, before any form is timed (a form that disagrees stops the part: a wrong
path is never timed); then each form timed for each mode in ``modes``:

* ``inference``: the forward pass under ``torch.no_grad``;
* ``training``: forward, a mean-squared loss against a seeded target, backward, Adam's step
  (fused on a GPU);
* ``training_graphed`` (GPU only): the same step captured once as one CUDA graph and replayed,
  for every form alike: the step without the host's Python, dispatch and launches, which bound
  it on small graphs. A form whose step waits for the GPU cannot be captured and is noted.

One untimed call comes first (it also makes the gradients and Adam's state), then ``warmup`` more
and ``repeat`` timed ones; on a GPU the intermediate memory is each timed call's peak minus what was
allocated after the untimed call, plus what the CUDA graphs captured since then keep reserved for
their intermediate values (Hector's replayed plans, systems/hector/cuda_graphs.py). Each form's
first call in each mode is timed apart, the device drained before and after, as ``first_call_time``
(inference: the check, the form's first call without gradients; training: the untimed call): for a
compiled form that is its compile time, never inside the timed steps, and ``graph_breaks`` are the
graph breaks dynamo met compiling it for that mode. Then, at the widths in ``breakdown_dims``
(default: all), one more call under the profiler gives the time and the bytes allocated by kind of
work (systems/rgnn/breakdown.py).

torch's matrix products run in exact float32 (TF32 off), as in Hector's protocol; a form of
another precision (``hector_best_tf32``) gets it from its own kernels. A form that runs out of GPU
memory, in its check or its timing, is recorded as ``out_of_memory`` with the size of the
allocation that failed; ``memory_cap_gib`` caps the memory the process may take (a smaller GPU).
On a CPU, a form that would materialize per-edge weights beyond ``cpu_materialize_limit_gib`` is
not attempted (an exhausted host is killed, not told): the notes say so, with the bytes it would
have needed. The results' metrics and columns are those of schema.py, kept in step with this.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import itertools
import re
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from harness.errors import UserError, WrongResult, raised_in
from harness.graphed_step import NotCapturable, capture_step
from harness.timing import measure
from systems.hector import cuda_graphs
from systems.relgraph.graph import RelGraph
from systems.rgnn.breakdown import profile_call
from systems.rgnn.forms import EXACT, FORMS, TOLERANCE, forms_of
from systems.rgnn.forms.compiled import CompiledLayer, CompileFailed
from systems.rgnn.layer import GraphNotSupported
from systems.rgnn.models import MODELS
from workloads.graphs import knowledge, published_heterographs, relational, store
from workloads.relational_gnn.gemm import gemm_template  # noqa: F401 (a part, found here by name)

GRAPHED = "training_graphed"  # the mode whose training step is captured whole and replayed
_SIZE = r"([0-9.]+) (B|KiB|MiB|GiB|TiB)"
# What torch's out-of-memory error says, each recorded where it says it: the allocation that
# failed, and what the process held at that moment (all of it, and torch's tensors alone), which
# tell a form too large for the GPU from one that found memory still held by something else.
_OUT_OF_MEMORY_SAYS = {
    "failed_allocation_bytes": re.compile(rf"Tried to allocate {_SIZE}"),
    "process_memory_at_failure_bytes": re.compile(rf"this process has {_SIZE} memory in use"),
    "allocated_at_failure_bytes": re.compile(rf"Of the allocated memory {_SIZE} is allocated by PyTorch"),
}
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


class FormsDisagree(WrongResult, AssertionError):
    """Two forms of one layer computed different outputs (or gradients) from the same weights and
    features."""


class BeyondRounding(FormsDisagree):
    """A lower-precision form off, on some slice, by more than the reference form's own rounding
    in that precision allows: not timed (noted), as a form wrong there would be."""


def knowledge_graphs(params, writer, *, repeat, warmup, device, **_):
    """The real knowledge graphs (workloads/graphs/knowledge.py), every model, form and mode."""
    notes = _notes(params)
    with _exact_float32(), _memory_cap(params, device):
        for name in params["graphs"]:
            spec, arrays = knowledge.load(name)
            _graph(name, spec, arrays, 1.0, params, writer, notes, repeat=repeat, warmup=warmup, device=device)
    return notes


def more_knowledge_graphs(params, writer, **kwargs):
    """The same as :func:`knowledge_graphs` for more of them, in a job of their own (on the H200 the
    compiles of a fresh machine, PyG's layers' most, took the three past one device call)."""
    return knowledge_graphs(params, writer, **kwargs)


def datasets(params, writer, *, repeat, warmup, device, **_):
    """Heterographs shaped like Hector's datasets (workloads/graphs/relational.py), generated once
    and cached on disk, every model, form and mode."""
    notes = _notes(params)
    with _exact_float32(), _memory_cap(params, device):
        for entry in params["datasets"]:
            name, factor = entry["name"], entry["scale_factor"]
            if "published_dir" in entry:  # the real dataset, from its published files (opt-in)
                spec, arrays = _published(name, entry)
                _graph(name, spec, arrays, 1.0, params, writer, notes, repeat=repeat, warmup=warmup, device=device)
                continue
            spec = relational.dataset_spec(name, seed=params["graph_seed"])
            spec = spec.scaled(factor) if factor < 1 else spec
            ratio = entry.get("unique_pair_ratio", relational.PUBLISHED[name].unique_pair_ratio)
            arrays = store.get(relational.HeteroParams(spec, ratio, seed=params["graph_seed"]))
            dataset = f"{name}-like" if factor == 1 else f"{name}-like-{factor:g}"
            _graph(dataset, spec, arrays, factor, params, writer, notes, repeat=repeat, warmup=warmup, device=device)
    return notes


# Each dataset's published format and its reader (the folder is the entry's published_dir).
PUBLISHED = {
    "fb15k": ("FB15k-237's train.txt, valid.txt and test.txt", lambda name, folder: knowledge.load(name, folder)),
    **{name: ("N-Triples (*.nt, *.nt.gz)", published_heterographs.ntriples) for name in ("aifb", "mutag", "bgs", "am")},
    **{name: ("OGB's raw layout (raw/...csv.gz)", published_heterographs.ogb) for name in ("mag", "biokg", "wikikg2")},
}


def _published(name: str, entry: dict):
    """A dataset read from its published files in ``published_dir``."""
    if entry["scale_factor"] != 1:
        raise UserError(f"{name}: a published dataset is used whole; set scale_factor to 1 with published_dir")
    folder = Path(entry["published_dir"]).expanduser()
    described, read = PUBLISHED[name]
    if not folder.is_dir():
        raise UserError(f"{name}: published_dir {folder} is not a folder (it should hold {described})")
    return read(name, folder)


def shapes(params, writer, *, repeat, warmup, device, **_):
    """Heterographs of shapes the config names (``shapes``: name, nodes, edges, node_types,
    relations, unique_pair_ratio), generated as the dataset-shaped ones are: graphs no dataset of
    the suite has, so a claim does not rest on the eight shapes alone."""
    notes = _notes(params)
    with _exact_float32(), _memory_cap(params, device):
        for entry in params["shapes"]:
            totals = relational.Published(
                entry["nodes"], entry["edges"], entry["node_types"], entry["relations"], 1, entry["unique_pair_ratio"]
            )
            spec = relational.dataset_spec(entry["name"], seed=params["graph_seed"], published=totals)
            arrays = store.get(relational.HeteroParams(spec, totals.unique_pair_ratio, seed=params["graph_seed"]))
            _graph(entry["name"], spec, arrays, 1.0, params, writer, notes, repeat=repeat, warmup=warmup, device=device)
    return notes


def large_shapes(params, writer, **kwargs):
    """The same as :func:`shapes` for larger shapes, in a job of their own (on the H200 the compiles
    of a fresh machine took the five shapes past one device call)."""
    return shapes(params, writer, **kwargs)


def large_datasets(params, writer, **kwargs):
    """The same as :func:`datasets` for the large graphs, in a job of their own (on a GPU machine
    they take most of the time, and a job that is cut short loses only its own graphs)."""
    return datasets(params, writer, **kwargs)


def largest_datasets(params, writer, **kwargs):
    """The same as :func:`datasets` for the largest graphs (GPU machines only: on the H200 the
    large graphs together take longer than one device call)."""
    return datasets(params, writer, **kwargs)


def bfloat16_datasets(params, writer, **kwargs):
    """The same as :func:`datasets` on bfloat16 features and weights (``dtypes``), in a job of its
    own: every form that computes in bfloat16; those that do not are noted."""
    return datasets(params, writer, **kwargs)


def width_sweep(params, writer, **kwargs):
    """The same as :func:`datasets` at other widths, in a job of its own (one device call each)."""
    return datasets(params, writer, **kwargs)


def _notes(params) -> dict:
    """The part's provenance notes, starting with why there is no DGL form; first, the models and
    forms named in ``params`` are checked against the registries (an unknown name is one line
    listing the valid ones), before anything is built."""
    for name in params["models"]:
        MODELS[name]
    for name in params.get("leave_out", []):
        FORMS[name]
    # A form naming a model no model is (a typo) would never be measured, and never say so.
    for form in FORMS:
        unknown = [name for name in (*form.models, *form.per_edge_weights) if name not in MODELS.names()]
        if unknown:
            raise UserError(
                f"form {form.name} names model {', '.join(unknown)}, which no registered model is "
                f"(models: {', '.join(MODELS.names())})"
            )
    try:
        import dgl  # noqa: F401  (only whether it imports)
    except Exception as err:  # ImportError, or DGL's own errors against this torch
        reason = f"dgl does not import here ({type(err).__name__}: {err})"
    else:
        reason = "dgl imports, but the suite has no dgl form yet"
    reason += "; DGL's PyPI wheels are CPU-only and built against an old torch"
    # The forms compared on each model (a user's registered ones too); those that could not run
    # somewhere are in "skipped", with why.
    compared = {
        name: [form.name for form in forms_of(MODELS[name]) if form.name not in params.get("leave_out", [])]
        for name in params["models"]
    }
    return {"forms": compared, "skipped": {"dgl": reason}, "graphs": {}}


def _graph(dataset, spec, arrays, factor, params, writer, notes, *, repeat, warmup, device) -> None:
    graph = RelGraph.from_store(arrays, len(spec.relations), device, num_node_types=len(spec.node_types))
    pairs = graph.unique_source_relation_pairs()
    notes["graphs"][dataset] = {
        "nodes": graph.num_nodes,
        "edges": graph.edges,
        "relations": graph.num_relations,
        "unique_pairs": pairs,
    }
    cap = params.get("memory_cap_gib")
    for model, dim, element_type in itertools.product(params["models"], params["dims"], params.get("dtypes", [EXACT])):
        config = {
            "device": device,
            "model": model,
            "in_dim": dim,
            "out_dim": dim,
            "dtype": element_type,  # the features' and weights' element type
            "nodes": graph.num_nodes,
            "edges": graph.edges,
            "relations": graph.num_relations,
            "unique_pairs": pairs,
            "scale_factor": factor,
            "memory_cap_bytes": int(cap * (1 << 30)) if cap and device == "cuda" else None,
        }
        _layer(dataset, graph, model, dim, params, writer, notes, config, repeat=repeat, warmup=warmup)


def _layer(dataset, graph, model_name, dim, params, writer, notes, config, *, repeat, warmup) -> None:
    """Check every form of the model against its reference form, then time each in each mode."""
    device, element_type = config["device"], config["dtype"]
    model = MODELS[model_name]
    generator = torch.Generator().manual_seed(params["seed"])
    as_measured = {"device": device, "dtype": getattr(torch, element_type)}
    x = torch.randn(graph.num_nodes, dim, generator=generator).to(**as_measured)
    target = torch.randn(graph.num_nodes, dim, generator=generator).to(**as_measured)
    weights = model.make_weights(graph, dim, dim, seed=params["seed"]).to(**as_measured)
    # Other features for the check after timing (kept on the host until then): a form that hands
    # back a result it kept from an earlier call would match on the same x.
    x_again = torch.randn(graph.num_nodes, dim, generator=generator).to(dtype=as_measured["dtype"])
    reference_again = None
    forms = [form for form in forms_of(model) if form.name not in params.get("leave_out", [])]
    reference, reference_gradients, checked = None, None, []
    # In a lower precision: the reference form's own error per slice, of its output and gradients.
    rounding, gradient_rounding = None, None
    trains = any(mode != "inference" for mode in params["modes"])
    for form in forms:
        where = f"{model.name} {form.name} on {dataset} at {dim}" + (
            "" if element_type == EXACT else f" in {element_type}"
        )
        if (why := form.missing_element_type(element_type)) is not None:
            notes["skipped"][f"{form.name} in {element_type}"] = why
            continue
        if device == "cpu" and form.gathers_edge_weights(model):
            # the gathered weights and their gradient, for each matrix the model gathers per edge
            need = graph.edges * dim * dim * 4 * 2 * model.edge_matrices
            if need > params["cpu_materialize_limit_gib"] * (1 << 30):
                notes["skipped"][where] = (
                    f"would gather {need / 2**30:.3g} GiB of per-edge weights, over this scale's "
                    f"cpu_materialize_limit_gib ({params['cpu_materialize_limit_gib']})"
                )
                continue
        if (why := form.missing(device)) is not None:
            notes["skipped"][f"{form.name} on {dataset}"] = why
            continue
        try:
            with raised_in(f"form {form.name} ({where})"):
                layer = form.build(model, weights, graph)
            with torch.no_grad(), raised_in(f"form {form.name} ({where})"):  # a compiled form compiles here
                out, first_inference = _first_call(lambda: layer(x), device)
        except GraphNotSupported as err:  # a limit of the library the form wraps: the others go on
            notes["skipped"][where] = str(err)
            continue
        except torch.cuda.OutOfMemoryError as err:
            for mode in params["modes"]:
                _out_of_memory(writer, dataset, form, config | {"mode": mode}, err)
            continue
        except CompileFailed as err:
            notes["skipped"][where] = str(err)
            continue
        if not isinstance(out, torch.Tensor):
            raise FormsDisagree(f"{where}: returns a {type(out).__name__}, not a tensor")
        if out.dtype != x.dtype and element_type == EXACT:  # float32 in, float32 out: anything else is wrong
            raise FormsDisagree(f"{where}: returns {out.dtype} on {x.dtype} features and weights")
        if out.dtype != x.dtype:  # it computed in another precision: not a form of this one
            notes["skipped"][where] = f"returns {out.dtype} on {x.dtype} features and weights"
            continue
        if reference is None:
            if form.name != model.reference:
                raise UserError(f"{where}: the reference form {model.reference} did not run, so nothing is checked")
            # In float32 the reference form's own result; in bfloat16 that form in float32 on the
            # same rounded values, so every bf16 form (the reference's bf16 run too) is checked
            # against arithmetic that rounds nothing further.
            reference = out if element_type == EXACT else _float32_reference(model, weights, graph, x)
            with torch.no_grad(), raised_in(f"form {form.name} ({where})"):
                again_on_device = x_again.to(device)
                reference_again = (
                    layer(again_on_device)
                    if element_type == EXACT
                    else _float32_reference(model, weights, graph, again_on_device)
                ).to("cpu", copy=True)
                del again_on_device
        tol = _tolerance(form, element_type)
        try:
            _check(out, reference, tol, f"{where}: differs from {model.reference}", rounding)
        except BeyondRounding as err:
            notes["skipped"][where] = str(err)
            continue
        if form.name == model.reference and element_type != EXACT:
            rounding = _slice_errors(out, reference)
        del out
        # Training is timed too: its gradients are checked as well (a form whose forward is right
        # but whose backward is wrong, or missing, would otherwise be timed as a fast training step).
        first_training, training_failed = None, None
        if trains:
            try:
                with raised_in(f"form {form.name} ({where}), its training step"):
                    gradients, first_training = _first_call(lambda: _gradients(layer, x, target, weights), device)
                if form.name == model.reference:  # the forms' gradients are checked against the reference's
                    reference_gradients = (
                        gradients if element_type == EXACT else _float32_gradients(model, weights, graph, x, target)
                    )
            except torch.cuda.OutOfMemoryError as err:
                # Kept as its message only: the error's traceback would hold the backward's tensors.
                training_failed = torch.cuda.OutOfMemoryError(str(err))  # the training modes record it
            except CompileFailed as err:
                training_failed = err  # the training modes are noted as skipped; inference is timed
            else:
                if reference_gradients is None:
                    notes.setdefault("gradients_not_checked", {})[where] = (
                        f"the reference form {model.reference}'s gradients could not be computed"
                    )
                else:
                    try:
                        _check_gradients(gradients, reference_gradients, tol, where, model, gradient_rounding)
                    except BeyondRounding as err:
                        notes["skipped"][where] = str(err)
                        continue
                    if form.name == model.reference and element_type != EXACT:
                        gradient_rounding = {
                            name: _slice_errors(g, reference_gradients[name]) for name, g in gradients.items()
                        }
                del gradients
        checked.append((form, layer, first_inference, first_training, training_failed))
        if form.name == model.reference and device == "cuda":
            # Kept for every later form's check, so moved out of the blocks the allocator cached for
            # the reference's own calls: a small result carved from a large cached block pins all of
            # it (empty_cache cannot give a block in use back), and a later form's large gather of
            # per-edge weights finds the GPU short by that much.
            reference, reference_gradients = _moved(reference, "cpu"), _moved(reference_gradients, "cpu")
            _give_back_gpu_memory(device)
            reference, reference_gradients = _moved(reference, device), _moved(reference_gradients, device)
        # Each check starts from the same memory, as each timing does: what one form's check leaves in
        # the allocator's cache must not decide whether the next form's gather fits (two checks ran out
        # of memory gathering 73 and 87 GiB of per-edge weights where an earlier run had fit them).
        _give_back_gpu_memory(device)
    # Kept on the host for the check after each form's timed calls, with the weights the checks
    # ran on (training's steps change them).
    kept = _moved(reference, "cpu", copy=True), _moved(reference_gradients, "cpu", copy=True)
    again = _Recheck(*kept, weights, x, target, model, x_again, reference_again)
    del reference, reference_gradients
    # On a GPU the fused Adam (one launch for all parameters): the for-each one launches several
    # kernels a parameter from Python, host time that on a small graph outweighs the layer itself,
    # whichever form computed it.
    optimizer = torch.optim.Adam(weights.parameters(), lr=1e-3, fused=device == "cuda")

    def step(layer, mode):
        if mode == "inference":
            with torch.no_grad():
                return layer(x)
        optimizer.zero_grad(set_to_none=False)  # gradients stay allocated: not intermediate memory
        loss = F.mse_loss(layer(x), target)
        loss.backward()
        optimizer.step()
        return loss

    timed = {"x": x, "target": target, "weights": weights, "repeat": repeat, "warmup": warmup}
    while checked:
        form, layer, *firsts = checked.pop(0)
        where = f"{model.name} {form.name} on {dataset} at {dim} after its timed calls"
        with raised_in(f"form {form.name} ({model.name} on {dataset} at {dim})"):
            _time_form(form, layer, *firsts, step, graph, dataset, params, writer, notes, config, **timed)
        again.check(form, layer, _tolerance(form, element_type), where, notes, checks_training=firsts[1] is not None)
        del layer  # with its compiled code, captures and caches, before the next form runs
        _give_back_gpu_memory(device)
    if device == "cuda":  # what stayed reserved after every form let go: a leak shows here
        notes.setdefault("gpu_memory_reserved_after", {})[f"{model.name} on {dataset} at {dim}"] = (
            torch.cuda.memory_reserved()
        )


class _Recheck:
    """Each form checked again after its timed calls, from the weights its first check ran on: a
    form right on its first calls and wrong on later ones (a cache that goes stale, a buffer
    reused too early) stops the part instead of being recorded. Its forward is checked on other
    features (``x_again``, against the reference form's result on them): a form that handed back a
    result kept from its first call would match on the features it was timed on."""

    def __init__(self, reference, reference_gradients, weights, x, target, model, x_again, reference_again):
        self.reference, self.reference_gradients = reference, reference_gradients
        self.weights, self.x, self.target, self.model = weights, x, target, model
        self.x_again, self.reference_again = x_again, reference_again
        self.checked_weights = _moved(weights.state_dict(), "cpu", copy=True)

    def check(self, form, layer, tol: float, where: str, notes: dict, checks_training: bool) -> None:
        if self.reference is None:
            return
        self.weights.load_state_dict(self.checked_weights)
        device = self.x.device
        try:
            with torch.no_grad():
                out = layer(self.x_again.to(device))
            differs = f"{where}, on other features: differs from {self.model.reference}"
            _check(out, self.reference_again.to(device), tol, differs)
            del out
            if checks_training and self.reference_gradients is not None:
                gradients = _gradients(layer, self.x, self.target, self.weights)
                reference = _moved(self.reference_gradients, device)
                _check_gradients(gradients, reference, tol, where, self.model)
        except torch.cuda.OutOfMemoryError:
            notes.setdefault("not_checked_after_timing", {})[where] = "out of memory"


def _time_form(
    form,
    layer,
    first_inference,
    first_training,
    training_failed,
    step,
    graph,
    dataset,
    params,
    writer,
    notes,
    config,
    *,
    x,
    target,
    weights,
    repeat,
    warmup,
) -> None:
    """Time ``layer`` (``form``, checked against the reference) in each of the part's modes;
    ``step(layer, mode)`` is one inference call or one training step. ``first_inference`` and
    ``first_training``: the checks' first calls (they compiled, where the form compiles);
    ``training_failed``: the out-of-memory error of the gradients' check, recorded for the
    training modes."""
    device, element_type = config["device"], config["dtype"]
    model, dim = MODELS[config["model"]], config["in_dim"]
    for mode in params["modes"]:
        row = config | {"mode": mode} | _columns(form, element_type)
        if mode != "inference" and isinstance(training_failed, CompileFailed):
            notes["skipped"][f"{model.name} {form.name} on {dataset} at {dim}, {mode}"] = str(training_failed)
            continue
        if mode != "inference" and training_failed is not None:
            _out_of_memory(writer, dataset, form, row, training_failed)
            continue
        if mode == GRAPHED:
            timed = dict(repeat=repeat, warmup=warmup, device=device)
            _graphed_training(layer, x, target, weights, form, row, dataset, params, writer, notes, **timed)
            continue
        try:
            # untimed: makes the gradients and the optimizer's state (and compiles for training)
            _, first = _first_call(lambda: step(layer, mode), device)
            if params.get("slow_call"):  # a second untimed call: the first may have compiled
                _, one_call = _first_call(lambda: step(layer, mode), device)
                calls = _calls_for(
                    one_call, repeat, warmup, params, notes, f"{model.name} {form.name} on {dataset}, {mode}"
                )
            else:
                calls = {"repeat": repeat, "warmup": warmup}
            before = torch.cuda.memory_allocated() if device == "cuda" else 0
            held_before = cuda_graphs.held_bytes(graph) if device == "cuda" else 0
            m = measure(
                lambda: step(layer, mode),
                device=device,
                **calls,
                track_memory=device == "cuda",
                desc=f"{dataset} {model.name} {dim} {form.name} {mode}",
            )
        except torch.cuda.OutOfMemoryError as err:
            _out_of_memory(writer, dataset, form, row, err)
            continue
        except CompileFailed as err:
            notes["skipped"][f"{model.name} {form.name} on {dataset} at {dim}, {mode}"] = str(err)
            continue
        held = cuda_graphs.held_bytes(graph) - held_before if device == "cuda" else 0
        writer.add_measurement(m, role=form.role, variant=form.name, config=row, dataset=dataset)
        common = {"role": form.role, "variant": form.name, "config": row, "dataset": dataset}
        # The checks came first: without gradients, then the training step's gradients.
        first = first_inference if mode == "inference" else first_training if first_training is not None else first
        writer.add(metric="first_call_time", value=first, unit="s", **common)
        if isinstance(layer, CompiledLayer):
            writer.add(metric="graph_breaks", value=layer.graph_breaks[mode], unit="1", **common)
        if config["in_dim"] in params.get("breakdown_dims", params["dims"]):  # one more call, profiled
            seconds, allocated = profile_call(lambda: step(layer, mode), device)
            for metric, split, unit in (("breakdown_time", seconds, "s"), ("breakdown_bytes", allocated, "B")):
                for kind, value in split.items():
                    writer.add(
                        role=form.role,
                        variant=form.name,
                        config=row | {"kernel_class": kind},
                        metric=metric,
                        value=value,
                        unit=unit,
                        dataset=dataset,
                    )
        for rep, peak in enumerate(m.peak_gpu_bytes):
            writer.add(
                role=form.role,
                variant=form.name,
                config=row,
                metric="intermediate_memory",
                value=peak - before + held,
                unit="B",
                repetition=rep,
                dataset=dataset,
            )


def _graphed_training(layer, x, target, weights, form, row, dataset, params, writer, notes, *, repeat, warmup, device):
    """The training step captured whole as one CUDA graph (harness/graphed_step.py) and replayed:
    each form's step with the host taken out, as a user whose step is host-bound would run it.
    Checked before timing: a replay's loss equals the eager loss of the same weights. Capture time
    is ``first_call_time``; a form whose step cannot be captured (it waits for the GPU) is noted."""
    where = f"{row['model']} {form.name} on {dataset} at {row['in_dim']}, {GRAPHED}"
    if device != "cuda":
        notes["skipped"][GRAPHED] = "a CUDA graph needs a GPU: every form's captured step is left out"
        return
    optimizer = torch.optim.Adam(weights.parameters(), lr=1e-3, fused=True, capturable=True)
    last = {}

    def step():
        optimizer.zero_grad(set_to_none=False)
        last["loss"] = F.mse_loss(layer(x), target)
        last["loss"].backward()
        optimizer.step()

    try:
        replay, capture_time = _first_call(lambda: capture_step(step), device)
        with torch.no_grad():
            want = F.mse_loss(layer(x), target)
        _, one_replay = _first_call(replay, device)  # rewrites the captured step's own loss tensor, last["loss"]
    except NotCapturable as err:
        notes["skipped"][where] = f"its training step cannot be captured: {err}"
        return
    except torch.cuda.OutOfMemoryError as err:
        _out_of_memory(writer, dataset, form, row, err)
        return
    try:
        if not torch.allclose(last["loss"], want, rtol=max(_tolerance(form, row["dtype"]), 1e-4), atol=0):
            raise FormsDisagree(
                f"{where}: a replay's loss {float(last['loss']):.6g} is not the eager {float(want):.6g}"
            )
        calls = _calls_for(one_replay, repeat, warmup, params, notes, where)
        m = measure(replay, device=device, desc=where, **calls)
    finally:
        # The graph's private pool holds the whole step's intermediates (gigabytes on the large
        # graphs): give it back before the next form is captured.
        del replay
        last.clear()
        _give_back_gpu_memory(device)
    writer.add_measurement(m, role=form.role, variant=form.name, config=row, dataset=dataset)
    writer.add(
        metric="first_call_time",
        value=capture_time,
        unit="s",
        role=form.role,
        variant=form.name,
        config=row,
        dataset=dataset,
    )


def _calls_for(first_seconds: float, repeat: int, warmup: int, params, notes, where: str) -> dict:
    """The timed and warm-up calls for a form whose first call took ``first_seconds``: the
    scale's own, or ``slow_call``'s fewer for a call slower than its threshold (noted)."""
    slow = params.get("slow_call")
    if not slow or first_seconds <= slow["seconds"]:
        return {"repeat": repeat, "warmup": warmup}
    notes.setdefault("fewer_repetitions", {})[where] = (
        f"its first call took {first_seconds:.2f} s (over {slow['seconds']} s): timed {slow['repeat']} times after "
        f"{slow['warmup']} warm-up calls, not {repeat} after {warmup}"
    )
    return {"repeat": min(slow["repeat"], repeat), "warmup": min(slow["warmup"], warmup)}


def _give_back_gpu_memory(device: str) -> None:
    """Collect what only the cycle collector frees (layers, captured graphs, tracebacks) and
    return the allocator's unused cache to the GPU, so each form starts from the same memory."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def _moved(tensors, device: str, copy: bool = False):
    """A tensor, or a dict of them (None: None), on ``device``; with ``copy``, never the tensor itself."""
    if isinstance(tensors, dict):
        return {name: tensor.detach().to(device, copy=copy) for name, tensor in tensors.items()}
    return None if tensors is None else tensors.detach().to(device, copy=copy)


def _first_call(call, device: str):
    """``call()``'s result and its seconds, the device's queue drained before and after."""
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = call()
    if device == "cuda":
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def _columns(form, element_type: str) -> dict:
    """A row's configuration columns for ``form`` on tensors of ``element_type``: what it computes
    and in which precision."""
    return {"form": form.form, "precision": form.precision_on(element_type)}


def _tolerance(form, element_type: str) -> float:
    return TOLERANCE[form.precision_on(element_type)]


def _float32_reference(model, weights, graph, x) -> torch.Tensor:
    """The model's reference form in float32 on the (rounded) values of ``weights`` and ``x``."""
    with torch.no_grad():
        return FORMS[model.reference].build(model, copy.deepcopy(weights).float(), graph)(x.float())


def _gradients(layer, x, target, weights) -> dict[str, torch.Tensor]:
    """The gradient of the training step's loss for each weight, by name (the weights and their
    ``.grad`` unchanged)."""
    names, parameters = zip(*weights.named_parameters(), strict=True)
    loss = F.mse_loss(layer(x), target)
    return dict(zip(names, torch.autograd.grad(loss, parameters, materialize_grads=True), strict=True))


def _check_gradients(gradients: dict, reference: dict, tol: float, where: str, model, rounding=None) -> None:
    """Each weight's gradient against the reference form's, on its own scale (a small gradient,
    a bias's, is not hidden by a large one); ``rounding``: by name, as :func:`_check` takes it."""
    for name, gradient in gradients.items():
        differs = f"{where}: the gradient of {name} differs from {model.reference}'s"
        _check(gradient, reference[name], tol, differs, rounding=(rounding or {}).get(name))


def _float32_gradients(model, weights, graph, x, target) -> dict[str, torch.Tensor]:
    """:func:`_gradients` of the model's reference form in float32 on the (rounded) values."""
    exact = copy.deepcopy(weights).float()
    return _gradients(FORMS[model.reference].build(model, exact, graph), x.float(), target.float(), exact)


# Each slice of a result (a node's row of the output, a relation's or node type's block of a
# weight's gradient) is judged on its own scale, down to this share of the whole's largest: judged
# on the whole's scale, a form wrong for a rare relation's weights or a low-degree node's row
# passed (its errors sat below a tolerance set by the largest values); the floor keeps slices
# whose true values are rounding noise from being judged on the noise.
SLICE_FLOOR = 1e-2
# Against a float32 result of a lower-precision form, no slice may be off by this share of its
# own norm (the whole is held to the form's tolerance norm-wise): a row left out or zeroed is off
# by all of it, rounding moves a row by a few percent.
SLICE_NORM_TOLERANCE = 0.5
# ... and no slice may be off by more than this many times the reference form's own error there in
# that precision (at least ROUNDING_FLOOR of the slice's norm): forms round alike, while one wrong
# for a rare relation (its norm off by 40%: 0.11 of a row against the rounding's 0.025 at most)
# passed the share above.
ROUNDING_FACTOR = 4.0
ROUNDING_FLOOR = 0.05


def _check(out: torch.Tensor, reference: torch.Tensor, tol: float, what: str, rounding=None) -> None:
    """Stop the part unless ``out`` is ``reference`` within ``tol``. Against a float32 result of a
    lower-precision form the error is norm-wise (||out - reference|| / ||reference||): rounding
    every stored value to 8 mantissa bits moves a few attention weights by several percent of
    the largest output (an exp of a rounded score), while a wrong result is off by its whole
    norm; each slice is also held to :data:`SLICE_NORM_TOLERANCE` of its own norm. Otherwise
    element-wise: relative, or relative to the largest magnitude of the element's slice
    (:data:`SLICE_FLOOR`). ``rounding``: the reference form's own error per slice in the lower
    precision (:func:`_slice_errors`), which no slice may exceed :data:`ROUNDING_FACTOR` times."""
    if out.shape != reference.shape:
        raise FormsDisagree(f"{what}: a result of shape {tuple(out.shape)}, not {tuple(reference.shape)}")
    if not bool(torch.isfinite(reference).all()):  # an infinite scale would let anything pass
        raise FormsDisagree(f"{what}: the reference form's own result is not finite, so nothing can be checked")
    if not bool(torch.isfinite(out).all()):  # else reported as "differs by up to inf" (or nan)
        bad = int((~torch.isfinite(out)).sum())
        raise FormsDisagree(f"{what}: {bad} of its {out.numel()} values are NaN or infinite, the reference's none")
    if out.dtype != reference.dtype:
        error = float((out.double() - reference.double()).norm() / reference.double().norm().clamp_min(1e-30))
        if not error <= tol:  # also stops on NaN
            raise FormsDisagree(
                f"{what} in float32 on the same rounded values by {error:.3g} norm-wise (tolerance {tol})"
            )
        if (worst := _worst_slice_norm_error(out, reference)) is not None and not worst[1] <= SLICE_NORM_TOLERANCE:
            raise FormsDisagree(
                f"{what} in float32 on the same rounded values: slice {worst[0]} is off by {worst[1]:.3g} of its own "
                f"norm (at most {SLICE_NORM_TOLERANCE})"
            )
        if rounding is not None and (errors := _slice_errors(out, reference)) is not None:
            allowed = (ROUNDING_FACTOR * rounding.to(errors.device)).clamp_min(ROUNDING_FLOOR)
            if bool((errors > allowed).any()):
                i = int((errors / allowed).argmax())
                raise BeyondRounding(
                    f"{what} in float32 on the same rounded values: slice {i} is off by {float(errors[i]):.3g} of "
                    f"its own norm, over {ROUNDING_FACTOR:g}x the reference form's own rounding there "
                    f"({float(rounding[i]):.3g}; at least {ROUNDING_FLOOR})"
                )
        return
    difference = (out - reference).abs()
    allowed = tol * reference.abs() + tol * _slice_scale(reference)
    if not bool((difference <= allowed).all()):  # also stops on NaN
        where = ""
        if out.dim() >= 2:
            wrong = ~(difference <= allowed)
            where = f" (first in slice {int(wrong.reshape(len(out), -1).any(1).nonzero()[0])}, on its own scale)"
        raise FormsDisagree(f"{what} by up to {float(difference.nan_to_num(float('inf')).max()):.3g}{where}")


def _slice_scale(reference: torch.Tensor) -> torch.Tensor:
    """Each element's scale: the largest magnitude of its slice along the first dimension (the
    whole tensor's for a vector), at least :data:`SLICE_FLOOR` of the whole's."""
    magnitude = reference.abs()
    largest = magnitude.max() if magnitude.numel() else magnitude.new_zeros(())
    if magnitude.dim() < 2 or not magnitude.numel():
        return largest
    per_slice = magnitude.reshape(len(magnitude), -1).amax(1).clamp_min(SLICE_FLOOR * largest)
    return per_slice.view(-1, *[1] * (magnitude.dim() - 1))


def _slice_errors(out: torch.Tensor, reference: torch.Tensor) -> torch.Tensor | None:
    """Each slice's (along the first dimension) norm-wise error, each slice's norm taken as at
    least :data:`SLICE_FLOOR` of the largest slice's; None for a vector."""
    if reference.dim() < 2 or not reference.numel():
        return None
    rows = len(reference)
    norms = reference.double().reshape(rows, -1).norm(dim=1)
    errors = (out.double() - reference.double()).reshape(rows, -1).norm(dim=1)
    return (errors / norms.clamp_min(max(SLICE_FLOOR * float(norms.max()), 1e-30))).nan_to_num(float("inf"))


def _worst_slice_norm_error(out: torch.Tensor, reference: torch.Tensor) -> tuple[int, float] | None:
    """The slice whose norm-wise error is largest (:func:`_slice_errors`), and that error."""
    relative = _slice_errors(out, reference)
    if relative is None:
        return None
    worst = int(relative.argmax())
    return worst, float(relative[worst])


def _out_of_memory(writer, dataset: str, form, config: dict, err: BaseException) -> None:
    """Record that ``form`` did not fit, with the failed allocation's size and the memory the
    process held where the error says them, and give the memory back."""
    torch.cuda.empty_cache()
    common = {
        "role": form.role,
        "variant": form.name,
        "config": config | _columns(form, config["dtype"]),
        "dataset": dataset,
    }
    writer.add(metric="out_of_memory", value=1, unit="1", **common)
    for metric, says in _OUT_OF_MEMORY_SAYS.items():
        if found := says.search(str(err)):
            writer.add(metric=metric, value=float(found.group(1)) * _UNITS[found.group(2)], unit="B", **common)


@contextlib.contextmanager
def _exact_float32():
    """Matrix products in full float32 (TF32 off), and bfloat16 ones accumulated in float32 (no
    reduced-precision split-K reductions), restored afterwards."""
    matmul = torch.backends.cuda.matmul
    saved = matmul.allow_tf32, torch.backends.cudnn.allow_tf32, matmul.allow_bf16_reduced_precision_reduction
    matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = matmul.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_tf32, torch.backends.cudnn.allow_tf32, matmul.allow_bf16_reduced_precision_reduction = saved


@contextlib.contextmanager
def _memory_cap(params, device: str):
    """At most ``memory_cap_gib`` of the GPU for this process, where set (a smaller GPU)."""
    cap = params.get("memory_cap_gib")
    if not cap or device != "cuda":
        yield
        return
    total = torch.cuda.get_device_properties(0).total_memory
    if cap * (1 << 30) > total:
        raise UserError(f"memory_cap_gib {cap} is more than this GPU's {total / 2**30:.1f} GiB")
    torch.cuda.set_per_process_memory_fraction(cap * (1 << 30) / total)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
