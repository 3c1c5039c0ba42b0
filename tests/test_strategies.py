"""``mgprof.wrap`` and friends on CPU; the analysis side imports without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _spawn import clean_env

import mgprof
from mgprof.collect.wrapping.wrap import chosen_strategy


@pytest.fixture(autouse=True)
def _no_launcher_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MGPROF_STRATEGY", "MGPROF_BATCH_SIZE", "WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def test_strategy_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    assert chosen_strategy() == "single"
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert chosen_strategy() == "ddp"
    monkeypatch.setenv("MGPROF_STRATEGY", "dp")
    assert chosen_strategy() == "dp"
    assert chosen_strategy("single") == "single"
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("MGPROF_STRATEGY")
    assert chosen_strategy() == "single"


@pytest.mark.parametrize("bad", ["zero3", "DDP", "data-parallel"])
def test_invalid_strategy_is_a_value_error(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    with pytest.raises(ValueError, match="single, dp, ddp, fsdp, fsdp-noreshard"):
        chosen_strategy(bad)
    monkeypatch.setenv("MGPROF_STRATEGY", bad)
    with pytest.raises(ValueError, match=repr(bad)):
        chosen_strategy()
    with pytest.raises(ValueError):
        mgprof.wrap(torch.nn.Linear(2, 2))


def test_dp_on_cpu_warns_and_returns_the_model_unchanged() -> None:
    model = torch.nn.Linear(3, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.warns(RuntimeWarning, match="DataParallel needs CUDA"):
        wrapped = mgprof.wrap(model, strategy="dp")
    assert wrapped is model
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_single_returns_a_module_on_cpu() -> None:
    wrapped = mgprof.wrap(torch.nn.Linear(3, 2), strategy="single")
    assert isinstance(wrapped, torch.nn.Linear)
    assert {p.device.type for p in wrapped.parameters()} == {"cpu"}
    assert wrapped(torch.zeros(1, 3)).shape == (1, 2)


def test_ddp_without_a_launcher_says_how_to_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(RuntimeError, match="torchrun"):
        mgprof.wrap(torch.nn.Linear(2, 2), strategy="ddp")


def test_device_is_cpu_here() -> None:
    assert mgprof.device() == torch.device("cpu")


def test_batch_size_default_and_launcher_value(monkeypatch: pytest.MonkeyPatch) -> None:
    assert mgprof.batch_size(64) == 64
    monkeypatch.setenv("MGPROF_BATCH_SIZE", "128")
    assert mgprof.batch_size(64) == 128


@pytest.mark.parametrize("junk", ["abc", "", "1.5", "0", "-4"])
def test_batch_size_rejects_junk(monkeypatch: pytest.MonkeyPatch, junk: str) -> None:
    monkeypatch.setenv("MGPROF_BATCH_SIZE", junk)
    with pytest.raises(ValueError, match="MGPROF_BATCH_SIZE"):
        mgprof.batch_size(64)


def test_seed_everything_without_a_group_uses_rank_env(monkeypatch: pytest.MonkeyPatch) -> None:
    state = torch.random.get_rng_state()
    try:
        monkeypatch.setenv("RANK", "3")
        assert mgprof.seed_everything(10) == 13
        a = torch.rand(3)
        assert mgprof.seed_everything(10, per_rank=False) == 10
        assert mgprof.seed_everything(13, per_rank=False) == 13
        assert torch.equal(torch.rand(3), a)
    finally:
        torch.random.set_rng_state(state)


def test_analysis_and_records_import_without_torch(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "sys.modules['pynvml'] = None\n"
        "import mgprof.analyze.run.analysis, mgprof.records, mgprof.rundir\n"
        "import mgprof\n"
        "assert mgprof.read_run is mgprof.records.read_run\n"
        "print('torch-free ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "torch-free ok"
