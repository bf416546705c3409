"""What a pipeline keeps in GPU memory for a whole run, and the GPU memory budgets it is judged
against.

A pipeline's resident data is what it places on the GPU once and keeps there: the feature table
and the CSR where they live on the GPU, the labels and the sampler's id maps where it samples on
the GPU, a hot-row cache. It is known from the graph's sizes before anything is allocated, so a
pipeline whose resident data exceed a budget is recorded as not fitting it and, over every
budget, is not run. One that is run runs under an allocator cap of the largest budget (an
overrun is an out-of-memory error, never a silent success) and its measured peak is judged
against each budget too: its batches and activations need room beside the resident data.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from harness.arguments import real_number
from harness.errors import UserError
from workloads.gnn.pipelines import PIPELINE_KINDS

GIB = 2**30
INDEX_BYTES = 8  # CSR, labels and the sampler's id maps are int64
# A sampler keeps one id map per thread that samples with it (systems/sampling/sampler.py): the
# prefetch thread's for the training batches, the training thread's for the validation batches.
SAMPLING_THREADS = 2


@dataclass(frozen=True)
class GraphSizes:
    """The sizes that decide a graph's footprint."""

    nodes: int
    edges: int
    feature_dim: int
    feature_itemsize: int
    label_itemsize: int = INDEX_BYTES

    @classmethod
    def of(cls, graph) -> GraphSizes:
        """Of a :class:`workloads.gnn.pipelines.Graph` (its tensors' sizes; nothing is read)."""
        features = graph.features
        return cls(
            nodes=int(graph.indptr.numel()) - 1,
            edges=int(graph.indices.numel()),
            feature_dim=int(features.shape[1]),
            feature_itemsize=features.element_size(),
            label_itemsize=graph.labels.element_size(),
        )

    @property
    def feature_table(self) -> int:
        return self.nodes * self.feature_dim * self.feature_itemsize

    @property
    def csr(self) -> int:
        return (self.nodes + 1 + self.edges) * INDEX_BYTES


def resident_bytes(pipeline: str, sizes: GraphSizes, options: dict | None = None) -> dict[str, int]:
    """The GPU memory ``pipeline`` keeps for a run, by what it holds ({} for none)."""
    kind = PIPELINE_KINDS[pipeline]
    held = {}
    if kind.sampling != "cpu":  # the sampler's id maps and the labels it indexes live on its device
        held["labels"] = sizes.nodes * sizes.label_itemsize
        held["id maps"] = SAMPLING_THREADS * (sizes.nodes + 1) * INDEX_BYTES
    if kind.sampling == "cuda":
        held["CSR"] = sizes.csr
    if kind.resident is not None:
        held |= kind.resident(sizes, options or {})
    return held


def parse_budgets(budgets) -> list[float]:
    """The configured budgets in GiB, ascending and distinct ([] for none)."""
    budgets = budgets or []
    if not isinstance(budgets, list) or any(real_number(b) is None or b <= 0 for b in budgets):
        raise UserError(f"gpu_memory_budget_gib must be a list of positive sizes in GiB, got {budgets!r}")
    return sorted({float(b) for b in budgets})


def over_budget(held: dict[str, int], budget_gib: float, peak: int | None = None) -> str | None:
    """Why ``held`` (and a measured ``peak``) does not fit ``budget_gib``, or None if it does."""
    total = sum(held.values())
    if total > budget_gib * GIB:
        parts = ", ".join(f"{name} {size / GIB:.2f}" for name, size in held.items())
        return f"{total / GIB:.2f} GiB resident ({parts}) over a {budget_gib:g} GiB budget"
    if peak is not None and peak > budget_gib * GIB:
        return f"a peak of {peak / GIB:.2f} GiB while training, over a {budget_gib:g} GiB budget"
    return None


def budgets_missed(held: dict[str, int], budgets: list[float], peak: int | None = None) -> dict[float, str]:
    """{budget: why} for each of ``budgets`` that ``held`` (or a measured ``peak``) does not fit."""
    missed = {budget: over_budget(held, budget, peak) for budget in budgets}
    return {budget: why for budget, why in missed.items() if why is not None}


@contextmanager
def allocator_cap(budget_gib: float | None, device: str) -> Iterator[None]:
    """torch's allocator on ``device`` capped at ``budget_gib`` (None: no cap) while inside, and
    its peak counter started afresh. A cap above the GPU's memory is the GPU's memory."""
    if device != "cuda":
        yield
        return
    torch.cuda.empty_cache()  # what earlier pipelines left cached would count against the cap
    torch.cuda.reset_peak_memory_stats()
    if budget_gib is None:
        yield
        return
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, budget_gib * GIB / total))
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
