"""The in-code API fails open on its own faults and refuses misuse once, at the call.

Injected faults in the session's parts (the probe's reproducers: ``Clock``, ``RegionStats`` or
``ProgressFile`` raising in ``Session.__init__``, ``Staging.close`` raising in ``stop()``) must
leave the training running and finishing; a bad argument (``batch_size="abc"``, ``1.5``, ``-5``,
``10**40``, ``region(None)``, ``sample_interval_s=nan``) is one short ValueError where it is
written, never a run.json that ``mgprof report`` refuses or a negative throughput.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import mgprof
from mgprof.collect.session import session as session_mod
from mgprof.collect.session import staging as staging_mod


def _train(prof: Any, steps: int = 4) -> float:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.tensor(0.0)
    for _ in range(steps):
        x = torch.randn(8, 4)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        prof.step(batch_size=8)
    return float(loss)


def _boom(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("injected fault")


@pytest.mark.parametrize("part", ["Clock", "RegionStats", "ProgressFile"])
def test_a_part_that_cannot_be_made_leaves_the_training_running(
    part: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(session_mod, part, _boom)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mgprof.profile(out=tmp_path, quiet=True, trace=False, sample=False) as prof:
            loss = _train(prof)
    assert math.isfinite(loss) and not prof.enabled
    assert not list(tmp_path.glob("*/run.json"))  # off, not half-written


def test_a_staging_close_that_raises_does_not_escape_the_with(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(staging_mod.Staging, "close", _boom)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with mgprof.profile(out=tmp_path, quiet=True, sample=False) as prof:
            loss = _train(prof, steps=6)
    assert math.isfinite(loss)
    assert list(tmp_path.glob("*/run.json"))  # the record was still written


@pytest.mark.parametrize("value", ["abc", 1.5, -5, 0, 10**40, True])
def test_a_batch_size_that_is_not_a_count_is_refused_at_the_call(
    value: object, tmp_path: Path
) -> None:
    with mgprof.profile(out=tmp_path, quiet=True, trace=False, sample=False) as prof:
        with pytest.raises(ValueError, match="batch_size must be"):
            prof.step(batch_size=value)  # type: ignore[arg-type]
        _train(prof, steps=3)  # the session goes on with good calls


def test_a_region_without_a_name_is_refused_at_the_with() -> None:
    for name in (None, "", "  "):
        with pytest.raises(ValueError, match="non-empty string"), mgprof.region(name):  # type: ignore[arg-type]
            pass


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf")])
def test_a_sample_interval_that_is_not_a_duration_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match="sample_interval_s"):
        mgprof.profile(sample_interval_s=value)
