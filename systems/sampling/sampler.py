"""Multi-hop uniform neighbour sampling into PyG-style subgraphs (what NeighborLoader returns).

The CSR lists each node's in-neighbours: ``indices[indptr[v]:indptr[v + 1]]`` are the nodes whose
messages flow to ``v`` (for an undirected graph, both directions of each edge are listed). For a
batch of seed nodes and fan-outs ``[k1, k2, ...]``: hop 1 samples up to k1 in-neighbours of
every seed, hop 2 up to k2 neighbours of every node that hop 1 added, and so on. The result is
one subgraph: ``n_id`` (global ids; the seeds first, then each hop's new nodes),
``edge_index`` (local ids, row 0 the sampled neighbour, row 1 the node it was sampled for, so
messages flow neighbour -> node as in PyG), and per-hop node and edge counts. PyG conv layers
run on it directly; the first ``batch_size`` outputs are the seeds'.

Where it runs: ``"cpu"`` (CSR in host memory), ``"cuda"`` (CSR copied to GPU memory) or
``"uva"`` (CSR pinned in host memory, read by the GPU kernel over PCIe). All three return the
same subgraph for the same seeds, batch number and seed of the sampler. On the CPU each hop,
relabelling included, is one call of the C++ kernel (``sample_hop``). On the GPU a batch is built
in fixed-size buffers bounded by the fan-outs (:meth:`NeighborSampler.sample_in_slots`): every
hop's sizes stay in GPU memory, so the host never waits inside a batch; the one wait is at the
end, reading the per-hop sizes that give the subgraph its shape (:meth:`NeighborSampler.finish`).
That path is device-agnostic torch code, and the tests hold it on the CPU to the C++ kernel's
output and run it on fake tensors, where any read of device data would fail.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from dataclasses import dataclass

import numpy as np
import torch

from harness.arguments import integer, whole_number
from harness.errors import NeedsGpuError, UserError
from systems import native
from systems.sampling.ops import BAD_CSR, BAD_CSR_MESSAGE, MAX_FANOUT, check_arguments, cpu_kernels, sample_into_slots

PLACES = ("cpu", "cuda", "uva")


@dataclass
class SampledSubgraph:
    n_id: torch.Tensor
    edge_index: torch.Tensor
    num_sampled_nodes: list[int]
    num_sampled_edges: list[int]
    batch_size: int


@dataclass
class SlottedSubgraph:
    """A batch's subgraph in buffers whose sizes depend on the fan-outs only, with the real sizes
    in device memory: what the GPU builds without the host waiting."""

    n_id: torch.Tensor  # the seeds, then each hop's new nodes; past them, unused
    sources: torch.Tensor  # local id of each edge's sampled neighbour; past the edges, unused
    targets: torch.Tensor  # local id of the node it was sampled for
    sizes: torch.Tensor  # nodes each hop added, then edges each hop sampled (2 x hops)
    batch_size: int


def check_csr_types(indptr: torch.Tensor, indices: torch.Tensor) -> None:
    """Refuse a CSR that is not two 1-D int64 tensors, naming what it is (a copy of the user's
    CSR to int64, for a graph of billions of edges, is a choice for its owner to make)."""
    if indptr.dtype != torch.int64 or indices.dtype != torch.int64 or indptr.dim() != 1 or indices.dim() != 1:
        got = f"{indptr.dtype} {tuple(indptr.shape)} and {indices.dtype} {tuple(indices.shape)}"
        raise UserError(
            f"indptr and indices must be 1-D int64 tensors, got {got} (convert them once: .long(), or "
            "numpy's .astype(np.int64))"
        )


def _check_csr(indptr: torch.Tensor, indices: torch.Tensor) -> None:
    """Refuse a CSR the kernels would read out of bounds with (one pass, when a sampler is made)."""
    check_csr_types(indptr, indices)
    n = indptr.numel() - 1
    if n < 1:
        raise UserError(f"the graph has no nodes (indptr has {indptr.numel()} entries): give one per node, plus one")
    if int(indptr[0]) != 0 or int(indptr[-1]) != indices.numel() or bool((indptr[1:] < indptr[:-1]).any()):
        raise UserError("indptr must start at 0, never decrease and end at the number of indices")
    if indices.numel() and not 0 <= int(indices.min()) <= int(indices.max()) < n:
        raise UserError(
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
            raise UserError(f"place must be one of {PLACES}, got {place!r}")
        given, fanouts = fanouts, [integer(k) for k in fanouts] if isinstance(fanouts, list | tuple) else None
        if not fanouts or any(k is None or not 1 <= k <= MAX_FANOUT for k in fanouts):
            raise UserError(f"fanouts must be a non-empty list of integers in [1, {MAX_FANOUT}], got {given!r}")
        if integer(seed) is None:
            raise UserError(f"seed must be an integer (it picks every batch's draws), got {seed!r}")
        if not isinstance(replace, bool | np.bool_):  # checked here, not at the first batch of one path
            raise UserError(f"replace must be a bool, got {replace!r} ({type(replace).__name__})")
        self.fanouts, self.replace, self.place, self.seed = list(fanouts), bool(replace), place, integer(seed)
        for name, t in (("indptr", indptr), ("indices", indices)):
            if not isinstance(t, torch.Tensor):
                raise UserError(
                    f"{name} must be a torch tensor (torch.from_numpy for an array), got {type(t).__name__}"
                )
        self.device = torch.device("cpu" if place == "cpu" else "cuda")
        if place == "uva":
            if not (indptr.is_pinned() and indices.is_pinned()):
                if not torch.cuda.is_available():  # without a GPU nothing can be pinned: say what is missing
                    raise NeedsGpuError("place='uva' samples on a CUDA GPU, and torch sees none here: use place='cpu'")
                raise UserError("place='uva' needs the CSR in pinned host memory (UnifiedTensor or pin_memory())")
            if not (indptr.is_contiguous() and indices.is_contiguous()):
                raise UserError("place='uva' needs a contiguous CSR (a dense copy would not be pinned)")
        if place != "cpu" and not torch.cuda.is_available():
            raise NeedsGpuError(f"place={place!r} samples on a CUDA GPU, and torch sees none here: use place='cpu'")
        if place != "uva":
            # The kernels read the CSR by plain offsets: a view (indptr[::2], a column of a
            # larger array) is made dense once here rather than refused at the first batch.
            indptr, indices = indptr.to(self.device).contiguous(), indices.to(self.device).contiguous()
        self.indptr, self.indices = indptr, indices
        self.num_nodes = indptr.numel() - 1
        _check_csr(indptr, indices)
        self._per_thread = threading.local()  # each thread's id map (see position)

    @property
    def position(self) -> torch.Tensor:
        """The calling thread's id map: global id -> local id of the batch it is building (-1: not
        in it), reset after each batch. One per thread, made at its first batch, so that threads
        sharing a sampler (a prefetch thread beside the training loop) never renumber each other's
        nodes. One more entry, for the id ``num_nodes`` that marks an unused slot on the GPU path.
        A batch cut short (an error, or Ctrl-C: Python raises KeyboardInterrupt between two
        statements, so right after a hop marked its new nodes and before they were listed) clears
        the whole map: the ids listed so far may not cover every mark, and a mark left behind would
        renumber the next batches silently."""
        mine = self._per_thread
        if getattr(mine, "position", None) is None:
            mine.position = torch.full((self.num_nodes + 1,), -1, dtype=torch.int64, device=self.device)
            mine.reset = None
        elif mine.reset is not None:  # this thread's last reset may be queued on another stream
            torch.cuda.current_stream().wait_event(mine.reset)
            mine.reset = None
        return mine.position

    @position.setter
    def position(self, id_map: torch.Tensor) -> None:  # the calling thread's, replaced (tests: fake tensors)
        self._per_thread.position, self._per_thread.reset = id_map, None

    def _reset_done(self) -> None:
        """Mark where the id map's reset was queued, for a next batch on another stream."""
        if self.device.type == "cuda":
            self._per_thread.reset = torch.cuda.Event()
            self._per_thread.reset.record()

    def rng_seed(self, batch: int, hop: int) -> int:
        """The seed of one hop's draws: a hash of (the sampler's seed, batch, hop), so that no two
        of them share a stream (a packing such as ``seed * P + batch`` would repeat one past P)."""
        return stream_seed(self.seed, _draw_number(batch, "batch"), _draw_number(hop, "hop"))

    def sample(self, seeds: torch.Tensor, batch: int, *, native_kernel: bool = True) -> SampledSubgraph:
        """The subgraph of one batch; ``batch`` numbers the batch (it picks the random draws)."""
        seeds = self.checked_seeds(seeds)
        if self.device.type == "cpu" and native_kernel:
            return self._sample_native(seeds.contiguous(), batch)
        return self.finish(self.sample_in_slots(seeds, batch))

    def checked_seeds(self, seeds: torch.Tensor) -> torch.Tensor:
        """The seeds as int64 on the sampler's device, refused unless distinct node ids. Seeds on
        the host (as the pipelines pass them) are checked there and copied without blocking;
        seeds already on the GPU are checked there, which waits for it."""
        seeds = self.check_seeds(seeds)
        if seeds.device.type == self.device.type:  # "cuda:0" is the sampler's "cuda": no copy, no pinning
            return seeds.to(self.device)
        if self.device.type == "cpu":
            # Not non_blocking: a copy to the host that does not block hands back a tensor the GPU
            # has yet to fill, and the C++ kernel would read it at once.
            return seeds.to(self.device)
        return seeds.pin_memory().to(self.device, non_blocking=True)

    def check_seeds(self, seeds: torch.Tensor) -> torch.Tensor:
        """``seeds`` as int64 where they are, refused in one line unless distinct node ids of this graph."""
        if not isinstance(seeds, torch.Tensor):
            raise UserError(f"seeds must be a 1-D tensor of node ids, got {type(seeds).__name__}")
        if seeds.dim() != 1 or seeds.is_floating_point() or seeds.is_complex() or seeds.dtype == torch.bool:
            raise UserError(f"seeds must be a 1-D tensor of node ids, got {seeds.dtype} of shape {tuple(seeds.shape)}")
        if seeds.device.type not in ("cpu", "cuda"):  # a meta tensor has no ids to check
            raise UserError(f"seeds must be node ids in host or GPU memory, got a tensor on {seeds.device}")
        wraps = seeds.dtype == torch.uint64  # an id from 2^63 up turns negative as int64: named as given
        seeds = seeds.to(torch.int64)
        if seeds.numel() and not 0 <= int(seeds.min()) <= int(seeds.max()) < self.num_nodes:
            bad = int(seeds[(seeds < 0) | (seeds >= self.num_nodes)][0])
            bad += 2**64 if wraps and bad < 0 else 0
            raise UserError(f"seed node {bad} is out of range for a graph of {self.num_nodes} nodes")
        values, counts = seeds.unique(return_counts=True)
        if values.numel() != seeds.numel():
            raise UserError(f"seed nodes must be distinct: node {int(values[counts > 1][0])} is named twice")
        return seeds

    def bounds(self, batch_size: int) -> list[int]:
        """The most nodes each hop's frontier can hold: the seeds, then each hop's new nodes
        (at most every draw of the hop before, and at most the graph)."""
        frontier = [batch_size]
        for fanout in self.fanouts:
            frontier.append(min(frontier[-1] * fanout, self.num_nodes))
        return frontier

    def sample_in_slots(self, seeds: torch.Tensor, batch: int) -> SlottedSubgraph:
        """One batch's subgraph without the host waiting for the device: checked ``seeds`` on the
        sampler's device (see :meth:`checked_seeds`), every buffer sized by the fan-outs.

        A hop draws into fixed slots (seed i's neighbours at i * fanout); its new nodes are the
        drawn ids not yet in the batch, in ascending order (as the C++ kernel numbers them),
        found by sorting the slots, unused ones holding ``absent``, an id past every node that
        sorts last. Counts and offsets are prefix sums in device memory; entries past them are
        written to one spare slot at the end of each buffer, so no write needs a size read back.
        """
        dev, position, absent = self.device, self.position, self.num_nodes
        bounds = self.bounds(seeds.numel())
        node_room = min(sum(bounds), self.num_nodes)
        edge_room = sum(b * k for b, k in zip(bounds, self.fanouts))
        n_id = torch.full((node_room + 1,), absent, dtype=torch.int64, device=dev)
        sources = torch.empty(edge_room + 1, dtype=torch.int64, device=dev)
        targets = torch.empty(edge_room + 1, dtype=torch.int64, device=dev)
        n_id[: seeds.numel()] = seeds
        nodes = torch.full((1,), seeds.numel(), dtype=torch.int64, device=dev)  # in the batch so far
        edges = torch.zeros(1, dtype=torch.int64, device=dev)
        frontier, frontier_size = seeds, nodes.clone()
        added_per_hop, edges_per_hop = [], []
        try:
            position.scatter_(0, seeds, torch.arange(seeds.numel(), device=dev))
            for hop, fanout in enumerate(self.fanouts):
                # The seeds and the CSR were checked already: check=False spares the wait for the GPU.
                counts, drawn = sample_into_slots(
                    self.indptr,
                    self.indices,
                    frontier,
                    frontier_size,
                    fanout,
                    self.replace,
                    self.rng_seed(batch, hop),
                    check=False,
                )
                real = (torch.arange(fanout, device=dev) < counts[:, None]).reshape(-1)
                ordered = torch.sort(torch.where(real, drawn, absent)).values
                first = torch.ones_like(real)
                first[1:] = ordered[1:] != ordered[:-1]
                is_new = first & (ordered != absent) & (position.index_select(0, ordered) < 0)
                rank = torch.cumsum(is_new, 0) - 1  # among this hop's new nodes
                local = nodes + rank
                position.scatter_(0, torch.where(is_new, ordered, absent), torch.where(is_new, local, -1))
                n_id.scatter_(0, torch.where(is_new, local, node_room), ordered)
                next_room = bounds[hop + 1]
                next_frontier = torch.zeros(next_room + 1, dtype=torch.int64, device=dev)
                next_frontier.scatter_(0, torch.where(is_new, rank, next_room), ordered)
                # Edges in slot order (seed by seed, draw by draw), as the C++ kernel lists them.
                slot = torch.where(real, edges + torch.cumsum(real, 0) - 1, edge_room)
                sources.scatter_(0, slot, position.index_select(0, torch.where(real, drawn, absent)))
                targets.scatter_(0, slot, position.index_select(0, frontier)[:, None].expand(-1, fanout).reshape(-1))
                added, sampled = is_new.sum().reshape(1), real.sum().reshape(1)
                added_per_hop.append(added)
                edges_per_hop.append(sampled)
                nodes, edges = nodes + added, edges + sampled
                frontier, frontier_size = next_frontier[:next_room], added
        except BaseException:
            position.fill_(-1)  # the whole map: see position
            raise
        finally:
            position.index_fill_(0, n_id, -1)  # the id map is clean for the next batch, also after an error
            self._reset_done()
        sizes = torch.cat(added_per_hop + edges_per_hop)
        return SlottedSubgraph(n_id[:node_room], sources[:edge_room], targets[:edge_room], sizes, seeds.numel())

    def finish(self, slotted: SlottedSubgraph) -> SampledSubgraph:
        """The subgraph cut to its real sizes: the batch's one wait for the device, for the few
        sizes that give its tensors their shapes."""
        sizes = slotted.sizes.tolist()
        hops = len(self.fanouts)
        added, edges = sizes[:hops], sizes[hops:]
        n_id = slotted.n_id[: slotted.batch_size + sum(added)]
        edge_index = torch.stack([slotted.sources[: sum(edges)], slotted.targets[: sum(edges)]])
        return SampledSubgraph(n_id, edge_index, [slotted.batch_size, *added], edges, slotted.batch_size)

    def _sample_native(self, seeds: torch.Tensor, batch: int) -> SampledSubgraph:
        kernels, p = cpu_kernels(), native.pointer
        check_arguments(self.indptr, self.indices, seeds, max(self.fanouts), 0)
        position = self.position
        n_ids, sources, targets = [seeds], [], []
        total, frontier = seeds.numel(), seeds
        num_nodes, num_edges = [seeds.numel()], []
        try:
            position[seeds] = torch.arange(seeds.numel())
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
        except BaseException:
            position.fill_(-1)  # the whole map: see position
            raise
        finally:
            for ids in n_ids:
                kernels.reset_positions(p(position), p(ids), ids.numel())
        edge_index = torch.stack([torch.cat(sources), torch.cat(targets)])
        return SampledSubgraph(n_id, edge_index, num_nodes, num_edges, seeds.numel())


def stream_seed(*key) -> int:
    """A seed in [0, 2^63) for the random stream named by ``key`` (its parts joined by commas): a
    hash, so that no two keys share a stream, as a packing such as ``seed + epoch`` would."""
    joined = ",".join(map(str, key)).encode()
    return int.from_bytes(hashlib.blake2b(joined, digest_size=8).digest(), "little") >> 1


def _draw_number(value, name: str) -> int:
    """``value`` as a non-negative int (numpy's too), refused otherwise: its text is hashed, so 1.0
    would draw otherwise than 1, and "1" as 1."""
    if (number := whole_number(value)) is None:
        raise UserError(f"{name} must be a non-negative integer (it numbers the random draws), got {value!r}")
    return number
