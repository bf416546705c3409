"""Blocks compiled by ``torch.compile`` (inductor) for the policies that run on compiled blocks.

A compiled block is the block's ``forward`` replaced, for the duration of a step, by
``torch.compile(forward)``; ``nn.Module.__call__`` still runs the block's hooks outside the
compiled code, so the offloader knows which block is running, and the saved-tensor hooks around
the call see what AOTAutograd's compiled function saves for backward (its forward's outputs that
its backward reads), one tensor at a time as eager autograd would hand them.

``activation_budget``: torch's ``torch._functorch.config.activation_memory_budget``, the fraction
of the activations the partitioner may keep (it recomputes the rest in backward, choosing the
cheapest ops to recompute), read when the block is compiled. ``None``: torch's default partitioner.
A block that drops out in training is refused under a budget below 1: torch's budgeted partitioner
(torch 2.11 to 2.13 at least) recomputes dropout in backward with new random numbers, so the
gradients are those of another mask (a finite-difference check agrees with compiled keep's, not
the budget's). Dropout written as a function (``F.dropout``, attention's ``dropout_p``) is not seen
by this check: set it to 0 for budgeted blocks.

One backend per budget, shared by every policy that asks for it: Dynamo keeps its compiled code
on the block class's ``forward`` and reuses it only for the same backend, so policies on the same
budget (compiled keep and offloading on compiled blocks) compile once per model, and each budget
adds one cache entry. The steps run with a recompile limit high enough for every budget of a
comparison, and with a limit that raises instead of falling back to eager code: a block that
silently ran eager would be timed as compiled.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from harness.arguments import real_number
from harness.errors import UserError
from systems.ssdtrain.layers import InstalledForward

RECOMPILE_LIMIT = 64  # cache entries per code object: budgets x models x graph breaks, with room

_BACKENDS: dict[float | None, Callable] = {}


def check_budget(budget) -> float | None:
    """``budget`` as a float in (0, 1], or None; anything else is refused in one line."""
    if budget is None:
        return None
    if (fraction := real_number(budget)) is None:
        raise UserError(f"activation_budget must be a number in (0, 1], got {budget!r}")
    if not 0 < fraction <= 1:
        raise UserError(f"activation_budget must be in (0, 1] (a fraction of the activations kept), got {budget!r}")
    return fraction


def inductor_backend(budget: float | None) -> Callable:
    """The backend that compiles with inductor, its partitioner under ``budget`` (or torch's
    default): one function per budget, so that Dynamo's cache serves every policy that shares it."""
    budget = check_budget(budget)
    if budget not in _BACKENDS:

        def backend(graph, example_inputs):
            from torch._inductor.compile_fx import compile_fx

            # AOTAutograd partitions forward from backward inside this call, reading the budget.
            patch = torch._functorch.config.patch(activation_memory_budget=budget)
            with patch if budget is not None else contextlib.nullcontext():
                return compile_fx(graph, example_inputs)

        backend.__name__ = backend.__qualname__ = "inductor" if budget is None else f"inductor_budget_{budget:g}"
        _BACKENDS[budget] = backend
    return _BACKENDS[budget]


class CompiledBlocks:
    """The blocks ``layers``, each with a compiled forward made once (compiled at its first call)
    and put in place by :meth:`installed` for one step.

    :meth:`use` gives each block a budget of its own (a plan that runs some blocks under torch's
    activation memory budget): a block's forward at a budget is the shared backend's, so a mix of
    budgets compiles once per distinct budget, not once per block."""

    def __init__(
        self,
        layers: list[nn.Module],
        budget: float | None = None,
        numbers: list[int] | None = None,
        budgets: list[float | None] | None = None,
    ):
        """``budget`` for every block, or ``budgets``: one per block (as :meth:`use` takes them)."""
        self.layers = list(layers)
        # How messages name each block: its place among the model's blocks (some may not be here).
        self.numbers = list(range(len(self.layers))) if numbers is None else list(numbers)
        self._made: dict[tuple[int, float | None], Callable] = {}
        self.use([check_budget(budget)] * len(self.layers) if budgets is None else budgets)

    def use(self, budgets: list[float | None]) -> None:
        """From the next :meth:`installed` on, block i runs compiled under ``budgets[i]``."""
        if len(budgets) != len(self.layers):
            raise ValueError(f"{len(budgets)} budgets for {len(self.layers)} blocks")
        self.budgets = [check_budget(budget) for budget in budgets]
        self.forwards = []
        for index, (layer, budget) in enumerate(zip(self.layers, budgets, strict=True)):
            key = (index, check_budget(budget))
            if key not in self._made:
                self._made[key] = torch.compile(layer.forward, backend=inductor_backend(key[1]))
            self.forwards.append(self._made[key])

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Within the block, every block runs its compiled forward; what was there before (an
        instance ``forward`` of another wrapper, or the class's) is back when it ends."""
        for number, layer, budget in zip(self.numbers, self.layers, self.budgets, strict=True):
            if budget is not None and budget < 1 and (dropout := _dropping_out(layer)):
                raise UserError(
                    f"block {number} drops out ({dropout}) in training, and under activation_budget {budget:g} torch "
                    "recomputes dropout with new random numbers (wrong gradients): set its dropout to 0, or keep it "
                    "in eval()"
                )
        before = [vars(layer).get("forward") for layer in self.layers]
        for layer, forward, earlier in zip(self.layers, self.forwards, before, strict=True):
            layer.forward = InstalledForward(forward, layer, earlier)  # shadows the class's forward
        limits = torch._dynamo.config.patch(
            recompile_limit=max(RECOMPILE_LIMIT, torch._dynamo.config.recompile_limit),
            fail_on_recompile_limit_hit=True,
        )
        try:
            with limits:
                yield
        finally:
            for layer, forward in zip(self.layers, before, strict=True):
                if forward is None:
                    vars(layer).pop("forward", None)
                else:
                    layer.forward = forward


def _dropping_out(block: nn.Module) -> str | None:
    """The first dropout module of ``block`` that drops anything now (in training, p > 0), named."""
    for name, module in block.named_modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.training and module.p > 0:
            return f"{name or type(block).__name__}, p={module.p:g}"
    return None
