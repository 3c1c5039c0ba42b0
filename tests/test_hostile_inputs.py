"""Hostile and special input files stay cheap and fail in one line (exit 2, no traceback).

Decompression bombs, gigabytes of zeros, FIFOs, devices, deep nesting, out-of-range numbers,
unreadable files and dangerous ``--out`` targets, given to the real command line. Cases that
could hang or eat the machine if the protection regressed run in a subprocess under a memory cap
(``RLIMIT_AS``) and a timeout; the others run ``main([...])`` in-process.
"""

from __future__ import annotations

import ctypes
import gzip
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _data import TRACES
from _trace_events import ev

from mgprof.analyze.tracefile.load import load_trace
from mgprof.cli import main
from mgprof.records import RankRecord, RunRecord, StepRecord, encode_run

ROOT = Path(__file__).resolve().parents[1]
MTIA = TRACES / "peers" / "hta-mtia_trace_single_rank" / "mtia_rank_0.json.gz"
MIB = 1 << 20
GIB = 1 << 30
CAP_BYTES = GIB
"""Address-space cap for the subprocess cases: python + numpy + msgspec + rich take ~150 MiB
of address space (measured: VmPeak 148 MiB after the imports), so 1 GiB leaves room for the
bounded work and none for decompressing a 2 GiB bomb."""
TIMEOUT_S = 15
"""Bounded cases finish in well under a second (plus ~0.3 s of start-up); before the fix they
took minutes or never ended."""


# --- helpers ---------------------------------------------------------------------------------


def good_events(rank: int = 0) -> list[dict]:
    """A small, valid GPU trace: one step, one launch, one kernel, one NCCL kernel."""
    return [
        ev("ProfilerStep#1", "user_annotation", 0, 200, tid=1),
        ev("aten::mm", "cpu_op", 10, 50, tid=1, **{"External id": 5}),
        ev("cudaLaunchKernel", "cuda_runtime", 20, 5, tid=1, correlation=11),
        ev("gemm", "kernel", 30, 100, tid=7, correlation=11, **{"External id": 5}),
        ev("ncclDevKernel_AllReduce", "kernel", 140, 20, tid=9, correlation=12),
        ev("cudaLaunchKernel", "cuda_runtime", 100, 5, tid=1, correlation=12),
    ]


def write_trace(path: Path, events: list[dict] | None = None, rank: int = 0) -> Path:
    doc = {"distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": events}
    if events is None:
        doc["traceEvents"] = good_events(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def gzip_bomb(path: Path, head: bytes, fill: bytes, mib: int) -> Path:
    """``head`` then ``mib`` MiB of ``fill``: a valid multi-member gzip file (RFC 1952), ~1 KB
    per MiB, made in milliseconds by repeating one compressed MiB."""
    member = gzip.compress(fill * MIB, compresslevel=9)
    with open(path, "wb") as fh:
        fh.write(gzip.compress(head))
        for _ in range(mib):
            fh.write(member)
    return path


def sparse_file(path: Path, head: bytes, size: int) -> Path:
    """``head`` then zeros up to ``size`` bytes, without writing them (a sparse file)."""
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(size)
    return path


def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def write_run(folder: Path, traces: dict[int, list[str]] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    run = RunRecord(
        run_id="20250101T000000Z-train",
        world_size=2,
        strategy="ddp",
        backend="nccl",
        ranks=[
            RankRecord(
                rank=r,
                world_size=2,
                steps=[StepRecord(index=i, duration_ms=20.0) for i in range(3)],
                traces=(traces or {}).get(r, []),
            )
            for r in range(2)
        ],
    )
    (folder / "run.json").write_bytes(encode_run(run))
    return folder


def _drop_dac() -> None:
    """In the child: lose CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, so that file modes apply
    to root as well (prctl PR_CAPBSET_DROP; the exec then leaves them out of the caps)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def cli(
    *args: str,
    cap: int | None = CAP_BYTES,
    timeout: float = TIMEOUT_S,
    drop_dac: bool = False,
    env: dict[str, str] | None = None,
) -> tuple[int, str, str]:
    """``python -m mgprof ARGS`` in a subprocess under a memory cap and a timeout."""

    def pre() -> None:
        if cap is not None:
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        if drop_dac:
            _drop_dac()

    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MGPROF_MAX_")}
    full_env.update(PYTHONPATH=str(ROOT), **(env or {}))
    proc = subprocess.run(
        [sys.executable, "-m", "mgprof", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=pre,
        env=full_env,
        cwd=ROOT,
    )
    return proc.returncode, proc.stdout, proc.stderr


def one_line(stderr: str) -> str:
    """The single error line; fails on a traceback or on several lines."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def no_non_finite(text: str) -> Any:
    """Parse JSON, failing on NaN/Infinity (which json.loads would otherwise accept)."""

    def refuse(name: str) -> None:
        raise AssertionError(f"non-finite {name} in JSON output")

    return json.loads(text, parse_constant=refuse)


def can_deny_reads() -> bool:
    if os.geteuid() != 0:
        return True
    try:
        subprocess.run([sys.executable, "-c", "pass"], preexec_fn=_drop_dac, check=True)
    except (subprocess.CalledProcessError, OSError):
        return False
    return True


needs_denial = pytest.mark.skipif(
    not can_deny_reads(), reason="running as root and cannot drop CAP_DAC_OVERRIDE here"
)


# --- 1. size limits: bombs and gigabytes of zeros -------------------------------------------
def test_gzip_bomb_2gib_stops_at_the_ratio_limit(tmp_path: Path) -> None:
    bomb = gzip_bomb(tmp_path / "rank-0.json.gz", b'{"traceEvents": [', b" ", 2048)
    assert bomb.stat().st_size < 3 * MIB
    code, _, err = cli("trace", str(bomb))
    line = one_line(err)
    assert code == 2 and str(bomb) in line
    assert "expands more than 100x" in line and "--max-trace-size" in line


def test_gzip_bomb_without_the_key_stops_at_the_ratio_limit(tmp_path: Path) -> None:
    """No "traceEvents" key: the key search gives up and the whole-file read is bounded too."""
    bomb = gzip_bomb(tmp_path / "rank-0.json.gz", b'{"other": "', b"\0", 2048)
    code, _, err = cli("trace", str(bomb))
    line = one_line(err)
    assert code == 2 and str(bomb) in line and "expands more than 100x" in line


def test_single_member_gzip_bomb_stops(tmp_path: Path) -> None:
    bomb = tmp_path / "rank-0.json.gz"
    with gzip.GzipFile(bomb, "wb", compresslevel=1) as gz:
        gz.write(b'{"traceEvents": [')
        for _ in range(192):
            gz.write(b" " * MIB)
    code, _, err = cli("trace", str(bomb))
    assert code == 2 and "expands more than 100x" in one_line(err)


def test_raised_limit_lifts_the_ratio_check_and_stops_at_the_size(tmp_path: Path) -> None:
    bomb = gzip_bomb(tmp_path / "rank-0.json.gz", b'{"traceEvents": [', b" ", 2048)
    code, _, err = cli("trace", str(bomb), "--max-trace-size", "96M")
    line = one_line(err)
    assert code == 2 and str(bomb) in line and "past the 96 MiB limit" in line
    assert "--max-trace-size" in line
    code, _, err = cli("trace", str(bomb), env={"MGPROF_MAX_TRACE_BYTES": "80M"})
    assert code == 2 and "past the 80 MiB limit" in one_line(err)


def test_report_applies_the_trace_limits(tmp_path: Path) -> None:
    """``mgprof report`` reads a run's traces through the same loader: a bomb among them is
    named in the report, the rest of it still renders."""
    folder = write_run(tmp_path / "run", {0: ["traces/rank-0.json"], 1: ["traces/rank-1.json.gz"]})
    write_trace(folder / "traces" / "rank-0.json", rank=0)
    gzip_bomb(folder / "traces" / "rank-1.json.gz", b'{"traceEvents": [', b" ", 2048)
    code, out, err = cli("report", str(folder), "--format", "json")
    assert code == 0, err[-3000:]
    assert "rank-1.json.gz" in out and "expands more than 100x" in out
    code, out, err = cli("report", str(folder), "--format", "json", "--max-trace-size", "70M")
    assert code == 0 and "past the 70 MiB limit" in out


def test_uncompressed_trace_over_the_limit_is_refused_before_reading(tmp_path: Path) -> None:
    big = sparse_file(tmp_path / "rank-0.json", b'{"traceEvents": [', 3 * GIB)
    code, _, err = cli("trace", str(big), "--max-trace-size", "1G")
    line = one_line(err)
    assert code == 2 and "3 GiB, over the 1 GiB limit" in line and "--max-trace-size" in line


def test_gigabyte_of_zeros_is_refused_at_once(tmp_path: Path) -> None:
    zeros = sparse_file(tmp_path / "rank-0.json", b"", GIB)
    start = time.perf_counter()
    code, _, err = cli("trace", str(zeros))
    elapsed = time.perf_counter() - start
    line = one_line(err)
    assert code == 2 and str(zeros) in line and "not valid JSON" in line
    assert elapsed < 10, elapsed  # was 26.5 s for 256 MB, no answer for 1 GiB


def test_object_then_whitespace_past_the_key_search_is_linear(tmp_path: Path) -> None:
    """``{`` and 100 MiB of spaces: the key search stops at 64 MiB and the whole-document decode
    says what is wrong, in linear time."""
    p = tmp_path / "rank-0.json"
    with open(p, "wb") as fh:
        fh.write(b"{")
        for _ in range(100):
            fh.write(b" " * MIB)
    code, _, err = cli("trace", str(p))
    assert code == 2 and "not valid JSON" in one_line(err)


def test_bad_size_values_are_one_line(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "rank-0.json")
    code, _, err = cli("trace", str(trace), "--max-trace-size", "lots")
    assert code == 2 and "--max-trace-size" in one_line(err)
    code, _, err = cli("trace", str(trace), env={"MGPROF_MAX_TRACE_BYTES": "lots"})
    assert code == 2 and "MGPROF_MAX_TRACE_BYTES" in one_line(err)


def test_the_most_compressible_real_trace_passes_the_default_limits() -> None:
    """The largest fixture expands 29x to 87 MB (past the 64 MiB floor of the ratio check)."""
    assert load_trace(MTIA).n_events == 455739


def test_normal_trace_loads_the_same_under_the_limits(tmp_path: Path) -> None:
    for name, data in (
        ("rank-0.json", json.dumps({"traceEvents": good_events()}).encode()),
        ("rank-0.json.gz", gzip.compress(json.dumps({"traceEvents": good_events()}).encode())),
    ):
        p = tmp_path / name
        p.write_bytes(data)
        rt = load_trace(p)
        assert rt.n_events == 6 and rt.dev_start.size == 2 and rt.launch_corr.tolist() == [11, 12]


# --- 2. special files ------------------------------------------------------------------------
def test_fifo_trace_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "rank-0.json"
    os.mkfifo(fifo)
    code, _, err = cli("trace", str(fifo))
    line = one_line(err)
    assert code == 2 and str(fifo) in line and "is a FIFO" in line


def test_fifo_run_json_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "run.json")
    code, _, err = cli("report", str(tmp_path))
    line = one_line(err)
    assert code == 2 and "run.json" in line and "is a FIFO" in line
    code, _, err = cli("report", str(tmp_path / "run.json"))
    assert code == 2 and "is a FIFO" in one_line(err)


def test_run_json_symlink_to_dev_zero_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run.json").symlink_to("/dev/zero")
    code, _, err = cli("report", str(tmp_path))
    line = one_line(err)
    assert code == 2 and "is a character device" in line and "/dev/zero" in line
    code, _, err = cli("report", "/dev/zero")
    assert code == 2 and "is a character device" in one_line(err)


def test_trace_symlink_to_dev_zero_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "rank-0.json.gz"
    link.symlink_to("/dev/zero")
    code, _, err = cli("trace", str(link))
    assert code == 2 and "is a character device" in one_line(err)


@pytest.mark.parametrize("name", ["comparison.json", "sweep.json"])
def test_special_comparison_and_sweep_records_are_refused(tmp_path: Path, name: str) -> None:
    os.mkfifo(tmp_path / name)
    code, _, err = cli("report", str(tmp_path / name))
    assert code == 2 and "is a FIFO" in one_line(err)
    (tmp_path / name).unlink()
    (tmp_path / name).symlink_to("/dev/zero")
    code, _, err = cli("report", str(tmp_path / name))
    assert code == 2 and "is a character device" in one_line(err)


def test_oversized_run_json_is_refused_before_reading(tmp_path: Path) -> None:
    sparse_file(tmp_path / "run.json", b'{"schema_version": 1, ', 300 * MIB)
    code, _, err = cli("report", str(tmp_path))
    line = one_line(err)
    assert code == 2 and "over the 256 MiB limit" in line and "MGPROF_MAX_RECORD_BYTES" in line


def test_special_files_in_a_trace_folder_are_named_and_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_trace(tmp_path / "rank-0.json", rank=0)
    os.mkfifo(tmp_path / "rank-1.json")
    (tmp_path / "rank-2.json").symlink_to("/dev/zero")
    code, out, err = run_main(capsys, "trace", str(tmp_path), "--json", "--workers", "1")
    assert code == 0, err
    skipped = no_non_finite(out)["jobs"][0]["not_applicable"]["skipped_files"]
    assert "rank-1.json: is a FIFO" in skipped and "rank-2.json: is a character device" in skipped


def test_folder_of_only_special_files_says_what_it_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    os.mkfifo(tmp_path / "rank-0.json")
    code, _, err = run_main(capsys, "trace", str(tmp_path))
    assert code == 2 and "rank-0.json: is a FIFO" in one_line(err)


# --- 3. tracebacks that must be one line -----------------------------------------------------
def test_deeply_nested_trace_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = {
        "args.json": b'{"traceEvents": [{"ph": "X", "args": {"x": ' + deep(5000) + b"}}]}",
        "top.json": b'{"traceEvents": [], "x": ' + deep(100000) + b"}",
        "list.json": b'{"traceEvents": ' + deep(5000) + b"}",
    }
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        code, _, err = run_main(capsys, "trace", str(p))
        line = one_line(err)
        assert code == 2 and str(p) in line, line
        assert "nested too deeply" in line or "not a Kineto" in line, line


def test_deeply_nested_records_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("run.json", "comparison.json", "sweep.json"):
        folder = tmp_path / name.split(".")[0]
        folder.mkdir()
        (folder / name).write_bytes(b'{"schema_version": 1, "x": ' + deep(100000) + b"}")
        code, _, err = run_main(capsys, "report", str(folder / name))
        line = one_line(err)
        assert code == 2 and "nested too deeply" in line, line


def test_integers_beyond_64_bits_are_no_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    huge = 10**30
    events = good_events()
    events[2]["args"]["correlation"] = huge  # the launch
    events[3]["args"]["correlation"] = huge  # its kernel
    events[3]["args"]["External id"] = -huge
    events.append(ev("aten::addmm", "cpu_op", 60, 5, tid=1, **{"External id": huge}))
    p = write_trace(tmp_path / "rank-0.json", events)
    code, out, err = run_main(capsys, "trace", str(p), "--json")
    assert code == 0, err
    rank = no_non_finite(out)["jobs"][0]["ranks"][0]
    assert rank["device_events"] == 2
    assert rank["health"]["device_events_without_launch"] == 1  # the huge id is no id


def test_integer_too_long_to_decode_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "rank-0.json"
    text = json.dumps({"traceEvents": good_events()}).replace('"correlation": 11', "", 1)
    p.write_text(text.replace('"correlation": 12', '"correlation": ' + "9" * 5000, 1))
    code, _, err = run_main(capsys, "trace", str(p))
    assert code == 2 and str(p) in one_line(err)


def test_step_number_of_5000_digits_is_no_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = good_events()
    events.append(ev("ProfilerStep#" + "9" * 5000, "user_annotation", 300, 10, tid=1))
    events.append(ev("ProfilerStep#²", "user_annotation", 320, 10, tid=1))
    p = write_trace(tmp_path / "rank-0.json", events)
    code, out, err = run_main(capsys, "trace", str(p), "--json")
    assert code == 0, err
    assert [s["step"] for s in no_non_finite(out)["jobs"][0]["ranks"][0]["steps"]] == [1]


@pytest.mark.parametrize(
    ("field", "value"),
    [("dur", 1e308), ("ts", 1.7e308), ("ts", -1e308), ("ts", 10**400), ("dur", 10**30)],
)
def test_absurd_times_are_skipped_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: float
) -> None:
    events = good_events()
    bad = [ev("gemm", "kernel", 150, 10, tid=7), ev("aten::add", "cpu_op", 150, 10, tid=1)]
    for e in bad:
        e[field] = value
    events += bad
    p = write_trace(tmp_path / "rank-0.json", events)
    code, out, err = run_main(capsys, "trace", str(p), "--json")
    assert code == 0, err
    rank = no_non_finite(out)["jobs"][0]["ranks"][0]
    assert rank["device_events"] == 2 and rank["skipped_device_events"] == 1
    assert any("2 events with a ts beyond" in n for n in rank["health"]["notes"])


def test_absurd_flops_and_shapes_stay_finite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = good_events()
    events.append(ev("aten::mm", "cpu_op", 70, 5, tid=1, flops=1e308))
    events.append(ev("aten::mm", "cpu_op", 80, 5, tid=1, flops=1e308))
    events.append(
        ev(
            "aten::mm",
            "cpu_op",
            90,
            5,
            tid=2,
            **{"Input Dims": [[10**200, 10**200], [10**200, 10**200]]},
        )
    )
    p = write_trace(tmp_path / "rank-0.json", events)
    code, out, err = run_main(capsys, "trace", str(p), "--json")
    assert code == 0, err
    no_non_finite(out)


@needs_denial
def test_unreadable_trace_file_is_one_line(tmp_path: Path) -> None:
    p = write_trace(tmp_path / "rank-0.json")
    p.chmod(0)
    code, _, err = cli("trace", str(p), drop_dac=True)
    line = one_line(err)
    assert code == 2 and str(p) in line and "permission denied" in line


@needs_denial
def test_unreadable_folder_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    write_trace(folder / "rank-0.json")
    folder.chmod(0)
    try:
        code, _, err = cli("trace", str(folder), drop_dac=True)
        line = one_line(err)
        assert code == 2 and str(folder) in line and "permission denied" in line
    finally:
        folder.chmod(0o755)


@needs_denial
def test_unreadable_run_json_is_one_line(tmp_path: Path) -> None:
    write_run(tmp_path)
    (tmp_path / "run.json").chmod(0)
    code, _, err = cli("report", str(tmp_path), drop_dac=True)
    assert code == 2 and "permission denied" in one_line(err)


@needs_denial
@pytest.mark.parametrize("command", ["trace", "report"])
def test_out_into_a_read_only_folder_is_one_line(tmp_path: Path, command: str) -> None:
    src = write_trace(tmp_path / "rank-0.json") if command == "trace" else write_run(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    fmt = ["--json"] if command == "trace" else ["--format", "json"]
    try:
        code, _, err = cli(command, str(src), *fmt, "--out", str(ro / "x.json"), drop_dac=True)
    finally:
        ro.chmod(0o755)
    line = one_line(err)
    assert code == 2 and "not writable" in line and not (ro / "x.json").exists()


def _src(tmp_path: Path, command: str) -> tuple[Path, list[str]]:
    if command == "trace":
        return write_trace(tmp_path / "in" / "rank-0.json"), ["--json"]
    return write_run(tmp_path / "in"), ["--format", "json"]


@pytest.mark.parametrize("command", ["trace", "report"])
def test_out_onto_a_folder_with_force_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    src, fmt = _src(tmp_path, command)
    (tmp_path / "outdir").mkdir()
    code, _, err = run_main(
        capsys, command, str(src), *fmt, "--out", str(tmp_path / "outdir"), "--force"
    )
    assert code == 2 and "is a folder" in one_line(err)


@pytest.mark.parametrize("command", ["trace", "report"])
def test_out_under_a_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    src, fmt = _src(tmp_path, command)
    (tmp_path / "afile").write_text("x")
    out = tmp_path / "afile" / "sub" / "x.json"
    code, _, err = run_main(capsys, command, str(src), *fmt, "--out", str(out))
    assert code == 2 and "is a file, not a folder" in one_line(err)


@pytest.mark.parametrize("command", ["trace", "report"])
def test_failed_write_is_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    """A write that fails after the checks (disk full) is one line as well."""
    import mgprof.atomic

    def full(fd: int, data: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mgprof.atomic, "_write", full)
    src, fmt = _src(tmp_path, command)
    code, _, err = run_main(capsys, command, str(src), *fmt, "--out", str(tmp_path / "o.json"))
    assert code == 2 and "No space left" in one_line(err)
    assert not (tmp_path / "o.json").exists()


# --- 4. one bad rank file does not refuse the folder -----------------------------------------
BAD_FILES: dict[str, Callable[[Path], Any]] = {
    "truncated gzip": lambda p: p.with_name(p.name + ".gz").write_bytes(
        gzip.compress(b'{"traceEvents": []}' * 50)[:-10]
    ),
    "deep nesting": lambda p: p.write_bytes(b'{"traceEvents": ' + deep(5000) + b"}"),
    "zeros": lambda p: sparse_file(p, b"", 64 * MIB),
    "not a trace": lambda p: p.write_text('{"name": "package.json"}'),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_one_bad_rank_file_is_named_and_the_rest_analysed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    write_trace(tmp_path / "rank-0.json", rank=0)
    BAD_FILES[case](tmp_path / "rank-1.json")
    code, out, err = run_main(capsys, "trace", str(tmp_path), "--json", "--workers", "1")
    assert code == 0, err
    job = no_non_finite(out)["jobs"][0]
    assert [r["rank"] for r in job["ranks"]] == [0]
    assert "rank-1.json" in job["not_applicable"]["skipped_files"]


def test_bad_rank_files_in_worker_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_trace(tmp_path / "rank-0.json", rank=0)
    write_trace(tmp_path / "rank-1.json", rank=1)
    (tmp_path / "rank-2.json").write_bytes(b'{"traceEvents": ' + deep(5000) + b"}")
    code, out, err = run_main(capsys, "trace", str(tmp_path), "--json", "--workers", "2")
    assert code == 0, err
    job = no_non_finite(out)["jobs"][0]
    assert [r["rank"] for r in job["ranks"]] == [0, 1]
    assert "rank-2.json: JSON is nested too deeply" in job["not_applicable"]["skipped_files"]
    code, _, err = run_main(capsys, "trace", str(tmp_path))  # the terminal names it too
    assert code == 0


def test_no_readable_rank_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "rank-0.json").write_bytes(b"\0" * 10)
    (tmp_path / "rank-1.json").write_text("{}")
    code, _, err = run_main(capsys, "trace", str(tmp_path), "--workers", "1")
    line = one_line(err)
    assert code == 2 and "none of the 2 trace files could be read" in line
    assert "rank-0.json" in line and "rank-1.json" in line


@needs_denial
def test_unreadable_rank_file_is_named(tmp_path: Path) -> None:
    write_trace(tmp_path / "rank-0.json", rank=0)
    write_trace(tmp_path / "rank-1.json", rank=1).chmod(0)
    code, out, err = cli("trace", str(tmp_path), "--json", "--workers", "1", drop_dac=True)
    assert code == 0, err
    skipped = json.loads(out)["jobs"][0]["not_applicable"]["skipped_files"]
    assert "rank-1.json: permission denied" in skipped


# --- 5. --out must never replace an input ----------------------------------------------------
def test_trace_out_onto_its_input_is_refused_even_with_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = write_trace(tmp_path / "rank-0.json")
    before = p.read_bytes()
    code, _, err = run_main(capsys, "trace", str(p), "--out", str(p), "--force")
    assert code == 2 and "is the input" in one_line(err)
    code, _, err = run_main(capsys, "trace", str(tmp_path), "--out", str(p), "--force")
    assert code == 2 and "is the input" in one_line(err)
    (tmp_path / "link.json").symlink_to(p)
    code, _, err = run_main(
        capsys, "trace", str(p), "--out", str(tmp_path / "link.json"), "--force"
    )
    assert code == 2 and "is the input" in one_line(err)
    assert p.read_bytes() == before


def test_report_out_onto_its_inputs_is_refused_even_with_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_run(tmp_path / "run", {0: ["traces/rank-0.json"]})
    trace = write_trace(folder / "traces" / "rank-0.json")
    before = (folder / "run.json").read_bytes(), trace.read_bytes()
    for target in (folder / "run.json", trace):
        code, _, err = run_main(
            capsys, "report", str(folder), "--format", "json", "--out", str(target), "--force"
        )
        assert code == 2 and "is the input" in one_line(err)
    assert ((folder / "run.json").read_bytes(), trace.read_bytes()) == before
    out = tmp_path / "report.json"  # and an ordinary --out still works
    code, _, err = run_main(capsys, "report", str(folder), "--format", "json", "--out", str(out))
    assert code == 0 and out.is_file()


@needs_denial
@pytest.mark.parametrize("command", ["trace", "report"])
def test_path_inside_an_unsearchable_folder_is_one_line(tmp_path: Path, command: str) -> None:
    """stat() itself is denied: Path.exists()/is_dir() would raise PermissionError here."""
    closed = tmp_path / "closed"
    target = write_trace(closed / "rank-0.json") if command == "trace" else write_run(closed)
    closed.chmod(0)
    try:
        code, _, err = cli(command, str(target), drop_dac=True)
    finally:
        closed.chmod(0o755)
    assert code == 2 and "permission denied" in one_line(err)
