"""The CUDA-event timing path, exercised on CPU with a stand-in for ``torch.cuda.Event``.

The stand-in keeps the semantics the session relies on: an event records a time, completes
in order (``query``), and gives elapsed milliseconds. It counts records and creations so the
cost of the step path (one record per step, pooled events) is checked, not assumed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import mgprof
from mgprof.collect.session import session as session_mod
from mgprof.collect.session import step_timer


class FakeEvent:
    created = 0
    records = 0
    queries = 0

    def __init__(self, enable_timing: bool = False) -> None:
        FakeEvent.created += 1
        self.t: float | None = None

    def record(self) -> None:
        FakeEvent.records += 1
        self.t = time.perf_counter()

    def query(self) -> bool:
        FakeEvent.queries += 1
        return self.t is not None

    def synchronize(self) -> None:
        assert self.t is not None

    def elapsed_time(self, other: FakeEvent) -> float:
        assert self.t is not None and other.t is not None
        return (other.t - self.t) * 1000.0


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> type[FakeEvent]:
    FakeEvent.created = FakeEvent.records = FakeEvent.queries = 0
    monkeypatch.setattr(step_timer.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(step_timer.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(session_mod.torch.cuda, "synchronize", lambda *a: None)
    # the session itself stays on CPU (no devices, memory or NVML); only its clock uses events
    monkeypatch.setattr(session_mod, "_cuda_indices_in_use", lambda strategy: [])

    class EventClock(step_timer.Clock):
        def __init__(self, use_cuda: bool) -> None:
            super().__init__(use_cuda=True)

    monkeypatch.setattr(session_mod, "Clock", EventClock)
    return FakeEvent


@pytest.mark.parametrize("form", ["ctx", "call"])
def test_event_timing_one_record_per_step_and_pooled(
    fake_cuda: type[FakeEvent], tmp_path: Path, form: str
) -> None:
    n = 150  # more than two resolve batches
    with mgprof.profile(out=tmp_path, trace=False, sample=False) as prof:
        for _ in range(n):
            if form == "ctx":
                with prof.step(batch_size=4):
                    time.sleep(0.0005)
            else:
                time.sleep(0.0005)
                prof.step(batch_size=4)
    steps = prof.record.steps
    assert [s.index for s in steps] == list(range(n))
    assert all(s.batch_size == 4 and 0.4 < s.duration_ms < 50 for s in steps)
    # the call form records one event per step (+1 at the start); the ``with`` form two
    # (entry and exit are different moments)
    assert fake_cuda.records <= (n + 2 if form == "call" else 2 * n + 2)
    # pooled: far fewer events created than recorded
    assert fake_cuda.created < fake_cuda.records / 2
    # completed steps are read in batches, not queried every step
    assert fake_cuda.queries < n / 4


def test_region_events_are_read_and_pooled(fake_cuda: type[FakeEvent], tmp_path: Path) -> None:
    n = 1000
    with mgprof.profile(out=tmp_path, trace=False, sample=False) as prof:
        for _ in range(n):
            with prof.step(batch_size=1), mgprof.region("fwd"):
                time.sleep(0.0001)
    region = prof.record.regions[0]
    assert region.name == "fwd" and region.count == n
    assert n * 0.05 < region.total_ms < n * 50
    # four marks a step; once the pool has filled, read events are reused
    assert fake_cuda.records <= 4 * n + 2
    assert fake_cuda.created < 0.5 * fake_cuda.records
