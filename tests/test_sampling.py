"""Neighbour sampling: the op's semantics and distribution, the multi-hop subgraph's structure,
PyG compatibility; on a GPU, the kernel (CSR in GPU memory or pinned host memory) draws exactly
what the CPU reference draws."""

import numpy as np
import pytest
import torch

from harness.errors import NeedsGpuError, UserError
from systems.sampling.ops import (
    reference,
    sample_into_slots,
    sample_into_slots_op,
    sample_neighbors,
    sample_neighbors_op,
)
from systems.sampling.sampler import NeighborSampler
from workloads.graphs.generate import GeneratorParams, generate
from workloads.graphs.spec import DATASETS


@pytest.fixture(scope="module")
def graph():
    g = generate(GeneratorParams(DATASETS["ogbn-products"].scaled(0.003), seed=11))
    return torch.from_numpy(g["indptr"]), torch.from_numpy(g["indices"])


def neighbour_lists(indptr, indices, seeds):
    return [indices[indptr[s] : indptr[s + 1]].tolist() for s in seeds.tolist()]


@pytest.mark.parametrize("fanout", [1, 5, 25])
def test_without_replacement_draws_distinct_positions_of_real_neighbours(graph, fanout):
    indptr, indices = graph
    seeds = torch.randperm(indptr.numel() - 1, generator=torch.Generator().manual_seed(fanout))[:400]
    counts, neighbors = sample_neighbors(indptr, indices, seeds, fanout, False, 5)
    degrees = indptr[seeds + 1] - indptr[seeds]
    assert torch.equal(counts, torch.clamp(degrees, max=fanout))
    offset = 0
    for seed_neighbours, count in zip(neighbour_lists(indptr, indices, seeds), counts.tolist()):
        drawn = neighbors[offset : offset + count].tolist()
        offset += count
        # A multiset subset of the true neighbour list (duplicate edges may repeat a node).
        for node in set(drawn):
            assert drawn.count(node) <= seed_neighbours.count(node)
    assert offset == neighbors.numel()


def test_with_replacement_draws_fanout_real_neighbours(graph):
    indptr, indices = graph
    seeds = torch.arange(indptr.numel() - 1)
    counts, neighbors = sample_neighbors(indptr, indices, seeds, 7, True, 9)
    degrees = indptr[1:] - indptr[:-1]
    assert torch.equal(counts, torch.where(degrees > 0, 7, 0))
    owner = torch.repeat_interleave(seeds, counts)
    real = set(zip(torch.repeat_interleave(seeds, degrees).tolist(), indices.tolist()))
    assert all(pair in real for pair in zip(owner.tolist(), neighbors.tolist()))


@pytest.mark.parametrize("replace", [False, True])
def test_every_neighbour_is_equally_likely(replace):
    # One node with 20 distinct neighbours; over many draws each is picked k/20 of the time.
    indptr = torch.tensor([0] + [20] * 120)  # 120 nodes; node 0's neighbours are 100..119
    indices = torch.arange(100, 120)
    k, trials = 5, 4000
    hits = np.zeros(20)
    for rng_seed in range(trials):
        _, picked = sample_neighbors(indptr, indices, torch.tensor([0]), k, replace, rng_seed)
        np.add.at(hits, (picked - 100).numpy(), 1)
    expected = trials * k / 20
    chi2 = ((hits - expected) ** 2 / expected).sum()
    assert chi2 < 45.3  # the 0.999 quantile of chi-square with 19 degrees of freedom


def test_draws_depend_on_the_rng_seed_only(graph):
    indptr, indices = graph
    seeds = torch.arange(50)
    a = sample_neighbors(indptr, indices, seeds, 10, False, 1)[1]
    b = sample_neighbors(indptr, indices, seeds, 10, False, 1)[1]
    c = sample_neighbors(indptr, indices, seeds, 10, False, 2)[1]
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((torch.tensor([0]), 0, False, 1), ValueError, "fanout must be an integer between 1 and 64"),
        ((torch.tensor([0]), 65, False, 1), ValueError, "fanout must be an integer between 1 and 64"),
        ((torch.tensor([0]), 3, False, -1), ValueError, "rng_seed"),
        (
            (torch.tensor([0]), 3, False, 2**63),
            ValueError,
            r"rng_seed must be an integer in \[0, 2\^63\), got 9223372036854775808",
        ),
        ((torch.tensor([0]), 3, False, 1.0), ValueError, r"rng_seed must be an integer .* \(float\)"),
        ((torch.tensor([0]), 3, False, True), ValueError, r"rng_seed must be an integer .* \(bool\)"),
        ((torch.tensor([0]), 2**64, False, 1), ValueError, "fanout must be an integer between 1 and 64"),
        ((torch.tensor([0]), 2.0, False, 1), ValueError, r"fanout must be an integer .* \(float\)"),
        ((torch.tensor([0]), 3, "no", 1), ValueError, "replace must be a bool, got 'no'"),
        ((torch.tensor([0]), 3, 1, 1), ValueError, r"replace must be a bool, got 1 \(int\)"),
        ((torch.tensor([0]), 3, False, torch.tensor(5)), ValueError, r"rng_seed must be an integer .* \(Tensor\)"),
        ((torch.tensor([0]), torch.tensor(True), False, 1), ValueError, r"fanout must be an integer .* \(Tensor\)"),
        ((torch.tensor([10**9]), 3, False, 1), IndexError, "seed node 1000000000 is out of range"),
        ((torch.tensor([0], dtype=torch.int32), 3, False, 1), ValueError, "1-D int64"),
    ],
)
def test_bad_arguments_are_refused(graph, args, error, message):
    with pytest.raises(error, match=message):
        sample_neighbors(*graph, *args)


def test_numpy_integers_draw_what_python_integers_draw_and_slots_refuse_the_same(graph):
    seeds = torch.arange(0, 40, 3)
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            sample_neighbors(*graph, seeds, np.int32(5), np.bool_(True), np.uint64(2**63 - 1)),
            sample_neighbors(*graph, seeds, 5, True, 2**63 - 1),
        )
    )
    with pytest.raises(ValueError, match=r"rng_seed must be an integer in \[0, 2\^63\)"):
        sample_into_slots(*graph, seeds, torch.tensor([3]), 4, False, 2**63)


def test_op_passes_opcheck(graph):
    torch.library.opcheck(sample_neighbors_op, (*graph, torch.arange(30), 4, False, 3))


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanout", [1, 7, 25, 64])
def test_cpu_kernel_draws_exactly_what_the_reference_draws(graph, fanout, replace):
    indptr, indices = graph
    seeds = torch.randperm(indptr.numel() - 1, generator=torch.Generator().manual_seed(fanout))[:500]
    counts, neighbors = sample_neighbors(indptr, indices, seeds, fanout, replace, 123)
    ref_counts, ref_neighbors = reference(indptr.numpy(), indices.numpy(), seeds.numpy(), fanout, replace, 123)
    assert np.array_equal(counts.numpy(), ref_counts) and np.array_equal(neighbors.numpy(), ref_neighbors)


@pytest.mark.parametrize("replace", [False, True])
def test_native_multi_hop_sampler_equals_the_torch_one(graph, replace):
    indptr, indices = graph
    sampler = NeighborSampler(indptr, indices, [15, 10, 5], replace=replace, seed=4)
    for batch in range(3):
        seeds = torch.randperm(indptr.numel() - 1, generator=torch.Generator().manual_seed(batch))[:200]
        native, generic = sampler.sample(seeds, batch), sampler.sample(seeds, batch, native_kernel=False)
        assert torch.equal(native.n_id, generic.n_id) and torch.equal(native.edge_index, generic.edge_index)
        assert native.num_sampled_nodes == generic.num_sampled_nodes
        assert native.num_sampled_edges == generic.num_sampled_edges
        assert (sampler.position == -1).all()


def test_slots_hold_the_reference_draws_of_the_valid_seeds_only(graph):
    indptr, indices = graph
    seeds = torch.randperm(indptr.numel() - 1, generator=torch.Generator().manual_seed(3))[:37]
    counts, slots = sample_into_slots(indptr, indices, seeds, torch.tensor([29]), 9, False, 41)
    ref_counts, ref_neighbors = reference(indptr.numpy(), indices.numpy(), seeds[:29].numpy(), 9, False, 41)
    assert counts[:29].tolist() == ref_counts.tolist() and (counts[29:] == 0).all()
    slots = slots.view(37, 9)
    used = torch.arange(9) < counts[:, None]
    assert torch.equal(slots[used], torch.from_numpy(ref_neighbors))  # row by row, in draw order
    assert (slots[~used] == -1).all()
    with pytest.raises(ValueError, match="num_valid must be in"):
        sample_into_slots(indptr, indices, seeds, torch.tensor([38]), 9, False, 41)
    torch.library.opcheck(sample_into_slots_op, (indptr, indices, seeds, torch.tensor([20]), 4, True, 3))


@pytest.mark.parametrize("batch_size, fanouts", [(1, [64, 3]), (5, [40, 40, 40]), (0, [4])])
def test_slotted_sampler_equals_the_native_one_when_bounds_reach_the_graph(batch_size, fanouts):
    """A graph of 60 nodes: the fan-out bounds exceed it, so the buffers are cut to its size."""
    g = torch.Generator().manual_seed(batch_size)
    degrees = torch.randint(0, 30, (60,), generator=g)
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(degrees, 0)])
    indices = torch.randint(0, 60, (int(indptr[-1]),), generator=g)
    sampler = NeighborSampler(indptr, indices, fanouts, seed=2)
    seeds = torch.randperm(60, generator=g)[:batch_size]
    native, slotted = sampler.sample(seeds, 7), sampler.sample(seeds, 7, native_kernel=False)
    assert torch.equal(native.n_id, slotted.n_id) and torch.equal(native.edge_index, slotted.edge_index)
    assert native.num_sampled_nodes == slotted.num_sampled_nodes
    assert native.num_sampled_edges == slotted.num_sampled_edges
    assert (sampler.position == -1).all()


def test_slotted_sampler_never_reads_device_data_back(graph):
    """On fake tensors (shapes without data) any op whose result needs the data on the host (an
    item, a mask, unique, nonzero, repeat_interleave by counts) raises: the device path runs
    through with none, so on a GPU it never waits inside a batch."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        FakeTensorMode,
    )

    sampler = NeighborSampler(*graph, [15, 10, 5], seed=4)
    mode = FakeTensorMode()
    for name in ("indptr", "indices", "position"):
        setattr(sampler, name, mode.from_tensor(getattr(sampler, name)))
    seeds = mode.from_tensor(torch.randperm(graph[0].numel() - 1)[:200])
    with mode:
        slotted = sampler.sample_in_slots(seeds, batch=3)
        assert slotted.sizes.shape == (6,) and slotted.n_id.numel() >= 200
        with pytest.raises(DataDependentOutputException):  # the check does catch a read
            int(slotted.sizes.sum())
        with pytest.raises(DynamicOutputShapeException):
            torch.unique(slotted.n_id)


def test_a_corrupt_csr_is_refused_not_read_out_of_bounds(graph):
    indptr, indices = graph
    bad = indices.clone()
    bad[int(indptr[5])] = indptr.numel() + 10  # a neighbour id that is not a node
    with pytest.raises(UserError, match="indices must be node ids"):
        NeighborSampler(indptr, bad, [10])
    with pytest.raises(ValueError, match="CSR is inconsistent"):
        sample_neighbors(indptr, bad, torch.arange(10), 64, False, 1)
    short = indptr.clone()
    short[-1] += 5  # the last row runs past the indices
    with pytest.raises(UserError, match="indptr must start at 0"):
        NeighborSampler(short, indices, [10])
    with pytest.raises(ValueError, match="CSR is inconsistent"):
        sample_neighbors(short, indices, torch.tensor([short.numel() - 2]), 64, True, 1)


def test_subgraph_structure(graph):
    indptr, indices = graph
    sampler = NeighborSampler(indptr, indices, [10, 5], place="cpu", seed=1)
    seeds = torch.randperm(indptr.numel() - 1, generator=torch.Generator().manual_seed(0))[:64]
    sub = sampler.sample(seeds, batch=3)
    assert torch.equal(sub.n_id[:64], seeds) and sub.batch_size == 64
    assert sub.n_id.unique().numel() == sub.n_id.numel() == sum(sub.num_sampled_nodes)
    assert sub.edge_index.shape == (2, sum(sub.num_sampled_edges))
    assert sub.edge_index.min() >= 0 and sub.edge_index.max() < sub.n_id.numel()
    real = set(
        zip(
            torch.repeat_interleave(torch.arange(indptr.numel() - 1), indptr[1:] - indptr[:-1]).tolist(),
            indices.tolist(),
        )
    )
    src, dst = sub.n_id[sub.edge_index[0]], sub.n_id[sub.edge_index[1]]
    assert all(pair in real for pair in zip(dst.tolist(), src.tolist()))  # src is a neighbour of dst
    # Hop-1 edges end at seeds; hop-2 edges end at the nodes hop 1 added.
    hop1 = sub.edge_index[1, : sub.num_sampled_edges[0]]
    assert hop1.max() < 64
    hop2 = sub.edge_index[1, sub.num_sampled_edges[0] :]
    assert hop2.min() >= 64 and hop2.max() < 64 + sub.num_sampled_nodes[1]
    assert (sampler.position == -1).all()  # the id map is clean for the next batch


@pytest.mark.parametrize("native_kernel", [True, False])
def test_threads_sharing_a_sampler_get_what_one_thread_gets(graph, native_kernel):
    """A prefetch thread beside the training loop: each thread numbers its batch's nodes in an id
    map of its own (the C++ kernel lets go of the GIL while it samples, so a shared map was
    renumbered under it, and the subgraphs came out wrong)."""
    from concurrent.futures import ThreadPoolExecutor

    indptr, indices = graph
    sampler = NeighborSampler(indptr, indices, [10, 10], seed=2)
    order = torch.Generator().manual_seed(5)
    batches = [torch.randperm(indptr.numel() - 1, generator=order)[:300] for _ in range(12)]
    alone = [sampler.sample(seeds, i, native_kernel=native_kernel) for i, seeds in enumerate(batches)]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda i: sampler.sample(batches[i], i, native_kernel=native_kernel), range(12)))
    for a, b in zip(alone, together):
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)


class _Interrupted(KeyboardInterrupt):
    """Ctrl-C as Python delivers it: between two statements, here right after a hop's kernel."""


@pytest.mark.parametrize(
    "native_kernel, interrupted_hop", [(True, 0), (True, 1), (False, 1)], ids=["native-0", "native-1", "slots-1"]
)
def test_a_batch_interrupted_during_a_hop_leaves_the_next_batches_as_they_were(
    graph, monkeypatch, native_kernel, interrupted_hop
):
    """A KeyboardInterrupt that lands during a hop: in the C++ path right after the kernel marked
    the hop's new nodes in the id map, before they were listed (where a Ctrl-C during sampling
    almost always lands: the kernel holds the signal back until it returns); in the slot path as
    the hop draws. The next batches are those of a fresh sampler, not renumbered by marks left behind."""
    import systems.sampling.sampler as sampler_module

    indptr, indices = graph
    seeds = torch.randperm(indptr.numel() - 1, generator=torch.Generator().manual_seed(8))[:300]
    probe = seeds[:40]
    want = NeighborSampler(indptr, indices, [10, 5], seed=3).sample(probe, 7, native_kernel=native_kernel)
    sampler = NeighborSampler(indptr, indices, [10, 5], seed=3)
    hops = []
    if native_kernel:
        real = sampler_module.cpu_kernels()

        class Kernels:
            reset_positions = real.reset_positions

            @staticmethod
            def sample_hop(*args):
                hops.append(real.sample_hop(*args))
                if len(hops) > interrupted_hop:
                    raise _Interrupted
                return hops[-1]

        monkeypatch.setattr(sampler_module, "cpu_kernels", lambda: Kernels)
    else:
        real_slots = sampler_module.sample_into_slots

        def sample_into_slots(*args, **kwargs):
            hops.append(None)
            if len(hops) > interrupted_hop:
                raise _Interrupted
            return real_slots(*args, **kwargs)

        monkeypatch.setattr(sampler_module, "sample_into_slots", sample_into_slots)
    with pytest.raises(_Interrupted):
        sampler.sample(seeds, 1, native_kernel=native_kernel)
    assert len(hops) == interrupted_hop + 1 and (sampler.position == -1).all()
    monkeypatch.undo()
    got = sampler.sample(probe, 7, native_kernel=native_kernel)
    assert torch.equal(got.n_id, want.n_id) and torch.equal(got.edge_index, want.edge_index)


def test_no_two_batches_or_hops_share_their_draws(graph):
    """The draws of (seed, batch, hop) are hashed together: a packing such as seed * P + batch
    gave batch P of one seed the draws of batch 0 of the next, and hop 16 the next batch's hop 0."""
    from workloads.gnn.pipelines import BATCHES_PER_EPOCH, batch_number

    indptr, indices = graph
    seeds = torch.arange(0, 400, 2)
    deep = NeighborSampler(indptr, indices, [3] * 17, seed=5)
    keys = {deep.rng_seed(batch, hop) for batch in range(4) for hop in range(17)}
    keys |= {NeighborSampler(indptr, indices, [3], seed=6).rng_seed(batch, 0) for batch in range(4)}
    assert len(keys) == 4 * 17 + 4 and all(0 <= k < 2**63 for k in keys)
    one = NeighborSampler(indptr, indices, [5], seed=0)
    assert not torch.equal(one.sample(seeds, 100_000).n_id, one.sample(seeds, batch_number(1, 0)).n_id)
    assert batch_number(1, 0) == BATCHES_PER_EPOCH > batch_number(0, BATCHES_PER_EPOCH - 1)
    for epoch, index in ((0, BATCHES_PER_EPOCH), (0, -1), (-1, 0)):
        with pytest.raises(ValueError, match="an epoch has"):
            batch_number(epoch, index)


def test_full_fanout_one_hop_sage_equals_full_graph_sage(graph):
    from torch_geometric.nn import SAGEConv

    indptr, indices = graph
    degrees = indptr[1:] - indptr[:-1]
    small = torch.nonzero((degrees > 0) & (degrees <= 20)).flatten()[:100]
    n = indptr.numel() - 1
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(1))
    conv = SAGEConv(8, 4)
    full_edges = torch.stack([indices, torch.repeat_interleave(torch.arange(n), degrees)])
    expected = conv(x, full_edges)[small]
    sub = NeighborSampler(indptr, indices, [20]).sample(small, batch=0)  # fanout >= degree: all neighbours
    got = conv(x[sub.n_id], sub.edge_index)[: sub.batch_size]
    torch.testing.assert_close(got, expected)


def test_sampler_refuses_bad_configuration(graph):
    with pytest.raises(UserError, match="fanouts must be"):
        NeighborSampler(*graph, [])
    with pytest.raises(UserError, match="fanouts must be"):
        NeighborSampler(*graph, [10, 0])
    with pytest.raises(UserError, match="place must be"):
        NeighborSampler(*graph, [10], place="tpu")
    if not torch.cuda.is_available():  # not torch's "Torch not compiled with CUDA enabled"
        with pytest.raises(NeedsGpuError, match="place='cuda' samples on a CUDA GPU, and torch sees none here"):
            NeighborSampler(*graph, [10], place="cuda")
    with pytest.raises(UserError, match="distinct"):
        NeighborSampler(*graph, [10]).sample(torch.tensor([1, 1]), batch=0)
    with pytest.raises(UserError, match="seed node -3 is out of range"):
        NeighborSampler(*graph, [10]).sample(torch.tensor([1, -3]), batch=0)
    with pytest.raises(UserError, match="1-D tensor of node ids"):
        NeighborSampler(*graph, [10]).sample(torch.tensor([1.0]), batch=0)
    # The batch number's text picks the draws: 1.0 drew otherwise than 1, and "1" as 1.
    for batch in (1.0, "1", 1.5, -1, True):
        with pytest.raises(UserError, match=f"batch must be a non-negative integer .*, got {batch!r}"):
            NeighborSampler(*graph, [10]).sample(torch.tensor([1]), batch=batch)
    sampler = NeighborSampler(*graph, [10])
    assert torch.equal(sampler.sample(torch.tensor([1]), np.int64(3)).n_id, sampler.sample(torch.tensor([1]), 3).n_id)
    with pytest.raises(UserError, match="got torch.bool"):  # not node ids 1 and 0
        NeighborSampler(*graph, [10]).sample(torch.tensor([True, False]), batch=0)
    for seed in (1.5, "3", True, None, torch.tensor(True)):  # each failed mid-batch, or (True) drew as seed 1
        with pytest.raises(UserError, match="seed must be an integer"):
            NeighborSampler(*graph, [10], seed=seed)
    for replace in (1, "yes", None):  # refused when made, not at the first batch of one path only
        with pytest.raises(UserError, match=f"replace must be a bool, got {replace!r}"):
            NeighborSampler(*graph, [10], replace=replace)
    assert NeighborSampler(*graph, [10], replace=np.bool_(True)).replace is True
    # Any integer picks draws: a numpy integer as the Python one, a huge or negative one too.
    seeds = torch.tensor([1, 2])
    same = NeighborSampler(*graph, [10], seed=np.int64(7)).sample(seeds, batch=0).n_id
    assert torch.equal(same, NeighborSampler(*graph, [10], seed=7).sample(seeds, batch=0).n_id)
    for seed in (2**70, -5):
        assert NeighborSampler(*graph, [10], seed=seed).sample(seeds, batch=0).n_id.numel() >= 2


def test_gpu_memory_budgets_are_distinct_and_ascending():
    from harness.errors import UserError
    from workloads.gnn.gpu_memory import parse_budgets

    assert parse_budgets([80, 16, 16.0, 24]) == [16.0, 24.0, 80.0]
    assert parse_budgets(None) == []
    for bad in ([0], [True], "16", [-1.5]):
        with pytest.raises(UserError, match="positive sizes in GiB"):
            parse_budgets(bad)


def test_dgl_comparison_is_skipped_with_a_reason():
    try:
        import dgl  # noqa: F401
    except Exception as err:
        pytest.skip(f"DGL does not import here ({type(err).__name__}); its sampler cannot be compared")
    pytest.skip("DGL imports, but a comparison with its sampler is not written yet")


# --- GPU: the kernel draws exactly what the reference draws ------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("place", ["cuda", "uva"])
@pytest.mark.parametrize("replace", [False, True])
def test_kernel_equals_reference(graph, place, replace):
    indptr, indices = graph
    csr = (indptr.cuda(), indices.cuda()) if place == "cuda" else (indptr.pin_memory(), indices.pin_memory())
    seeds = torch.randperm(indptr.numel() - 1)[:3000]
    for fanout in (1, 10, 25, 64):
        counts, neighbors = sample_neighbors(*csr, seeds.cuda(), fanout, replace, 77)
        ref_counts, ref_neighbors = reference(indptr.numpy(), indices.numpy(), seeds.numpy(), fanout, replace, 77)
        assert np.array_equal(counts.cpu().numpy(), ref_counts)
        assert np.array_equal(neighbors.cpu().numpy(), ref_neighbors)


@pytest.mark.gpu
@pytest.mark.parametrize("place", ["cuda", "uva"])
def test_gpu_sampler_returns_the_cpu_subgraph(graph, place):
    indptr, indices = graph
    csr = (indptr.pin_memory(), indices.pin_memory()) if place == "uva" else graph
    seeds = torch.randperm(indptr.numel() - 1)[:256]
    cpu = NeighborSampler(*graph, [15, 10, 5], seed=4).sample(seeds, batch=2)
    gpu = NeighborSampler(*csr, [15, 10, 5], place=place, seed=4).sample(seeds, batch=2)
    assert torch.equal(gpu.n_id.cpu(), cpu.n_id) and torch.equal(gpu.edge_index.cpu(), cpu.edge_index)
    assert gpu.num_sampled_nodes == cpu.num_sampled_nodes


@pytest.mark.gpu
@pytest.mark.parametrize("place", ["cuda", "uva"])
def test_gpu_sampling_waits_for_the_device_once_per_batch(graph, place):
    """No wait while the hops run (sync debug mode "error" raises at the first one); the sizes
    read at the end are the batch's one wait."""
    import warnings

    indptr, indices = graph
    csr = (indptr.pin_memory(), indices.pin_memory()) if place == "uva" else graph
    sampler = NeighborSampler(*csr, [10, 25], place=place, seed=9)
    cpu = NeighborSampler(*graph, [10, 25], seed=9)
    for batch in range(3):
        seeds = torch.randperm(indptr.numel() - 1, generator=torch.Generator().manual_seed(batch))[:300]
        on_device = sampler.checked_seeds(seeds)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            slotted = sampler.sample_in_slots(on_device, batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                sub = sampler.finish(slotted)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        assert len([w for w in caught if "synchroniz" in str(w.message)]) == 1
        expected = cpu.sample(seeds, batch)
        assert torch.equal(sub.n_id.cpu(), expected.n_id) and torch.equal(sub.edge_index.cpu(), expected.edge_index)
    assert (sampler.position == -1).all()


def _six_node_graph():
    """Nodes 0-4: neighbours i + 1 and i + 2 (mod 6); node 5: none."""
    indptr = torch.tensor([0, 2, 4, 6, 8, 10, 10])
    indices = torch.tensor([1, 2, 2, 3, 3, 4, 4, 5, 5, 0])
    return indptr, indices


def _refusals_of(indptr, indices, to):
    """The error type and message of each bad input to both ops, CSR and seeds moved by ``to``."""
    bad_neighbor = indices.clone()
    bad_neighbor[3] = 99
    long_row = indptr.clone()
    long_row[2] = 40  # row 1 runs past the indices
    cases = {
        "seed out of range": (indptr, indices, torch.tensor([2, 6])),
        "negative seed": (indptr, indices, torch.tensor([-1, 2])),
        "neighbour id not a node": (indptr, bad_neighbor, torch.tensor([1, 2])),
        "row past the indices": (long_row, indices, torch.tensor([0, 1])),
        "int32 CSR": (indptr.int(), indices.int(), torch.tensor([0, 1])),
    }
    seen = {}
    for name, (ip, ix, seeds) in cases.items():
        for op in ("neighbors", "slots"):
            try:
                if op == "neighbors":
                    sample_neighbors(to(ip), to(ix), to(seeds), 2, False, 3)
                else:
                    sample_into_slots(to(ip), to(ix), to(seeds), to(torch.tensor([2])), 2, False, 3)
            except (ValueError, IndexError) as err:
                seen[name, op] = (type(err), str(err))
            else:
                seen[name, op] = None
    return seen


def test_slot_op_reports_no_error_on_the_cpu_and_refuses_bad_input():
    indptr, indices = _six_node_graph()
    counts, slots, error = sample_into_slots_op(indptr, indices, torch.tensor([0, 4]), torch.tensor([2]), 2, False, 3)
    assert counts.tolist() == [2, 2] and slots.tolist() == [1, 2, 5, 0] and error.tolist() == [0]
    refusals = _refusals_of(indptr, indices, lambda t: t)
    assert all(refusals.values()), [case for case, error in refusals.items() if error is None]
    assert refusals["seed out of range", "slots"] == (IndexError, "seed node 6 is out of range for a graph of 6 nodes")
    assert refusals["int32 CSR", "slots"][1].startswith("indptr must be a 1-D int64 tensor")


@pytest.mark.gpu
@pytest.mark.parametrize("place", ["cuda", "uva"])
def test_gpu_ops_refuse_what_the_cpu_ops_refuse_with_the_same_error(place):
    indptr, indices = _six_node_graph()

    def to(t):
        if place == "uva" and t.numel() > 2:  # the CSR in pinned host memory, the seeds on the GPU
            return t.pin_memory()
        return t.cuda()

    assert _refusals_of(indptr, indices, to) == _refusals_of(indptr, indices, lambda t: t)
    torch.cuda.synchronize()  # the context is still usable: nothing was written out of bounds


@pytest.mark.gpu
def test_unchecked_gpu_slots_sample_nothing_for_bad_seeds_and_keep_the_good_ones():
    """check=False: no wait; a seed out of range gets no draws (it used to read a row past the
    CSR and write before its slots, over its neighbour's), and the op's error word says so."""
    indptr, indices = _six_node_graph()
    seeds = torch.tensor([2, 6, -3, 0], device="cuda")
    counts, slots, error = sample_into_slots_op(
        indptr.cuda(), indices.cuda(), seeds, torch.tensor([4], device="cuda"), 2, False, 3
    )
    expected_counts, expected_slots = sample_into_slots(
        indptr, indices, torch.tensor([2, 0]), torch.tensor([2]), 2, False, 3
    )
    assert counts.tolist() == [2, 0, 0, 2] and error.tolist() == [1]
    assert slots.view(4, 2)[[0, 3]].tolist() == expected_slots.view(2, 2).tolist()
    assert (slots.view(4, 2)[[1, 2]] == -1).all()
    assert expected_counts.tolist() == [2, 2]


def _seed_views(n: int, device: str) -> dict[str, torch.Tensor]:
    """Seeds as users pass them: every-other row of a larger tensor, a view at an offset, one id
    expanded (stride 0), a column of a 2-D tensor; each a view, never copied beforehand."""
    base = torch.randperm(n, generator=torch.Generator().manual_seed(8)).to(device)
    grid = base[:40].view(8, 5)
    return {
        "strided": base[::3][:30],
        "offset": base[17:47],
        "expanded": base[5:6].expand(12),
        "column": grid[:, 2],
    }


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("view", ["strided", "offset", "expanded", "column"])
def test_seed_views_draw_what_their_contiguous_copies_draw(graph, device, view):
    indptr, indices = (t.to(device) for t in graph)
    seeds = _seed_views(indptr.numel() - 1, device)[view]
    assert not seeds.is_contiguous() or seeds.storage_offset() > 0
    copy = seeds.contiguous().clone()
    valid = torch.tensor([seeds.numel() - 1], device=device)  # the last seed is padding
    for replace in (False, True):
        got = sample_neighbors(indptr, indices, seeds, 7, replace, 19)
        want = sample_neighbors(indptr, indices, copy, 7, replace, 19)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        got = sample_into_slots(indptr, indices, seeds, valid, 7, replace, 19)
        want = sample_into_slots(indptr, indices, copy, valid, 7, replace, 19)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    # and they are the reference's draws, not merely the same wrong ones
    counts, neighbors = sample_neighbors(indptr, indices, seeds, 7, False, 19)
    ref_counts, ref_neighbors = reference(indptr.cpu().numpy(), indices.cpu().numpy(), copy.cpu().numpy(), 7, False, 19)
    assert counts.tolist() == ref_counts.tolist() and neighbors.tolist() == ref_neighbors.tolist()


def test_arguments_that_are_no_tensors_are_named_and_num_valid_may_be_an_integer():
    indptr, indices = _six_node_graph()
    seeds = torch.tensor([0, 4, 2])
    for bad in ([0, 4], np.array([0, 4]), None):
        with pytest.raises(ValueError, match=f"^seeds must be a torch tensor, got {type(bad).__name__}$"):
            sample_neighbors(indptr, indices, bad, 2, False, 3)
        with pytest.raises(ValueError, match=f"^indptr must be a torch tensor, got {type(bad).__name__}$"):
            sample_into_slots(bad, indices, seeds, 2, 2, False, 3)
        for op in (sample_neighbors, lambda *a: sample_into_slots(*a[:3], 2, *a[3:])):
            with pytest.raises(ValueError, match=f"^indices must be a torch tensor, got {type(bad).__name__}$"):
                op(indptr, bad, seeds, 2, False, 3)
            with pytest.raises(ValueError, match=f"^seeds must be a torch tensor, got {type(bad).__name__}$"):
                op(indptr, indices, bad, 2, False, 3)
    want = sample_into_slots(indptr, indices, seeds, torch.tensor([2]), 2, False, 3)
    for count in (2, np.int64(2)):
        got = sample_into_slots(indptr, indices, seeds, count, 2, False, 3)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    for bad in (True, 2.0, "2"):
        with pytest.raises(ValueError, match="num_valid must be an int64 tensor of one element or an integer"):
            sample_into_slots(indptr, indices, seeds, bad, 2, False, 3)
    with pytest.raises(ValueError, match=r"num_valid must be in \[0, 3\], got 4"):
        sample_into_slots(indptr, indices, seeds, 4, 2, False, 3)


@pytest.mark.gpu
def test_an_integer_num_valid_is_put_beside_gpu_seeds():
    indptr, indices = (t.cuda() for t in _six_node_graph())
    seeds = torch.tensor([0, 4, 2], device="cuda")
    want = sample_into_slots(indptr, indices, seeds, torch.tensor([2], device="cuda"), 2, False, 3)
    got = sample_into_slots(indptr, indices, seeds, 2, 2, False, 3)
    assert all(a.is_cuda and torch.equal(a, b) for a, b in zip(got, want))
