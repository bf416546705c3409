"""A dataset's graph by name, from the store (store.py): generated with the dataset's published
statistics at a scale (spec.py, generate.py), or the real dataset imported from its published
files (published.py). What every topic that trains on a dataset's graph calls.

With ``features_in_memory`` in a dataset's parameters, :func:`load_graph` generates the graph in
this process instead, its feature table drawn straight into shared host memory (the memory a
zero-copy pipeline pins in place), and writes nothing to disk: for a table that the disk cannot
cache next to its copy in memory (papers100M-like at full size: 53 GiB). The rows are those of
the cached graph with the same parameters.
"""

from __future__ import annotations

from pathlib import Path

from harness.errors import UserError
from harness.progress import progress
from workloads.graphs import store
from workloads.graphs.generate import GeneratorParams, generate
from workloads.graphs.published import import_published
from workloads.graphs.shared import shared_anonymous_table
from workloads.graphs.spec import DATASETS, GraphSpec


def cached_graph(name: str, params: dict, graph_seed: int) -> tuple[GraphSpec, str, Path]:
    """Dataset ``name``'s spec, its label in the results and its graph's folder in the store
    (generated or imported first): the real dataset from ``params["published_dir"]`` when that
    is set, else a graph with its statistics at ``params["scale_factor"]``, from ``graph_seed``."""
    if name not in DATASETS:
        raise UserError(f"unknown dataset {name!r}; one of {', '.join(DATASETS)}")
    if params.get("published_dir"):
        folder = import_published(name, Path(params["published_dir"]).expanduser())
        arrays = store.load(folder)
        nodes = arrays["labels"].shape[0]
        spec = GraphSpec(
            name,
            nodes,
            arrays["indices"].shape[0],
            arrays["features"].shape[1],
            int(arrays["labels"].max()) + 1,
            arrays["train_idx"].shape[0] / nodes,
            arrays["val_idx"].shape[0] / nodes,
        )
        return spec, name, folder
    spec = DATASETS[name].scaled(params["scale_factor"])
    generator = GeneratorParams(spec, seed=graph_seed)
    store.get(generator)
    return spec, f"{name}-like", store.folder_for(generator)


def load_graph(name: str, params: dict, graph_seed: int) -> tuple[GraphSpec, str, dict]:
    """As :func:`cached_graph`, with the graph's arrays (memory-mapped) instead of its folder; or,
    with ``params["features_in_memory"]``, as :func:`generated_in_memory`."""
    if params.get("features_in_memory"):
        return generated_in_memory(name, params, graph_seed)
    spec, label, folder = cached_graph(name, params, graph_seed)
    return spec, label, store.load(folder)


def generated_in_memory(name: str, params: dict, graph_seed: int) -> tuple[GraphSpec, str, dict]:
    """Dataset ``name``'s generated graph at ``params["scale_factor"]``, made in this process: its
    feature table (``arrays["features"]``) in shared anonymous memory, drawn there a chunk at a
    time, the other arrays in private memory; nothing is read from or written to the store."""
    if name not in DATASETS:
        raise UserError(f"unknown dataset {name!r}; one of {', '.join(DATASETS)}")
    if params.get("published_dir"):
        raise UserError(
            f"{name}: features_in_memory generates the graph; a published dataset is imported into the store "
            "instead (set one of published_dir and features_in_memory)"
        )
    spec = DATASETS[name].scaled(params["scale_factor"])
    table = shared_anonymous_table((spec.nodes, spec.feature_dim), "float32")
    shown = lambda items, desc, total: progress(items, desc=desc, total=total)  # noqa: E731
    arrays = generate(GeneratorParams(spec, seed=graph_seed), progress=shown, features=table)
    return spec, f"{name}-like", arrays
