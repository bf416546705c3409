"""A dataset's graph by name, from the store (store.py): generated with the dataset's published
statistics at a scale (spec.py, generate.py), or the real dataset imported from its published
files (published.py). What every topic that trains on a dataset's graph calls.
"""

from __future__ import annotations

from pathlib import Path

from harness.errors import UserError
from workloads.graphs import store
from workloads.graphs.generate import GeneratorParams
from workloads.graphs.published import import_published
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
    """As :func:`cached_graph`, with the graph's arrays (memory-mapped) instead of its folder."""
    spec, label, folder = cached_graph(name, params, graph_seed)
    return spec, label, store.load(folder)
