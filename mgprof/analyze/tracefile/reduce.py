"""Classify decoded trace events and reduce them, slice by slice, to one rank's RankTrace."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import numpy as np

from mgprof.analyze import intervals as iv
from mgprof.analyze.trace.operators import host_op_columns
from mgprof.analyze.tracefile.flop_estimate import (
    _FLOP_OPS,
    FLOPS_ESTIMATED,
    _leaf_flops,
    _precision,
    estimate_flops,
    leaf_gemm_time,
)
from mgprof.analyze.tracefile.rank_trace import (
    KIND_COMM,
    KIND_COMPUTE,
    KIND_MEMCPY,
    KIND_MEMSET,
    CommArgs,
    CpuCommOp,
    RankTrace,
    Step,
)
from mgprof.analyze.tracefile.schema import (
    Num,
    _Args,
    _as_int,
    _as_str,
    _comm_args,
    _DistInfo,
    _Event,
    _finite,
    _input_bytes,
)
from mgprof.errors import TraceError

__all__ = ["COMM_KERNEL_RE", "rank_from_filename"]

# DESIGN.md: a communication kernel is a kernel whose name matches nccl or rccl.
COMM_KERNEL_RE = re.compile(r"nccl|rccl", re.IGNORECASE)
_RANK_FILE_RE = re.compile(r"(?:rank[-_]?|worker)(\d+)(?![0-9])", re.IGNORECASE)
_DEVICE_CATS = {
    "kernel": KIND_COMPUTE,
    "gpu_memcpy": KIND_MEMCPY,
    "memcpy": KIND_MEMCPY,
    "gpu_memset": KIND_MEMSET,
    "memset": KIND_MEMSET,
    # Meta's MTIA accelerators: device-side kernels and DMA transfers in one category
    "mtia_ccp_events": KIND_COMPUTE,
}
_LAUNCH_CATS = {"cuda_runtime", "runtime", "cuda_driver", "mtia_runtime"}
_KNOWN_HOST_CATS = {
    "user_annotation", "python_function", "cpu_instant_event", "Operator", "Runtime",
    "overhead", "cuda_profiler_range", "Trace", "trace", "ac2g", "fwdbwd",
}  # fmt: skip
"""Host categories torch.profiler writes; others are listed in the trace's health block, since a
device category mgprof does not know would otherwise pass silently as host work."""
_DMA_NAMES = ("dma_request",)
"""MTIA device events that move memory (counted as memcpy, as HTA's MEMORY class)."""
# CPU-side events that are communication rather than compute (DESIGN.md "communication ops").
_CPU_COMM_PREFIXES = ("gloo:", "nccl:")
_CPU_COMM_WRAPPERS = ("c10d::", "record_param_comms")


def rank_from_filename(path: Path) -> int | None:
    """Rank from names like ``rank-3.json.gz``, ``rank3.pt.trace.json``, ``worker3.*``."""
    m = _RANK_FILE_RE.search(path.name)
    return int(m.group(1)) if m else None


_MAX_TS_US = 1e18
"""|ts| past this (31,700 years in microseconds) is not a time a profiler wrote: such an event
is skipped and counted, so that no figure overflows to inf."""
_MAX_DUR_US = 1e15
"""``dur`` past this (31 years) is likewise skipped and counted."""
_MAX_FLOPS = 1e30
"""FLOPs of one op past this are out of range (10^9 s of a 10^21 FLOP/s machine)."""
_INT64 = 1 << 63


def _step_number(name: str) -> int | None:
    tail = name[len("ProfilerStep#") :]
    # ASCII digits only (int() refuses other Unicode digits), and few of them: int() of a
    # string over 4300 digits raises, and a step number past 2^63 is no step number.
    if tail.isascii() and tail.isdigit() and len(tail) <= 18:
        return int(tail)
    return None


def _out_of_range(ts: Num, dur: Num) -> bool:
    """True when the times are present but outside what a profiler writes (see _MAX_TS_US)."""
    if ts is None or dur is None:
        return False
    return not (-_MAX_TS_US < ts < _MAX_TS_US) or dur >= _MAX_DUR_US


def _int64_array(values: list[int]) -> np.ndarray:
    """``values`` as int64; a value outside int64 (a hostile id) becomes -1, "no id"."""
    try:
        return np.asarray(values, dtype=np.int64)
    except OverflowError:
        return np.asarray([v if -_INT64 <= v < _INT64 else -1 for v in values], dtype=np.int64)


# What :meth:`_Reducer.feed` does with an event, decided once per distinct ``cat`` (a device
# category maps to its KIND_*, 0..3) and, for CPU events, once per distinct name (_N_* bits).
_CAT_LAUNCH, _CAT_SKIP, _CAT_CPU, _CAT_OP_2021, _CAT_CPU_OTHER, _CAT_NOCAT = 4, 5, 6, 7, 8, 9
_CAT_UNKNOWN = 10
_N_CODES = 11
"""``_CAT_CPU``: an operator (``cat`` ``cpu_op``); ``_CAT_OP_2021``: the 2021 schema's
``Operator`` (operators, but also steps and ``record_function`` spans: never CPU compute, as
before; an operator of the Operators view unless its name is a known annotation);
``_CAT_CPU_OTHER``: any other host category (``user_annotation``, ``python_function``, ...):
containers, never compute on CPU traces; ``_CAT_NOCAT``: an event without ``cat`` (old
traces), classified by its name; ``_CAT_UNKNOWN``: a host category torch.profiler does not
write, counted in the health block and then handled as ``_CAT_CPU_OTHER``. Host codes ≤
``_CAT_OP_2021`` are operator categories."""
_N_STEP, _N_DATALOADER, _N_CPU_COMM, _N_FLOP_OP, _N_PARAM_COMMS, _N_ANNOTATION = 1, 2, 4, 8, 16, 32
_SHAPE_PENDING = -2
"""An operator's shape index until its slice is done (see ``_Reducer._shape_indices``)."""
_N_BITS = 6
_N_MASK = (1 << _N_BITS) - 1
"""A host event's key: (index of its (code, thread, name) combination in ``_Reducer.combo_*``)
<< _N_BITS | its name's _N_* bits."""


def _cat_code(raw_cat: str | None) -> int:
    cat = raw_cat.lower() if raw_cat else ""
    kind = _DEVICE_CATS.get(cat)
    if kind is not None:
        return kind
    if cat in _LAUNCH_CATS:
        return _CAT_LAUNCH
    if cat in ("trace", "gpu_user_annotation"):
        return _CAT_SKIP
    if cat == "cpu_op":
        return _CAT_CPU
    if cat == "operator":
        return _CAT_OP_2021
    if not cat:
        return _CAT_NOCAT
    return _CAT_CPU_OTHER if raw_cat in _KNOWN_HOST_CATS else _CAT_UNKNOWN


def _name_flags(name: str) -> int:
    if name.startswith("ProfilerStep#"):
        return _N_STEP
    flags = 0
    if name.startswith("enumerate(DataLoader)#"):
        flags |= _N_DATALOADER
    elif name.startswith(_ANNOTATION_PREFIXES):
        flags |= _N_ANNOTATION  # a container, never an operator (2021 traces write it as one)
    if name.startswith(_CPU_COMM_PREFIXES):
        flags |= _N_CPU_COMM
    if name in _FLOP_OPS:
        flags |= _N_FLOP_OP
    elif name == "record_param_comms":
        flags |= _N_PARAM_COMMS
    return flags


class _Reducer:
    """Reduces decoded events, one slice at a time, to the columns :class:`RankTrace` holds."""

    def __init__(self) -> None:
        self.base: float | None = None
        self.dev_start: list[float] = []
        self.dev_end: list[float] = []
        self.dev_kind: list[int] = []
        self.dev_corr: list[int] = []
        self.dev_name: list[int] = []
        self.dev_ext: list[int] = []
        self.name_index: dict[str, int] = {}
        self.kind_of_name: dict[str, int] = {}  # kernel name -> KIND_COMPUTE / KIND_COMM
        self.comm_args: dict[int, CommArgs] = {}
        # Runtime/driver calls by correlation id: their row in runtime_s/_e/_tid (a dict of
        # untracked ints: no garbage-collector work per launch).
        self.launch_row: dict[int, int] = {}  # correlation id -> row in runtime_s/_e/_tid
        self.steps: list[Step] = []
        self.dl_s: list[float] = []
        self.dl_e: list[float] = []
        self.param_comms: list[tuple[str, float, float, CommArgs]] = []
        self.cpu_comm_ops: list[CpuCommOp] = []
        # Host events other than launches and steps, as columns: start, end, key and shape.
        # A key names one (category code, thread, name) combination (see _host_key) with the
        # name's _N_* bits; shape is the index of an operator's Input Dims in shape_of (0:
        # none; -1: not an operator). Each slice's columns become numpy arrays when the slice
        # is done (host_chunks), so a host event costs ~28 bytes, not a tuple of objects.
        self.h_start: list[float] = []
        self.h_end: list[float] = []
        self.h_key: list[int] = []
        self.h_shape: list[int] = []
        self.host_chunks: tuple[list[np.ndarray], ...] = ([], [], [], [])
        self.host_ctx: list[dict[object, dict[str, int]]] = [{} for _ in range(_N_CODES)]
        """Per category code, per raw ``tid``: name -> key."""
        self.combo_name: list[int] = []  # per key >> _N_BITS: index into host_names
        self.combo_code: list[int] = []  # ... its _CAT_* code
        self.combo_thread: list[int] = []  # ... its index into threads
        self.host_names: list[str] = []
        self.name_ix: dict[str, int] = {}
        self.threads: list[str] = []  # host threads as text, in order of first appearance
        self.thread_of: dict[str, int] = {}
        self.shape_of: dict[bytes, int] = {b"": 0}  # raw Input Dims JSON -> index
        # GEMM/conv ops: (tid, start, end, flops or None, reason)
        self.flop_ops: list[tuple[str, float, float, float | None, str]] = []
        self.gemm_ops: list[tuple[str, float, float, int]] = []  # (thread, start, end, PREC_*)
        self.gemm_prec: dict[int, int] = {}  # External id -> PREC_* of GEMM/conv ops
        self.flops_total = 0.0
        self.flops_ops = 0
        self.flop_values: list[float] | None = None
        """Each ``args.flops`` added, in file order, when set to a list: a reducer of a later
        part of the file (trace_split) hands them over, so the total is summed in file order."""
        self.skipped = 0
        self.out_of_range = 0  # events (device or host) whose ts/dur are beyond any real time
        self.complete = 0
        self.n_events = 0
        self.graph_launches = 0
        self.runtime_s: list[float] = []
        self.runtime_e: list[float] = []
        self.runtime_tid: list[str] = []
        self.dev_stream: list[int] = []
        self.stream_of: dict[object, int] = {}  # device event tid (stream) -> index
        self.unknown_cats: dict[str, int] = {}
        self.tid_str: dict[object, str] = {}
        self.cat_code: dict[str | None, int] = {}  # raw ``cat`` -> KIND_* or _CAT_*

    def find_base(self, events: list[_Event]) -> None:
        """Set the time origin, when still unset, to the first complete event in ``events``
        with valid times (times are kept relative to it, so every figure keeps its precision)."""
        if self.base is not None:
            return
        for ev in events:
            ts0 = ev.ts
            if (
                ev.ph == "X"
                and ts0 is not None
                and -_MAX_TS_US < ts0 < _MAX_TS_US
                and ev.dur is not None
                and 0.0 <= ev.dur < _MAX_DUR_US
            ):
                self.base = float(ts0)
                return

    def feed(self, events: list[_Event]) -> None:
        self.n_events += len(events)
        self.find_base(events)
        base = self.base if self.base is not None else 0.0
        cat_code = self.cat_code
        host_ctx = self.host_ctx
        h_start, h_end, h_key, h_shape = self.h_start, self.h_end, self.h_key, self.h_shape
        kind_of_name = self.kind_of_name
        name_index = self.name_index
        tid_str = self.tid_str
        launch_row = self.launch_row
        dev_start, dev_end, dev_kind = self.dev_start, self.dev_end, self.dev_kind
        dev_corr, dev_name, dev_ext = self.dev_corr, self.dev_name, self.dev_ext
        dims_raw: list[msgspec.Raw] = []
        add_dims = dims_raw.append
        dev_stream, stream_of = self.dev_stream, self.stream_of
        runtime_s, runtime_e, runtime_tid = self.runtime_s, self.runtime_e, self.runtime_tid
        min_ts, max_ts, max_dur = -_MAX_TS_US, _MAX_TS_US, _MAX_DUR_US  # locals: hot loop
        complete = skipped = 0  # written back to self after the loop
        for ev in events:
            if ev.ph != "X":
                continue
            raw_cat = ev.cat
            code = cat_code.get(raw_cat)
            if code is None:
                code = cat_code[raw_cat] = _cat_code(raw_cat)
            ts = ev.ts
            dur = ev.dur
            # Comparisons, not isfinite: they also bound ints too large for a float (isfinite
            # raises on those), and a NaN fails them. Float bounds: int-vs-float comparison is
            # the slow path.
            valid = (
                ts is not None and dur is not None and 0.0 <= dur < max_dur and min_ts < ts < max_ts
            )
            if code < _CAT_LAUNCH:  # a device event: code is its KIND_*
                if not valid:
                    skipped += 1
                    if _out_of_range(ts, dur):
                        self.out_of_range += 1
                    continue
                complete += 1
                name = ev.name or ""
                start = ts - base  # type: ignore[operator]
                row = len(dev_start)
                stream = stream_of.get(ev.tid)
                if stream is None:
                    stream = stream_of[ev.tid] = len(stream_of)
                dev_stream.append(stream)
                dev_start.append(start)
                dev_end.append(start + dur)  # type: ignore[operator]
                args = ev.args
                corr = args.correlation if args is not None else None
                if type(corr) is not int:
                    corr = _as_int(corr)
                dev_corr.append(-1 if corr is None else corr)
                if code == KIND_COMPUTE:
                    kind = kind_of_name.get(name, -1)
                    if kind < 0:
                        if COMM_KERNEL_RE.search(name):
                            kind = KIND_COMM
                        elif name in _DMA_NAMES:
                            kind = KIND_MEMCPY
                        else:
                            kind = KIND_COMPUTE
                        kind_of_name[name] = kind
                        name_index[name] = len(name_index)
                    dev_name.append(name_index[name])
                    ext = None
                    if args is not None:
                        ext = args.external_id
                        if ext is None:
                            ext = args.external_id_lower
                    if type(ext) is not int:
                        ext = _as_int(ext)
                    dev_ext.append(-1 if ext is None else ext)
                    if kind == KIND_COMM and args is not None:
                        ca = _comm_args(args)
                        if ca is not None:
                            self.comm_args[row] = ca
                    dev_kind.append(kind)
                else:
                    dev_name.append(-1)
                    dev_ext.append(-1)
                    dev_kind.append(code)
                continue
            if not valid:
                if _out_of_range(ts, dur):
                    self.out_of_range += 1
                continue
            complete += 1
            if code >= _CAT_CPU_OTHER:
                if code == _CAT_UNKNOWN:
                    self.unknown_cats[raw_cat or ""] = self.unknown_cats.get(raw_cat or "", 0) + 1
                    code = _CAT_CPU_OTHER
            elif code == _CAT_SKIP:
                # The profiler's own span is not activity, and GPU-side annotations (which repeat
                # ProfilerStep#N names on the device timeline) are not CPU events.
                continue
            ts = ts - base  # type: ignore[operator]
            if code == _CAT_LAUNCH:
                raw_tid = ev.tid
                if type(raw_tid) is str:
                    tid = raw_tid
                else:
                    tid = tid_str.get(raw_tid)  # type: ignore[assignment]
                    if tid is None:
                        tid = tid_str[raw_tid] = _as_str(raw_tid) or ""
                if ev.name and "GraphLaunch" in ev.name:
                    self.graph_launches += 1
                launch = len(runtime_s)
                runtime_s.append(ts)
                runtime_e.append(ts + dur)  # type: ignore[operator]
                runtime_tid.append(tid)
                args = ev.args
                if args is not None:
                    corr = args.correlation
                    if type(corr) is not int:
                        corr = _as_int(corr)
                    if corr is not None:
                        launch_row[corr] = launch
                continue
            end = ts + dur  # type: ignore[operator]
            name = ev.name or ""
            by_name = host_ctx[code].get(ev.tid)
            if by_name is None:
                by_name = self._host_names(code, ev.tid)
            key = by_name.get(name)
            if key is None:
                key = by_name[name] = self._host_key(code, ev.tid, name)
            flags = key & _N_MASK
            args = ev.args
            if not flags:  # the common case: an op with no special meaning
                shape = -1 if code > _CAT_OP_2021 else 0  # -1: not an operator category
                if args is not None:
                    if args.flops is not None:
                        self._add_flops(args.flops)
                    if shape == 0:
                        dims = args.input_dims
                        if dims:
                            add_dims(dims)
                            shape = _SHAPE_PENDING
                h_start.append(ts)
                h_end.append(end)
                h_key.append(key)
                h_shape.append(shape)
                continue
            tid = self.threads[self.combo_thread[key >> _N_BITS]]
            if flags & _N_STEP:
                num = _step_number(name)
                if num is not None:
                    self.steps.append(Step(num, ts, end, tid))
                continue
            if flags & _N_DATALOADER:
                self.dl_s.append(ts)
                self.dl_e.append(end)
            shape = -1 if code > _CAT_OP_2021 or flags & (_N_DATALOADER | _N_ANNOTATION) else 0
            if args is None:
                if flags & _N_CPU_COMM:
                    self.cpu_comm_ops.append(CpuCommOp(name, ts, end, tid, None))
            else:
                if shape == 0 and args.input_dims:
                    add_dims(args.input_dims)
                    shape = _SHAPE_PENDING
                if args.flops is not None:
                    self._add_flops(args.flops)
                self._special(name, flags, tid, ts, end, args)
            h_start.append(ts)
            h_end.append(end)
            h_key.append(key)
            h_shape.append(shape)
        self.complete += complete
        self.skipped += skipped
        if h_start:
            starts, ends, combos, shapes = self.host_chunks
            starts.append(np.array(h_start, dtype=np.float64))
            ends.append(np.array(h_end, dtype=np.float64))
            combos.append((np.array(h_key, dtype=np.int64) >> _N_BITS).astype(np.int32))
            shape_col = np.array(h_shape, dtype=np.int32)
            if dims_raw:
                shape_col[shape_col == _SHAPE_PENDING] = self._shape_indices(dims_raw)
            shapes.append(shape_col)
            self.h_start, self.h_end, self.h_key, self.h_shape = [], [], [], []

    def _shape_indices(self, dims: list[msgspec.Raw]) -> np.ndarray:
        """Each ``Input Dims`` (raw JSON, in file order) as its index in ``shape_of``; a new one
        gets the next index.

        Done once per slice rather than per event: one join and one split make the byte
        strings (a NUL never occurs in decoded JSON, so it cannot split one), and the table
        lookups run in C. A per-event ``bytes()`` copy and lookup cost about a third of the
        reduction of a CPU trace, where almost every event is an operator with shapes.
        """
        shape_of = self.shape_of
        parts = b"\0".join(dims).split(b"\0")
        if len(parts) != len(dims):  # not reachable from msgspec-decoded JSON; kept exact
            parts = [bytes(raw) for raw in dims]
        for raw in dict.fromkeys(parts):
            if raw not in shape_of:
                shape_of[raw] = len(shape_of)
        return np.fromiter(map(shape_of.__getitem__, parts), dtype=np.int32, count=len(parts))

    def _host_names(self, code: int, raw_tid: object) -> dict[str, int]:
        """The name -> key table of host events of ``code`` on thread ``raw_tid`` (new)."""
        tid = raw_tid if type(raw_tid) is str else self.tid_str.get(raw_tid)
        if tid is None:
            tid = self.tid_str[raw_tid] = _as_str(raw_tid) or ""
        if tid not in self.thread_of:
            self.thread_of[tid] = len(self.threads)
            self.threads.append(tid)
        table: dict[str, int] = {}
        self.host_ctx[code][raw_tid] = table
        return table

    def _host_key(self, code: int, raw_tid: object, name: str) -> int:
        """A new (code, thread, name) combination's key: its index << _N_BITS | _N_* bits."""
        ix = self.name_ix.get(name)
        if ix is None:
            ix = self.name_ix[name] = len(self.host_names)
            self.host_names.append(name)
        tid = raw_tid if type(raw_tid) is str else self.tid_str[raw_tid]
        combo = len(self.combo_name)
        self.combo_name.append(ix)
        self.combo_code.append(code)
        self.combo_thread.append(self.thread_of[tid])
        return combo << _N_BITS | _name_flags(name)

    def _special(self, name: str, flags: int, tid: str, ts: float, end: float, args: _Args) -> None:
        """The records kept for GEMM/conv ops, ``record_param_comms`` and gloo/nccl ops."""
        if flags & _N_FLOP_OP:
            est, why = _flop_estimate(name, args)
            self.flop_ops.append((tid, ts, end, est, why))
            prec = _precision(name, args.input_type)
            self.gemm_ops.append((tid, ts, end, prec))
            ext = _as_int(args.external_id)
            if ext is not None and prec:
                self.gemm_prec[ext] = prec
        elif flags & _N_PARAM_COMMS:
            ca = _comm_args(args)
            if ca is not None:
                self.param_comms.append((tid, ts, end, ca))
        if flags & _N_CPU_COMM:
            self.cpu_comm_ops.append(
                CpuCommOp(
                    name,
                    ts,
                    end,
                    tid,
                    _input_bytes(args),
                    ext=_as_int(args.external_id),
                    comm=_comm_args(args),
                )
            )

    def _host_columns(self) -> _HostColumns:
        """The host events of every slice as one set of columns (the slices are let go)."""
        chunks, self.host_chunks = self.host_chunks, ([], [], [], [])
        if not chunks[0]:
            empty = np.empty(0, dtype=np.float64)
            none = np.empty(0, dtype=np.int32)
            return _HostColumns(empty, empty, none, none, none)
        start, end, combo, shape = (_concat_and_clear(col) for col in chunks)
        thread = np.asarray(self.combo_thread, dtype=np.int32)[combo]
        return _HostColumns(start, end, combo, thread, shape)

    def _main_compute(self, host: _HostColumns, main: int | None) -> tuple[np.ndarray, np.ndarray]:
        """The main thread's compute intervals (DESIGN.md CPU-only rule), comm ops cut out.

        Which events count is decided once per (code, thread, name) combination, then picked
        out of the columns with one mask each: no per-event Python work.
        """
        names = self.host_names
        on_main = [t == main for t in self.combo_thread]
        compute = np.fromiter(
            (
                m and _is_cpu_compute(code, names[n])
                for m, code, n in zip(on_main, self.combo_code, self.combo_name)
            ),
            dtype=bool,
            count=len(on_main),
        )[host.combo]
        comm = np.fromiter(
            (m and _is_comm_name(names[n]) for m, n in zip(on_main, self.combo_name)),
            dtype=bool,
            count=len(on_main),
        )[host.combo]
        main_s, main_e = host.start[compute], host.end[compute]
        if comm.any():
            # A comm op nested in an operator span (c10d::allreduce_ inside autograd's
            # AccumulateGrad, where DDP's reducer launches it) is still the main thread
            # waiting on communication: it is cut out of the compute intervals.
            main_s, main_e = iv.subtract((main_s, main_e), (host.start[comm], host.end[comm]))
        return main_s, main_e

    def _add_flops(self, flops: Num) -> None:
        fl = _finite(flops)
        if fl is not None and 0 <= fl < _MAX_FLOPS:
            self.flops_total += fl
            self.flops_ops += 1
            if self.flop_values is not None:
                self.flop_values.append(fl)

    def finish(self, p: Path, dist: _DistInfo | None, props: list[dict[str, object]]) -> RankTrace:
        if self.complete == 0:
            raise TraceError(
                f"{p}: trace has no complete ('ph': 'X') events with a timestamp and duration; "
                "profile at least one active step"
            )
        rank = _as_int(dist.rank) if dist else None
        rank_source = "distributedInfo"
        if rank is None:
            rank = rank_from_filename(p)
            rank_source = "file name" if rank is not None else "unknown"
        pg_sizes: dict[str, int] = {}
        if dist and dist.pg_config:
            for pg in dist.pg_config:
                size = _as_int(pg.pg_size)
                if pg.pg_name is not None and size is not None:
                    pg_sizes[str(pg.pg_name)] = size

        steps = sorted(self.steps, key=lambda s: s.start)
        host = self._host_columns()
        main_tid = _main_thread(steps, host, self.threads)
        main_s: np.ndarray | list[float] = []
        main_e: np.ndarray | list[float] = []
        cpu_window_all = None
        if not self.dev_start and host.start.size:
            # Only CPU-only traces use the main-thread compute events and the whole-trace window.
            main_s, main_e = self._main_compute(host, self.thread_of.get(main_tid or ""))
            lo, hi = float(host.start.min()), float(host.end.max())
            cpu_window_all = (lo, hi)
        if steps and not self.dev_start:
            lo = min(s.start for s in steps)
            hi = max(s.end for s in steps)
            cpu_window_all = (
                (min(lo, cpu_window_all[0]), max(hi, cpu_window_all[1]))
                if cpu_window_all
                else (lo, hi)
            )
        names = np.asarray(self.combo_name, dtype=np.int32)[host.combo]
        host_ops, host_first = host_op_columns(
            host.start,
            host.end,
            host.thread,
            names,
            host.shape,
            self.host_names,
            self.threads,
            self.shape_of,
        )
        del host, names
        self.shape_of = {}
        firsts = [host_first] if host_first is not None else []
        firsts += [s.start for s in steps[:1]]
        dev_start = np.asarray(self.dev_start, dtype=np.float64)
        firsts += [float(dev_start.min())] if dev_start.size else []

        est_total, est_ops, est_skipped = _leaf_flops(self.flop_ops)
        if self.flops_ops:
            flops_total: float | None = self.flops_total
            flops_ops, flops_source = self.flops_ops, "trace args.flops"
        elif est_ops:
            flops_total, flops_ops, flops_source = est_total, est_ops, FLOPS_ESTIMATED
        else:
            flops_total, flops_ops, flops_source = None, 0, None

        corr_sorted = sorted(c for c in self.launch_row if -_INT64 <= c < _INT64)
        launch_rows = np.fromiter(
            map(self.launch_row.__getitem__, corr_sorted), dtype=np.int64, count=len(corr_sorted)
        )
        runtime_s = np.asarray(self.runtime_s, dtype=np.float64)
        firsts += [float(runtime_s.min())] if runtime_s.size else []
        notes = []
        if self.out_of_range:
            notes.append(
                f"{self.out_of_range} events with a ts beyond ±1e18 us or a dur beyond 1e15 us "
                "(not times a profiler writes) were skipped"
            )
        return RankTrace(
            path=p,
            rank=rank,
            rank_source=rank_source,
            world_size=_as_int(dist.world_size) if dist else None,
            backend=_as_str(dist.backend) if dist else None,
            pg_sizes=pg_sizes,
            device_properties=props,
            n_events=self.n_events,
            skipped_device_events=self.skipped,
            graph_launches=self.graph_launches,
            runtime=(
                runtime_s,
                np.asarray(self.runtime_e, dtype=np.float64),
            ),
            dev_stream=np.asarray(self.dev_stream, dtype=np.int32),
            unknown_categories=dict(self.unknown_cats),
            dev_start=dev_start,
            dev_end=np.asarray(self.dev_end, dtype=np.float64),
            dev_kind=np.asarray(self.dev_kind, dtype=np.int8),
            dev_corr=_int64_array(self.dev_corr),
            dev_name=np.asarray(self.dev_name, dtype=np.int32),
            kernel_names=list(self.name_index),
            comm_args=self.comm_args,
            launch_corr=np.asarray(corr_sorted, dtype=np.int64),
            notes=notes,
            launch_ts=runtime_s[launch_rows],
            launch_tid=list(map(self.runtime_tid.__getitem__, launch_rows.tolist())),
            launch_rows=launch_rows,
            runtime_tid=self.runtime_tid,
            steps=steps,
            dataloader=(
                np.asarray(self.dl_s, dtype=np.float64),
                np.asarray(self.dl_e, dtype=np.float64),
            ),
            param_comms=self.param_comms,
            cpu_comm_ops=self.cpu_comm_ops,
            main_tid=main_tid,
            main_thread=(
                np.asarray(main_s, dtype=np.float64),
                np.asarray(main_e, dtype=np.float64),
            ),
            cpu_window_all=cpu_window_all,
            flops_total=flops_total,
            flops_ops=flops_ops,
            time_base_us=self.base if self.base is not None else 0.0,
            dev_ext=_int64_array(self.dev_ext),
            gemm_precision=self.gemm_prec,
            gemm_host_us=leaf_gemm_time(self.gemm_ops),
            flops_source=flops_source,
            flops_estimate_skipped=est_skipped,
            host_ops=host_ops,
            trace_start_us=min(firsts) if firsts else 0.0,
        )


def _flop_estimate(name: str, args: _Args) -> tuple[float | None, str]:
    """``estimate_flops``, with shapes too large for a float (hostile Input Dims) refused."""
    try:
        est, why = estimate_flops(name, args.input_dims, args.concrete)
    except OverflowError:
        return None, "Input Dims too large for a FLOP count"
    if est is not None and not 0 <= est < _MAX_FLOPS:
        return None, "Input Dims too large for a FLOP count"
    return est, why


def _is_comm_name(name: str) -> bool:
    return name.startswith(_CPU_COMM_PREFIXES) or name.startswith(_CPU_COMM_WRAPPERS)


# Annotation spans recognisable by name, for traces whose events carry no ``cat``.
_ANNOTATION_PREFIXES = (
    "ProfilerStep#",
    "enumerate(DataLoader)#",
    "DistributedDataParallel.forward",
    "Optimizer.step#",
    "Optimizer.zero_grad#",
)


def _is_cpu_compute(code: int, name: str) -> bool:
    """DESIGN.md, CPU-only traces: compute is the operators (``cat`` ``cpu_op``) other than
    communication ops. Annotation spans (``user_annotation``: ProfilerStep#N, mgprof regions,
    ``DistributedDataParallel.forward``, ...) are containers: counting them hid the main
    thread's waits for all-reduce. Without ``cat``, every event but the known annotations."""
    if _is_comm_name(name):
        return False
    if code == _CAT_CPU:
        return True
    return code == _CAT_NOCAT and not name.startswith(_ANNOTATION_PREFIXES)


def _concat_and_clear(chunks: list[np.ndarray]) -> np.ndarray:
    """One array of ``chunks``, which are let go at once: the peak holds one column twice,
    not all of them."""
    out = np.concatenate(chunks)
    chunks.clear()
    return out


class _HostColumns(msgspec.Struct):
    """A rank's host events (other than launches and steps), one row each, in file order."""

    start: np.ndarray
    end: np.ndarray
    combo: np.ndarray  # the key >> _N_BITS: (code, thread, name) combination
    thread: np.ndarray  # index into _Reducer.threads
    shape: np.ndarray  # index into shape_of; -1: not an operator


def _main_thread(steps: list[Step], host: _HostColumns, threads: list[str]) -> str | None:
    """The thread of the ``ProfilerStep#N`` events; without steps, the busiest CPU thread.

    "Busiest" = largest summed duration of top-level-or-not complete events; it is a fallback for
    traces recorded without a schedule, stated in the result's definitions. ``bincount`` sums
    each thread's durations in file order, and ``argmax`` takes the first of equal totals, in
    order of first appearance, as the per-event loop it replaces did.
    """
    if steps:
        counts: dict[str, int] = {}
        for s in steps:
            counts[s.tid] = counts.get(s.tid, 0) + 1
        return max(counts, key=lambda t: counts[t])
    if not host.start.size:
        return None
    totals = np.bincount(host.thread, weights=host.end - host.start, minlength=len(threads))
    return threads[int(np.argmax(totals))]
