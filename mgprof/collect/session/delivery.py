"""The end of a session on each rank: build its ``RankRecord``, send it with its trace files to
rank 0 over the job's process group (or write it directly when there is none), and on rank 0
write the run directory: traces, samples and run.json.

Split from ``session.py`` as a mixin of ``Session``: these steps run once, at ``stop``, and
read the state the session gathered while the training ran (its steps, regions, trace writer,
rank); the session keeps its lifecycle and its timing (with ``steps``). The attributes declared
below are the session's, set in ``Session.__init__`` and ``Session.start``.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
import torch

from mgprof import rundir
from mgprof.atomic import write_bytes_atomic
from mgprof.collect import hooks
from mgprof.collect.devices.device_facts import device_info, guess_strategy, record_versions
from mgprof.collect.devices.memory_history import MemoryHistory
from mgprof.collect.distenv import RankInfo, env_rank_info, gather_bytes_to_rank0, group_ready
from mgprof.collect.failopen import FailOpen
from mgprof.collect.session.region_stats import RegionStats
from mgprof.collect.session.staging import Staging
from mgprof.collect.torch_profiler import TraceWriter
from mgprof.records import (
    DeviceInfo,
    MemoryRecord,
    RankRecord,
    RunRecord,
    SamplerRecord,
    StepRecord,
    TrainingFacts,
)


class RankPayload(msgspec.Struct):
    """What a rank sends to rank 0: its record and its trace files' bytes."""

    record: RankRecord
    traces: dict[str, bytes]
    memory: dict[str, bytes] = msgspec.field(default_factory=dict)
    """Allocator snapshots (``--memory`` on CUDA): file name -> JSON bytes."""


NOT_FINALISED = (
    "the launcher has not recorded how this run ended (it was stopped, or could not write "
    "run.json); the ranks' measurements are as rank 0 saved them"
)
"""run.json's error while the launcher's final update is pending: a run directory the launcher
never finalised (a full disk, a killed launcher) then never stays ``running``."""

_FIXES = {
    errno.ENOSPC: "free space and re-run",
    errno.EDQUOT: "free space (disk quota exceeded) and re-run",
    errno.EFBIG: "raise the file size limit (ulimit -f) and re-run",
    errno.EROFS: "pass a writable output folder and re-run",
    errno.EACCES: "pass a writable output folder and re-run",
    errno.EPERM: "pass a writable output folder and re-run",
}


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    try:
        return str(exc) or type(exc).__name__
    except Exception:
        return type(exc).__name__


def _fix(exc: BaseException) -> str:
    errno_ = exc.errno if isinstance(exc, OSError) else None
    return _FIXES.get(errno_ or 0, "check the output folder and re-run")


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


def _whose(records: list[RankRecord]) -> str:
    ranks = sorted(r.rank for r in records)
    if len(ranks) == 1:
        return f"rank {ranks[0]}'s record"
    return f"the records of ranks {', '.join(map(str, ranks))}"


class DeliveryMixin:
    """``Session``'s end: the record, the gather to rank 0 and the run directory.

    Writing order, for a disk that fills while the training runs: the staging folder's reserve
    is freed, then the small record (run.json, or the rank's partial record) is written first,
    then the large files (traces, samples), then the record once more with the files that were
    saved. A full disk then costs the traces before it costs the measurements, and a write that
    fails says what was lost and where, in one line, while the training's result stands.
    """

    out: str | os.PathLike[str] | None
    name: str | None
    strategy: str | None
    auto: bool
    failopen: FailOpen
    run_dir: Path | None
    _info: RankInfo | None
    _mode: str | None
    _done_steps: list[StepRecord]
    _region_stats: RegionStats
    _cuda_indices: list[int]
    _writer: TraceWriter | None
    _staging: Staging | None
    _memory: MemoryHistory | None

    def _rank_info(self) -> RankInfo:
        return self._info if self._info is not None else env_rank_info()

    def _save_failed(self, what: str, path: Path | str, exc: BaseException, lost: str) -> None:
        """One line on stderr (and a note) for a file that could not be written."""
        self.failopen.report(
            "writer",
            exc,
            message=f"could not save {what} to {path}: {_reason(exc)}; {lost} ({_fix(exc)})",
            loud=True,
        )

    def _build_record(
        self, sampler: SamplerRecord, memory: MemoryRecord | None, error: str | None
    ) -> RankRecord:
        info = self._rank_info()
        regions = self._region_stats.records()
        strategy = self.strategy or os.environ.get("MGPROF_STRATEGY") or guess_strategy(info)
        backend = None
        with self.failopen.guard("backend"):
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                backend = str(torch.distributed.get_backend())
        device = DeviceInfo(kind="cuda" if self._cuda_indices else "cpu")
        with self.failopen.guard("device"):
            device = device_info(self._cuda_indices)
        training = TrainingFacts()
        with self.failopen.guard("hooks"):
            training = hooks.training_facts()
        versions: dict[str, str | None] = {}
        with self.failopen.guard("versions"):
            versions = record_versions()
        return RankRecord(
            rank=info.rank,
            world_size=info.world_size,
            local_rank=info.local_rank,
            host=info.host,
            pid=os.getpid(),
            strategy=strategy,
            backend=backend,
            device=device,
            devices_used=max(1, len(self._cuda_indices)),
            steps=self._done_steps,
            step_form="auto" if self.auto else ("with" if self._mode == "ctx" else "call"),
            regions=regions,
            sampler=sampler,
            memory=memory,
            training=training,
            versions=versions,
            warnings=list(self.failopen.notes),
            error=error,
        )

    def _trace_files(self) -> dict[str, bytes]:
        files: dict[str, bytes] = {}
        if self._writer is None:
            return files
        for path in self._writer.written:
            with self.failopen.guard("traces"):
                files[path.name] = path.read_bytes()
        return files

    def _group_ready(self) -> bool:
        try:
            return group_ready()
        except Exception as exc:  # a broken process group: deliver without it
            self.failopen.report("gather", exc)
            return False

    def _memory_files(self, rank: int) -> dict[str, bytes]:
        history = self._memory
        if history is None:
            return {}
        return {f"rank{rank}.{why}.json": data for why, data in history.snapshots.items()}

    def _deliver(self, record: RankRecord) -> RunRecord | None:
        """Gather to rank 0 over the process group when there is one; else write directly."""
        traces = self._trace_files()
        payload = RankPayload(record=record, traces=traces, memory=self._memory_files(record.rank))
        if self._group_ready() and record.error is None:
            # a failing rank must not enter a collective its healthy peers will never join
            try:
                gathered = gather_bytes_to_rank0(msgspec.msgpack.encode(payload))
            except Exception as exc:
                self.failopen.report("gather", exc)
                record.warnings.append(self.failopen.notes[-1])
            else:
                self._cleanup_tmp()
                if gathered is None:
                    return None
                decoder = msgspec.msgpack.Decoder(RankPayload)
                payloads: list[RankPayload] = []
                for data in gathered:
                    if data:
                        with self.failopen.guard("gather"):
                            payloads.append(decoder.decode(data))
                return self._write_run([p.record for p in payloads], payloads)
        if record.world_size > 1 and rundir.RUN_DIR_ENV in os.environ:
            # the launcher merges partial records; this rank could not send its record
            self._write_partial(payload)
            return None
        return self._write_run([record], [payload])

    def _resolve_run_dir(self, whose: str = "rank 0's record") -> Path | None:
        """The run directory (made now unless the launcher made it); None, said in one line,
        when it cannot be made."""
        if self.run_dir is not None:
            return self.run_dir
        env = os.environ.get(rundir.RUN_DIR_ENV)
        where = env or str(self.out or rundir.DEFAULT_ROOT)
        try:
            if env:
                run_dir = Path(env)
                run_dir.mkdir(parents=True, exist_ok=True)
            else:
                stem = self.name or Path(sys.argv[0] or "python").stem or "python"
                info = self._rank_info()
                if info.rank > 0:  # no group carried this rank's record to rank 0: keep it apart
                    stem = f"{stem}-rank{info.rank}"
                run_dir = rundir.new_run_dir(self.out or rundir.DEFAULT_ROOT, stem)
        except Exception as exc:
            cause = exc.__cause__ or exc.__context__
            self._save_failed(
                whose,
                where,
                cause if isinstance(cause, OSError) else exc,
                "the measurements of this run are lost",
            )
            return None
        self.run_dir = run_dir
        return run_dir

    def _release_reserve(self) -> None:
        if self._staging is not None:
            self._staging.release_reserve()

    def _write_files(
        self, run_dir: Path, records: list[RankRecord], payloads: list[RankPayload]
    ) -> bool:
        """The large files (traces, memory snapshots, samples) of each rank; True when any was
        written or failed (the record then needs rewriting). Failures: one line, and a note in
        each rank's record."""
        failed: list[tuple[RankRecord, str, BaseException]] = []
        changed = False
        for rec, p in zip(records, payloads):
            snapshots = rec.memory.snapshots if rec.memory is not None else []
            for folder, files, saved in (
                (rundir.TRACES, p.traces, rec.traces),
                (rundir.MEMORY, p.memory, snapshots),
            ):
                for name, data in files.items():
                    rel = f"{folder}/{name}"
                    try:
                        write_bytes_atomic(run_dir / rel, data)
                    except OSError as exc:
                        failed.append((rec, rel, exc))
                    except Exception as exc:
                        self.failopen.report("writer", exc)
                    else:
                        saved.append(rel)
                        changed = True
            if rec.sampler.devices:
                rel = f"{rundir.SAMPLES}/rank{rec.rank}.csv"
                try:
                    from mgprof.collect.devices.sampler import write_samples_csv

                    write_samples_csv(rec.sampler, run_dir / rel)
                except OSError as exc:
                    failed.append((rec, rel, exc))
                except Exception as exc:
                    self.failopen.report("samples", exc)
        if not failed:
            return changed
        for rec, rel, why in failed:
            rec.warnings.append(f"writer: could not save {rel}: {_reason(why)}")
        names = ", ".join(rel for _, rel, _ in failed)
        self._save_failed(
            f"{len(failed)} file(s) ({names})",
            run_dir,
            failed[0][2],
            "those are lost; the other measurements are in the record",
        )
        return True

    def _write_run(self, records: list[RankRecord], payloads: list[RankPayload]) -> RunRecord:
        info = self._rank_info()
        run_dir = self._resolve_run_dir(_whose(records))
        existing = None
        if run_dir is not None and (run_dir / rundir.RUN_JSON).exists():
            with self.failopen.guard("writer"):
                from mgprof.records import read_run

                existing = read_run(run_dir)
        base = existing or RunRecord(
            run_id=run_dir.name if run_dir is not None else "",
            created_utc=rundir.utc_iso(),
            script=sys.argv[0] or None,
            script_args=list(sys.argv[1:]),
            world_size=info.world_size,
            nnodes=info.nnodes,
            status="complete",
        )
        errors = [r.error for r in records if r.error]
        status = "incomplete" if errors else base.status
        error = errors[0] if errors else base.error
        if status == "running":  # the launcher's: its final update replaces this placeholder
            status, error = "incomplete", error or NOT_FINALISED
        run = msgspec.structs.replace(
            base,
            strategy=records[0].strategy if records else base.strategy,
            backend=records[0].backend if records else base.backend,
            cpu_fallback=bool(records) and records[0].device.kind == "cpu",
            status=status,
            error=error,
        )
        run = rundir.merge_ranks(msgspec.structs.replace(run, ranks=[]), records)
        if run_dir is None:
            return run
        self._release_reserve()
        if not self._save_record(
            lambda: rundir.write_run(run_dir, run),
            _whose(records),
            run_dir / rundir.RUN_JSON,
            "the measurements of this run are lost",
        ):
            if existing is None and not os.environ.get(rundir.RUN_DIR_ENV):
                _remove_if_empty(run_dir)  # made for this record alone: leave no empty folder
            return run
        if self._write_files(run_dir, records, payloads):
            # the ranks' records (shared with ``run``) now list their saved files
            self._save_record(
                lambda: rundir.write_run(run_dir, run),
                "the list of saved traces and samples",
                run_dir / rundir.RUN_JSON,
                "run.json keeps the measurements without it",
            )
        return run

    def _write_partial(self, payload: RankPayload) -> None:
        """This rank's own record (and files) for the launcher to merge: no group carried it."""
        record = payload.record
        run_dir = self._resolve_run_dir(_whose([record]))
        if run_dir is None:
            return
        self._release_reserve()
        path = run_dir / rundir.PARTIALS / f"rank{record.rank}.json"
        if not self._save_record(
            lambda: rundir.write_partial(run_dir, record),
            _whose([record]),
            path,
            "this rank's measurements are lost",
        ):
            return
        if self._write_files(run_dir, [record], [payload]):
            self._save_record(
                lambda: rundir.write_partial(run_dir, record),
                "the list of saved traces and samples",
                path,
                "the partial record keeps the measurements without it",
            )

    def _save_record(self, write: Callable[[], object], what: str, path: Path, lost: str) -> bool:
        """Run one record write; False (said in one line) when it failed."""
        try:
            write()
        except OSError as exc:
            self._save_failed(what, path, exc, lost)
            return False
        except Exception as exc:
            self.failopen.report("writer", exc)
            return False
        return True

    def _cleanup_tmp(self) -> None:
        """Remove this session's staging folder (its traces are delivered or lost by now)."""
        staging, self._staging = self._staging, None
        if staging is not None:
            try:
                staging.close()
            except Exception as exc:  # fail open: a folder left behind, never the training
                self.failopen.report("staging", exc)
