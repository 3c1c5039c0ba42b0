"""The end of a session on each rank: build its ``RankRecord``, send it with its trace files to
rank 0 over the job's process group (or write it directly when there is none), and on rank 0
write the run directory: traces, samples and run.json.

Split from ``session.py`` as a mixin of ``Session``: these steps run once, at ``stop``, and
read the state the session gathered while the training ran (its steps, regions, trace writer,
rank); the session keeps its lifecycle and its timing (with ``steps``). The attributes declared
below are the session's, set in ``Session.__init__`` and ``Session.start``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import msgspec
import torch

from mgprof import rundir
from mgprof.collect import hooks
from mgprof.collect.device_facts import device_info, guess_strategy, record_versions
from mgprof.collect.distenv import RankInfo, gather_bytes_to_rank0, group_ready, rank_info
from mgprof.collect.failopen import FailOpen
from mgprof.collect.torch_profiler import TraceWriter
from mgprof.records import (
    MemoryRecord,
    RankRecord,
    RegionRecord,
    RunRecord,
    SamplerRecord,
    StepRecord,
)


class RankPayload(msgspec.Struct):
    """What a rank sends to rank 0: its record and its trace files' bytes."""

    record: RankRecord
    traces: dict[str, bytes]


class DeliveryMixin:
    """``Session``'s end: the record, the gather to rank 0 and the run directory."""

    out: str | os.PathLike[str] | None
    name: str | None
    strategy: str | None
    auto: bool
    failopen: FailOpen
    run_dir: Path | None
    _info: RankInfo | None
    _mode: str | None
    _done_steps: list[StepRecord]
    _region_totals: dict[str, list[float]]
    _cuda_indices: list[int]
    _writer: TraceWriter | None
    _trace_tmp: Path | None

    def _build_record(
        self, sampler: SamplerRecord, memory: MemoryRecord | None, error: str | None
    ) -> RankRecord:
        info = self._info or rank_info()
        regions = [
            RegionRecord(name=n, count=int(t[0]), total_ms=round(t[1], 6), max_ms=round(t[2], 6))
            for n, t in sorted(self._region_totals.items())
        ]
        strategy = self.strategy or os.environ.get("MGPROF_STRATEGY") or guess_strategy(info)
        backend = None
        with self.failopen.guard("backend"):
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                backend = str(torch.distributed.get_backend())
        return RankRecord(
            rank=info.rank,
            world_size=info.world_size,
            local_rank=info.local_rank,
            host=info.host,
            pid=os.getpid(),
            strategy=strategy,
            backend=backend,
            device=device_info(self._cuda_indices),
            devices_used=max(1, len(self._cuda_indices)),
            steps=self._done_steps,
            step_form="auto" if self.auto else ("with" if self._mode == "ctx" else "call"),
            regions=regions,
            sampler=sampler,
            memory=memory,
            training=hooks.training_facts(),
            versions=record_versions(),
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

    def _deliver(self, record: RankRecord) -> RunRecord | None:
        """Gather to rank 0 over the process group when there is one; else write directly."""
        traces = self._trace_files()
        payload = RankPayload(record=record, traces=traces)
        if group_ready() and record.error is None:
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
                payloads = [decoder.decode(b) for b in gathered if b]
                return self._write_run([p.record for p in payloads], payloads)
        run_dir = self._resolve_run_dir()
        if record.world_size > 1 and rundir.RUN_DIR_ENV in os.environ:
            # the launcher merges partial records; this rank could not send its record
            self._write_traces(run_dir, traces, record)
            with self.failopen.guard("writer"):
                rundir.write_partial(run_dir, record)
            self._cleanup_tmp()
            return None
        run = self._write_run([record], [payload])
        self._cleanup_tmp()
        return run

    def _resolve_run_dir(self) -> Path:
        if self.run_dir is not None:
            return self.run_dir
        env = os.environ.get(rundir.RUN_DIR_ENV)
        if env:
            self.run_dir = Path(env)
            self.run_dir.mkdir(parents=True, exist_ok=True)
        else:
            stem = self.name or Path(sys.argv[0] or "python").stem or "python"
            info = self._info or rank_info()
            if info.rank > 0:  # no group carried this rank's record to rank 0: keep it apart
                stem = f"{stem}-rank{info.rank}"
            self.run_dir = rundir.new_run_dir(self.out or rundir.DEFAULT_ROOT, stem)
        return self.run_dir

    def _write_traces(self, run_dir: Path, traces: dict[str, bytes], record: RankRecord) -> None:
        from mgprof.atomic import write_bytes_atomic

        for name, data in traces.items():
            with self.failopen.guard("writer"):
                write_bytes_atomic(run_dir / rundir.TRACES / name, data)
                record.traces.append(f"{rundir.TRACES}/{name}")

    def _write_run(self, records: list[RankRecord], payloads: list[RankPayload]) -> RunRecord:
        run_dir = self._resolve_run_dir()
        for rec, p in zip(records, payloads):
            self._write_traces(run_dir, p.traces, rec)
            with self.failopen.guard("samples"):
                from mgprof.collect.sampler import write_samples_csv

                if rec.sampler.devices:
                    write_samples_csv(rec.sampler, run_dir / rundir.SAMPLES / f"rank{rec.rank}.csv")
        info = self._info or rank_info()
        existing = None
        if (run_dir / rundir.RUN_JSON).exists():
            with self.failopen.guard("writer"):
                from mgprof.records import read_run

                existing = read_run(run_dir)
        base = existing or RunRecord(
            run_id=run_dir.name,
            created_utc=rundir.utc_iso(),
            script=sys.argv[0] or None,
            script_args=list(sys.argv[1:]),
            world_size=info.world_size,
            nnodes=info.nnodes,
            status="complete",
        )
        errors = [r.error for r in records if r.error]
        run = msgspec.structs.replace(
            base,
            strategy=records[0].strategy if records else base.strategy,
            backend=records[0].backend if records else base.backend,
            cpu_fallback=bool(records) and records[0].device.kind == "cpu",
            status="incomplete" if errors else base.status,
            error=errors[0] if errors else base.error,
        )
        run = rundir.merge_ranks(msgspec.structs.replace(run, ranks=[]), records)
        with self.failopen.guard("writer"):
            rundir.write_run(run_dir, run)
        return run

    def _cleanup_tmp(self) -> None:
        if self._trace_tmp is not None:
            import shutil

            shutil.rmtree(self._trace_tmp, ignore_errors=True)
            self._trace_tmp = None
