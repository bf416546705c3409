"""Seeded synthetic graphs with a dataset's statistics and a learnable signal.

* Degrees follow a power law (Chung-Lu): the node of rank r gets weight ~ (r + 1)^(-1/(gamma-1)),
  and every edge end is drawn in proportion to the weights, so a few hubs hold many edges. The
  weights are the masses of a continuous power law over [r, r + 1), so a rank is drawn in O(1)
  by inverting its distribution function (no search over n weights), and the CSR is built
  directly: each node's number of neighbours is one multinomial draw over the weights, and its
  neighbours are drawn independently (no sort of the edge list).
* Node ids are randomly permuted, as in the real datasets (hubs are scattered over the id range
  and so over the feature table).
* Labels are uniform over the classes; a share ``homophily`` of each node's neighbours is drawn
  from its own class (by the same power law over the class's nodes in rank order), and features
  are a class centroid plus noise, so both a node's own features and its neighbourhood predict
  its label: accuracy means something.
* Edges and feature rows are drawn in chunks on all cores, each chunk from its own random stream.
* The train / validation / test split has the published dataset's proportions (GraphSpec).
* The CSR lists, for every node, the neighbours a sampler may pick (its in-neighbours).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

import numpy as np

from workloads.graphs.spec import GraphSpec

ALGORITHM = 2  # bumped whenever the same parameters would give a different graph
CHUNK = 1 << 24  # edges drawn per step, to bound temporary memory
RANK_OFFSET = 1.0  # weights (r + 1)^-a rather than r^-a: keeps the first hub finite


@dataclass(frozen=True)
class GeneratorParams:
    spec: GraphSpec
    seed: int = 0
    gamma: float = 2.5  # power-law exponent of the degree distribution
    homophily: float = 0.6  # share of neighbours drawn from the node's own class
    signal: float = 1.0  # distance of class centroids, in units of the feature noise

    def __post_init__(self):
        if not self.spec.homogeneous:  # the arrays below have no node or edge types
            raise ValueError(f"{self.spec.name}: this generator makes homogeneous graphs only, not heterographs")
        check_gamma(self.gamma)
        if not 0 <= self.homophily <= 1:
            raise ValueError(f"homophily must be in [0, 1], got {self.homophily}")

    @property
    def label(self) -> str:
        return f"{self.spec.name}-like"

    def as_dict(self) -> dict:
        return {
            "algorithm": ALGORITHM,
            "spec": self.spec.as_dict(),
            "seed": self.seed,
            "gamma": self.gamma,
            "homophily": self.homophily,
            "signal": self.signal,
        }


def check_gamma(gamma: float) -> None:
    if not gamma > 2:
        raise ValueError(f"gamma must be > 2 (a finite mean degree), got {gamma}")


class PowerLawRanks:
    """Ranks 0..n-1 with P(rank = r) proportional to the mass of x^-a over [r + c, r + 1 + c)."""

    def __init__(self, n: int, gamma: float):
        self.n, self.e = n, 1.0 - 1.0 / (gamma - 1.0)  # e = 1 - a: the exponent of the integral
        self.low = RANK_OFFSET**self.e

    def _cdf_at(self, x: np.ndarray) -> np.ndarray:
        return (x + RANK_OFFSET) ** self.e - self.low

    def masses(self) -> np.ndarray:
        edges = self._cdf_at(np.arange(self.n + 1, dtype=np.float64))
        return np.diff(edges) / edges[-1]

    def draw(self, sizes: np.ndarray | int, rng: np.random.Generator, count: int) -> np.ndarray:
        """``count`` ranks, each under a population of ``sizes`` (one per draw, or one for all)."""
        sizes = np.asarray(sizes, dtype=np.float64)
        top = (sizes + RANK_OFFSET) ** self.e - self.low
        x = (self.low + rng.random(count) * top) ** (1.0 / self.e) - RANK_OFFSET
        return np.minimum(x.astype(np.int64), sizes.astype(np.int64) - 1)


def generate(
    params: GeneratorParams, progress=lambda items, desc, total: items, features: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """The graph's arrays: indptr, indices (CSR of neighbours), features, labels, split ids.

    Edges and feature rows are drawn in fixed-size chunks, each from its own random stream
    (spawned from the seed), on all cores: the graph depends on the parameters only, not on the
    number of threads. ``features``: a float32 (nodes, feature_dim) array to draw the feature
    rows into, in place (memory the caller placed, e.g. shared memory a GPU reads zero-copy), so
    the table never exists twice; its rows are the same as in a table the generator allocates.
    """
    spec = params.spec
    features = _feature_table(spec, features)
    n, m = spec.nodes, spec.edges
    main_stream, edge_streams, feature_streams = np.random.SeedSequence(params.seed).spawn(3)
    rng = np.random.default_rng(main_stream)
    ranks = PowerLawRanks(n, params.gamma)
    node_of_rank = rng.permutation(n)  # random ids: hubs anywhere in the id range
    labels = rng.integers(0, spec.classes, n, dtype=np.int64)
    # Every class's nodes in rank order, for same-class neighbours.
    by_class = node_of_rank[np.argsort(labels[node_of_rank], kind="stable")]
    class_start = np.searchsorted(labels[by_class], np.arange(spec.classes + 1))
    class_size = np.diff(class_start)

    degrees = np.empty(n, dtype=np.int64)
    degrees[node_of_rank] = rng.multinomial(m, ranks.masses())
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(degrees, out=indptr[1:])
    row_labels = np.repeat(labels.astype(np.int16), degrees)  # the class of each edge's node
    indices = np.empty(m, dtype=np.int64)

    def draw_edges(start: int, stream: np.random.SeedSequence) -> None:
        chunk_rng, count = np.random.default_rng(stream), min(CHUNK, m - start)
        cols = node_of_rank[ranks.draw(n, chunk_rng, count)]
        same = np.flatnonzero(chunk_rng.random(count) < params.homophily)
        cls = row_labels[start + same]
        cols[same] = by_class[class_start[cls] + ranks.draw(class_size[cls], chunk_rng, same.size)]
        indices[start : start + count] = cols

    starts = range(0, m, CHUNK)
    _in_parallel(draw_edges, starts, edge_streams, progress, f"edges of {spec.name}-like")
    row_labels = None  # frees its memory before the features are drawn

    centroids = rng.standard_normal((spec.classes, spec.feature_dim)).astype(np.float32)
    centroids *= params.signal / np.sqrt(spec.feature_dim) * 4.0
    rows_per_chunk = max(1, CHUNK // spec.feature_dim)

    def draw_features(start: int, stream: np.random.SeedSequence) -> None:
        stop = min(start + rows_per_chunk, n)
        np.random.default_rng(stream).standard_normal(
            (stop - start, spec.feature_dim), dtype=np.float32, out=features[start:stop]
        )
        features[start:stop] += centroids[labels[start:stop]]

    _in_parallel(draw_features, range(0, n, rows_per_chunk), feature_streams, progress, f"features of {spec.name}-like")

    perm = rng.permutation(n)
    n_train, n_val = int(n * spec.train_fraction), int(n * spec.val_fraction)
    return {
        "indptr": indptr,
        "indices": indices,
        "features": features,
        "labels": labels,
        "train_idx": np.sort(perm[:n_train]),
        "val_idx": np.sort(perm[n_train : n_train + n_val]),
        "test_idx": np.sort(perm[n_train + n_val :]),
    }


def _feature_table(spec: GraphSpec, given: np.ndarray | None) -> np.ndarray:
    """The array the feature rows are drawn into: ``given``, checked, or a new one."""
    shape = (spec.nodes, spec.feature_dim)
    if given is None:
        return np.empty(shape, dtype=np.float32)
    if given.dtype != np.float32 or given.shape != shape or not given.flags.c_contiguous or not given.flags.writeable:
        raise ValueError(
            f"{spec.name}-like: the feature table to draw into must be a writable C-contiguous float32 array of "
            f"shape {shape}, not {given.dtype} {given.shape}"
        )
    return given


def _in_parallel(work, starts: range, streams: np.random.SeedSequence, progress, desc: str) -> None:
    """``work(start, stream)`` for every chunk, chunk k with the k-th child stream of ``streams``.
    numpy releases the GIL in its random draws and array operations, so threads use all cores."""
    children = streams.spawn(len(starts))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = [pool.submit(work, start, child) for start, child in zip(starts, children)]
        for future in progress(as_completed(futures), desc=desc, total=len(futures)):
            future.result()
