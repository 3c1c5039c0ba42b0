"""FSDP2 communication per unit and per phase: which module's all-gathers and reduce-scatters
cost how much, and how much of it compute hid.

Each collective call of the rank (the same calls as the ``collectives`` figures) is placed where
it was issued: a communication kernel at its CPU-side launch (the runtime call with the same
correlation), an ``nccl:*`` launch at itself, and a ``gloo:*`` event, which runs on one of
gloo's worker threads, at the ``c10d::*`` op that queued it (gloo runs its queue in order: the
k-th gloo event of a kind belongs to the k-th op of that kind still unmatched that started
before it and whose tensors have its size; gloo runs a reduce-scatter as an ``all_reduce``). The
``FSDP::*`` spans around that place on its thread name

- the unit: the module FQN of the innermost span (``FSDP::all_gather (layers.0)``, or
  ``FSDP::backward_prefetch for layers.2``); a span without one belongs to the root module,
  which FSDP names by no FQN at all (reported as ``(root)``);
- the phase: from the innermost span that says which pass it is in: ``pre_forward``,
  ``root_pre_forward``, ``forward_prefetch`` → forward; ``pre_backward``,
  ``backward_prefetch`` → backward; ``post_backward*``, ``root_post_backward_callback`` →
  post-backward; with the collective's type: forward all-gather, backward all-gather (prefetch
  included), post-backward reduce-scatter, or other (another type, or no pass).

Times: the union of all calls inside the trace window is cut into one piece per call (each
instant to the earliest-starting call running then), so the rows' ``comm_us`` add up, with the
calls outside FSDP spans, to the rank's communication time, and their ``exposed_us`` (each row's
pieces minus their part covered by compute, :func:`~mgprof.analyze.trace.comm.type_unions`,
as every exposure figure) to its exposed communication. Bus bandwidth divides a row's bytes
(nccl-tests' buffer) by the union of its own calls' spans, × the type's nccl-tests factor
(:func:`~mgprof.analyze.trace.comm_types.busbw_factor`: (n−1)/n for all-gather and
reduce-scatter).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec
import numpy as np

from mgprof.analyze.intervals import FloatArray
from mgprof.analyze.trace.comm import CollectiveCall, type_unions
from mgprof.analyze.trace.comm_types import busbw_factor, collective_type
from mgprof.analyze.trace.fsdp_events import (
    FsdpEvents,
    HostCollective,
    HostSpan,
    ProcessGroupInfo,
    read_fsdp_events,
)
from mgprof.analyze.tracefile.load import KIND_COMM, RankTrace
from mgprof.errors import TraceError

__all__ = [
    "DEFINITIONS",
    "PHASES",
    "ROOT",
    "FirstAllGather",
    "FsdpComm",
    "FsdpRow",
    "attribute",
    "fsdp_comm",
    "is_fsdp_trace",
    "phase_of",
    "span_stage",
    "span_unit",
]

ROOT = "(root)"
"""The unit of the root module: FSDP writes its spans with no FQN (``FSDP::pre_forward``)."""
FORWARD_AG, BACKWARD_AG, POST_BACKWARD_RS, OTHER = (
    "forward_all_gather",
    "backward_all_gather",
    "post_backward_reduce_scatter",
    "other",
)
PHASES = (FORWARD_AG, BACKWARD_AG, POST_BACKWARD_RS, OTHER)

DEFINITIONS = {
    "fsdp": "FSDP2 (fully_shard) traces only (FSDP::* spans, fsdp::* ops): each collective "
    "call placed where it was issued (a kernel at its launch, a gloo event at the c10d op that "
    "queued it) and given to the unit and phase of the FSDP::* spans around that place",
    "fsdp.rows.unit": "module FQN of the innermost FSDP span around the call "
    "(FSDP::all_gather (layers.0), FSDP::backward_prefetch for layers.2); (root) for the root "
    "module, whose spans carry no FQN",
    "fsdp.rows.phase": "forward_all_gather (inside pre_forward / root_pre_forward / "
    "forward_prefetch), backward_all_gather (pre_backward, backward_prefetch), "
    "post_backward_reduce_scatter (post_backward_*, root_post_backward_callback); other: "
    "another type or no pass; the innermost span that names a pass decides",
    "fsdp.rows.comm_us": "the row's share of the union of all calls in the window (each instant "
    "to the earliest-starting call running then): rows + outside_comm_us = totals.comm_us",
    "fsdp.rows.exposed_us": "the row's share minus its part covered by compute (as "
    "collectives.exposed_us); rows + outside_exposed_us = totals.exposed_comm_us",
    "fsdp.rows.bytes": "Σ nccl-tests buffer bytes: max(output, input) of the c10d op (gloo) or "
    "the kernel's / nccl op's message size (NCCL)",
    "fsdp.rows.busbw_gbps": "bytes / |union of the row's own call spans in the window| × "
    "(n−1)/n for all-gather and reduce-scatter (nccl-tests); gloo runs a reduce-scatter as an "
    "all-reduce of the whole buffer, the factor stays the reduce-scatter's",
    "fsdp.first_all_gather": "each step's first forward all-gather (the whole trace's without "
    "ProfilerStep spans): the parameters the first computation needs, so nothing can overlap it",
}

_SPAN_RE = re.compile(
    r"FSDP::(?P<label>[A-Za-z0-9_]+?)(?: for (?P<target>[^()\[\]]*?))?"
    r"(?: \((?P<fqn>[^()]*)\))?(?: \[pg=\d+\])?"
)
_FORWARD = frozenset({"pre_forward", "root_pre_forward", "forward_prefetch"})
_BACKWARD = frozenset({"pre_backward", "backward_prefetch"})
_POST_BACKWARD = frozenset({"root_post_backward_callback"})


class FsdpRow(msgspec.Struct):
    """One (unit, phase, collective type, process group) of an FSDP2 rank."""

    unit: str
    """Module FQN of the FSDP unit; ``(root)`` for the root module."""
    phase: str
    """``forward_all_gather``, ``backward_all_gather``, ``post_backward_reduce_scatter`` or
    ``other``."""
    type: str
    """The collective FSDP asked for (gloo's reduce-scatter runs as an all-reduce: this says
    ``reduce_scatter``)."""
    group: str | None
    """Process group name (``Process Group Name``; the job's only group when it has one)."""
    group_size: int | None
    """n of the bus-bandwidth factor (``Group size``, or the group's size in the trace)."""
    count: int
    """Collective calls."""
    comm_us: float | None
    """Its share of the rank's communication time (the rows add up to it); None for
    launch-only ``nccl:*`` ops of a trace without device events."""
    exposed_us: float | None
    """The part of ``comm_us`` no compute covered."""
    bytes: int | None
    """Σ nccl-tests buffer bytes: max(output, input) of each call."""
    busbw_gbps: float | None
    """bytes / the union of the row's own call spans × the type's nccl-tests factor."""
    not_applicable: str | None = None
    """Why ``busbw_gbps`` (or the times) are None."""


class FirstAllGather(msgspec.Struct):
    """Each step's first forward all-gather: nothing can overlap it."""

    unit: str
    """The unit whose all-gather it is (the most frequent one over the steps)."""
    calls: int
    """One per step (one in a trace without ProfilerStep spans)."""
    comm_us: float | None
    """Their share of the communication time, as the rows'."""
    exposed_us: float | None
    """The part of it no compute covered."""


class FsdpComm(msgspec.Struct):
    """FSDP2 communication of one rank by unit and phase (``mgprof.analyze.trace.fsdp``)."""

    units: list[str]
    """Units in the order their spans first appear (forward order)."""
    rows: list[FsdpRow]
    """By unit, then phase."""
    comm_us: float | None
    """Σ rows' comm_us."""
    exposed_us: float | None
    """Σ rows' exposed_us."""
    outside_calls: int
    """Collective calls inside no FSDP span (the script's own, or gloo events whose c10d op
    is not in the trace)."""
    outside_comm_us: float | None
    """Their share of the communication time: rows + this = ``totals.comm_us``."""
    outside_exposed_us: float | None
    """Their exposed part: rows + this = ``totals.exposed_comm_us``."""
    first_all_gather: FirstAllGather | None
    """Each step's first forward all-gather; None when no forward all-gather was found."""
    groups: list[ProcessGroupInfo] = msgspec.field(default_factory=list)
    """The process groups the rows name, as the trace describes them (ranks, description)."""


class _Place(msgspec.Struct, frozen=True):
    """Where one call was issued, what FSDP asked for, and its bytes."""

    tid: str | None
    ts: float
    type: str
    nbytes: int | None
    pg: str | None


def span_unit(name: str) -> str | None:
    """The unit an ``FSDP::*`` span names: its FQN, the prefetch target, or ``ROOT``; None for
    a name that is not an FSDP span."""
    m = _SPAN_RE.fullmatch(name)
    if m is None:
        return None
    fqn = m.group("target") if m.group("target") is not None else m.group("fqn")
    return fqn if fqn else ROOT


def span_stage(name: str) -> str | None:
    """``forward``, ``backward`` or ``post_backward`` for a span that says which pass it is in."""
    m = _SPAN_RE.fullmatch(name)
    if m is None:
        return None
    label = m.group("label")
    if label in _FORWARD:
        return "forward"
    if label in _BACKWARD:
        return "backward"
    if label.startswith("post_backward") or label in _POST_BACKWARD:
        return "post_backward"
    return None


def phase_of(stage: str | None, kind: str) -> str:
    """The phase of a collective of type ``kind`` issued in pass ``stage``."""
    if kind == "all_gather" and stage == "forward":
        return FORWARD_AG
    if kind == "all_gather" and stage == "backward":
        return BACKWARD_AG
    if kind == "reduce_scatter" and stage == "post_backward":
        return POST_BACKWARD_RS
    return OTHER


def attribute(
    places: Sequence[tuple[str | None, float, str]], spans: Sequence[HostSpan]
) -> list[tuple[str, str] | None]:
    """(unit, phase) of each ``(tid, ts, type)`` place, or None where no FSDP span on that
    thread encloses ``ts`` (spans on one thread nest, as ``record_function`` writes them)."""
    by_tid: dict[str, list[tuple[float, int, int]]] = {}
    for k, s in enumerate(spans):
        by_tid.setdefault(s.tid, []).append((s.start, 0, k))
    for i, (tid, ts, _kind) in enumerate(places):
        if tid is not None:
            by_tid.setdefault(tid, []).append((ts, 1, i))
    out: list[tuple[str, str] | None] = [None] * len(places)
    for items in by_tid.values():
        items.sort(key=lambda x: (x[0], x[1], -spans[x[2]].end if x[1] == 0 else 0.0))
        stack: list[HostSpan] = []
        for t, what, k in items:
            while stack and stack[-1].end < t:
                stack.pop()
            if what == 0:
                stack.append(spans[k])
                continue
            chain = [s for s in stack if s.end >= t]
            unit = next((u for s in reversed(chain) if (u := span_unit(s.name))), None)
            if unit is None:
                continue
            stage = next((g for s in reversed(chain) if (g := span_stage(s.name))), None)
            out[k] = (unit, phase_of(stage, places[k][2]))
    return out


def is_fsdp_trace(rt: RankTrace) -> bool:
    """FSDP2's own operators (``fsdp::all_gather_copy_in``...) are in the trace."""
    ops = rt.host_ops
    return ops is not None and any(n.startswith("fsdp::") for n in ops.names)


def _compatible(gloo_kind: str, op_kind: str) -> bool:
    return gloo_kind == op_kind or (gloo_kind == "all_reduce" and op_kind == "reduce_scatter")


def _gloo_places(
    rt: RankTrace, gloo: Sequence[int], ops: Sequence[HostCollective]
) -> dict[int, _Place]:
    """Each gloo event (index into ``rt.cpu_comm_ops``) at the c10d op that queued it."""
    base = rt.time_base_us
    pending = [(o, collective_type(o.name)) for o in ops]
    used = [False] * len(pending)
    first = 0  # pending[:first] are all used
    out: dict[int, _Place] = {}
    for i in sorted(gloo, key=lambda i: rt.cpu_comm_ops[i].start):
        g = rt.cpu_comm_ops[i]
        kind = collective_type(g.name)
        start = g.start + base
        while first < len(pending) and used[first]:
            first += 1
        for j in range(first, len(pending)):
            op, op_kind = pending[j]
            if op.start > start:
                break
            if used[j] or not _compatible(kind, op_kind):
                continue
            if g.nbytes is not None and op.sizes and g.nbytes not in op.sizes:
                continue
            used[j] = True
            out[i] = _Place(op.tid, op.start - base, op_kind, op.nbytes, op.pg_name)
            break
    return out


def _places(
    rt: RankTrace, calls: Sequence[CollectiveCall], ops: Sequence[HostCollective]
) -> list[_Place] | None:
    """Where each call was issued, in the order summary builds ``calls`` (device calls, then
    gloo events, on a GPU trace; every gloo/nccl CPU event on a CPU one); None if they differ."""
    if rt.has_device_events:
        rows = np.flatnonzero(rt.dev_kind == KIND_COMM).tolist()
        cpu = [i for i, op in enumerate(rt.cpu_comm_ops) if op.name.startswith("gloo:")]
    else:
        rows, cpu = [], list(range(len(rt.cpu_comm_ops)))
    if len(rows) + len(cpu) != len(calls):
        return None
    out: list[_Place] = []
    for r, call in zip(rows, calls):
        corr = int(rt.dev_corr[r])
        i = int(np.searchsorted(rt.launch_corr, corr))
        found = corr >= 0 and i < rt.launch_corr.size and rt.launch_corr[i] == corr
        tid = rt.launch_tid[i] if found else None
        ts = float(rt.launch_ts[i]) if found else 0.0
        out.append(_Place(tid, ts, call.type, call.bytes, call.pg))
    gloo = [i for i in cpu if rt.cpu_comm_ops[i].name.startswith("gloo:")]
    queued = _gloo_places(rt, gloo, ops)
    for i, call in zip(cpu, calls[len(rows) :]):
        op = rt.cpu_comm_ops[i]
        place = queued.get(i)
        if place is None:
            tid = op.tid if not op.name.startswith("gloo:") else None
            kind = collective_type(op.name)
            place = _Place(tid, op.start, kind, call.bytes, call.pg)
        elif place.nbytes is None:
            place = msgspec.structs.replace(place, nbytes=call.bytes)
        out.append(place)
    return out


def _pieces(calls: Sequence[CollectiveCall]) -> list[tuple[float, float]]:
    """Each call's share of the calls' union: the part of it no earlier-starting call covers."""
    order = sorted(range(len(calls)), key=lambda k: (calls[k].start_us, k))
    out = [(0.0, 0.0)] * len(calls)
    frontier = -np.inf
    for k in order:
        c = calls[k]
        end = c.start_us + c.dur_us
        lo = max(c.start_us, frontier)
        out[k] = (lo, max(lo, end))
        if not c.launch_only:
            frontier = max(frontier, end)
    return out


def _keyed(
    calls: Sequence[CollectiveCall],
    keys: Sequence[str | None],
    pieces: Sequence[tuple[float, float]] | None = None,
) -> list[CollectiveCall]:
    """The calls with ``type`` set to their key (and their span to their piece), for
    :func:`type_unions` to total per key; calls whose key is None are left out."""
    out = []
    for k, (c, key) in enumerate(zip(calls, keys)):
        if key is None:
            continue
        if pieces is None:
            out.append(msgspec.structs.replace(c, type=key))
        else:
            lo, hi = pieces[k]
            out.append(msgspec.structs.replace(c, type=key, start_us=lo, dur_us=hi - lo))
    return out


def _first_all_gathers(
    rt: RankTrace, places: Sequence[_Place], found: Sequence[tuple[str, str] | None]
) -> list[int]:
    """Per step (the whole trace without steps), the index of its first forward all-gather."""
    forward = [i for i, f in enumerate(found) if f is not None and f[1] == FORWARD_AG]
    forward.sort(key=lambda i: places[i].ts)
    if not rt.steps:
        return forward[:1]
    firsts = []
    for step in rt.steps:
        inside = [i for i in forward if step.start <= places[i].ts <= step.end]
        if inside:
            firsts.append(inside[0])
    return firsts


def _row_sort_key(units: list[str], row: FsdpRow) -> tuple[int, int, str, str]:
    u = units.index(row.unit) if row.unit in units else len(units)
    return (u, PHASES.index(row.phase), row.type, row.group or "")


def _busbw(
    kind: str, n: int | None, nbytes: int | None, inflight_us: float | None
) -> tuple[float | None, str | None]:
    if nbytes is None:
        return None, "the trace does not record the message size of every call"
    if inflight_us is None or inflight_us <= 0:
        return None, "no time inside the trace window"
    factor = busbw_factor(kind, n)
    if factor is None:
        if n is None:
            return None, "group size unknown (not in the args or distributedInfo.pg_config)"
        return None, f"nccl-tests defines no bus bandwidth for {kind}"
    return nbytes / (inflight_us * 1e-6) / 1e9 * factor, None


def _sum(values: Sequence[float | None]) -> float | None:
    return None if any(v is None for v in values) else float(sum(v or 0.0 for v in values))


_RowKey = tuple[str, str, str, str | None, int | None]
"""(unit, phase, type, process group, group size)."""
_LAUNCH_ONLY = "nccl:* launches in a trace without device events: counts and sizes only"


def _row_keys(
    places: Sequence[_Place],
    found: Sequence[tuple[str, str] | None],
    calls: Sequence[CollectiveCall],
    groups: dict[str, ProcessGroupInfo],
) -> dict[_RowKey, list[int]]:
    """The calls of each row, in the order rows are first met."""
    out: dict[_RowKey, list[int]] = {}
    for k, (p, f, c) in enumerate(zip(places, found, calls)):
        if f is None:
            continue
        group = groups.get(p.pg) if p.pg is not None else None
        n = c.group_size if c.group_size is not None else (group.size if group else None)
        out.setdefault((f[0], f[1], p.type, p.pg, n), []).append(k)
    return out


def _labels(n: int, chosen: Sequence[Sequence[int]], names: Sequence[str]) -> list[str | None]:
    """Per call, the name of the selection it is in (None: in none)."""
    out: list[str | None] = [None] * n
    for ks, name in zip(chosen, names):
        for k in ks:
            out[k] = name
    return out


def _row(
    key: _RowKey,
    mine: Sequence[int],
    calls: Sequence[CollectiveCall],
    places: Sequence[_Place],
    share: tuple[float, float],
    inflight_us: float,
) -> FsdpRow:
    unit, phase, kind, pg, n = key
    live = any(not calls[k].launch_only for k in mine)
    sizes = [places[k].nbytes for k in mine]
    nbytes = None if any(b is None for b in sizes) else sum(b or 0 for b in sizes)
    bw, why = _busbw(kind, n, nbytes, inflight_us) if live else (None, _LAUNCH_ONLY)
    return FsdpRow(
        unit=unit,
        phase=phase,
        type=kind,
        group=pg,
        group_size=n,
        count=len(mine),
        comm_us=share[0] if live else None,
        exposed_us=share[1] if live else None,
        bytes=nbytes,
        busbw_gbps=bw,
        not_applicable=why,
    )


def _first_figure(
    first: Sequence[int],
    found: Sequence[tuple[str, str] | None],
    calls: Sequence[CollectiveCall],
    share: tuple[float, float],
) -> FirstAllGather | None:
    units = [f[0] for i in first if (f := found[i]) is not None]
    if not units:
        return None
    live = any(not calls[i].launch_only for i in first)
    return FirstAllGather(
        unit=max(dict.fromkeys(units), key=units.count),
        calls=len(first),
        comm_us=share[0] if live else None,
        exposed_us=share[1] if live else None,
    )


def summarize_fsdp(
    rt: RankTrace,
    calls: Sequence[CollectiveCall],
    window: tuple[FloatArray, FloatArray],
    cover: tuple[FloatArray, FloatArray],
    events: FsdpEvents,
) -> tuple[FsdpComm | None, str | None]:
    """The figures from the rank's calls (as summary builds them) and its FSDP host events;
    (None, why) when they cannot be attributed."""
    base = rt.time_base_us
    spans = [HostSpan(s.name, s.tid, s.start - base, s.end - base) for s in events.spans]
    if not spans:
        return None, "FSDP2 operators (fsdp::*) but no FSDP::* spans in the trace"
    places = _places(rt, calls, events.ops)
    if places is None:
        return None, "the collective calls do not match the trace's communication events"
    only = next(iter(events.groups)) if len(events.groups) == 1 else None
    places = [p if p.pg is not None else msgspec.structs.replace(p, pg=only) for p in places]
    found = attribute([(p.tid, p.ts, p.type) for p in places], spans)
    if not any(found):
        return None, "no collective call was issued inside an FSDP::* span"
    by_row = _row_keys(places, found, calls, events.groups)
    outside = [k for k, f in enumerate(found) if f is None]
    first = _first_all_gathers(rt, places, found)
    pieces = _pieces(calls)
    names = [str(i) for i in range(len(by_row))]
    n = len(calls)
    # Every total below is type_unions' (union in the window, minus its part under compute),
    # keyed by row instead of by collective type.
    shares = type_unions(
        _keyed(calls, _labels(n, list(by_row.values()), names), pieces), base, window, cover
    )
    inflight = type_unions(
        _keyed(calls, _labels(n, list(by_row.values()), names)), base, window, cover
    )
    apart = type_unions(
        _keyed(calls, _labels(n, [outside, first], ["outside", "first"]), pieces),
        base,
        window,
        cover,
    )
    rows = [
        _row(
            key,
            mine,
            calls,
            places,
            shares.get(name, (0.0, 0.0)),
            inflight.get(name, (0.0, 0.0))[0],
        )
        for (key, mine), name in zip(by_row.items(), names)
    ]
    units = []
    for s in spans:
        u = span_unit(s.name)
        if u is not None and u not in units and any(r.unit == u for r in rows):
            units.append(u)
    rows.sort(key=lambda r: _row_sort_key(units, r))
    live_out = any(not calls[k].launch_only for k in outside) or not outside
    out_share = apart.get("outside", (0.0, 0.0))
    named = {r.group for r in rows if r.group is not None}
    return (
        FsdpComm(
            units=units,
            rows=rows,
            comm_us=_sum([r.comm_us for r in rows]),
            exposed_us=_sum([r.exposed_us for r in rows]),
            outside_calls=len(outside),
            outside_comm_us=out_share[0] if live_out else None,
            outside_exposed_us=out_share[1] if live_out else None,
            first_all_gather=_first_figure(first, found, calls, apart.get("first", (0.0, 0.0))),
            groups=[g for name, g in sorted(events.groups.items()) if name in named],
        ),
        None,
    )


def fsdp_comm(
    rt: RankTrace,
    calls: Sequence[CollectiveCall],
    window: tuple[FloatArray, FloatArray],
    cover: tuple[FloatArray, FloatArray],
) -> tuple[FsdpComm | None, str | None]:
    """FSDP figures of a rank, or (None, None) for a trace that is not FSDP2's, or (None,
    reason) for one that is but cannot be attributed. Reads ``rt.path`` once more for the
    ``FSDP::*`` spans (:mod:`~mgprof.analyze.trace.fsdp_events`) only when FSDP2's operators
    are in the trace."""
    if not is_fsdp_trace(rt):
        return None, None
    try:
        events = read_fsdp_events(rt.path)
    except TraceError as exc:
        return None, f"FSDP spans not read: {exc}"
    return summarize_fsdp(rt, calls, window, cover, events)
