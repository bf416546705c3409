"""Multi-hop uniform neighbour sampling into PyG-style subgraphs (what NeighborLoader returns).

For a batch of seed nodes and fan-outs ``[k1, k2, ...]``: hop 1 samples up to k1 neighbours of
every seed, hop 2 up to k2 neighbours of every node that hop 1 added, and so on. The result is
one subgraph: ``n_id`` (global ids; the seeds first, then each hop's new nodes),
``edge_index`` (local ids, row 0 the sampled neighbour, row 1 the node it was sampled for, so
messages flow neighbour -> node as in PyG), and per-hop node and edge counts. PyG conv layers
run on it directly; the first ``batch_size`` outputs are the seeds'.

Where it runs: ``"cpu"`` (CSR in host memory), ``"cuda"`` (CSR copied to GPU memory) or
``"uva"`` (CSR pinned in host memory, read by the GPU kernel over PCIe). All three return the
same subgraph for the same seeds, batch number and seed of the sampler. On the CPU each hop,
relabelling included, is one call of the C++ kernel (``sample_hop``); on the GPU the hop is the
op plus torch's unique and indexing (``_sample_with_torch``, which also runs on the CPU, and the
tests hold the two to the same output).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from systems import native
from systems.sampling.ops import BAD_CSR, BAD_CSR_MESSAGE, MAX_FANOUT, check_arguments, cpu_kernels, sample_neighbors

PLACES = ("cpu", "cuda", "uva")


@dataclass
class SampledSubgraph:
    n_id: torch.Tensor
    edge_index: torch.Tensor
    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]
    batch_size: int


def _check_csr(indptr: torch.Tensor, indices: torch.Tensor) -> None:
    """Refuse a CSR the kernels would read out of bounds with (one pass, when a sampler is made)."""
    if indptr.dtype != torch.int64 or indices.dtype != torch.int64 or indptr.dim() != 1 or indices.dim() != 1:
        raise ValueError("indptr and indices must be 1-D int64 tensors")
    n = indptr.numel() - 1
    if n < 1 or int(indptr[0]) != 0 or int(indptr[-1]) != indices.numel() or bool((indptr[1:] < indptr[:-1]).any()):
        raise ValueError("indptr must start at 0, never decrease and end at the number of indices")
    if indices.numel() and not 0 <= int(indices.min()) <= int(indices.max()) < n:
        raise ValueError(
            f"indices must be node ids in [0, {n}); the CSR holds {int(indices.min())}..{int(indices.max())}"
        )


class NeighborSampler:
    def __init__(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        fanouts: list[int],
        *,
        replace: bool = False,
        place: str = "cpu",
        seed: int = 0,
    ):
        if place not in PLACES:
            raise ValueError(f"place must be one of {PLACES}, got {place!r}")
        if not fanouts or any(not isinstance(k, int) or not 1 <= k <= MAX_FANOUT for k in fanouts):
            raise ValueError(f"fanouts must be a non-empty list of integers in [1, {MAX_FANOUT}], got {fanouts}")
        self.fanouts, self.replace, self.place, self.seed = list(fanouts), replace, place, seed
        self.device = torch.device("cpu" if place == "cpu" else "cuda")
        if place == "cuda":
            indptr, indices = indptr.to(self.device), indices.to(self.device)
        elif place == "uva":
            if not (indptr.is_pinned() and indices.is_pinned()):
                raise ValueError("place='uva' needs the CSR in pinned host memory (UnifiedTensor or pin_memory())")
        self.indptr, self.indices = indptr, indices
        self.num_nodes = indptr.numel() - 1
        _check_csr(indptr, indices)
        # Global id -> local id of the batch being built (-1: not in it); reset after each batch.
        self.position = torch.full((self.num_nodes,), -1, dtype=torch.int64, device=self.device)

    def rng_seed(self, batch: int, hop: int) -> int:
        return ((self.seed * 1_000_003 + batch) * 16 + hop) % (2**63)

    def sample(self, seeds: torch.Tensor, batch: int, *, native_kernel: bool = True) -> SampledSubgraph:
        """The subgraph of one batch; ``batch`` numbers the batch (it picks the random draws)."""
        seeds = seeds.to(self.device, torch.int64)
        if seeds.unique().numel() != seeds.numel():
            raise ValueError("seed nodes of a batch must be distinct")
        if self.device.type == "cpu" and native_kernel:
            return self._sample_native(seeds.contiguous(), batch)
        return self._sample_with_torch(seeds, batch)

    def _sample_native(self, seeds: torch.Tensor, batch: int) -> SampledSubgraph:
        kernels, p = cpu_kernels(), native.pointer
        check_arguments(self.indptr, self.indices, seeds, max(self.fanouts), 0)
        position = self.position
        n_ids, sources, targets = [seeds], [], []
        position[seeds] = torch.arange(seeds.numel())
        total, frontier = seeds.numel(), seeds
        num_nodes, num_edges = [seeds.numel()], []
        try:
            for hop, fanout in enumerate(self.fanouts):
                room = frontier.numel() * fanout
                counts = torch.empty(frontier.numel(), dtype=torch.int64)
                neighbors, src, dst, new = (torch.empty(room, dtype=torch.int64) for _ in range(4))
                num_new = torch.zeros(1, dtype=torch.int64)
                edges = kernels.sample_hop(
                    p(self.indptr),
                    p(self.indices),
                    self.num_nodes,
                    self.indices.numel(),
                    p(frontier),
                    frontier.numel(),
                    fanout,
                    int(self.replace),
                    ctypes.c_uint64(self.rng_seed(batch, hop)),
                    p(position),
                    total,
                    p(counts),
                    p(neighbors),
                    p(src),
                    p(dst),
                    p(new),
                    p(num_new),
                )
                if edges == BAD_CSR:
                    raise ValueError(BAD_CSR_MESSAGE)
                new = new[: int(num_new)]
                n_ids.append(new)
                sources.append(src[:edges])
                targets.append(dst[:edges])
                num_nodes.append(new.numel())
                num_edges.append(edges)
                total += new.numel()
                frontier = new
            n_id = torch.cat(n_ids)
        finally:
            for ids in n_ids:
                kernels.reset_positions(p(position), p(ids), ids.numel())
        edge_index = torch.stack([torch.cat(sources), torch.cat(targets)])
        return SampledSubgraph(n_id, edge_index, num_nodes, num_edges, seeds.numel())

    def _sample_with_torch(self, seeds: torch.Tensor, batch: int) -> SampledSubgraph:
        position = self.position
        n_ids, sources, targets = [seeds], [], []
        position[seeds] = torch.arange(seeds.numel(), device=self.device)
        total, frontier = seeds.numel(), seeds
        num_nodes, num_edges = [seeds.numel()], []
        try:
            for hop, fanout in enumerate(self.fanouts):
                counts, neighbors = sample_neighbors(
                    self.indptr, self.indices, frontier, fanout, self.replace, self.rng_seed(batch, hop)
                )
                targets.append(torch.repeat_interleave(position[frontier], counts))
                new = torch.unique(neighbors[position[neighbors] < 0])
                position[new] = torch.arange(total, total + new.numel(), device=self.device)
                total += new.numel()
                sources.append(position[neighbors])
                n_ids.append(new)
                num_nodes.append(new.numel())
                num_edges.append(neighbors.numel())
                frontier = new
            n_id = torch.cat(n_ids)
        finally:
            for ids in n_ids:
                position[ids] = -1
        edge_index = torch.stack([torch.cat(sources), torch.cat(targets)])
        return SampledSubgraph(n_id, edge_index, num_nodes, num_edges, seeds.numel())
