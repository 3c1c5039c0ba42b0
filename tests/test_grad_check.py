"""The gradient check in the training process: what it reads, and that it changes nothing.

``mgprof.collect.grad_check`` hooks every optimizer's step to read the gradient norm on a
sample of updates. It must read float64 and NaN gradients right, leave a compiled
``optimizer.step`` compiled once, and never change an update.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from mgprof.collect import grad_check


@pytest.fixture
def check() -> Iterator[None]:
    grad_check._pending.clear()
    grad_check._updates.clear()
    grad_check.install()
    yield
    grad_check.uninstall()
    grad_check._pending.clear()
    grad_check._updates.clear()


def _train(model: nn.Module, steps: int, dtype: torch.dtype = torch.float32) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    norms = []
    for _ in range(steps):
        loss = model(torch.ones(2, 4, dtype=dtype)).sum()
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norms.append(math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads)))
        optimizer.step()
        optimizer.zero_grad()
    return norms


def test_the_first_updates_then_one_in_64_are_read_exactly(check: None) -> None:
    torch.manual_seed(0)
    expected = _train(nn.Linear(4, 3), 70)
    updates, norms, nonfinite = grad_check.read()
    assert updates == [0, 1, 2, 3, 64] and nonfinite == []
    assert norms == pytest.approx([expected[i] for i in updates], rel=1e-6)


def test_float64_and_non_finite_gradients(check: None) -> None:
    _train(nn.Linear(4, 3).double(), 1, torch.float64)  # a float64 model is read, not skipped
    broken = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(broken.parameters(), lr=0.1)
    broken(torch.full((2, 4), float("nan"))).sum().backward()  # NaN inputs: NaN weight grads
    optimizer.step()
    updates, norms, nonfinite = grad_check.read()
    assert updates == [0, 0] and norms[0] is not None and norms[0] > 0
    assert norms[1] is None and nonfinite == [1]  # NaN is not "no gradient"


def test_updates_are_bit_identical_with_and_without_the_check() -> None:
    def final(hooked: bool) -> torch.Tensor:
        torch.manual_seed(0)
        model = nn.Linear(4, 3)
        if hooked:
            grad_check.install()
        try:
            _train(model, 6)
        finally:
            grad_check.uninstall()
        return model.weight.detach().clone()

    assert torch.equal(final(False), final(True))


def test_a_compiled_optimizer_step_compiles_once(check: None) -> None:
    """Traced by dynamo, the check's update counter made the step recompile every update until
    torch gave up and ran it eagerly: the check must stay outside the graph."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = torch.compile(optimizer.step, backend="eager")
    for _ in range(12):
        model(torch.randn(2, 4)).sum().backward()
        step()
        optimizer.zero_grad()
    assert counters["stats"]["unique_graphs"] == 1
    assert len(grad_check.read()[0]) == 4
    torch._dynamo.reset()
