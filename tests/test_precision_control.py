"""``PrecisionControl`` in this process: the fp16 GradScaler mgprof inserts, when it does not,
and the loss it records. (The end-to-end runs are in test_precision.py.)"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from mgprof.collect.wrapping.precision import PrecisionControl


@pytest.fixture
def installed() -> Iterator[list[PrecisionControl]]:
    """Controls made by the test, their patches removed afterwards."""
    made: list[PrecisionControl] = []
    yield made
    for control in made:
        control.uninstall()


def _control(
    made: list[PrecisionControl], precision: str, optimizers: list[object]
) -> PrecisionControl:
    control = PrecisionControl(precision, lambda: optimizers)
    control.install()
    made.append(control)
    return control


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def test_inserted_scaler_unscales_before_clipping_and_records_the_unscaled_loss(
    installed: list[PrecisionControl],
) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    control = _control(installed, "fp16", [opt])
    call = control.route(model, model)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    norms, losses = [], []
    for _ in range(3):
        opt.zero_grad()
        loss = nn.functional.mse_loss(call(x).float(), y)
        losses.append(loss.item())
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)))
        opt.step()
        control.on_update()
    record = control.snapshot()
    assert record.loss_scaling == "inserted"
    assert record.losses == pytest.approx(losses)
    # a step the scaler skipped (inf/NaN gradients at its first scale) left the weights as
    # they were: the next update starts from the same loss
    repeats = sum(1 for a, b in itertools.pairwise(losses) if a == b)
    assert record.skipped_updates == repeats
    # the GradScaler's scale is 65536: a norm taken before unscaling would be that much larger
    # (unscaled first, a finite norm is the true one; the skipped step's gradients were inf)
    assert control._scaler.get_scale() >= 2.0**15
    finite = [n for n in norms if math.isfinite(n)]
    assert len(finite) == len(norms) - record.skipped_updates >= 2
    assert max(finite) < 100.0
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_two_optimizers_get_no_scaler_and_say_why(installed: list[PrecisionControl]) -> None:
    model = _model()
    opts = [
        torch.optim.SGD(model[0].parameters(), lr=0.01),
        torch.optim.SGD(model[2].parameters(), lr=0.01),
    ]
    control = _control(installed, "fp16", list(opts))
    call = control.route(model, model)
    call(torch.randn(4, 8)).float().sum().backward()
    record = control.snapshot()
    assert record.loss_scaling == "none"
    assert record.loss_scaling_note == "2 optimizers: mgprof inserts a GradScaler only for one"
    assert control._scaler is None


def test_the_scripts_own_scaler_is_used_and_its_loss_counted_once(
    installed: list[PrecisionControl],
) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    control = _control(installed, "fp16", [opt])
    scaler = torch.amp.GradScaler("cpu")
    call = control.route(model, model)
    loss = call(torch.randn(4, 8)).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    control.on_update()
    record = control.snapshot()
    assert record.script_grad_scaler and record.loss_scaling == "script"
    assert record.losses == [pytest.approx(loss.item())]  # unscaled, once


def test_fp32_turns_off_the_scripts_autocast_at_the_model_and_notes_it(
    installed: list[PrecisionControl],
) -> None:
    model = _model()
    control = _control(installed, "fp32", [])
    call = control.route(model, model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = call(torch.randn(4, 8))
        outside = model(torch.randn(4, 8))
    assert inside.dtype == torch.float32 and outside.dtype == torch.bfloat16
    assert control.record.script_autocast == "bfloat16"


def test_dataparallel_replicas_run_the_setting_in_their_own_threads(
    installed: list[PrecisionControl],
) -> None:
    """torch's DataParallel re-enters autocast in each replica thread with the outer enable flag
    only (``parallel_apply``): the dtype falls back to the device's default. Emulated here on
    CPU, where the default is bf16, with an fp16 setting."""
    from mgprof.collect.wrapping import autowrap

    model = _model()
    control = _control(installed, "fp16", [])
    dp = nn.DataParallel(model)  # no CUDA: a pass-through, enough to be the wrapper
    auto = autowrap.AutoWrap("dp", precision=control, wrap=False)
    auto._replicas_too(model, dp)
    model.__class__ = autowrap._routed_class(type(model))  # as _consider routes it
    try:
        replica = model._replicate_for_data_parallel()
        seen: dict[str, torch.dtype] = {}
        enabled: list[bool] = []

        def replica_thread() -> None:
            with torch.autocast("cpu", enabled=enabled[0]):  # parallel_apply: the flag only
                seen["dtype"] = replica(torch.randn(2, 8)).dtype

        with control.replica_context("cpu")():  # the outer call, as the route enters it
            enabled.append(torch.is_autocast_enabled("cpu"))
            autowrap._Route.inside = True
            try:
                thread = threading.Thread(target=replica_thread)
                thread.start()
                thread.join()
            finally:
                autowrap._Route.inside = False
        assert seen["dtype"] == torch.float16
        # outside a routed call, another instance of the class is left alone
        assert _model()(torch.randn(2, 8)).dtype == torch.float32
    finally:
        autowrap._replica_contexts.pop(type(model), None)
