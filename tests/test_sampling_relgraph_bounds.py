"""The sampling ops, the CPU kernel, the multi-hop sampler and RelGraph.build at their edges: each
test holds a result to an independent reference (a pure-Python sampler written
from the ops' docstring, a pure-Python relabelling, hand-counted graph tables) or pins a refusal
that a plausible slip in a check would drop."""

import numpy as np
import pytest
import torch

from harness.errors import UserError
from systems.relgraph.graph import RelGraph
from systems.sampling.ops import reference, sample_into_slots, sample_neighbors
from systems.sampling.sampler import NeighborSampler

MASK = 2**64 - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser, in Python integers."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def _draw(rng_seed: int, node: int, counter: int) -> int:
    return _mix64((_mix64(rng_seed ^ _mix64(node)) + counter) & MASK)


def _python_sample(indptr: list, indices: list, node: int, fanout: int, replace: bool, rng_seed: int) -> list:
    """One seed's neighbours as the ops' docstring specifies them, one draw at a time."""
    row = indices[indptr[node] : indptr[node + 1]]
    degree = len(row)
    if replace:
        return [row[_draw(rng_seed, node, s) % degree] for s in range(fanout)] if degree else []
    if degree <= fanout:
        return list(row)  # every neighbour, in CSR order
    chosen = []
    for j in range(degree - fanout, degree):  # Floyd's algorithm
        t = _draw(rng_seed, node, j) % (j + 1)
        chosen.append(j if t in chosen else t)
    return [row[c] for c in chosen]


def _csr_of_every_degree_class(seed: int, nodes: int, fanout: int):
    """A CSR whose degrees are 0, fanout - 1, fanout, fanout + 1 and well above: the boundaries of
    the kept-in-order and Floyd cases, and isolated nodes; neighbour ids repeat."""
    rng = np.random.default_rng(seed)
    classes = np.array([0, max(fanout - 1, 0), fanout, fanout + 1, 2 * fanout + 3])
    degree = rng.choice(classes, size=nodes)
    degree[:5] = classes  # every class at least once
    rng.shuffle(degree)
    indptr = np.concatenate([[0], np.cumsum(degree)]).astype(np.int64)
    indices = rng.integers(0, nodes, size=int(indptr[-1]), dtype=np.int64)
    return torch.from_numpy(indptr), torch.from_numpy(indices)


def _as_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """``t``'s values as a strided view, a view at an offset, or ``t`` itself."""
    if layout == "strided":
        return torch.stack([t, t.new_full(t.shape, -9)], 1)[:, 0]
    if layout == "offset":
        return torch.cat([t.new_full((3,), -9), t])[3:]
    return t


def test_the_hash_is_splitmix64():
    """The draws' hash is splitmix64: its first output from state 0 is a published constant."""
    assert _mix64(0) == 0xE220A8397B1DCDAF


@pytest.mark.parametrize("layout", ["contiguous", "strided", "offset"])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanout", [1, 3, 8, 64])
def test_kernel_and_reference_draw_what_a_pure_python_sampler_draws_on_every_degree_class(fanout, replace, layout):
    """Degrees of exactly the fan-out keep every neighbour in CSR order (not a Floyd permutation of
    them), isolated nodes get no draws with replacement, and the CSR and seeds may be views."""
    indptr, indices = _csr_of_every_degree_class(seed=fanout, nodes=90, fanout=fanout)
    seeds = torch.randperm(90, generator=torch.Generator().manual_seed(fanout + 1))[:70]
    rng_seed = 2**62 + 12345
    lists = indptr.tolist(), indices.tolist()
    expected = [_python_sample(*lists, s, fanout, replace, rng_seed) for s in seeds.tolist()]
    want_counts = [len(e) for e in expected]
    want = [v for e in expected for v in e]
    counts, neighbors = sample_neighbors(
        _as_layout(indptr, layout), _as_layout(indices, layout), _as_layout(seeds, layout), fanout, replace, rng_seed
    )
    assert counts.tolist() == want_counts and neighbors.tolist() == want
    ref_counts, ref_neighbors = reference(indptr.numpy(), indices.numpy(), seeds.numpy(), fanout, replace, rng_seed)
    assert ref_counts.tolist() == want_counts and ref_neighbors.tolist() == want
    slot_counts, slots = sample_into_slots(
        _as_layout(indptr, layout),
        _as_layout(indices, layout),
        _as_layout(seeds, layout),
        60,
        fanout,
        replace,
        rng_seed,
    )
    assert slot_counts.tolist() == want_counts[:60] + [0] * 10
    rows = slots.view(70, fanout).tolist()
    for i in range(70):
        drawn = expected[i] if i < 60 else []
        assert rows[i] == drawn + [-1] * (fanout - len(drawn))


def _six_nodes():
    """Nodes 0-4: neighbours i + 1 and i + 2 (mod 6); node 5: none."""
    return torch.tensor([0, 2, 4, 6, 8, 10, 10]), torch.tensor([1, 2, 2, 3, 3, 4, 4, 5, 5, 0])


@pytest.mark.parametrize("replace", [False, True])
def test_a_csr_pointing_just_past_the_graph_is_refused_by_the_ops(replace):
    """Off-by-one corruption: a neighbour id equal to the node count, a last row ending one entry
    past the indices, a row ending before it starts; each refused, never sampled from."""
    indptr, indices = _six_nodes()
    one_past = indices.clone()
    one_past[3] = 6  # node 1's neighbours are 2 and 6, and there is no node 6
    long_last = indptr.clone()
    long_last[-1] = 11  # node 5's row is [10, 11): one past the indices
    # The indices end where a larger buffer goes on with a valid node id: a read one past them
    # would return node 0, not garbage that the neighbour check might refuse by chance.
    indices_in_buffer = torch.cat([indices, torch.tensor([0, 0])])[:10]
    cases = [
        (indptr, one_past, torch.tensor([1])),
        (long_last, indices_in_buffer, torch.tensor([5])),
        (long_last, indices_in_buffer, torch.tensor([0, 5])),
    ]
    for end in (3, 2):  # node 2's row is [4, 3) or [4, 2): it ends before it starts
        backwards = torch.tensor([0, 2, 4, end, 8, 10, 10])
        cases += [(backwards, indices, torch.tensor([2])), (backwards, indices, torch.tensor([0, 2]))]
    for ip, ix, seeds in cases:
        with pytest.raises(ValueError, match="the CSR is inconsistent"):
            sample_neighbors(ip, ix, seeds, 2, replace, 3)
        with pytest.raises(ValueError, match="the CSR is inconsistent"):
            sample_into_slots(ip, ix, seeds, seeds.numel(), 2, replace, 3)


def test_seeds_outside_the_graph_are_named_as_out_of_range_by_both_ops():
    """A negative seed and the seed one past the last node are IndexErrors naming the seed (not
    a corrupt-CSR error from the kernel)."""
    indptr, indices = _six_nodes()
    for seeds, bad in ((torch.tensor([2, -1]), -1), (torch.tensor([3, 6]), 6), (torch.tensor([-4]), -4)):
        words = f"^seed node {bad} is out of range for a graph of 6 nodes$"
        with pytest.raises(IndexError, match=words):
            sample_neighbors(indptr, indices, seeds, 2, False, 3)
        with pytest.raises(IndexError, match=words):
            sample_into_slots(indptr, indices, seeds, seeds.numel(), 2, True, 3)


def test_ops_refuse_ids_that_are_not_one_dimensional_int64():
    """A 2-D or 0-D tensor of ids is refused by name, not read as its flattened values."""
    indptr, indices = _six_nodes()
    cases = {
        "seeds": (indptr, indices, torch.tensor([[0, 1], [2, 3]])),
        "indptr": (indptr.view(1, 7), indices, torch.tensor([0, 1])),
        "indices": (indptr, indices.view(2, 5), torch.tensor([0, 1])),
    }
    for name, (ip, ix, seeds) in cases.items():
        with pytest.raises(ValueError, match=f"^{name} must be a 1-D int64 tensor"):
            sample_neighbors(ip, ix, seeds, 2, False, 3)
        with pytest.raises(ValueError, match=f"^{name} must be a 1-D int64 tensor"):
            sample_into_slots(ip, ix, seeds, 2, 2, False, 3)
    with pytest.raises(ValueError, match="^seeds must be a 1-D int64 tensor, got torch.int64 of shape \\(\\)$"):
        sample_neighbors(indptr, indices, torch.tensor(3), 2, False, 3)
    with pytest.raises(ValueError, match="^seeds must be a 1-D int64 tensor, got torch.int32"):
        sample_neighbors(indptr, indices, torch.tensor([0, 1], dtype=torch.int32), 2, False, 3)


def test_num_valid_as_a_tensor_must_be_one_int64():
    """num_valid as int32 (which the GPU kernel would read as int64) or float is refused, as is one
    of several elements; one int64 element works."""
    indptr, indices = _six_nodes()
    seeds = torch.tensor([0, 4, 2])
    for bad in (torch.tensor([2], dtype=torch.int32), torch.tensor([2.0]), torch.tensor([2, 1])):
        with pytest.raises(ValueError, match="^num_valid must be one int64 on the seeds' device$"):
            sample_into_slots(indptr, indices, seeds, bad, 2, False, 3)
    counts, slots = sample_into_slots(indptr, indices, seeds, torch.tensor([2]), 2, False, 3)
    assert counts.tolist() == [2, 2, 0] and slots.tolist() == [1, 2, 5, 0, -1, -1]


def _python_subgraph(indptr, indices, seeds, fanouts, replace, seed_of_hop):
    """NeighborSampler's subgraph, built one draw at a time: the seeds, then each hop's new nodes
    in ascending id order; edges seed by seed, draw by draw, as (neighbour, node) local ids."""
    ip, ix = indptr.tolist(), indices.tolist()
    n_id = list(seeds)
    local = {v: i for i, v in enumerate(n_id)}
    frontier, src, dst, nodes, edges = list(seeds), [], [], [len(seeds)], []
    for hop, fanout in enumerate(fanouts):
        pairs = [(u, v) for v in frontier for u in _python_sample(ip, ix, v, fanout, replace, seed_of_hop(hop))]
        new = sorted({u for u, _ in pairs} - set(local))
        for u in new:
            local[u] = len(n_id)
            n_id.append(u)
        src += [local[u] for u, _ in pairs]
        dst += [local[v] for _, v in pairs]
        nodes.append(len(new))
        edges.append(len(pairs))
        frontier = new
    return n_id, [src, dst], nodes, edges


@pytest.mark.parametrize("native_kernel", [True, False])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "offset"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("replace", [False, True])
def test_sampler_subgraph_equals_a_pure_python_relabelling(replace, dtype, layout, native_kernel):
    """Two hops on a graph with isolated nodes and repeated neighbours, seeds of either index
    dtype and as views: n_id, edge_index and the per-hop counts are those of the Python sampler."""
    indptr, indices = _csr_of_every_degree_class(seed=21, nodes=80, fanout=4)
    sampler = NeighborSampler(indptr, indices, [4, 3], replace=replace, seed=17)
    seeds = torch.randperm(80, generator=torch.Generator().manual_seed(2))[:12]
    batch = 5
    n_id, edge_index, nodes, edges = _python_subgraph(
        indptr, indices, seeds.tolist(), [4, 3], replace, lambda hop: sampler.rng_seed(batch, hop)
    )
    sub = sampler.sample(_as_layout(seeds.to(dtype), layout), batch, native_kernel=native_kernel)
    assert sub.n_id.tolist() == n_id and sub.edge_index.tolist() == edge_index
    assert sub.num_sampled_nodes == nodes and sub.num_sampled_edges == edges and sub.batch_size == 12
    assert (sampler.position == -1).all()


def test_sampler_subgraph_over_a_csr_view_equals_the_python_one():
    """A CSR given as views (a strided indptr, indices at an offset) samples its values."""
    indptr, indices = _csr_of_every_degree_class(seed=4, nodes=50, fanout=3)
    sampler = NeighborSampler(_as_layout(indptr, "strided"), _as_layout(indices, "offset"), [3, 2], seed=3)
    seeds = torch.tensor([7, 0, 49, 22])
    want = _python_subgraph(indptr, indices, seeds.tolist(), [3, 2], False, lambda hop: sampler.rng_seed(1, hop))
    sub = sampler.sample(seeds, 1)
    assert (sub.n_id.tolist(), sub.edge_index.tolist(), sub.num_sampled_nodes, sub.num_sampled_edges) == want


@pytest.mark.parametrize("native_kernel", [True, False])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_hops_whose_every_draw_is_a_new_node_fill_their_buffers_to_the_bound(dtype, native_kernel):
    """A binary tree (node i's neighbours 2i + 1 and 2i + 2): from the root, fan-outs of 2 draw
    only new nodes, 2, 4, 8 and 16 of them, exactly the bounds the GPU path sizes its buffers by;
    none may be lost."""
    nodes = 63
    degree = torch.tensor([2 if 2 * i + 2 < nodes else 0 for i in range(nodes)])
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(degree, 0)])
    indices = torch.tensor([c for i in range(nodes) if 2 * i + 2 < nodes for c in (2 * i + 1, 2 * i + 2)])
    sampler = NeighborSampler(indptr, indices, [2, 2, 2, 2], seed=8)
    want = _python_subgraph(indptr, indices, [0], [2, 2, 2, 2], False, lambda hop: sampler.rng_seed(0, hop))
    assert want[2] == [1, 2, 4, 8, 16] and want[0] == list(range(31))
    sub = sampler.sample(torch.tensor([0], dtype=dtype), 0, native_kernel=native_kernel)
    assert (sub.n_id.tolist(), sub.edge_index.tolist(), sub.num_sampled_nodes, sub.num_sampled_edges) == want
    assert (sampler.position == -1).all()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_sampler_refuses_the_seed_one_past_the_last_node_in_its_own_words(dtype):
    indptr, indices = _csr_of_every_degree_class(seed=5, nodes=30, fanout=2)
    sampler = NeighborSampler(indptr, indices, [2])
    for native_kernel in (True, False):
        with pytest.raises(UserError, match="^seed node 30 is out of range for a graph of 30 nodes$"):
            sampler.sample(torch.tensor([3, 30], dtype=dtype), 0, native_kernel=native_kernel)
    assert (sampler.position == -1).all()


def test_sampler_never_wraps_a_large_seed_id_onto_a_node():
    """Ids past int32 (or int64, as uint64) are out of range, named as given, never read modulo
    2^32 as node 5 would be."""
    indptr, indices = _csr_of_every_degree_class(seed=5, nodes=30, fanout=2)
    sampler = NeighborSampler(indptr, indices, [2])
    for seeds, bad in (
        (torch.tensor([2**32 + 5]), 2**32 + 5),
        (torch.tensor([1, 2**32 + 1]), 2**32 + 1),
        (torch.tensor([4, 2**63 + 5], dtype=torch.uint64), 2**63 + 5),
    ):
        with pytest.raises(UserError, match=f"^seed node {bad} is out of range for a graph of 30 nodes$"):
            sampler.sample(seeds, 0)


# --- RelGraph.build: the graph's tables against hand-counted ones ---------------------------------


def _edges(seed: int, edges: int = 41, nodes: int = 13, relations: int = 4, types: int = 3):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(0, nodes, (edges,), generator=g),
        torch.randint(0, nodes, (edges,), generator=g),
        torch.randint(0, relations, (edges,), generator=g),
        torch.randint(0, types, (nodes,), generator=g),
    )


def _python_offsets(ids: list, count: int) -> list:
    offsets = [0]
    for value in range(count):
        offsets.append(offsets[-1] + ids.count(value))
    return offsets


@pytest.mark.parametrize("layout", ["contiguous", "strided", "offset"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_relgraph_tables_equal_hand_counted_ones(dtype, layout):
    """norm is 1 / the edges of each (target, relation); the relation and type orders are stable
    sorts; the offsets are prefix sums of the counts, for ids of either dtype and as views."""
    src, dst, etype, node_type = _edges(seed=9)
    given = [_as_layout(t.to(dtype), layout) for t in (src, dst, etype, node_type)]
    graph = RelGraph.build(*given[:3], 13, 4, node_type=given[3], num_node_types=3)
    s, d, r, nt = (t.tolist() for t in (src, dst, etype, node_type))
    pairs = list(zip(d, r))
    assert graph.src.tolist() == s and graph.dst.tolist() == d and graph.etype.tolist() == r
    assert all(t.dtype == torch.int64 for t in (graph.src, graph.dst, graph.etype, graph.node_type))
    assert graph.norm.tolist() == [float(np.float32(1.0) / np.float32(pairs.count(p))) for p in pairs]
    assert graph.norm.dtype == torch.float32
    assert graph.by_relation.tolist() == sorted(range(41), key=lambda e: r[e])
    assert graph.offsets.tolist() == _python_offsets(r, 4)
    assert graph.node_type.tolist() == nt and graph.num_node_types == 3
    assert graph.by_type.tolist() == sorted(range(13), key=lambda v: nt[v])
    assert graph.type_offsets.tolist() == _python_offsets(nt, 3)


def test_relgraph_from_a_store_csr_has_the_edges_of_its_rows():
    """From a CSR by target: node v's row lists its sources, so its edges are (indices[i], v)."""
    indptr = np.array([0, 3, 3, 4, 7, 7])
    indices = np.array([4, 0, 4, 2, 1, 1, 3])
    edge_type = np.array([1, 0, 1, 2, 0, 2, 2])
    graph = RelGraph.from_store({"indptr": indptr, "indices": indices, "edge_type": edge_type}, 3)
    assert graph.num_nodes == 5 and graph.src.tolist() == [4, 0, 4, 2, 1, 1, 3]
    assert graph.dst.tolist() == [0, 0, 0, 2, 3, 3, 3] and graph.etype.tolist() == [1, 0, 1, 2, 0, 2, 2]
    assert graph.norm.tolist() == [0.5, 1.0, 0.5, 1.0, 1.0, 0.5, 0.5]
    assert graph.offsets.tolist() == [0, 2, 4, 7]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_node_types_of_another_length_than_the_nodes_are_refused(dtype):
    """One type per node: a list one short or one long would give the type tables other nodes."""
    for types in ([0, 1, 0], [0, 1, 0, 1, 1]):
        with pytest.raises(UserError, match=r"^node_type must hold one type per node \(4\), got \("):
            RelGraph.build(
                torch.tensor([0, 1], dtype=dtype),
                [1, 2],
                [0, 0],
                4,
                1,
                node_type=torch.tensor(types, dtype=dtype),
                num_node_types=2,
            )


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_relations_of_another_length_than_the_edges_are_refused(dtype):
    """One relation per edge: a single relation id would broadcast over every edge's norm."""
    src, dst = torch.tensor([0, 1, 2], dtype=dtype), torch.tensor([1, 2, 0], dtype=dtype)
    for etype in ([0], [0, 1], [0, 1, 1, 0]):
        with pytest.raises(UserError, match="^src, dst and etype must be 1-d and of one length"):
            RelGraph.build(src, dst, torch.tensor(etype, dtype=dtype), 3, 2)
    with pytest.raises(UserError, match="^src, dst and etype must be 1-d and of one length"):
        RelGraph.build(src.view(1, 3), dst.view(1, 3), torch.tensor([[0, 1, 1]], dtype=dtype), 3, 2)
