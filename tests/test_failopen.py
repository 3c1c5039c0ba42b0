"""Fail open: a broken part of mgprof costs one warning and a note, never the training."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import mgprof
from mgprof.collect.devices import sampler as sampler_module
from mgprof.collect.failopen import FailOpen, MgprofWarning
from mgprof.collect.session import session as session_module
from mgprof.collect.torch_profiler import TraceWriter
from mgprof.records import read_run

STEPS = 5
MODEL = torch.nn.Linear(4, 2)


def broken(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("injected failure")


def train(out: Path, **kwargs: Any) -> tuple[mgprof.Session, int]:
    """A small training loop under a session; returns the session and the steps it ran."""
    done = 0
    with mgprof.profile(out=out, name="failopen", **kwargs) as prof:
        for _ in range(STEPS):
            x = torch.randn(3, 4)
            with prof.step(x):
                MODEL(x).sum().backward()
            done += 1
    return prof, done


def mgprof_warnings(record: Any) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, MgprofWarning)]


def test_sampler_that_cannot_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_module, "start_sampler", broken)
    with pytest.warns(MgprofWarning) as record:
        prof, done = train(tmp_path, trace=False, sample=True)
    assert done == STEPS
    assert len(mgprof_warnings(record)) == 1
    assert "sampler" in mgprof_warnings(record)[0]
    rank = read_run(prof.run_dir).ranks[0]  # type: ignore[arg-type]
    assert len(rank.steps) == STEPS
    assert rank.warnings == ["sampler: RuntimeError: injected failure"]
    assert rank.sampler.kind == "none"


def test_trace_export_that_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TraceWriter, "__call__", broken)
    with pytest.warns(MgprofWarning) as record:
        prof, done = train(tmp_path, skip=1, warmup=1, active=2, sample=False)
    assert done == STEPS
    assert len(mgprof_warnings(record)) == 1
    rank = read_run(prof.run_dir).ranks[0]  # type: ignore[arg-type]
    assert len(rank.steps) == STEPS
    assert rank.warnings and all(w.startswith("profiler: ") for w in rank.warnings)
    assert rank.traces == []
    assert not list(tmp_path.rglob("*.pt.trace.json*"))


def test_trace_export_that_fails_at_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The window still open when the loop ends: the export runs inside ``stop``."""
    monkeypatch.setattr(TraceWriter, "__call__", broken)
    with pytest.warns(MgprofWarning) as record:
        prof, done = train(tmp_path, skip=1, warmup=1, active=10, sample=False)
    assert done == STEPS
    assert len(mgprof_warnings(record)) == 1
    rank = read_run(prof.run_dir).ranks[0]  # type: ignore[arg-type]
    assert len(rank.steps) == STEPS
    assert rank.warnings == ["profiler: RuntimeError: injected failure"]


def test_run_dir_writer_that_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("mgprof.rundir.write_run", broken)
    with pytest.warns(MgprofWarning) as record:
        prof, done = train(tmp_path, trace=False, sample=False)
    assert done == STEPS
    messages = mgprof_warnings(record)
    assert len(messages) == 1 and "writer" in messages[0]
    assert prof.run_dir is not None and not (prof.run_dir / "run.json").exists()
    assert prof.record is not None and len(prof.record.steps) == STEPS
    assert prof.failopen.notes == ["writer: RuntimeError: injected failure"]


def test_memory_collection_that_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_module, "collect_memory", broken)
    with pytest.warns(MgprofWarning) as record:
        prof, done = train(tmp_path, trace=False, sample=False)
    assert done == STEPS
    assert len(mgprof_warnings(record)) == 1
    rank = read_run(prof.run_dir).ranks[0]  # type: ignore[arg-type]
    assert rank.memory is None
    assert rank.warnings == ["memory: RuntimeError: injected failure"]
    assert len(rank.steps) == STEPS


def test_two_failing_parts_warn_once_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_module, "start_sampler", broken)
    monkeypatch.setattr(session_module, "collect_memory", broken)
    with pytest.warns(MgprofWarning) as record:
        prof, done = train(tmp_path, trace=False, sample=True)
    assert done == STEPS
    parts = sorted(m.split()[1] for m in mgprof_warnings(record))
    assert parts == ["memory:", "sampler:"]
    rank = read_run(prof.run_dir).ranks[0]  # type: ignore[arg-type]
    assert sorted(w.split(":")[0] for w in rank.warnings) == ["memory", "sampler"]


def test_failopen_warns_once_per_part_but_notes_every_failure() -> None:
    failopen = FailOpen()
    with pytest.warns(MgprofWarning) as record:
        for _ in range(3):
            with failopen.guard("step"):
                raise ValueError("bad")
    assert len(mgprof_warnings(record)) == 1
    assert failopen.notes == ["step: ValueError: bad"] * 3
    with pytest.raises(KeyboardInterrupt), failopen.guard("step"):
        raise KeyboardInterrupt


def test_second_session_is_disabled_and_the_first_still_records(tmp_path: Path) -> None:
    with (
        pytest.warns(MgprofWarning) as record,
        mgprof.profile(out=tmp_path, name="outer", trace=False, sample=False) as outer,
        mgprof.profile(out=tmp_path, name="inner", trace=False, sample=False) as inner,
    ):
        for _ in range(3):
            x = torch.randn(2, 4)
            with inner.step(x), outer.step(x):
                MODEL(x).sum().backward()
    messages = mgprof_warnings(record)
    assert len(messages) == 1 and "already running" in messages[0]
    assert inner.enabled is False and inner.run_dir is None
    assert outer.run_dir is not None and [p.name for p in tmp_path.iterdir()] == [
        outer.run_dir.name
    ]
    rank = read_run(outer.run_dir).ranks[0]
    assert len(rank.steps) == 3
    assert rank.warnings == []


def test_user_exception_propagates_and_run_is_incomplete(tmp_path: Path) -> None:
    err = KeyError("missing column")
    with warnings.catch_warnings():
        warnings.simplefilter("error", MgprofWarning)  # the user's error is not mgprof's
        with (
            pytest.raises(KeyError) as caught,
            mgprof.profile(out=tmp_path, name="crash", trace=False, sample=False) as prof,
        ):
            for i in range(4):
                with prof.step(torch.zeros(2, 4)):
                    if i == 2:
                        raise err
    assert caught.value is err
    assert prof.run_dir is not None
    run = read_run(prof.run_dir)
    assert run.status == "incomplete"
    assert run.error == "KeyError: 'missing column'"
    assert run.ranks[0].error == run.error
    assert [s.index for s in run.ranks[0].steps] == [0, 1, 2]
