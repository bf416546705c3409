"""The one reading of "a whole number" (harness/arguments.py) and the library surfaces that use it:
integers of every kind are taken (and handed on as Python ints), bools, floats and strings never."""

import numpy as np
import pytest
import torch

from harness.arguments import cpu_or_cuda, integer, real_number, whole_number
from harness.errors import UserError
from systems.relgraph.graph import RelGraph
from systems.ssdtrain import EmulatedStore, HostStore, offload
from systems.ssdtrain.bound import offload_bound
from workloads.gnn.gpu_memory import parse_budgets
from workloads.gnn.worker_split import budget_cores

INTEGERS = [7, np.int64(7), np.int32(7), np.uint8(7), torch.tensor(7), torch.tensor(7, dtype=torch.int32)]
NOT_INTEGERS = [True, False, np.True_, torch.tensor(True), 7.0, np.float32(7), torch.tensor(7.0), "7", None, [7]]


@pytest.mark.parametrize("value", INTEGERS, ids=repr)
def test_an_integer_of_any_kind_is_a_python_int(value):
    assert integer(value) == 7 and type(integer(value)) is int


@pytest.mark.parametrize("value", NOT_INTEGERS, ids=repr)
def test_bools_floats_and_strings_are_not_integers(value):
    assert integer(value) is None
    assert whole_number(value) is None


@pytest.mark.parametrize(
    "value, bounds, expected",
    [(0, {}, 0), (-1, {}, None), (3, {"at_least": 4}, None), (4, {"at_least": 4}, 4), (5, {"at_most": 4}, None)],
)
def test_whole_numbers_are_bounded_on_both_sides(value, bounds, expected):
    assert whole_number(value, **bounds) == expected


def test_the_libraries_take_numpy_integers_and_hand_on_python_ints():
    # The counts of a graph made from numpy arrays are often numpy integers.
    graph = RelGraph.build(
        np.array([0, 1]), np.array([1, 2]), np.array([0, 1]), num_nodes=np.int64(3), num_relations=np.int32(2)
    )
    assert (graph.num_nodes, graph.num_relations) == (3, 2) and type(graph.num_nodes) is int
    assert budget_cores(np.int64(2)) == 2 and type(budget_cores(np.int64(2))) is int
    as_int = offload_bound([1e6, 1e6], [1e-3, 1e-3], [1e-3, 1e-3], 1e9, 1e9, keep_last=1)
    assert offload_bound([1e6, 1e6], [1e-3, 1e-3], [1e-3, 1e-3], 1e9, 1e9, keep_last=np.int64(1)) == as_int
    model = torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(3)))
    session = offload(model, store=HostStore(), keep_last=np.int64(1), min_bytes=np.int32(0))
    assert type(session.keep_last) is int


@pytest.mark.parametrize("keep_last", [1.0, True, "1", -1])
def test_the_libraries_refuse_what_is_not_a_whole_number_in_one_line(keep_last):
    model = torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(3)))
    with pytest.raises(UserError, match="keep_last must be a non-negative integer"):
        offload(model, store=HostStore(), keep_last=keep_last)
    with pytest.raises(UserError, match="keep_last must be a whole number between 0 and 2"):
        offload_bound([1e6, 1e6], [1e-3, 1e-3], [1e-3, 1e-3], 1e9, 1e9, keep_last=keep_last)


@pytest.mark.parametrize("value", [2, 2.5, np.float32(2.5), np.int64(2), -1.0])
def test_a_real_number_of_any_kind_is_a_python_float(value):
    assert real_number(value) == float(value) and type(real_number(value)) is float


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -np.inf, True, "2", None, torch.tensor(2.0)], ids=repr)
def test_nan_infinities_bools_and_strings_are_not_real_numbers(value):
    assert real_number(value) is None


@pytest.mark.parametrize("speed", [float("inf"), float("nan"), 0, True, "16"], ids=repr)
def test_an_emulated_store_needs_a_finite_speed(speed):
    with pytest.raises(UserError, match="bandwidth_gbps must be a positive, finite number of GB/s"):
        EmulatedStore(speed)


def test_an_emulated_store_takes_a_numpy_speed_as_a_float():
    store = EmulatedStore(np.float32(2.5))
    try:
        assert store.bandwidth_gbps == 2.5 and type(store.bandwidth_gbps) is float
    finally:
        store.close()


@pytest.mark.parametrize("budgets", [[float("nan")], [24, float("inf")], [True]], ids=repr)
def test_a_gpu_memory_budget_must_be_a_finite_size(budgets):
    with pytest.raises(UserError, match="gpu_memory_budget_gib must be a list of positive sizes"):
        parse_budgets(budgets)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("cpu", torch.device("cpu")),
        ("cuda", torch.device("cuda")),
        ("cuda:1", torch.device("cuda", 1)),
        (torch.device("cuda", 2), torch.device("cuda", 2)),
        (0, torch.device("cuda", 0)),  # an ordinal, read without asking whether a GPU is there
        (np.int64(3), torch.device("cuda", 3)),
    ],
)
def test_cpu_or_cuda_reads_a_device_as_torch_does_without_needing_the_gpu(value, expected):
    assert cpu_or_cuda(value) == expected


@pytest.mark.parametrize(
    "value",
    ["gpu", "meta", torch.device("meta"), "cuda:x", -1, True, 1.0, None, 128, 256, 2**40, "cuda:300", "cuda:255"],
)
def test_cpu_or_cuda_is_none_for_what_is_not_the_cpu_or_a_cuda_gpu(value):
    assert cpu_or_cuda(value) is None


def test_a_graph_asked_for_a_cuda_ordinal_on_a_machine_without_one_says_so():
    if torch.cuda.is_available():
        graph = RelGraph.build([0, 1], [1, 0], [0, 0], num_nodes=2, num_relations=1, device=0)
        assert graph.src.device == torch.device("cuda", 0)
    else:
        with pytest.raises(UserError, match="^device cuda:0 asked for, but this machine has no CUDA GPU"):
            RelGraph.build([0, 1], [1, 0], [0, 0], num_nodes=2, num_relations=1, device=0)
