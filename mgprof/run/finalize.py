"""The end of a launch: the run record's final status, exit code and one-line failure.

``finalize`` merges what the ranks left in the run directory (the gathered run.json or per-rank
partials) with what the launcher knows (exit code, torchrun's failure lines, the stderr tail) and
writes run.json, then the run's timeline (``write_timeline``: every rank on one clock, for
Perfetto, which report.html links to); ``_failure`` builds the line naming the rank that failed
first, of what, and where its log is. The analysis and report files come after, in
``finish.py``.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import msgspec

from mgprof import rundir
from mgprof.collect.session.staging import recover_staged
from mgprof.errors import UsageError
from mgprof.records import RankExit, RunRecord, read_run
from mgprof.report.failure_summary import (
    NO_STEP,
    TRACEBACK_HEAD,
    exception_text,
    first_failure,
)
from mgprof.report.safe_text import printable
from mgprof.run.failures import (
    collective_of,
    collective_sites,
    describe_exit,
    describe_exits,
    last_meaningful,
    parse_torchrun_failures,
    shell_code,
    signal_name,
    stack_sites,
)
from mgprof.run.ranklog import LOGS_DIR


def finalize(
    run_dir: Path,
    initial: RunRecord,
    code: int,
    stderr_tail: list[str],
    interrupted: str | None,
    torchrun_lines: list[str] | None = None,
    *,
    straggler: str | None = None,
    lost: list[str] | None = None,
    steps_seen: dict[int, int] | None = None,
) -> RunRecord:
    """Merge what the ranks left (gathered run.json or per-rank partials) and set the status.

    ``interrupted`` names what stopped the launcher (``Ctrl-C``, ``SIGTERM``...), None when the
    script ended by itself; ``code`` is then 128 + that signal. The run's exit code is the
    script's own: the first failing rank's under torchrun (which itself only says 1), the
    process's otherwise; recorded as a shell reports it (killed by SIGKILL: 137), which is the
    code mgprof exits with. Traces a dead rank left
    in its staging folder are recovered first (``mgprof.collect.session.staging``).

    In a multi-node job the ranks send their records to rank 0, which may live on any node
    (c10d rendezvous assigns ranks by arrival): a node without rank 0 expects an empty run here,
    and only its exit code decides.

    ``straggler`` is the launcher's words for ranks it stopped because they ran on long after
    another rank ended (``mgprof.run.stragglers``): the run's error, with where each was.
    ``lost`` holds the ranks' lines about records they could not save and ``steps_seen`` the
    steps each rank reported in its progress file: a run whose records are missing after steps
    were made says its records were lost (a full disk), not that the script made no step.
    """
    try:
        run = read_run(run_dir)
    except UsageError:
        run = initial
    run = msgspec.structs.replace(run, world_size=initial.world_size)
    run = rundir.merge_ranks(run, rundir.read_partials(run_dir))
    for note in recover_staged(run_dir):
        print(f"mgprof: {printable(note)}", file=sys.stderr)
    satellite = initial.nnodes > 1 and not any(r.rank == 0 for r in run.ranks)
    rank_errors = [_rank_error(r.rank, r.error) for r in run.ranks if r.error]
    exits = parse_torchrun_failures(torchrun_lines or [], single_node=initial.nnodes == 1)
    # exit code 0 and no rank reported: the script never reached an optimizer step (it resumed
    # from a finished checkpoint, had no data...); no failure, and no "missing ranks" either
    nothing = code == 0 and not interrupted and not satellite and not run.ranks
    error = None
    errors = {r.rank: r.error for r in run.ranks if r.error}
    finished = rundir.take_finished(run_dir)
    exit_note = None
    if code != 0 and not interrupted:
        code = script_exit_code(code, exits, errors)
        exit_note = _teardown_note(code, exits, finished, errors, run)
    if interrupted:
        error = f"interrupted ({interrupted})"
    elif straggler is not None:
        error = straggler + _where_stopped(run_dir)
        exit_note = None
    elif exit_note is not None:
        pass  # every failed process had finished its script: the records are complete
    elif code != 0:
        error = _failure(code, exits, stderr_tail, errors, run_dir, initial.world_size)
    elif rank_errors:
        error = rank_errors[0]
    elif (
        not satellite
        and (nothing or run.missing_ranks)
        and (said := records_lost(lost, steps_seen, run))
    ):
        error = said
    elif nothing:
        error = f"{NO_STEP} (exit code 0)"
        run = msgspec.structs.replace(run, missing_ranks=[])
    if run.missing_ranks and not satellite and not interrupted:
        missing = f"no record from rank(s) {', '.join(map(str, run.missing_ranks))}"
        error = missing if error is None else f"{error}; {missing}"
    status = "complete" if error is None else "interrupted" if interrupted else "incomplete"
    run = msgspec.structs.replace(
        run,
        status=status,
        error=error,
        exit_code=shell_code(code),
        strategy=initial.strategy,
        world_size=initial.world_size,
        nnodes=initial.nnodes,
        backend=run.backend or initial.backend,
        cpu_fallback=initial.cpu_fallback,
        cpu_fallback_reason=initial.cpu_fallback_reason,
        script=initial.script,
        script_args=initial.script_args,
        rank_exits=exits,
        exit_note=exit_note,
    )
    try:
        rundir.write_run(run_dir, run)
    except OSError as exc:  # the folder went away or read-only mid-run: the script's result stands
        print(
            printable(
                f"mgprof: error: cannot write {run_dir / rundir.RUN_JSON}: {exc.strerror}; "
                "the run's record is lost, the script's own outputs and exit code are not"
            ),
            file=sys.stderr,
        )
    else:
        write_timeline(run_dir, run)
    return run


def records_lost(
    lost: list[str] | None, steps_seen: dict[int, int] | None, run: RunRecord
) -> str | None:
    """``the ranks' records were lost: could not save the records of ranks 0, 1 to
    RUN/run.json: No space left on device (ENOSPC); rank 0 made 8 optimizer steps, rank 1 made 8
    optimizer steps before that (free space and re-run)``: what the ranks said of the records
    they could not save, and the steps they reported, when a rank made steps whose record is not
    here; None when nothing says steps were made."""
    recorded = {r.rank for r in run.ranks}
    made = {r: n for r, n in sorted((steps_seen or {}).items()) if n > 0 and r not in recorded}
    said = [text for text in dict.fromkeys(_save_failure(line) for line in lost or []) if text]
    records = [text for text in said if " record" in text]
    said = records or said  # the records' loss says it all: the traces' went first
    if not made and not said:
        return None
    steps = ", ".join(
        f"rank {r} made {n} optimizer step{'s' if n != 1 else ''}" for r, n in made.items()
    )
    if not said:
        return (
            f"no record reached the run folder although {steps} (their progress files); the "
            "ranks' records were lost on the way (see logs/rank<N>.log)"
        )
    text = f"the ranks' records were lost: {'; '.join(said[:3])}"
    text = f"{text}; {steps} before that" if steps else text
    fixes = [f for line in lost or [] if (f := _fix_said(line))]
    return f"{text} ({fixes[0]})" if fixes else text


def _fix_said(line: str) -> str:
    """What the rank's line says to do: its last parenthesis (``free space and re-run``)."""
    text = line.rstrip()
    at = text.rfind("(")
    return text[at + 1 : -1] if text.endswith(")") and at >= 0 else ""


def _save_failure(line: str) -> str:
    """From a rank's ``... MgprofWarning: mgprof writer: OSError: could not save X to P: No space
    left on device; ...`` line: ``could not save X to P: No space left on device (ENOSPC)``."""
    at = line.find("could not save ")
    if at < 0:
        return ""
    text = line[at:].split("; ", 1)[0]
    for code, name in sorted(errno.errorcode.items()):
        if text.endswith(f": {os.strerror(code)}"):
            return f"{text} ({name})"
    return text


def write_timeline(run_dir: Path, run: RunRecord) -> None:
    """RUN/timeline.json.gz (every rank on one clock, ``mgprof timeline``), which report.html
    links to, when the run has a trace. It fails open: whatever goes wrong is one warning line
    and the run's result stands, since the timeline is a view derived from files that stay."""
    if not any(r.traces for r in run.ranks):
        return
    try:
        from mgprof.analyze.timeline.build import write_run_timeline

        done = write_run_timeline(run_dir)
    except Exception as exc:  # fail open: MemoryError, OSError, a bad trace, a bug
        print(
            printable(
                f"mgprof: warning: no timeline.json.gz ({type(exc).__name__}: {exc}); make it "
                f"with 'mgprof timeline {run_dir}'"
            ),
            file=sys.stderr,
        )
        return
    if isinstance(done, str):
        print(printable(f"mgprof: timeline.json.gz not written: {done}"), file=sys.stderr)


def _teardown_note(
    code: int, exits: list[RankExit], finished: set[int], errors: dict[int, str], run: RunRecord
) -> str | None:
    """Words for a failure that came after every failed process had finished its script (its
    record written), else None: interpreter teardown crashed, not the training."""
    if errors or run.missing_ranks or not finished:
        return None
    if not exits:  # one process (single, DataParallel): its own exit code
        if finished != {r.rank for r in run.ranks} or len(run.ranks) != 1:
            return None
        how = f"the process {signal_name(code) or f'exit code {code}'}"
    elif any(e.rank is None or e.rank not in finished for e in exits):
        return None
    else:
        how = ", ".join(
            f"rank {e.rank} {e.signal or f'exit code {e.exit_code}'}"
            for e in sorted(exits, key=lambda e: e.rank or 0)
        )
    return (
        f"{how} after the script had finished and mgprof's record was written: a crash in "
        "interpreter teardown (atexit handlers, C++ destructors; torch's gloo can abort there), "
        "not in the training; the run's figures are complete, and the exit code is the "
        "process's"
    )


def script_exit_code(code: int, exits: list[RankExit], errors: dict[int, str]) -> int:
    """The script's own exit code: torchrun exits 1 whatever its workers did, so under torchrun
    it is the exit code of the rank that failed first (its root cause, else the first rank it
    names); ``code`` itself when torchrun named none (one process, or torchrun's own failure)."""
    first = first_failure(exits, errors) if exits else None
    if first is None and exits:
        first = exits[0]  # multi-node: local ranks only, root cause first
    if first is not None and first.exit_code != 0:
        return first.exit_code
    return code


def _rank_error(rank: int, error: str) -> str:
    """``rank 0: RuntimeError: ... Timed out ... (in all_reduce)``: the exception (or the first
    line), and the collective the traceback failed in, since gloo's and NCCL's messages rarely
    name it."""
    return f"rank {rank}: {_exception(error)}"


def _exception(error: str) -> str:
    """``ValueError: bad batch (in all_reduce)`` from a rank's error text (its first line when
    it holds no traceback), with the collective it failed in, if any."""
    text = (exception_text(error) or error.strip().splitlines()[0]) if error.strip() else "?"
    collective = collective_of(error)
    return f"{text} (in {collective})" if collective else text


LOG_TAIL_BYTES = 64 * 1024
"""How much of the end of a rank's log is searched for its traceback."""


def _log_exception(log: Path) -> str | None:
    """The exception a rank's log ends with (a rank that failed before recording anything)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - LOG_TAIL_BYTES))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    start = text.rfind(TRACEBACK_HEAD)
    if start < 0 or exception_text(text[start:]) is None:
        return None
    return _exception(text[start:])  # the last traceback only: its collective, its exception


def _rank_said(
    rank: int, exit_code: int, errors: dict[int, str], run_dir: Path
) -> tuple[str | None, Path | None]:
    """What one rank died of (from its record, else from its log) and its log, if there."""
    log = run_dir / LOGS_DIR / f"rank{rank}.log"
    try:
        log_there = log.is_file()
    except OSError:
        log_there = False
    said = errors.get(rank)
    if said and exception_text(said):
        return _exception(said), log if log_there else None
    # no traceback recorded: the log's last one, unless a signal ended the rank (a traceback in
    # its log would then be an older, handled one)
    if log_there and 0 < exit_code < 128:
        found = _log_exception(log)
        if found:
            return found, log
    return None, log if log_there else None


def _where_stopped(run_dir: Path) -> str:
    """``; when stopped: rank 1 at hang.py:12 in <module>``: where each rank mgprof stopped
    was (its stack dump), so a rank that never arrived shows its own line; empty when none."""
    sites = stack_sites(run_dir)
    said = collective_sites(run_dir)
    text = f"; collectives (flight recorder): {said}" if said else ""
    if not sites:
        return text
    stopped = "; ".join(f"rank {r} {where}" for r, where in sorted(sites.items()))
    return f"{text}; when stopped: {stopped}"


def _failure(
    code: int,
    exits: list[RankExit],
    stderr_tail: list[str],
    errors: dict[int, str],
    run_dir: Path,
    world_size: int = 1,
) -> str:
    """One line on a failed launch: which rank failed first, of what, and where its log is::

        script exited with code 1: rank 1 failed first: ValueError: bad batch shape
        (log: runs/.../logs/rank1.log); then rank 0 exited with code 143 (SIGTERM)

    The first rank is torchrun's root cause unless that rank died of a peer's failure
    (``first_failure``); its exception comes from its record, else from its log.
    """
    if code < 0:
        head = f"script was killed by {signal_name(code) or f'signal {-code}'} (exit code {code})"
    else:
        head = f"script exited with code {code}"
    rank_lines = [f"rank {r}: {_exception(e)}" for r, e in sorted(errors.items())]
    timeouts = [e for e in rank_lines if "timed out" in e.lower() or "timeout" in e.lower()]
    hint = " (a rank stopped answering; raise --collective-timeout if it was only slow)"
    stopped = _where_stopped(run_dir)
    first = first_failure(exits, errors) if exits else None
    if first is not None and first.rank is not None:
        said, log = _rank_said(first.rank, first.exit_code, errors, run_dir)
        detail = f"rank {first.rank} failed first: {said}" if said else describe_exit(first)
        if log is not None:
            detail += f" (log: {log})"
        rest = [describe_exit(e) for e in exits if e is not first]
        if rest:
            detail += f"; then {', '.join(rest)}"
        if not said:
            others = timeouts or [e for e in rank_lines if "(in " in e]
            if others:
                detail += f"; {others[0]}"
        return f"{head}: {detail}{hint if timeouts else ''}{stopped}"
    if exits:  # multi-node: torchrun named local ranks only
        detail = describe_exits(exits)
        said_list = timeouts or [e for e in rank_lines if "(in " in e]
        if said_list:
            detail += f"; {said_list[0]}"
        return f"{head}: {detail}{hint if timeouts else ''}{stopped}"
    if world_size > 1 and signal_name(code) and (errors or not last_meaningful(stderr_tail)):
        # torchrun itself ended by a signal it did not turn into a failure summary, and the
        # ranks say how they ended (or nothing else does): not mgprof's stop (that is
        # "interrupted"), and torchrun's last lines would be its own banner, not the cause
        ranks = "; ".join(f"rank {r}: {e.splitlines()[0]}" for r, e in sorted(errors.items()))
        after = f"; then its ranks were stopped ({ranks})" if ranks else ""
        return (
            f"torchrun, which runs the ranks, was killed by {signal_name(code)} (exit code "
            f"{code}), not by mgprof: no rank reported a failure of its own{after}{stopped}"
        )
    if world_size == 1:  # one process: rank 0 is the script
        said, log = _rank_said(0, code, errors, run_dir)
        if said:
            return f"{head}: {said}" + (f" (log: {log})" if log is not None else "")
    last = last_meaningful(stderr_tail)
    return f"{head}: {last}" if last else head
