"""A relational graph built from what users pass: lists, numpy arrays and tensors of any integer
dtype, on the CPU or a GPU, give the same graph; anything that is not integer ids, or ids out of
range, is refused in one line naming the argument, with the same words on every device."""

import numpy as np
import pytest
import torch

from harness.errors import UserError
from systems.relgraph.graph import RelGraph

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.gpu),
]


def _random_edges(seed: int, edges: int = 37, nodes: int = 11, relations: int = 5):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(0, nodes, (edges,), generator=g),
        torch.randint(0, nodes, (edges,), generator=g),
        torch.randint(0, relations, (edges,), generator=g),
        nodes,
        relations,
    )


def _fields(graph: RelGraph) -> dict:
    return {name: getattr(graph, name) for name in graph.__dataclass_fields__}


def _assert_same(a: RelGraph, b: RelGraph) -> None:
    for name, value in _fields(a).items():
        other = getattr(b, name)
        if isinstance(value, torch.Tensor):
            assert value.dtype == other.dtype, name
            assert torch.equal(value.cpu(), other.cpu()), name
        else:
            assert value == other, name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "convert",
    [
        lambda t: t.tolist(),
        lambda t: t.numpy().astype(np.int32),
        lambda t: t.numpy().astype(np.uint16),
        lambda t: t.to(torch.int32),
        lambda t: t.to(torch.uint8),
        lambda t: torch.stack([t, t + 1], 1)[:, 0],  # a strided view
        lambda t: torch.cat([t.new_zeros(3), t])[3:],  # an offset view
    ],
    ids=["list", "int32-numpy", "uint16-numpy", "int32", "uint8", "strided", "offset"],
)
def test_every_integer_form_of_the_ids_gives_the_same_graph(device, convert):
    src, dst, etype, nodes, relations = _random_edges(seed=3)
    expected = RelGraph.build(src, dst, etype, nodes, relations)
    given = [convert(t) for t in (src, dst, etype)]
    if device == "cuda":
        given = [torch.as_tensor(np.asarray(t)).cuda() for t in given]
    graph = RelGraph.build(*given, nodes, relations, device=device)
    assert graph.src.device.type == device
    _assert_same(graph, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_expanded_and_reversed_ids_give_the_graph_of_their_values(device):
    """A single relation for every edge as an expanded (stride 0) tensor, and ids read backwards
    through a negative-stride numpy view, build the graph their values describe."""
    src, dst, _, nodes, relations = _random_edges(seed=5)
    one_relation = torch.tensor([3]).expand(len(src))  # every edge of relation 3, one element stored
    backwards = np.ascontiguousarray(dst.numpy()[::-1])[::-1]  # the same ids through a reversed view
    expected = RelGraph.build(src, dst, torch.full((len(src),), 3), nodes, relations)
    given = [src, backwards, one_relation]
    if device == "cuda":  # torch has no negative strides: on the GPU, every other element of a copy
        strided = torch.from_numpy(backwards.copy()).cuda().repeat_interleave(2)[::2]
        given = [src.cuda(), strided, torch.tensor([3], device="cuda").expand(len(src))]
    graph = RelGraph.build(*given, nodes, relations, device=device)
    _assert_same(graph, expected)
    assert graph.etype.unique().tolist() == [3]


@pytest.mark.gpu
def test_cuda_ids_build_where_asked_and_match_the_cpu_graph():
    src, dst, etype, nodes, relations = _random_edges(seed=4, edges=1001, nodes=97, relations=13)
    on_gpu = RelGraph.build(src.cuda(), dst.cuda(), etype.cuda(), nodes, relations, device="cuda")
    to_cpu = RelGraph.build(src.cuda(), dst.cuda(), etype.cuda(), nodes, relations, device="cpu")
    expected = RelGraph.build(src, dst, etype, nodes, relations)
    _assert_same(on_gpu, expected)
    _assert_same(to_cpu, expected)
    assert to_cpu.src.device.type == "cpu"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "bad, words",
    [
        (torch.tensor([0.0, 1.5, 2.0]), "etype must hold integer ids, got torch.float32"),
        (torch.tensor([True, False, True]), "etype must hold integer ids, got torch.bool"),
        (torch.tensor([0j, 1j, 0j]), "etype must hold integer ids, got torch.complex64"),
        (np.array([0.0, 1.0, 2.0]), "etype must hold integer ids, got float64"),
        (np.array([True, False, True]), "etype must hold integer ids, got bool"),
        ([0, 1.0, 2], "etype must hold integer ids, got float64"),
        (["0", "1", "2"], "etype must hold integer ids, got <U1"),
        ([0, True, 2], "etype must hold integer ids, got a bool among them"),
        ((0, np.True_, 2), "etype must hold integer ids, got a bool among them"),
        ([False, True, False], "etype must hold integer ids, got bool"),
    ],
    ids=[
        "float",
        "bool",
        "complex",
        "float-numpy",
        "bool-numpy",
        "float-list",
        "strings",
        "int-and-bool",
        "np-bool",
        "bools",
    ],
)
def test_ids_that_are_not_integers_are_refused_naming_the_argument(device, bad, words):
    if device == "cuda" and isinstance(bad, torch.Tensor):
        bad = bad.cuda()
    with pytest.raises(UserError, match=f"^{words}$".replace("(", r"\(").replace(")", r"\)")):
        RelGraph.build([0, 1, 2], [1, 2, 0], bad, num_nodes=3, num_relations=3, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_ids_out_of_range_are_refused_with_the_same_words_on_every_device(device):
    cases = [
        (
            ([0, 1, 2], [1, 2, 0], [0, 1, 5]),
            r"etype\[2\] = 5 is not a relation id of this graph \(0 to 4; 1 such ids\)",
        ),
        (([0, -7, 2], [1, 2, 0], [0, 1, 1]), r"src\[1\] = -7 is not a node id of this graph \(0 to 2; 1 such ids\)"),
        (([0, 1, 2], [3, 9, 0], [0, 1, 1]), r"dst\[0\] = 3 is not a node id of this graph \(0 to 2; 2 such ids\)"),
    ]
    for (src, dst, etype), words in cases:
        tensors = [torch.tensor(a, device=device) for a in (src, dst, etype)]
        with pytest.raises(UserError, match=words):
            RelGraph.build(*tensors, num_nodes=3, num_relations=5, device=device)
    with pytest.raises(UserError, match=r"node_type\[1\] = 2 is not a node type id"):
        RelGraph.build(
            [0], [1], [0], 3, 1, device=device, node_type=torch.tensor([0, 2, 1], device=device), num_node_types=2
        )
    # Types given, their count left at its default of one: the message names the count.
    forgot = r"^node_type\[1\] = 1 is not a node type id of this graph \(0 to 0; 2 such ids\): num_node_types is 1 "
    with pytest.raises(UserError, match=forgot):
        RelGraph.build([0], [1], [0], 3, 1, device=device, node_type=torch.tensor([0, 1, 1], device=device))
    with pytest.raises(
        UserError, match=r"^node_type\[1\] = -1 is not a node type id of this graph \(0 to 0; 1 such ids\)$"
    ):
        RelGraph.build([0], [1], [0], 3, 1, device=device, node_type=torch.tensor([0, -1, 0], device=device))
    with pytest.raises(UserError, match=r"etype\[0\] = 0 is not a relation id of this graph \(it has no relations;"):
        RelGraph.build([0], [1], [0], 3, 0, device=device)


@pytest.mark.parametrize(
    "counts, words",
    [
        ({"num_nodes": 3.0}, "num_nodes must be a non-negative integer, got 3.0"),
        ({"num_nodes": -1}, "num_nodes must be a non-negative integer, got -1"),
        ({"num_relations": True}, "num_relations must be a non-negative integer, got True"),
        ({"num_node_types": "2"}, "num_node_types must be a non-negative integer, got '2'"),
    ],
)
def test_counts_that_are_not_integers_are_refused(counts, words):
    given = {"num_nodes": 3, "num_relations": 2} | counts
    with pytest.raises(UserError, match=f"^{words}$"):
        RelGraph.build([0], [1], [0], **given)


def test_uint64_ids_past_int64_are_refused_not_wrapped():
    with pytest.raises(UserError, match="etype holds ids past int64's range"):
        RelGraph.build([0], [1], np.array([2**63 + 1], dtype=np.uint64), num_nodes=3, num_relations=2)
    with pytest.raises(UserError, match=rf"^src holds ids past int64's range \(largest {2**64 - 1}\)$"):
        RelGraph.build(torch.tensor([2**64 - 1], dtype=torch.uint64), [1], [0], num_nodes=3, num_relations=1)
    small = RelGraph.build(torch.tensor([2, 0], dtype=torch.uint64), [1, 1], [0, 0], num_nodes=3, num_relations=1)
    assert small.src.tolist() == [2, 0]


def test_a_graph_is_made_by_build_only_so_its_derived_fields_match_its_edges():
    """Reversing a graph's edges with dataclasses.replace would keep the old norm, orders and
    offsets, which every form reads: refused, as is the constructor; build makes the reversed one."""
    import dataclasses

    graph = RelGraph.build([0, 1, 2, 2, 3], [1, 1, 1, 0, 0], [0, 0, 1, 1, 0], 4, 2)
    with pytest.raises(UserError, match=r"^a RelGraph is made by RelGraph.build\(src, dst, etype"):
        dataclasses.replace(graph, src=graph.dst, dst=graph.src)
    with pytest.raises(UserError, match="not dataclasses.replace or the constructor"):
        RelGraph(*(getattr(graph, f.name) for f in dataclasses.fields(graph)))
    reversed_graph = RelGraph.build(graph.dst, graph.src, graph.etype, 4, 2)
    assert reversed_graph.norm.tolist() == [1.0, 1.0, 0.5, 0.5, 1.0]


def test_an_empty_graph_builds_from_empty_lists_and_tensors():
    for empty in ([], np.array([], dtype=np.float64), torch.empty(0, dtype=torch.int32)):
        graph = RelGraph.build(empty, empty, empty, num_nodes=4, num_relations=3)
        assert graph.edges == 0 and graph.offsets.tolist() == [0, 0, 0, 0]
        assert graph.src.dtype == torch.int64


def test_segment_products_read_the_sizes_once_and_again_after_an_in_place_change():
    """The segment lengths are kept per offsets tensor (a step that reads nothing back can be
    captured); changing the offsets in place must not leave the old lengths in use."""
    from systems.relgraph.ops import segment_products

    generator = torch.Generator().manual_seed(3)
    rows, weight = torch.randn(11, 5, generator=generator), torch.randn(3, 5, 4, generator=generator)

    def per_segment(offsets):
        return torch.cat([rows[a:b] @ weight[r] for r, (a, b) in enumerate(zip(offsets[:-1], offsets[1:]))])

    offsets = torch.tensor([0, 4, 4, 11])
    torch.testing.assert_close(segment_products(rows, weight, offsets), per_segment([0, 4, 4, 11]))
    torch.testing.assert_close(segment_products(rows, weight, offsets), per_segment([0, 4, 4, 11]))
    offsets[1:3] = torch.tensor([2, 9])
    torch.testing.assert_close(segment_products(rows, weight, offsets), per_segment([0, 2, 9, 11]))
    offsets.set_(torch.tensor([0, 1, 5, 11]))  # a new storage, the version counter untouched by it
    torch.testing.assert_close(segment_products(rows, weight, offsets), per_segment([0, 1, 5, 11]))
    offsets.data = torch.tensor([0, 6, 7, 11])
    torch.testing.assert_close(segment_products(rows, weight, offsets), per_segment([0, 6, 7, 11]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a CUDA GPU")
def test_a_gpu_asked_for_on_a_machine_without_one_is_refused_in_words():
    with pytest.raises(UserError, match="device cuda asked for, but this machine has no CUDA GPU"):
        RelGraph.build([0], [1], [0], num_nodes=3, num_relations=2, device="cuda")


@pytest.mark.parametrize("argument", ["src", "dst", "etype"])
def test_ragged_id_lists_are_refused_in_one_line_naming_the_argument(argument):
    ids = {"src": [0, 1, 2], "dst": [1, 2, 0], "etype": [0, 1, 0]} | {argument: [[0, 1], [2]]}
    with pytest.raises(UserError, match=f"^{argument} must be a flat sequence of integer ids, got ragged nested ones$"):
        RelGraph.build(**ids, num_nodes=3, num_relations=2)


def test_segment_products_of_no_relations_are_empty_and_still_differentiable():
    from systems.relgraph.ops import segment_products

    rows = torch.randn(0, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(0, 5, 4, dtype=torch.float64, requires_grad=True)
    out = segment_products(rows, weight, torch.zeros(1, dtype=torch.int64))
    assert out.shape == (0, 4) and out.dtype == torch.float64
    rows_grad, weight_grad = torch.autograd.grad(out.sum(), [rows, weight])
    assert rows_grad.shape == (0, 5) and weight_grad.shape == (0, 5, 4)


def test_the_norm_in_float64_is_one_over_each_target_and_relations_edge_count():
    """In float64 the norm is 1 / count computed in float64 (float32's 1 / 3 widened is off in
    its eighth digit); in float32 and below it is the graph's own norm."""
    graph = RelGraph.build([0, 1, 2, 3, 0, 1, 2], [4, 4, 4, 0, 0, 0, 1], [1, 1, 1, 0, 0, 2, 2], 5, 3)
    counts = torch.tensor([3, 3, 3, 2, 2, 1, 1], dtype=torch.float64)
    assert torch.equal(graph.norm_as(torch.float64), 1 / counts)
    assert torch.equal(graph.norm_as(torch.float32), graph.norm)
    assert torch.equal(graph.norm_as(torch.bfloat16), graph.norm.to(torch.bfloat16))


@pytest.mark.parametrize(
    "ids, words",
    [
        # numpy reads these lists as float64 (a negative id beside one past int64) or as objects
        ([-1, 2**63], r"^src\[1\] = 9223372036854775808 is past int64's range, so no id of any graph \(1 such ids\)$"),
        ([5, 2**64, 2**70], r"^src\[1\] = 18446744073709551616 is past int64's range, .* \(2 such ids\)$"),
        ([0, -(2**63) - 1], r"^src\[1\] = -9223372036854775809 is below int64's range, so no id of any graph"),
        (np.array([1, 2**100], dtype=object), r"^src\[1\] = 1267650600228229401496703205376 is past int64's range"),
        ([0, 1.5, 2**64], r"^src must hold integer ids, got object$"),  # a float among them: the type is the error
    ],
    ids=["negative-and-past", "two-past", "below", "object-array", "with-a-float"],
)
def test_python_ids_past_int64_are_refused_naming_the_id_not_the_type_numpy_gave_them(ids, words):
    dst = list(range(len(ids)))
    with pytest.raises(UserError, match=words):
        RelGraph.build(ids, dst, [0] * len(ids), num_nodes=len(ids), num_relations=1)


def _csr(seed: int = 7):
    """A random graph's store arrays (a CSR by target) and the graph build makes of its edges."""
    src, dst, etype, nodes, relations = _random_edges(seed)
    order = torch.sort(dst, stable=True).indices
    indptr = np.zeros(nodes + 1, dtype=np.int64)
    indptr[1:] = np.cumsum(np.bincount(dst.numpy(), minlength=nodes))
    arrays = {"indptr": indptr, "indices": src[order].numpy(), "edge_type": etype[order].numpy()}
    return arrays, RelGraph.build(src[order], dst[order], etype[order], nodes, relations), relations


def _decreasing(indptr):
    return np.concatenate([indptr[:3], [indptr[2] - 1], indptr[4:]])


MALFORMED_CSR = {  # what is changed in a well-formed CSR -> the one line that refuses it
    "indptr-from-1": (
        lambda a: {"indptr": a["indptr"] + 1},
        r"^indptr\[0\] must be 0 \(where the first node's edges start\), got 1$",
    ),
    "decreasing": (
        lambda a: {"indptr": _decreasing(a["indptr"])},
        r"^indptr must be non-decreasing \(each node's edges start where the last's end\), but indptr\[3\] = \d+ < ",
    ),
    "short-indptr": (
        lambda a: {"indptr": a["indptr"][:-1]},
        r"^indptr's last offset must be the edge count, len\(indices\) = 37, got \d+$",
    ),
    "short-indices": (
        lambda a: {"indices": a["indices"][:-1], "edge_type": a["edge_type"][:-1]},
        r"^indptr's last offset must be the edge count, len\(indices\) = 36, got 37$",
    ),
    "float-indptr": (
        lambda a: {"indptr": a["indptr"].astype(np.float64)},
        r"^indptr must hold integer offsets, got float64$",
    ),
    "float-indices": (
        lambda a: {"indices": a["indices"].astype(np.float32)},
        r"^indices must hold integer ids, got float32$",
    ),
    "bool-edge-type": (lambda a: {"edge_type": a["edge_type"] > 0}, r"^edge_type must hold integer ids, got bool$"),
    "2d-indptr": (
        lambda a: {"indptr": a["indptr"].reshape(1, -1)},
        r"^indptr must be 1-d, one offset per node and one more, got shape \(1, 12\)$",
    ),
    "empty-indptr": (
        lambda a: {"indptr": np.array([], dtype=np.int64)},
        r"^indptr must be 1-d, one offset per node and one more, got shape \(0,\)$",
    ),
    "index-out-of-range": (
        lambda a: {"indices": np.where(np.arange(37) == 5, 11, a["indices"])},
        r"^indices\[5\] = 11 is not a node id of this graph \(0 to 10; 1 such ids\)$",
    ),
    "negative-relation": (
        lambda a: {"edge_type": np.where(np.arange(37) >= 30, -2, a["edge_type"])},
        r"^edge_type\[30\] = -2 is not a relation id of this graph \(0 to 4; 7 such ids\)$",
    ),
    "short-edge-type": (
        lambda a: {"edge_type": a["edge_type"][:-2]},
        r"^edge_type must hold one relation per edge \(37, as indices\), got shape \(35,\)$",
    ),
}


@pytest.mark.parametrize("change, words", MALFORMED_CSR.values(), ids=MALFORMED_CSR.keys())
def test_a_malformed_csr_from_the_store_is_refused_in_one_line_naming_the_array(change, words):
    arrays, _, relations = _csr()
    with pytest.raises(UserError, match=words):
        RelGraph.from_store(arrays | change(arrays), relations)


def test_a_well_formed_csr_gives_the_graph_of_its_edges_and_missing_arrays_are_named():
    arrays, expected, relations = _csr()
    _assert_same(RelGraph.from_store(arrays, relations), expected)
    _assert_same(RelGraph.from_store({k: torch.from_numpy(v) for k, v in arrays.items()}, relations), expected)
    with pytest.raises(
        UserError, match=r"^arrays must hold indptr, indices and edge_type .*; missing \['edge_type'\]$"
    ):
        RelGraph.from_store({"indptr": arrays["indptr"], "indices": arrays["indices"]}, relations)


def test_a_count_whose_tables_the_machine_cannot_hold_is_refused_with_the_sizes_before_any_allocation(monkeypatch):
    """num_nodes = 2**40 reached the allocator (8 TiB of node types) and failed there in words
    about memory naming no argument; now the count is refused with what its tables would take."""
    src, dst = [3, 5, 0], [1, 2, 5]
    with pytest.raises(
        UserError,
        match=r"^num_nodes = 1099511627776 is more than cpu can hold: the graph's tables per node would take "
        r"24\.0 TiB \(24 bytes a node\), [\d.]+ [KMGT]iB is available; the ids given reach node 5$",
    ):
        RelGraph.build(src, dst, [0, 1, 0], num_nodes=2**40, num_relations=2)
    # With 1 GiB free, 2**26 relations (16 bytes each: 1 GiB) and 2 node types' tables do not fit.
    monkeypatch.setattr("harness.machine.available_memory_bytes", lambda: 2**30)
    with pytest.raises(UserError, match=r"^num_relations = 67108864 .* would take 1\.0 GiB .*, 1\.0 GiB is available;"):
        RelGraph.build(src, dst, [0, 1, 0], num_nodes=6, num_relations=2**26)
    with pytest.raises(
        UserError, match=r"^num_node_types = 134217728 .* per node type .*; the ids given reach node type 1$"
    ):
        RelGraph.build(src, dst, [0, 1, 0], 6, 2, node_type=[0, 1, 1, 0, 0, 1], num_node_types=2**27)
    assert RelGraph.build(src, dst, [0, 1, 0], num_nodes=6, num_relations=2).num_nodes == 6  # small: not asked


def test_edge_softmax_takes_a_score_per_head_each_column_as_its_own_softmax():
    """Per-head scores ([edges, heads]) failed inside scatter_reduce on the index's dimensions."""
    from harness.errors import UserError
    from systems.relgraph.ops import edge_softmax

    gen = torch.Generator().manual_seed(3)
    dst = torch.tensor([0, 2, 0, 1, 2, 2])
    scores = torch.randn(6, 3, generator=gen, dtype=torch.float64)
    per_head = edge_softmax(scores, dst, 4)
    for head in range(3):
        assert torch.allclose(per_head[:, head], edge_softmax(scores[:, head], dst, 4), atol=0, rtol=1e-15)
        for node in range(3):  # each target's weights sum to one, per head
            assert torch.isclose(per_head[dst == node, head].sum(), torch.tensor(1.0, dtype=torch.float64))
    with pytest.raises(
        UserError, match=r"^edge_softmax takes one score .* got scores of shape \(5, 3\) for dst of shape \(6,\)"
    ):
        edge_softmax(scores[:5], dst, 4)


def test_integer_ids_held_as_objects_are_ids_and_masked_ids_are_refused():
    """A pandas object column of integers was refused as "got object"; a masked array's masked
    values were read as ids without a word."""
    import numpy as np

    from harness.errors import UserError

    g = RelGraph.build(np.array([0, np.int32(1)], dtype=object), [1, 0], [0, 0], num_nodes=2, num_relations=1)
    assert g.src.tolist() == [0, 1] and g.src.dtype == torch.int64
    for mixed in (
        np.array([0, 1.5], dtype=object),
        np.array([0, True], dtype=object),
        np.array(["0", 1], dtype=object),
    ):
        with pytest.raises(UserError, match="^src must hold integer ids, got object$"):
            RelGraph.build(mixed, [1, 0], [0, 0], num_nodes=2, num_relations=1)
    with pytest.raises(UserError, match="^src is a masked array with masked ids: drop or fill them first$"):
        RelGraph.build(np.ma.array([0, 5], mask=[False, True]), [1, 0], [0, 0], num_nodes=2, num_relations=1)
    assert RelGraph.build(np.ma.array([0, 1]), [1, 0], [0, 0], num_nodes=2, num_relations=1).src.tolist() == [0, 1]
