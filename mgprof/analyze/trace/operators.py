"""Host operators with their host and device time: the TensorBoard plugin's Operators view.

An operator is a host event of ``cat`` ``cpu_op`` (2021 schema: ``Operator``) on any thread;
annotation spans (``user_annotation``: ``ProfilerStep#N``, ``record_function`` regions,
``Optimizer.step#…``) are containers, not operators. Per operator call:

- host total = its duration; host self = duration − the durations of the operators directly
  nested in it on the same thread (``aten::linear`` → ``aten::addmm``) − the runtime/driver
  calls made directly in it (PyTorch's self CPU time leaves those out since 1.8);
- device self = the summed durations of the device events (kernels, memcpy, memset, as the
  TensorBoard plugin counts them) whose runtime launch (``cudaLaunchKernel`` …, matched by
  ``args.correlation``) lies inside the call and inside none of its nested operators; device
  total = the device self time of the call and of everything nested in it.

A runtime call belongs to the innermost operator running at its start; an operator whose only
nested operator has its own name is one call (PyTorch's ``EventList._remove_dup_nodes``). With
these rules the plugin's own ResNet-50 sample gives the plugin's figures for every group.

Calls are grouped by (name, ``Input Dims``) and by name. Nesting is found per thread on the
operators sorted by (start, longer first): an operator's parent is the closest earlier operator
that ends no earlier, found for all rows at once by pointer jumping (numpy, no per-event loop).
"""

from __future__ import annotations

import itertools
import json
import re

import msgspec
import numpy as np

from mgprof.analyze.tracefile.rank_trace import HostOps, RankTrace

__all__ = [
    "DEVICE_LIMIT",
    "LIMIT",
    "OperatorNameStat",
    "OperatorStat",
    "OperatorTables",
    "OperatorsDropped",
    "host_op_columns",
    "operator_tables",
]

LIMIT = 200
"""Groups kept per table: the top ``LIMIT`` by host self time ..."""
DEVICE_LIMIT = 50
"""... plus any group in the top ``DEVICE_LIMIT`` by device self time."""
_SHAPE_CHARS = 500
"""Input shapes longer than this (an ``aten::cat`` of hundreds of tensors) are cut with "…"."""


class OperatorStat(msgspec.Struct):
    """One (operator name, input shapes) group; times in µs, summed over its calls."""

    name: str
    input_shapes: str
    """``Input Dims`` as ``[[64, 256], [512, 256]]``; "" when not recorded (record_shapes off)."""
    calls: int
    host_total_us: float
    host_self_us: float
    device_total_us: float | None
    device_self_us: float | None


class OperatorNameStat(msgspec.Struct):
    """One operator name, all its input shapes together; times in µs, summed over its calls."""

    name: str
    calls: int
    host_total_us: float
    host_self_us: float
    device_total_us: float | None
    device_self_us: float | None
    input_shape_groups: int
    """How many distinct ``Input Dims`` the name was called with."""


class OperatorsDropped(msgspec.Struct):
    """What a bounded operator table left out, so that shares of the whole stay honest."""

    groups: int
    calls: int
    host_self_us: float
    device_self_us: float | None


class OperatorTables(msgspec.Struct):
    """The Operators view of one rank (see the module docstring)."""

    by_shape: list[OperatorStat]
    by_name: list[OperatorNameStat]
    dropped: OperatorsDropped
    dropped_by_name: OperatorsDropped
    device_unattributed_us: float | None
    """Device time whose launch lies in no host operator (or that has no launch in the trace)."""
    device_reason: str | None
    """Why the device figures are None, when they are."""


# --- building the columns (called by the reducer, once per trace) ----------------------------


def host_op_columns(
    start: np.ndarray,
    end: np.ndarray,
    thread: np.ndarray,
    name: np.ndarray,
    shape: np.ndarray,
    names: list[str],
    threads: list[str],
    shape_of: dict[bytes, int],
) -> tuple[HostOps | None, float | None]:
    """The operator rows of the reducer's host events, sorted; and the earliest host start.

    The host events come as columns in file order: ``thread`` indexes ``threads`` (in order of
    first appearance), ``name`` indexes ``names``, and ``shape`` is −1 for host events that are
    not operators, else the index of the operator's ``Input Dims`` in ``shape_of`` (raw JSON ->
    index; 0: none).
    """
    if not start.size:
        return None, None
    first = float(start.min())
    rows = np.flatnonzero(shape >= 0)
    if rows.size == 0:
        return None, first
    if rows.size < start.size:
        start, end, shape = start[rows], end[rows], shape[rows]
        name, thread = name[rows], thread[rows]
    order = _op_order(start, end, thread, len(threads))
    ops = HostOps(
        start=start[order],
        end=end[order],
        thread=thread[order].astype(np.int32),
        name=name[order].astype(np.int32),
        shape=shape[order].astype(np.int32),
        names=names,
        shapes=list(shape_of),
        threads=list(threads),
    )
    return ops, first


def _op_order(start: np.ndarray, end: np.ndarray, thread: np.ndarray, threads: int) -> np.ndarray:
    """The (thread, start, longer first) order. Kineto writes each thread's operators in that
    order already, so a stable sort by thread (a radix sort on int16) usually suffices; the full
    sort runs only when the check finds a row out of place."""
    if threads == 1:
        order = np.arange(start.size)
    else:
        key = thread.astype(np.int16) if threads < 1 << 15 else thread
        order = np.argsort(key, kind="stable")
    s, e, t = start[order], end[order], thread[order]
    ds = np.diff(s)
    if ((t[1:] == t[:-1]) & ((ds < 0) | ((ds == 0) & (e[1:] > e[:-1])))).any():
        order = np.lexsort((-end, start, thread))
    return order


_PRINTED_DIMS = re.compile(rb"[\[\]0-9-]*(?:, [\[\]0-9-]*)*")
"""Integer lists already printed as Python prints them (Kineto's own spacing)."""
_COMPACT_DIMS = re.compile(rb"[\[\]0-9,-]*")
"""Integer lists written without spaces (a trace rewritten by a JSON library)."""


def _render_shape(raw: bytes) -> str:
    """``Input Dims`` JSON as Python prints the list (the TensorBoard plugin's ``str(shape)``),
    cut to ``_SHAPE_CHARS``."""
    if not raw:
        return ""
    if _PRINTED_DIMS.fullmatch(raw):
        text = raw.decode("ascii")
    elif _COMPACT_DIMS.fullmatch(raw):
        text = raw.replace(b",", b", ").decode("ascii")
    else:
        try:
            text = json.dumps(msgspec.json.decode(raw))
        except (msgspec.DecodeError, RecursionError, ValueError):
            text = raw.decode("utf-8", "replace")
    return text if len(text) <= _SHAPE_CHARS else text[: _SHAPE_CHARS - 1] + "…"


def _shape_texts(shapes: list[bytes]) -> tuple[list[str], np.ndarray]:
    """The distinct printed shapes, and each raw shape's index among them: calls are grouped by
    the shapes as shown, so that two raw spellings (or two long lists cut to the same text)
    are one row, never two rows that read the same."""
    index: dict[str, int] = {}
    slot = [index.setdefault(_render_shape(raw), len(index)) for raw in shapes]
    return list(index), np.asarray(slot, dtype=np.int64)


# --- analysis ---------------------------------------------------------------------------------


def _parents(ops: HostOps) -> np.ndarray:
    """Each operator's enclosing operator on its thread (−1: none).

    In (thread, start, longer first) order, the parent of row i is the closest earlier row j of
    the same thread with end_j ≥ end_i. Pointer jumping: every row j between cand[i] and i ends
    before i does, so when cand[i] does too, i may jump to cand[cand[i]].
    """
    n = ops.size
    cand = np.arange(-1, n - 1, dtype=np.int64)
    first = np.ones(n, dtype=bool)
    first[1:] = ops.thread[1:] != ops.thread[:-1]
    end = ops.end
    # Top-level operators (each ends after every earlier one of its thread) would be the longest
    # chains: they are settled at once from the running maximum of the ends.
    top = first.copy()
    bounds = [*np.flatnonzero(first).tolist(), n]
    for a, b in itertools.pairwise(bounds):
        top[a + 1 : b] = end[a + 1 : b] > np.maximum.accumulate(end[a : b - 1])
    cand[top] = -1
    todo = np.flatnonzero(cand >= 0)
    while todo.size:
        todo = todo[end[cand[todo]] < end[todo]]
        if not todo.size:
            break
        cand[todo] = cand[cand[todo]]
        todo = todo[cand[todo] >= 0]
    return cand


def _merge_repeats(ops: HostOps, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fold an operator whose only nested operator has its name into one call, as PyTorch's
    ``EventList._remove_dup_nodes`` and the TensorBoard plugin do (a dispatcher re-entry such as
    ``aten::div`` → ``aten::div`` is one call). Returns the parents after folding, each row's
    surviving self-or-ancestor, and which rows survive."""
    n = ops.size
    par = parent.copy()
    up = np.arange(n, dtype=np.int64)
    alive = np.ones(n, dtype=bool)
    while True:
        kid = np.flatnonzero(alive & (par >= 0))
        count = np.bincount(par[kid], minlength=n)
        p = par[kid]
        repeat = kid[(count[p] == 1) & (ops.name[kid] == ops.name[p])]
        if not repeat.size:
            return par, up, alive
        alive[repeat] = False
        up[repeat] = par[repeat]
        while not alive[up].all():  # a folded row's parent may be folded too
            up = up[up]
        has = par >= 0
        par[has] = up[par[has]]


def _launch_device_us(rt: RankTrace) -> tuple[np.ndarray, np.ndarray, float]:
    """(runtime rows, device µs) of the launches that have device events; and the device time
    whose launch is not in the trace."""
    dur = rt.dev_end - rt.dev_start
    if rt.launch_corr.size == 0 or rt.launch_rows.size != rt.launch_corr.size:
        return np.zeros(0, dtype=np.int64), np.zeros(0), float(dur.sum())
    pos = np.searchsorted(rt.launch_corr, rt.dev_corr)
    pos = np.minimum(pos, rt.launch_corr.size - 1)
    found = (rt.dev_corr >= 0) & (rt.launch_corr[pos] == rt.dev_corr)
    per_launch = np.bincount(pos[found], weights=dur[found], minlength=rt.launch_corr.size)
    hits = np.flatnonzero(np.bincount(pos[found], minlength=rt.launch_corr.size))
    return rt.launch_rows[hits], per_launch[hits], float(dur[~found].sum())


def _runtime_owners(rt: RankTrace, ops: HostOps, parent: np.ndarray) -> np.ndarray:
    """For each runtime/driver call, the innermost operator of its thread running at its start
    (−1: none)."""
    starts = rt.runtime[0]
    owner = np.full(starts.size, -1, dtype=np.int64)
    if not starts.size or len(rt.runtime_tid) != starts.size:
        return owner
    thread_ix = {t: i for i, t in enumerate(ops.threads)}
    bounds = np.searchsorted(ops.thread, np.arange(len(ops.threads) + 1))
    # Threads compared once each (a few distinct strings): cheaper than a lookup per call.
    tids = np.asarray(rt.runtime_tid, dtype=object)
    for tid in set(rt.runtime_tid):
        t = thread_ix.get(tid)
        if t is None:
            continue  # a thread without operators
        a, b = int(bounds[t]), int(bounds[t + 1])
        mine = np.flatnonzero(tids == tid)
        ts = starts[mine]
        # The last operator starting at or before the call, then up its parents to the first
        # that still runs at the call: the innermost operator around it.
        p = a + np.searchsorted(ops.start[a:b], ts, side="right") - 1
        p[p < a] = -1
        climb = np.flatnonzero(p >= 0)
        while climb.size:
            pc = p[climb]
            out = ops.end[pc] < ts[climb]
            climb, up = climb[out], parent[pc[out]]
            p[climb] = up
            climb = climb[up >= 0]
        owner[mine] = p
    return owner


def _device_times(
    rt: RankTrace, ops: HostOps, parent: np.ndarray, owner: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float]:
    """(device self µs, device total µs) per operator row, and the unattributed device µs."""
    rows, dev_us, unlaunched = _launch_device_us(rt)
    by = owner[rows] if owner.size else np.full(rows.size, -1, dtype=np.int64)
    ok = by >= 0
    dev_self = np.bincount(by[ok], weights=dev_us[ok], minlength=ops.size)
    # Device total: the device self time of the operator's whole subtree, carried up the
    # parent links one level per round (rounds = nesting depth).
    dev_total = dev_self.copy()
    node = np.flatnonzero(dev_self)
    weight = dev_self[node]
    while node.size:
        up = parent[node]
        keep = up >= 0
        node, weight = up[keep], weight[keep]
        np.add.at(dev_total, node, weight)
    return dev_self, dev_total, unlaunched + float(dev_us[~ok].sum())


def _dense_unique(key: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(key, return_inverse=True)`` for keys in [0, bound): a table lookup instead
    of a sort when the table is small."""
    if bound > 4 * key.size + (1 << 16):
        return np.unique(key, return_inverse=True)
    seen = np.zeros(bound, dtype=bool)
    seen[key] = True
    groups = np.flatnonzero(seen)
    slot = np.cumsum(seen) - 1
    return groups, slot[key]


def _select(host_self: np.ndarray, dev_self: np.ndarray | None, limit: int, dlimit: int):
    """Indices kept: top ``limit`` by host self, plus the top ``dlimit`` with device self > 0;
    ordered by host self, largest first."""
    order = np.argsort(-host_self, kind="stable")
    keep = np.zeros(host_self.size, dtype=bool)
    keep[order[:limit]] = True
    if dev_self is not None:
        by_dev = np.argsort(-dev_self, kind="stable")[:dlimit]
        keep[by_dev[dev_self[by_dev] > 0]] = True
    return order[keep[order]]


def _dropped(
    kept: np.ndarray, calls: np.ndarray, host_self: np.ndarray, dev_self: np.ndarray | None
) -> OperatorsDropped:
    mask = np.ones(calls.size, dtype=bool)
    mask[kept] = False
    return OperatorsDropped(
        groups=int(mask.sum()),
        calls=int(calls[mask].sum()),
        host_self_us=float(host_self[mask].sum()),
        device_self_us=None if dev_self is None else float(dev_self[mask].sum()),
    )


def _empty(device_reason: str | None) -> OperatorTables:
    none = OperatorsDropped(0, 0, 0.0, None if device_reason else 0.0)
    return OperatorTables([], [], none, none, None, device_reason)


def operator_tables(
    rt: RankTrace, limit: int = LIMIT, device_limit: int = DEVICE_LIMIT
) -> OperatorTables:
    """Group ``rt``'s host operators by (name, input shapes) and by name (module docstring)."""
    ops = rt.host_ops
    reason: str | None = None
    if not rt.has_device_events:
        reason = "CPU-only trace: no device events"
    if ops is None or ops.size == 0:
        return _empty(reason)
    within = _parents(ops)
    owner = _runtime_owners(rt, ops, within)
    parent, up, alive = _merge_repeats(ops, within)
    called = owner >= 0
    owner[called] = up[owner[called]]
    dur = ops.end - ops.start
    child = np.flatnonzero(alive & (parent >= 0))
    nested = np.bincount(parent[child], weights=dur[child], minlength=ops.size)
    # Runtime calls (cudaLaunchKernel …) are not the operator's own host time either: PyTorch's
    # self CPU time leaves them out since 1.8, and so does the TensorBoard plugin.
    runtime_us = rt.runtime[1][called] - rt.runtime[0][called]
    in_calls = np.bincount(owner[called], weights=runtime_us, minlength=ops.size)
    host_self = np.maximum(dur - nested - in_calls, 0.0)
    dev_self: np.ndarray | None = None
    dev_total: np.ndarray | None = None
    unattributed: float | None = None
    if reason is None:
        dev_self, dev_total, unattributed = _device_times(rt, ops, parent, owner)
        if not dev_self.any():
            reason = (
                "no device event's runtime launch (matched by correlation id) lies inside a "
                "host operator"
            )
            dev_self = dev_total = None

    texts, slot = _shape_texts(ops.shapes)
    n_shapes = max(len(texts), 1)
    rows = np.flatnonzero(alive)
    key = ops.name[rows].astype(np.int64) * n_shapes + slot[ops.shape[rows]]
    groups, inverse = _dense_unique(key, len(ops.names) * n_shapes)
    g_calls = np.bincount(inverse, minlength=groups.size)
    g_total = np.bincount(inverse, weights=dur[rows], minlength=groups.size)
    g_self = np.bincount(inverse, weights=host_self[rows], minlength=groups.size)
    g_dself = g_dtotal = None
    if dev_self is not None and dev_total is not None:
        g_dself = np.bincount(inverse, weights=dev_self[rows], minlength=groups.size)
        g_dtotal = np.bincount(inverse, weights=dev_total[rows], minlength=groups.size)
    kept = _select(g_self, g_dself, limit, device_limit)
    by_shape = [
        OperatorStat(
            name=ops.names[int(groups[i]) // n_shapes],
            input_shapes=texts[int(groups[i]) % n_shapes],
            calls=int(g_calls[i]),
            host_total_us=float(g_total[i]),
            host_self_us=float(g_self[i]),
            device_total_us=None if g_dtotal is None else float(g_dtotal[i]),
            device_self_us=None if g_dself is None else float(g_dself[i]),
        )
        for i in kept.tolist()
    ]
    dropped = _dropped(kept, g_calls, g_self, g_dself)

    # By name: the groups above, summed per name (group keys are sorted, so by name too).
    g_name = groups // n_shapes
    names, n_inv = _dense_unique(g_name, len(ops.names))
    n_calls = np.bincount(n_inv, weights=g_calls, minlength=names.size).astype(np.int64)
    n_total = np.bincount(n_inv, weights=g_total, minlength=names.size)
    n_self = np.bincount(n_inv, weights=g_self, minlength=names.size)
    n_shapes_per = np.bincount(n_inv, minlength=names.size)
    n_dself = n_dtotal = None
    if g_dself is not None and g_dtotal is not None:
        n_dself = np.bincount(n_inv, weights=g_dself, minlength=names.size)
        n_dtotal = np.bincount(n_inv, weights=g_dtotal, minlength=names.size)
    kept_n = _select(n_self, n_dself, limit, device_limit)
    by_name = [
        OperatorNameStat(
            name=ops.names[int(names[i])],
            calls=int(n_calls[i]),
            host_total_us=float(n_total[i]),
            host_self_us=float(n_self[i]),
            device_total_us=None if n_dtotal is None else float(n_dtotal[i]),
            device_self_us=None if n_dself is None else float(n_dself[i]),
            input_shape_groups=int(n_shapes_per[i]),
        )
        for i in kept_n.tolist()
    ]
    return OperatorTables(
        by_shape=by_shape,
        by_name=by_name,
        dropped=dropped,
        dropped_by_name=_dropped(kept_n, n_calls, n_self, n_dself),
        device_unattributed_us=unattributed,
        device_reason=reason,
    )
