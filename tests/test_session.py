"""Single-process sessions for real: steps, schedule, trace file, regions, run directory."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch
from _spawn import clean_env, profiler_steps, python_args, read_trace, run, write_script

import mgprof
from mgprof.collect.session.session import FINGERPRINT_STEPS, Session
from mgprof.records import RunRecord, read_run

RUN_DIR_NAME = re.compile(r"\d{8}T\d{6}Z-(?P<stem>.+?)(-(?P<n>\d+))?")

MODEL = torch.nn.Linear(4, 2)


def work(x: torch.Tensor, i: int) -> None:
    """One iteration, named ``iter<i>`` in the trace so its step can be checked."""
    with torch.profiler.record_function(f"iter{i}"):
        MODEL(x).sum().backward()


def ctx_loop(prof: Session, batches: list[torch.Tensor]) -> None:
    for i, x in enumerate(batches):
        with prof.step(x):
            with mgprof.region("forward"):
                work(x, i)
            if i % 2 == 0:
                with mgprof.region("even"):
                    pass


def call_loop(prof: Session, batches: list[torch.Tensor]) -> None:
    for i, x in enumerate(batches):
        with mgprof.region("forward"):
            work(x, i)
        prof.step(batch=x)


def sized(*sizes: int) -> list[torch.Tensor]:
    return [torch.randn(n, 4) for n in sizes]


def run_of(prof: Session) -> RunRecord:
    assert prof.run_dir is not None
    return read_run(prof.run_dir)


def trace_files(prof: Session) -> list[Path]:
    assert prof.run_dir is not None
    folder = prof.run_dir / "traces"
    return sorted(folder.iterdir()) if folder.exists() else []


@pytest.mark.parametrize("form", ["ctx", "call"])
def test_steps_batch_sizes_schedule_regions_and_one_trace(tmp_path: Path, form: str) -> None:
    loop = ctx_loop if form == "ctx" else call_loop
    with mgprof.profile(out=tmp_path, name=form, skip=1, warmup=1, active=2, sample=False) as prof:
        loop(prof, sized(3, 4, 5, 6, 7, 8))

    rank = run_of(prof).ranks[0]
    assert [s.index for s in rank.steps] == [0, 1, 2, 3, 4, 5]
    assert [s.batch_size for s in rank.steps] == [3, 4, 5, 6, 7, 8]
    # skip 1 untouched step, warm up 1, record 2: steps 2 and 3 are in the trace
    assert [s.traced for s in rank.steps] == [False, False, True, True, False, False]
    assert all(s.duration_ms > 0 for s in rank.steps)

    regions = {r.name: r for r in rank.regions}
    assert regions["forward"].count == 6
    if form == "ctx":
        assert regions["even"].count == 3
    assert 0 < regions["forward"].max_ms <= regions["forward"].total_ms

    files = trace_files(prof)
    assert [f.name for f in files] == ["rank0.pt.trace.json.gz"]
    assert rank.traces == ["traces/rank0.pt.trace.json.gz"]
    trace = read_trace(files[0])  # gzip'd Chrome trace
    assert isinstance(trace["traceEvents"], list)
    assert sorted(profiler_steps(trace)) == [s.index for s in rank.steps if s.traced]


def iteration_steps(trace: dict) -> dict[int, list[int]]:
    """For each ``iter<i>`` event: the ProfilerStep numbers whose span holds it."""
    steps = profiler_steps(trace)
    found: dict[int, list[int]] = {}
    for ev in trace["traceEvents"]:
        name = ev.get("name", "")
        if ev.get("ph") == "X" and re.fullmatch(r"iter\d+", name):
            start, end = ev["ts"], ev["ts"] + ev["dur"]
            found[int(name[4:])] = [n for n, (a, b) in steps.items() if a <= start and end <= b]
    return found


@pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")
@pytest.mark.parametrize(
    "form",
    [
        "ctx",
        # the call form is known only at the second call: the profiler joins the schedule
        # there, so a window that starts earlier loses its first steps (honestly untraced)
        "call",
    ],
)
def test_trace_step_n_holds_iteration_n(tmp_path: Path, form: str) -> None:
    loop = ctx_loop if form == "ctx" else call_loop
    with mgprof.profile(out=tmp_path, name=form, skip=0, warmup=0, active=3, sample=False) as prof:
        loop(prof, sized(2, 2, 2, 2, 2))
    trace = read_trace(trace_files(prof)[0])
    traced = [s.index for s in run_of(prof).ranks[0].steps if s.traced]
    expected = [0, 1, 2] if form == "ctx" else [2]
    assert traced == expected
    assert iteration_steps(trace) == {i: [i] for i in expected}


def test_trace_holds_only_recorded_steps_when_window_is_open_at_stop(tmp_path: Path) -> None:
    with mgprof.profile(
        out=tmp_path, name="open", skip=1, warmup=1, active=5, sample=False
    ) as prof:
        ctx_loop(prof, sized(2, 2, 2, 2))
        time.sleep(0.05)  # after the loop: not a step
    rank = run_of(prof).ranks[0]
    assert [s.traced for s in rank.steps] == [False, False, True, True]
    files = trace_files(prof)
    assert len(files) == 1
    assert sorted(profiler_steps(read_trace(files[0]))) == [2, 3]


def test_trace_false_writes_no_trace(tmp_path: Path) -> None:
    with mgprof.profile(out=tmp_path, name="notrace", trace=False, sample=False) as prof:
        ctx_loop(prof, sized(2, 2, 2, 2))
    rank = run_of(prof).ranks[0]
    assert len(rank.steps) == 4
    assert not any(s.traced for s in rank.steps)
    assert rank.traces == []
    assert trace_files(prof) == []
    assert not list(tmp_path.rglob("*.pt.trace.json*"))


def test_explicit_batch_size_wins_and_no_batch_means_no_fingerprint(tmp_path: Path) -> None:
    with mgprof.profile(out=tmp_path, name="explicit", trace=False, sample=False) as prof:
        for _ in range(3):
            prof.step(batch_size=32)
        prof.step(batch=torch.zeros(7, 3), batch_size=5)
        prof.step(batch={"ids": [torch.zeros(9, 2)], "label": torch.zeros(1)})
    steps = run_of(prof).ranks[0].steps
    assert [s.batch_size for s in steps] == [32, 32, 32, 5, 9]
    assert [s.fingerprint is None for s in steps] == [True, True, True, False, False]


def test_run_json_decodes_and_describes_the_run(tmp_path: Path) -> None:
    with mgprof.profile(out=tmp_path, name="decode", trace=False) as prof:
        ctx_loop(prof, sized(2, 2, 2))
    assert prof.run_dir is not None
    run = read_run(prof.run_dir)
    assert read_run(prof.run_dir / "run.json") == run
    assert run.run_id == prof.run_dir.name
    assert (run.world_size, run.status, run.strategy, run.error) == (1, "complete", "single", None)
    assert run.missing_ranks == []
    assert run.cpu_fallback is True
    rank = run.ranks[0]
    assert (rank.rank, rank.world_size, rank.device.kind, rank.warnings) == (0, 1, "cpu", [])
    assert rank.memory is not None and rank.memory.kind == "cpu"
    # the CPU sampler ran and its series was written next to run.json
    assert rank.sampler.kind == "cpu"
    assert (prof.run_dir / "samples" / "rank0.csv").is_file()


def test_run_dirs_are_named_by_time_and_never_reused(tmp_path: Path) -> None:
    made = []
    for n in (3, 4):
        with mgprof.profile(out=tmp_path, name="same name!", trace=False, sample=False) as prof:
            ctx_loop(prof, sized(*[2] * n))
        made.append(prof.run_dir)
    assert made[0] != made[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in made if p)
    for path, n in zip(made, (3, 4)):
        assert path is not None
        match = RUN_DIR_NAME.fullmatch(path.name)
        assert match and match["stem"] == "same-name"
        assert len(read_run(path).ranks[0].steps) == n


def test_run_dir_env_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fixed = tmp_path / "from-env"
    monkeypatch.setenv("MGPROF_RUN_DIR", str(fixed))
    with mgprof.profile(out=tmp_path / "ignored", name="env", trace=False, sample=False) as prof:
        ctx_loop(prof, sized(2, 2))
    assert prof.run_dir == fixed
    assert len(read_run(fixed).ranks[0].steps) == 2
    assert not (tmp_path / "ignored").exists()


@pytest.mark.parametrize("form", ["ctx", "call"])
def test_fingerprints_tell_batches_apart_for_the_first_steps_only(
    tmp_path: Path, form: str
) -> None:
    same = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    batches = [same.clone(), same.clone(), same + 1, *sized(*[3] * 9)]
    loop = ctx_loop if form == "ctx" else call_loop
    with mgprof.profile(out=tmp_path, name=form, trace=False, sample=False) as prof:
        loop(prof, batches)
    fps = [s.fingerprint for s in run_of(prof).ranks[0].steps]
    assert len(fps) == 12
    assert fps[0] == fps[1]
    assert fps[2] != fps[0]
    assert len(set(fps[:FINGERPRINT_STEPS])) == FINGERPRINT_STEPS - 1
    assert all(fps[:FINGERPRINT_STEPS]) and fps[FINGERPRINT_STEPS:] == [None] * 4


def test_fingerprint_is_taken_before_the_batch_changes_in_place(tmp_path: Path) -> None:
    original = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    with mgprof.profile(out=tmp_path, name="inplace", trace=False, sample=False) as prof:
        for _ in range(2):
            x = original.clone()
            with prof.step(x):
                x.mul_(-1)  # the step's work changes its batch
    fps = [s.fingerprint for s in run_of(prof).ranks[0].steps]
    assert fps[0] == fps[1] is not None


def test_profile_step_decorator_writes_the_run_at_exit(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        "deco_train.py",
        """
        import torch
        import mgprof

        model = torch.nn.Linear(4, 2)

        @mgprof.profile_step(out="runs", name="deco", skip=0, warmup=1, active=2, sample=False)
        def train_step(x, scale=1.0):
            (model(x) * scale).sum().backward()

        for n in (5, 6, 7, 8, 9):
            train_step(torch.randn(n, 4), scale=0.5)
        print("loop done")
        """,
    )
    result = run(python_args(script), cwd=tmp_path, env=clean_env())
    assert result.returncode == 0, result.explain()
    assert "loop done" in result.stdout
    (run_dir,) = list((tmp_path / "runs").iterdir())
    assert RUN_DIR_NAME.fullmatch(run_dir.name)
    run_record = read_run(run_dir)
    assert run_record.status == "complete"
    steps = run_record.ranks[0].steps
    assert [s.batch_size for s in steps] == [5, 6, 7, 8, 9]
    assert [s.traced for s in steps] == [False, True, True, False, False]
    assert [p.name for p in (run_dir / "traces").iterdir()] == ["rank0.pt.trace.json.gz"]
    assert sorted(profiler_steps(read_trace(run_dir / "traces" / "rank0.pt.trace.json.gz"))) == [
        1,
        2,
    ]
