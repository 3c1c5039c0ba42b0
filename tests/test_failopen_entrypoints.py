"""Fail open at every entry point of the in-code API: a failure injected into mgprof's own path
(host name, process group, sampler, profiler, staging, clock, record writer, the hooks mgprof
puts into torch) costs a warning line, never the user's training: the loop runs to the end and
the model's final parameters are those of the same loop without mgprof.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import mgprof
from mgprof.collect import api as api_module
from mgprof.collect import failopen as failopen_module
from mgprof.collect import hooks
from mgprof.collect.devices import sampler as sampler_module
from mgprof.collect.failopen import FailOpen, MgprofWarning
from mgprof.collect.session import delivery as delivery_module
from mgprof.collect.session import session as session_module
from mgprof.collect.session.step_timer import Clock
from mgprof.collect.wrapping import wrap as wrap_module
from mgprof.collect.wrapping.nosync import NoSyncAB
from mgprof.records import read_run

STEPS = 6


def broken(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("injected failure")


Step = Callable[[torch.Tensor], contextlib.AbstractContextManager[Any]]


def train(
    step: Step | None = None, model: torch.nn.Module | None = None, device: str = "cpu"
) -> list[torch.Tensor]:
    """The user's loop: the same data and updates every time; ``step`` wraps each iteration."""
    torch.manual_seed(0)
    net = model if model is not None else torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x = torch.randn(4, 8, generator=gen).to(device)
        with step(x) if step is not None else contextlib.nullcontext():
            net(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    return [p.detach().clone() for p in net.parameters()]


def expected() -> list[torch.Tensor]:
    return train()


def same(got: list[torch.Tensor]) -> bool:
    want = expected()
    return len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


def lines(record: Any, part: str) -> list[str]:
    """The mgprof warning lines that name ``part``."""
    texts = [str(w.message) for w in record if issubclass(w.category, MgprofWarning)]
    return [t for t in texts if f"mgprof {part}:" in t]


def profiled(out: Path, **kwargs: Any) -> tuple[list[torch.Tensor], mgprof.Session]:
    """The loop under ``mgprof.profile`` (``with prof.step(x):``)."""
    kwargs.setdefault("sample", False)
    with mgprof.profile(out=out, name="entry", **kwargs) as prof:
        got = train(lambda x: prof.step(x))
    return got, prof


@pytest.fixture(autouse=True)
def _fast_and_isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    """No report files (a fresh process each), and a fresh process-wide FailOpen."""
    monkeypatch.setattr(session_module, "report_run", lambda run_dir, run, **kw: run)
    monkeypatch.setattr(failopen_module, "_process", FailOpen())
    for name in ("MGPROF_RUN_DIR", "MGPROF_BATCH_SIZE", "MGPROF_STRATEGY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def gloo_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A one-rank gloo process group in this process, destroyed afterwards."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# -- Session.start ----------------------------------------------------------------------------


def test_start_survives_a_host_name_that_cannot_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "gethostname", broken)
    with pytest.warns(MgprofWarning) as record:
        got, prof = profiled(tmp_path, trace=False)
    assert same(got)
    assert lines(record, "rank")
    rank = read_run(prof.run_dir).ranks[0]  # type: ignore[arg-type]
    assert rank.host == "unknown-host" and len(rank.steps) == STEPS
    assert any(w.startswith("rank: RuntimeError: injected failure") for w in rank.warnings)


def test_start_survives_a_process_group_whose_get_rank_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gloo_group: None
) -> None:
    monkeypatch.setattr(dist, "get_rank", broken)
    with pytest.warns(MgprofWarning) as record:
        got, prof = profiled(tmp_path, trace=False)
    assert same(got)
    assert lines(record, "rank")
    assert len(read_run(prof.run_dir).ranks[0].steps) == STEPS  # type: ignore[arg-type]


def test_start_survives_a_sampler_that_cannot_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sampler_module, "start_sampler", broken)
    with pytest.warns(MgprofWarning) as record:
        got, _ = profiled(tmp_path, trace=False, sample=True)
    assert same(got)
    assert lines(record, "sampler")


def test_start_survives_a_profiler_that_cannot_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_module, "build_profiler", broken)
    with pytest.warns(MgprofWarning) as record:
        got, prof = profiled(tmp_path, skip=1, warmup=1, active=2)
    assert same(got)
    assert lines(record, "profiler")
    assert read_run(prof.run_dir).ranks[0].traces == []  # type: ignore[arg-type]


def test_start_survives_a_staging_folder_that_cannot_be_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_module, "open_staging", broken)
    with pytest.warns(MgprofWarning) as record:
        got, prof = profiled(tmp_path, skip=1, warmup=1, active=2)
    assert same(got)
    assert lines(record, "staging")
    assert len(read_run(prof.run_dir).ranks[0].steps) == STEPS  # type: ignore[arg-type]


def test_start_survives_a_clock_that_fails_its_first_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device clock failing at the start (a CUDA event error): the host clock takes over."""

    class FirstMarkFails(Clock):
        failed = False

        def mark(self) -> Any:
            if not FirstMarkFails.failed:
                FirstMarkFails.failed = True
                raise RuntimeError("injected failure")
            return super().mark()

    monkeypatch.setattr(session_module, "Clock", FirstMarkFails)
    with pytest.warns(MgprofWarning) as record:
        got, prof = profiled(tmp_path, trace=False)
    assert same(got)
    assert lines(record, "timing")
    assert len(read_run(prof.run_dir).ranks[0].steps) == STEPS  # type: ignore[arg-type]


# -- steps, regions, decorator, __exit__ ------------------------------------------------------


def test_step_survives_a_batch_it_cannot_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_module, "batch_size_of", broken)
    with pytest.warns(MgprofWarning) as record:
        got, _ = profiled(tmp_path, trace=False)
    assert same(got)
    assert lines(record, "step")


def test_with_step_survives_a_failing_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_module.Session, "_enter_step", broken)
    with pytest.warns(MgprofWarning) as record:
        got, _ = profiled(tmp_path, trace=False)
    assert same(got)
    assert lines(record, "step")


def test_region_survives_a_clock_that_fails(tmp_path: Path) -> None:
    class Failing(Clock):
        def mark(self) -> Any:
            raise RuntimeError("injected failure")

    with (
        pytest.warns(MgprofWarning) as record,
        mgprof.profile(out=tmp_path, trace=False, sample=False) as prof,
    ):
        prof._clock = Failing(use_cuda=False)  # what every mark of this session now meets

        @contextlib.contextmanager
        def step(x: torch.Tensor) -> Iterator[None]:
            with mgprof.region("forward"):
                yield

        got = train(step)
    assert same(got)
    assert lines(record, "region")


def test_profile_step_runs_the_step_when_its_session_cannot_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(api_module, "lazy_session", broken)

    @mgprof.profile_step(trace=False, sample=False)
    def one_step(net: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
        net(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    torch.manual_seed(0)
    net = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    with pytest.warns(MgprofWarning) as record:
        for _ in range(STEPS):
            one_step(net, opt, torch.randn(4, 8, generator=gen))
    assert same([p.detach().clone() for p in net.parameters()])
    assert lines(record, "profile_step")


def test_exit_keeps_the_users_exception_when_its_message_cannot_be_read(tmp_path: Path) -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no message")

    err = Unprintable()
    with (
        pytest.raises(Unprintable) as caught,
        mgprof.profile(out=tmp_path, trace=False, sample=False) as prof,
    ):
        raise err
    assert caught.value is err
    run = read_run(prof.run_dir)  # type: ignore[arg-type]
    assert run.status == "incomplete" and (run.error or "").startswith("Unprintable:")


# -- stop: the record -------------------------------------------------------------------------


def test_stop_survives_a_record_writer_that_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("mgprof.rundir.write_run", full)
    with pytest.warns(MgprofWarning) as record:
        got, prof = profiled(tmp_path, trace=False)
    assert same(got)
    (line,) = lines(record, "writer")
    assert "could not save rank 0's record to" in line and "No space left on device" in line
    assert prof.record is not None and len(prof.record.steps) == STEPS


def test_stop_survives_device_facts_that_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(delivery_module, "device_info", broken)
    with pytest.warns(MgprofWarning) as record:
        got, prof = profiled(tmp_path, trace=False)
    assert same(got)
    assert lines(record, "device")
    rank = read_run(prof.run_dir).ranks[0]  # type: ignore[arg-type]
    assert rank.device.kind == ("cuda" if torch.cuda.is_available() else "cpu")
    assert len(rank.steps) == STEPS


# -- hooks mgprof installs in torch -----------------------------------------------------------


def test_dataloader_hook_survives_a_failing_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_module.Session, "add_dataloader_wait", broken)
    gen = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(STEPS * 4, 8, generator=gen))

    def loop() -> list[torch.Tensor]:
        torch.manual_seed(0)
        net = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for (x,) in torch.utils.data.DataLoader(data, batch_size=4):
            net(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        return [p.detach().clone() for p in net.parameters()]

    want = loop()
    with (
        pytest.warns(MgprofWarning) as record,
        mgprof.profile(out=tmp_path, trace=False, sample=False),
    ):
        got = loop()
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert lines(record, "dataloader hook")


def test_destroy_process_group_hook_still_destroys_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gloo_group: None
) -> None:
    monkeypatch.setattr(hooks, "_before_destroy", broken)
    with (
        pytest.warns(MgprofWarning) as record,
        mgprof.profile(out=tmp_path, trace=False, sample=False) as prof,
    ):
        got = train(lambda x: prof.step(x))
        dist.destroy_process_group()  # the script's own, through mgprof's hook
        assert not dist.is_initialized()
    assert same(got)
    assert lines(record, "destroy_process_group hook")


def test_init_process_group_hook_still_initialises_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hooks, "process_group_by_mgprof", broken)
    try:
        with (
            pytest.warns(MgprofWarning) as record,
            mgprof.profile(out=tmp_path, trace=False, sample=False) as prof,
        ):
            dist.init_process_group(  # the script's own, through mgprof's hook
                "gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1
            )
            assert dist.is_initialized()
            got = train(lambda x: prof.step(x))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    assert same(got)
    assert lines(record, "init_process_group hook")


def test_ddp_construction_hook_survives_a_failing_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gloo_group: None
) -> None:
    from torch.nn.parallel import DistributedDataParallel

    monkeypatch.setattr(hooks, "watch_wrapper", broken)
    with (
        pytest.warns(MgprofWarning) as record,
        mgprof.profile(out=tmp_path, trace=False, sample=False) as prof,
    ):
        torch.manual_seed(0)
        ddp = DistributedDataParallel(torch.nn.Linear(8, 2))
        got = train(lambda x: prof.step(x), model=ddp)
    assert same(got)  # one rank: DDP's averaged gradients are the plain ones
    assert lines(record, "DDP hook")


def test_optimizer_hook_of_the_bootstrap_survives_a_session_that_cannot_start_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mgprof analyze``'s automatic session starts inside the optimizer's step hook."""
    from mgprof.run.bootstrap import AutoInstrument

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(session_module, "_explicit_started", False)  # earlier tests' sessions
    monkeypatch.setattr(socket, "gethostname", broken)
    auto = AutoInstrument(warmup=0, steps=None, active=0)
    try:
        with pytest.warns(MgprofWarning) as record:
            auto.install()
            got = train()
            auto.finish()
    finally:
        for handle in auto._handles:
            handle.remove()
    assert same(got)
    assert lines(record, "rank")
    assert auto.session is not None and auto.session.record is not None
    assert len(auto.session.record.steps) == STEPS - 1  # step 0 runs from the first update


# -- mgprof.wrap, mgprof.batch_size, the sync A/B ---------------------------------------------


def test_wrap_survives_failing_facts_and_torchs_default_bucket_cap(
    monkeypatch: pytest.MonkeyPatch, gloo_group: None
) -> None:
    dev = str(mgprof.device())  # wrap puts the model there (a CUDA device where there is one)
    torch.manual_seed(0)
    want = train(model=torch.nn.Linear(8, 2).to(dev), device=dev)
    monkeypatch.setattr(hooks, "note_fact", broken)
    with pytest.warns(MgprofWarning) as record:
        torch.manual_seed(0)
        model = mgprof.wrap(torch.nn.Linear(8, 2), strategy="ddp", bucket_cap_mb=None)
        got = train(model=model, device=dev)
    assert all(torch.equal(a, b) for a, b in zip(got, want))  # one rank: DDP changes nothing
    assert lines(record, "wrap")


def test_batch_size_survives_failing_facts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks, "note_fact", broken)
    monkeypatch.setenv(wrap_module.BATCH_SIZE_ENV, "4")
    with pytest.warns(MgprofWarning) as record:
        assert mgprof.batch_size(64) == 4
    assert lines(record, "batch_size")


def test_sync_ab_that_fails_restores_the_model_and_never_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The A/B runs in the optimizer hook: a failure (here: its state snapshot, and a result
    that cannot be written) ends the A/B with the model as it was and gradient sync on."""
    import mgprof.collect.wrapping.nosync as nosync_module

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    before = [p.detach().clone() for p in model.parameters()]
    monkeypatch.setattr(wrap_module, "switchable_models", lambda: [model])
    monkeypatch.setattr(nosync_module, "_to_cpu", broken)
    blocked = tmp_path / "file"
    blocked.write_text("")
    ab = NoSyncAB(2, blocked / "run")  # under a regular file: the result cannot be written
    with pytest.warns(MgprofWarning) as record:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        assert ab.start([opt]) in (True, False)
        for _ in range(4):
            if not ab.active:
                break
            ab.on_update()
        ab.abandon()
    assert not ab.active and not wrap_module._skip_grad_sync
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))
    assert lines(record, "sync A/B")
    assert lines(record, "sync A/B result")


# -- the warning line itself ------------------------------------------------------------------


def test_warnings_as_errors_never_break_the_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -W error train.py``: mgprof's warning would be an exception in the loop; the
    line goes to stderr instead."""
    monkeypatch.setattr(session_module, "batch_size_of", broken)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got, _ = profiled(tmp_path, trace=False)
    assert same(got)
    err = capsys.readouterr().err
    assert "mgprof step: RuntimeError: injected failure (training continues)" in err


def test_ignored_warnings_still_print_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sampler_module, "start_sampler", broken)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, _ = profiled(tmp_path, trace=False, sample=True)
    assert same(got)
    assert "mgprof sampler: RuntimeError: injected failure" in capsys.readouterr().err


def test_module_level_report_reaches_the_running_sessions_record(tmp_path: Path) -> None:
    with (
        pytest.warns(MgprofWarning),
        mgprof.profile(out=tmp_path, trace=False, sample=False) as prof,
    ):
        failopen_module.report("some hook", RuntimeError("injected failure"))
    rank = read_run(prof.run_dir).ranks[0]  # type: ignore[arg-type]
    assert "some hook: RuntimeError: injected failure" in rank.warnings


def test_a_part_failing_on_every_batch_notes_a_bounded_number_of_failures() -> None:
    failopen = FailOpen()
    with pytest.warns(MgprofWarning) as record:
        for _ in range(1000):
            failopen.report("dataloader hook", RuntimeError("injected failure"))
    assert len(lines(record, "dataloader hook")) == 1
    assert len(failopen.notes) == FailOpen.NOTES_PER_PART + 1
    assert failopen.notes[-1] == "dataloader hook: failed again; further failures are not noted"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
