"""A relational graph as the layers take it: edge lists, relation ids, and what every form
precomputes once from them (outside any timed loop)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from harness.errors import UserError


@dataclass(frozen=True)
class RelGraph:
    """Edges ``src -> dst`` of relation ``etype`` (int64 tensors on one device), over
    ``num_nodes`` nodes and ``num_relations`` relations. Construct with :meth:`build`."""

    num_nodes: int
    num_relations: int
    src: torch.Tensor
    dst: torch.Tensor
    etype: torch.Tensor
    # Mean aggregation per (target, relation): 1 / the number of the target's edges of that relation.
    norm: torch.Tensor
    # The edges ordered by relation (stable), and each relation's segment [offsets[r], offsets[r + 1]).
    by_relation: torch.Tensor
    offsets: torch.Tensor

    @classmethod
    def build(cls, src, dst, etype, num_nodes: int, num_relations: int, device="cpu") -> RelGraph:
        """Checks the ids (every node id below ``num_nodes``, every relation id below
        ``num_relations``: a clear error names the first offender) and precomputes the rest."""
        src, dst, etype = (torch.as_tensor(np.asarray(a), dtype=torch.int64) for a in (src, dst, etype))
        if not src.shape == dst.shape == etype.shape or src.dim() != 1:
            raise UserError(
                f"src, dst and etype must be 1-d and of one length, got {tuple(src.shape)}, "
                f"{tuple(dst.shape)} and {tuple(etype.shape)}"
            )
        for name, ids, bound in (("src", src, num_nodes), ("dst", dst, num_nodes), ("etype", etype, num_relations)):
            bad = torch.nonzero((ids < 0) | (ids >= bound))
            if bad.numel():
                i = int(bad[0])
                kind = "relation" if name == "etype" else "node"
                raise UserError(
                    f"{name}[{i}] = {int(ids[i])} is not a {kind} id of this graph (0 to {bound - 1}; "
                    f"{bad.numel()} such ids)"
                )
        counts = torch.zeros(num_nodes * num_relations, dtype=torch.float32)
        counts.index_add_(0, dst * num_relations + etype, torch.ones(len(dst)))
        norm = 1.0 / counts[dst * num_relations + etype] if len(dst) else torch.zeros(0)
        by_relation = torch.sort(etype, stable=True).indices
        offsets = torch.zeros(num_relations + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(torch.bincount(etype, minlength=num_relations), 0)
        move = lambda t: t.to(device)  # noqa: E731
        return cls(
            num_nodes,
            num_relations,
            *map(move, (src, dst, etype, norm, by_relation, offsets)),
        )

    @classmethod
    def from_store(cls, arrays: dict, num_relations: int, device="cpu") -> RelGraph:
        """From a graph in the store's layout (a CSR by target: each target's sources)."""
        indptr = np.asarray(arrays["indptr"])
        dst = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
        return cls.build(arrays["indices"], dst, arrays["edge_type"], len(indptr) - 1, num_relations, device)

    @property
    def edges(self) -> int:
        return len(self.src)

    def unique_source_relation_pairs(self) -> int:
        """Distinct (source, relation) pairs: what a compact form materializes instead of edges."""
        return int(torch.unique(self.src * self.num_relations + self.etype).numel())
