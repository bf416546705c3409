"""Heterographs shaped like the eight datasets Hector was evaluated on (REFERENCE §2), generated.

The published statistics are the totals: nodes, edges, node types and relations. What a
relational GNN's cost depends on beyond them is generated with stated assumptions:

* **Node types** hold long-tailed shares of the nodes (Zipf, exponent 1); where the real sizes
  are known (ogbn-mag, biokg) they are used.
* **Relations** hold long-tailed shares of the edges (Zipf, exponent ``RELATION_SKEW``): a few
  relations carry most edges, many carry a handful, as in knowledge graphs; ogbn-mag's four are
  its real counts. Each relation joins a source and a target node type, drawn in proportion to
  the types' sizes (seeded), the biggest relations from the biggest source types, except where
  the real schema is known (ogbn-mag).
* **Degrees** follow a power law on both ends (workloads.graphs.generate.PowerLawRanks), with one
  random order of each type's nodes shared by all relations: a hub is a hub in every relation.
* **Unique (source, relation) pairs.** Hector's compact materialization computes a per-edge value
  that depends only on (source, relation) once per pair, so its gain is edges / pairs. Each
  relation gets ``unique_pair_ratio`` x its edges distinct sources (capped by the source type's
  size), each at least one edge and the rest by a power law: #pairs / #edges is that ratio
  wherever the cap does not bind. ogbn-mag's 0.16 is estimated from its schema (every author
  writes, every paper has topics and ~600 K papers cite); the others' values are assumptions,
  recorded with the graph and overridable per run.

Multi-edges (the same source, target and relation twice) are not removed: they are rare at these
densities, and removing them would change the counts. Features are seeded Gaussian rows; labels
are uniform classes (relational layers are timed on the full graph, so no split is used).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.errors import UserError
from workloads.graphs.generate import PowerLawRanks, check_gamma
from workloads.graphs.spec import GraphSpec, NodeType, Relation, apportion

ALGORITHM = 2  # bumped whenever the same parameters would give a different graph
RELATION_SKEW = 1.2  # Zipf exponent of the edges' shares over relations
FEATURE_DIM = 64  # Hector's protocol: 64 in, 64 out


@dataclass(frozen=True)
class Published:
    """A dataset's published totals and what is known of its schema."""

    nodes: int
    edges: int
    node_types: int | tuple[tuple[str, int], ...]  # a count, or the real (name, size) list
    relations: int | tuple[tuple[str, str, str, int], ...]  # a count, or real (name, source, target, edges)
    classes: int
    unique_pair_ratio: float  # #unique(source, relation) / #edges (see the module)


MAG_TYPES = (("paper", 736_389), ("author", 1_134_649), ("institution", 8_740), ("field_of_study", 59_965))
MAG_RELATIONS = (
    ("affiliated_with", "author", "institution", 1_043_998),
    ("writes", "author", "paper", 7_145_660),
    ("cites", "paper", "paper", 5_416_271),
    ("has_topic", "paper", "field_of_study", 7_505_078),
)
BIOKG_TYPES = (("disease", 10_687), ("drug", 10_533), ("function", 45_085), ("protein", 17_499), ("sideeffect", 9_969))

PUBLISHED = {
    "aifb": Published(7_262, 48_810, 7, 104, 4, 0.5),
    "mutag": Published(27_163, 148_100, 5, 50, 2, 0.5),
    "bgs": Published(94_806, 672_884, 27, 122, 2, 0.5),
    "am": Published(881_680, 5_668_682, 7, 108, 11, 0.5),
    "mag": Published(1_939_743, 21_111_007, MAG_TYPES, MAG_RELATIONS, 349, 0.16),
    "wikikg2": Published(2_500_604, 16_109_182, 1, 535, 1, 0.4),
    "fb15k": Published(14_541, 620_232, 1, 474, 1, 0.4),
    "biokg": Published(93_773, 4_762_678, BIOKG_TYPES, 51, 1, 0.4),
}


def zipf_shares(total: int, count: int, exponent: float) -> list[int]:
    """``total`` split over ``count`` parts with shares ~ (rank + 1)^-exponent, each part at
    least 1 where ``total`` allows, summing exactly to ``total``."""
    if count < 1:
        raise ValueError(f"at least one part needed, got {count}")
    floor = 1 if total >= count else 0
    weights = [(rank + 1) ** -exponent for rank in range(count)]
    scale = 1_000_000
    rest = apportion([round(w * scale) for w in weights], total - floor * count)
    return [floor + r for r in rest]


def dataset_spec(name: str, seed: int = 0, published: Published | None = None) -> GraphSpec:
    """The heterograph shape of dataset ``name`` (one of :data:`PUBLISHED`), at full size; or,
    given ``published``, a graph of those totals named ``name`` (a shape of the user's own)."""
    if published is None and name not in PUBLISHED:
        raise UserError(f"unknown relational dataset {name!r}; one of {', '.join(PUBLISHED)}")
    p = published or PUBLISHED[name]
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5EC]))
    if isinstance(p.node_types, int):
        sizes = zipf_shares(p.nodes, p.node_types, 1.0)
        types = tuple(NodeType(f"type{i}", c) for i, c in enumerate(sizes))
    else:
        types = tuple(NodeType(n, c) for n, c in p.node_types)
    if isinstance(p.relations, int):
        counts = zipf_shares(p.edges, p.relations, RELATION_SKEW)
        share = np.array([t.count for t in types], dtype=np.float64)
        share /= share.sum()
        ends = rng.choice(len(types), size=(p.relations, 2), p=share)
        # The biggest relations start at the biggest types (ties in random order), so that a
        # relation's distinct sources are not capped by a small type more than they must be.
        shuffled = rng.permutation(p.relations)
        by_source = shuffled[np.argsort(-share[ends[shuffled, 0]], kind="stable")]
        count_of = dict(zip(by_source.tolist(), counts))
        relations = tuple(
            Relation(f"rel{i}", types[ends[i, 0]].name, types[ends[i, 1]].name, count_of[i]) for i in range(p.relations)
        )
    else:
        relations = tuple(Relation(*r) for r in p.relations)
    return GraphSpec(name, p.nodes, p.edges, FEATURE_DIM, p.classes, 0.0, 0.0, node_types=types, relations=relations)


@dataclass(frozen=True)
class HeteroParams:
    """What a generated heterograph depends on: its shape, the pair ratio, the seed, the degree law."""

    spec: GraphSpec
    unique_pair_ratio: float
    seed: int = 0
    gamma: float = 2.5  # power-law exponent of the degrees

    def __post_init__(self):
        if self.spec.homogeneous:
            raise ValueError(f"{self.spec.name}: a relational graph needs node types and relations")
        if not 0 < self.unique_pair_ratio <= 1:
            raise ValueError(f"unique_pair_ratio must be in (0, 1], got {self.unique_pair_ratio}")
        check_gamma(self.gamma)

    @property
    def label(self) -> str:
        return f"{self.spec.name}-like"

    def as_dict(self) -> dict:
        return {
            "algorithm": ALGORITHM,
            "generator": "relational",
            "spec": self.spec.as_dict(),
            "seed": self.seed,
            "gamma": self.gamma,
            "unique_pair_ratio": self.unique_pair_ratio,
        }


def generate(params: HeteroParams, progress=lambda items, desc, total: items) -> dict[str, np.ndarray]:
    """The heterograph's arrays, in the store's layout (workloads/graphs/store.py): a CSR by target
    node (``indptr``, ``indices`` = sources), ``edge_type`` per stored edge, ``node_type`` per
    node, features, labels and (empty) split ids. Each relation draws from its own random stream."""
    spec = params.spec
    main, per_relation = np.random.SeedSequence(params.seed).spawn(2)
    rng = np.random.default_rng(main)
    node_type = np.repeat(np.arange(len(spec.node_types)), spec.node_type_counts)
    first = np.concatenate([[0], np.cumsum(spec.node_type_counts)])
    # One random order per type, shared by all relations: rank 0 is the type's biggest hub.
    node_of_rank = [first[t] + rng.permutation(c) for t, c in enumerate(spec.node_type_counts)]
    type_index = {t.name: i for i, t in enumerate(spec.node_types)}
    sources, targets, kinds = [], [], []
    streams = per_relation.spawn(len(spec.relations))
    for r, (relation, stream) in progress(
        enumerate(zip(spec.relations, streams)), desc=f"relations of {spec.name}-like", total=len(streams)
    ):
        if relation.count == 0:
            continue
        relation_rng = np.random.default_rng(stream)
        src_type, dst_type = type_index[relation.source], type_index[relation.target]
        src, dst = _relation_edges(
            relation.count,
            node_of_rank[src_type],
            node_of_rank[dst_type],
            params.unique_pair_ratio,
            params.gamma,
            relation_rng,
        )
        sources.append(src)
        targets.append(dst)
        kinds.append(np.full(relation.count, r, dtype=np.int32))
    src, dst, kind = (np.concatenate(a) for a in (sources, targets, kinds))
    order = np.argsort(dst, kind="stable")  # the CSR lists each target's sources
    indptr = np.zeros(spec.nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=spec.nodes), out=indptr[1:])
    features = rng.standard_normal((spec.nodes, spec.feature_dim), dtype=np.float32)
    empty = np.zeros(0, dtype=np.int64)
    return {
        "indptr": indptr,
        "indices": src[order].astype(np.int64),
        "edge_type": kind[order],
        "node_type": node_type,
        "features": features,
        "labels": rng.integers(0, spec.classes, spec.nodes, dtype=np.int64),
        "train_idx": empty,
        "val_idx": empty,
        "test_idx": empty,
    }


def _relation_edges(count, source_nodes, target_nodes, ratio, gamma, rng) -> tuple[np.ndarray, np.ndarray]:
    """``count`` edges of one relation: round(ratio x count) distinct sources (at most all of the
    type), each with at least one edge and the rest by a power law; targets by a power law."""
    pairs = int(min(max(1, round(ratio * count)), count, len(source_nodes)))
    # In rank order: the power law's extra edges go to the lowest ranks, the type's hubs in every
    # relation (in draw order the heaviest source was whichever rank came first).
    chosen = np.sort(_distinct_power_law(len(source_nodes), pairs, gamma, rng))
    extra = rng.multinomial(count - pairs, PowerLawRanks(pairs, gamma).masses()) if count > pairs else 0
    src = np.repeat(source_nodes[chosen], 1 + np.asarray(extra, dtype=np.int64))
    src = src[rng.permutation(count)]  # no order by source within the relation
    dst = target_nodes[PowerLawRanks(len(target_nodes), gamma).draw(len(target_nodes), rng, count)]
    return src, dst


def _distinct_power_law(n: int, k: int, gamma: float, rng) -> np.ndarray:
    """``k`` distinct ranks of ``n``, hubs (low ranks) more likely: power-law draws, first
    occurrences kept, until ``k`` are found. Where ``k`` is a large share of ``n``, the draws
    would mostly repeat hubs: then the ``k`` are drawn uniformly without replacement instead."""
    if 4 * k > n:
        return rng.choice(n, size=k, replace=False)
    ranks = PowerLawRanks(n, gamma)
    found = np.zeros(0, dtype=np.int64)
    while found.size < k:
        draws = np.concatenate([found, ranks.draw(n, rng, 2 * (k - found.size) + 16)])
        _, first = np.unique(draws, return_index=True)
        found = draws[np.sort(first)]
    return found[:k]
