"""Seeded synthetic graphs with a dataset's statistics and a learnable signal.

* Degrees follow a power law: each node gets a weight ~ rank^(-1/(gamma - 1)) (Chung-Lu), and
  edge endpoints are drawn in proportion to the weights, so a few hubs hold many edges.
* Node ids are randomly permuted, as in the real datasets (hubs are scattered over the id range
  and so over the feature table).
* Labels are uniform over the classes; a share ``homophily`` of each node's neighbours is drawn
  from its own class, and features are a class centroid plus noise, so both a node's own
  features and its neighbourhood predict its label: accuracy means something.
* The CSR lists, for every node, the neighbours a sampler may pick (its in-neighbours).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workloads.graphs.spec import GraphSpec

CHUNK = 1 << 24  # edges drawn per step, to bound temporary memory


@dataclass(frozen=True)
class GeneratorParams:
    spec: GraphSpec
    seed: int = 0
    gamma: float = 2.5          # power-law exponent of the degree distribution
    homophily: float = 0.6      # share of neighbours drawn from the node's own class
    signal: float = 1.0         # distance of class centroids, in units of the feature noise
    train_fraction: float = 0.6
    val_fraction: float = 0.2

    @property
    def label(self) -> str:
        return f"{self.spec.name}-like"

    def as_dict(self) -> dict:
        return {"spec": self.spec.as_dict(), "seed": self.seed, "gamma": self.gamma, "homophily": self.homophily,
                "signal": self.signal, "train_fraction": self.train_fraction, "val_fraction": self.val_fraction}


def _weights(n: int, gamma: float, rng: np.random.Generator) -> np.ndarray:
    ranks = np.arange(1, n + 1, dtype=np.float64)
    weights = ranks ** (-1.0 / (gamma - 1.0))
    return weights[rng.permutation(n)]  # random ids: hubs anywhere in the id range


def _draw(cdf: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` positions drawn with probabilities given by the cumulative weights ``cdf``."""
    return np.searchsorted(cdf, rng.random(count) * cdf[-1], side="right").clip(0, len(cdf) - 1)


def generate(params: GeneratorParams, progress=lambda items, desc, total: items) -> dict[str, np.ndarray]:
    """The graph's arrays: indptr, indices (CSR of neighbours), features, labels, split ids."""
    spec, rng = params.spec, np.random.default_rng(params.seed)
    n, m = spec.nodes, spec.edges
    labels = rng.integers(0, spec.classes, n, dtype=np.int64)
    weights = _weights(n, params.gamma, rng)
    global_cdf = np.cumsum(weights)
    # Per-class cumulative weights, for neighbours drawn from the node's own class.
    by_class = np.argsort(labels, kind="stable")
    class_start = np.searchsorted(labels[by_class], np.arange(spec.classes + 1))
    class_cdf = np.cumsum(weights[by_class])

    rows = np.empty(m, dtype=np.int64)
    cols = np.empty(m, dtype=np.int64)
    for start in progress(range(0, m, CHUNK), desc=f"edges of {spec.name}-like", total=-(-m // CHUNK)):
        count = min(CHUNK, m - start)
        row = _draw(global_cdf, count, rng)  # the node whose neighbour list gets the edge
        col = _draw(global_cdf, count, rng)
        same = rng.random(count) < params.homophily
        # Same-class neighbours: draw within the row's class, by weight.
        cls = labels[row[same]]
        lo, hi = class_start[cls], class_start[cls + 1]
        base = np.where(lo > 0, class_cdf[np.maximum(lo - 1, 0)], 0.0)
        target = base + rng.random(cls.size) * (class_cdf[hi - 1] - base)
        col[same] = by_class[np.searchsorted(class_cdf, target, side="right").clip(lo, hi - 1)]
        rows[start:start + count], cols[start:start + count] = row, col

    order = np.argsort(rows, kind="stable")
    indices = cols[order]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
    del rows, cols, order

    centroids = rng.standard_normal((spec.classes, spec.feature_dim)).astype(np.float32)
    centroids *= params.signal / np.sqrt(spec.feature_dim) * 4.0
    features = rng.standard_normal((n, spec.feature_dim), dtype=np.float32)
    features += centroids[labels]

    perm = rng.permutation(n)
    n_train, n_val = int(n * params.train_fraction), int(n * params.val_fraction)
    return {
        "indptr": indptr, "indices": indices, "features": features, "labels": labels,
        "train_idx": np.sort(perm[:n_train]), "val_idx": np.sort(perm[n_train:n_train + n_val]),
        "test_idx": np.sort(perm[n_train + n_val:]),
    }
