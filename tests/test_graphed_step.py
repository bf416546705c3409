"""A whole training step captured as one CUDA graph (harness/graphed_step.py): replays do what
eager steps do, to the parameters and the loss, for a plain torch model and for Hector's layer
(whose op launches directly inside a caller's capture); a step that waits for the GPU is refused
with the reason."""

import pytest
import torch
import torch.nn.functional as F

from harness.graphed_step import NotCapturable, capture_step


def _trainer(model: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, forward=None):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, fused=x.is_cuda, capturable=x.is_cuda)
    losses = []

    def step():
        optimizer.zero_grad(set_to_none=False)
        loss = F.mse_loss((forward or model)(x), target)
        loss.backward()
        optimizer.step()
        losses.append(loss)

    return step, losses


def _replays_match_eager_steps(captured, eager, captured_model, eager_model, tol: float, steps: int = 4):
    """Captured after 3 warm-up steps (the capture itself runs nothing), then each replay against
    one eager step from the same start: the same loss each step, the same parameters after."""
    (step, losses), (eager_step, eager_losses) = captured, eager
    replay = capture_step(step, warmup=3)
    for _ in range(3):
        eager_step()
    for _ in range(steps):
        replay()
        eager_step()
        torch.testing.assert_close(losses[-1], eager_losses[-1], rtol=tol, atol=1e-6)
    for (name, a), b in zip(captured_model.named_parameters(), eager_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal without a GPU")
def test_without_a_gpu_a_step_is_refused_in_one_line():
    with pytest.raises(NotCapturable, match="needs a CUDA GPU"):
        capture_step(lambda: None)


@pytest.mark.gpu
def test_replays_update_the_parameters_as_eager_steps_do():
    g = torch.Generator().manual_seed(0)
    x, target = torch.randn(37, 13, generator=g).cuda(), torch.randn(37, 5, generator=g).cuda()
    torch.manual_seed(1)
    captured = torch.nn.Sequential(torch.nn.Linear(13, 29), torch.nn.Tanh(), torch.nn.Linear(29, 5)).cuda()
    eager = torch.nn.Sequential(torch.nn.Linear(13, 29), torch.nn.Tanh(), torch.nn.Linear(29, 5)).cuda()
    eager.load_state_dict(captured.state_dict())
    _replays_match_eager_steps(_trainer(captured, x, target), _trainer(eager, x, target), captured, eager, tol=1e-5)


@pytest.mark.gpu
def test_a_step_that_waits_for_the_gpu_is_refused_with_the_reason():
    x = torch.randn(8, 4, device="cuda")
    with pytest.raises(NotCapturable) as caught:
        capture_step(lambda: float(x.sum().item()))
    assert len(str(caught.value).splitlines()) == 1
    torch.zeros(3, device="cuda").add_(1)  # the device still works after the failed capture
    torch.cuda.synchronize()
    # ...and so does its random-number generator, which the failed capture left capturing
    torch.cuda.manual_seed(4)
    first = torch.randn(5, device="cuda")
    torch.cuda.manual_seed(4)
    assert torch.equal(torch.randn(5, device="cuda"), first)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["rgcn", "rgat", "hgt"])
def test_a_hector_layer_trains_alike_captured_whole_and_eager(name):
    from systems.hector import op, passes
    from systems.rgnn.models import MODELS
    from tests.test_hector_op import random_graph

    graph = random_graph(seed=3, nodes=211, edges=1501, relations=9, device="cuda")
    model = MODELS[name]
    layer = op.Layer(passes.optimize(model.program(), "reorder", "compact"))
    captured_weights = model.make_weights(graph, 16, 16, seed=4).cuda()
    eager_weights = model.make_weights(graph, 16, 16, seed=4).cuda()
    g = torch.Generator().manual_seed(5)
    x, target = (
        torch.randn(graph.num_nodes, 16, generator=g).cuda(),
        torch.randn(graph.num_nodes, 16, generator=g).cuda(),
    )

    def run(weights):
        return lambda x: layer(graph, x=x, **model.bind(weights))

    captured = _trainer(captured_weights, x, target, forward=run(captured_weights))
    eager = _trainer(eager_weights, x, target, forward=run(eager_weights))
    _replays_match_eager_steps(captured, eager, captured_weights, eager_weights, tol=1e-4)


@pytest.mark.gpu
def test_after_a_step_that_waits_the_allocator_still_gives_its_cache_back():
    """A capture that a read-back invalidated must not leave torch's allocator recording to its
    pool: while it believes a capture is under way it keeps its cache when an allocation fails, and
    a request larger than any cached block then runs out of memory with most of the GPU cached."""
    x = torch.randn(1000, device="cuda")
    with pytest.raises(NotCapturable):
        capture_step(lambda: x.sum().item(), warmup=1)
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    chunk = 1 << 30
    cached = [torch.empty(chunk, dtype=torch.uint8, device="cuda") for _ in range(int(free * 0.6) // chunk)]
    del cached  # freed into the cache, not to the GPU: 60% of the free memory in 1 GiB blocks
    assert torch.cuda.memory_reserved() >= free * 0.5
    big = torch.empty(int(free * 0.6), dtype=torch.uint8, device="cuda")  # needs that cache back
    assert big.numel() == int(free * 0.6)
    del big
    torch.cuda.empty_cache()
    # and a step that can be captured still captures and replays
    y = torch.zeros(3, device="cuda")
    replay = capture_step(lambda: y.add_(1), warmup=1)
    replay()
    assert y.tolist() == [2.0, 2.0, 2.0]


@pytest.mark.gpu
def test_a_step_that_runs_out_of_memory_while_captured_says_so_as_eager_would():
    """Out of memory is a size (the part records an out_of_memory row), not a refusal to capture."""
    _, total = torch.cuda.mem_get_info()

    def step():  # the warm-up calls allocate nothing; the captured one more than the GPU has
        if torch.cuda.is_current_stream_capturing():
            torch.empty(2 * total, dtype=torch.uint8, device="cuda")

    with pytest.raises(torch.cuda.OutOfMemoryError, match="Tried to allocate"):
        capture_step(step, warmup=1)
    y = torch.zeros(2, device="cuda")
    capture_step(lambda: y.add_(1), warmup=1)()
    assert y.tolist() == [2.0, 2.0]
