"""Join two reducers of consecutive parts of one trace into the reducer of the whole.

A reducer numbers what it meets in order of first appearance: kernel names, streams, host
threads, (category, thread, name) combinations, operator shapes. :func:`absorb` appends the later
part's rows to the earlier part's and renumbers the later part's tables as one reducer reading
the whole file would have numbered them, so ``finish`` gives the same RankTrace, bit for bit
(trace_split's reason to exist; its tests compare every summary byte for byte).

Both reducers must use the same time origin (``base``), and the later one must have kept its
``args.flops`` values (``flop_values``) so the FLOP total is summed in file order.
"""

from __future__ import annotations

import numpy as np

from mgprof.analyze.tracefile.reduce import _N_BITS, _Reducer

__all__ = ["MERGED_ATTRIBUTES", "Unjoinable", "absorb"]


class Unjoinable(Exception):
    """The two parts cannot be joined into one reader's result (the caller reads the file
    alone): they name a thread differently, or were reduced against different time origins."""


MERGED_ATTRIBUTES = frozenset(
    {
        "base", "dev_start", "dev_end", "dev_kind", "dev_corr", "dev_name", "dev_ext",
        "name_index", "kind_of_name", "comm_args", "launch_row", "steps", "dl_s", "dl_e",
        "param_comms", "cpu_comm_ops", "h_start", "h_end", "h_key", "h_shape", "host_chunks",
        "host_ctx", "combo_name", "combo_code", "combo_thread", "host_names", "name_ix",
        "threads", "thread_of", "shape_of", "flop_ops", "gemm_ops", "gemm_prec", "flops_total",
        "flops_ops", "flop_values", "skipped", "out_of_range", "complete", "n_events",
        "graph_launches", "runtime_s", "runtime_e", "runtime_tid", "dev_stream", "stream_of",
        "unknown_cats", "tid_str", "cat_code",
    }
)  # fmt: skip
"""Every attribute of a reducer; a test checks the list against ``vars(_Reducer())``, so a new
attribute cannot be added without deciding here how two parts of it join."""


def absorb(into: _Reducer, later: _Reducer) -> None:
    """Append ``later`` (the reducer of the events after ``into``'s) to ``into``."""
    if into.base is None:
        into.base = later.base
    elif later.base is not None and later.base != into.base:
        raise Unjoinable("the two parts were reduced against different time origins")
    for raw, text in later.tid_str.items():
        # 5 and 5.0 are one dict key: one reader names the thread by the spelling it met first,
        # and the later part's records already carry its own spelling
        if into.tid_str.get(raw, text) != text:
            raise Unjoinable(f"thread {raw!r} is spelled {into.tid_str[raw]!r} before the cut")
    if into.h_start or later.h_start:
        raise RuntimeError("a reducer holds host rows not yet moved to its columns")
    _absorb_device(into, later)
    _absorb_host(into, later)
    for name in ("steps", "dl_s", "dl_e", "param_comms", "cpu_comm_ops", "flop_ops", "gemm_ops"):
        getattr(into, name).extend(getattr(later, name))
    into.gemm_prec.update(later.gemm_prec)
    for value in later.flop_values or ():
        into.flops_total += value
    if into.flop_values is not None:
        into.flop_values.extend(later.flop_values or ())
    into.flops_ops += later.flops_ops
    for name in ("skipped", "out_of_range", "complete", "n_events", "graph_launches"):
        setattr(into, name, getattr(into, name) + getattr(later, name))
    for cat, n in later.unknown_cats.items():
        into.unknown_cats[cat] = into.unknown_cats.get(cat, 0) + n
    for raw, code in later.cat_code.items():
        into.cat_code.setdefault(raw, code)


def _absorb_device(into: _Reducer, later: _Reducer) -> None:
    """Device events and runtime launches: rows appended, names and streams renumbered."""
    rows, launches = len(into.dev_start), len(into.runtime_s)
    names = []
    for name in later.name_index:  # in the later part's numbering order
        ix = into.name_index.get(name)
        if ix is None:
            ix = into.name_index[name] = len(into.name_index)
            into.kind_of_name[name] = later.kind_of_name[name]
        names.append(ix)
    streams = []
    for tid in later.stream_of:
        ix = into.stream_of.get(tid)
        if ix is None:
            ix = into.stream_of[tid] = len(into.stream_of)
        streams.append(ix)
    into.dev_name.extend(names[i] if i >= 0 else -1 for i in later.dev_name)
    into.dev_stream.extend(streams[i] for i in later.dev_stream)
    into.dev_start.extend(later.dev_start)
    into.dev_end.extend(later.dev_end)
    into.dev_kind.extend(later.dev_kind)
    into.dev_corr.extend(later.dev_corr)
    into.dev_ext.extend(later.dev_ext)
    for row, args in later.comm_args.items():
        into.comm_args[row + rows] = args
    into.runtime_s.extend(later.runtime_s)
    into.runtime_e.extend(later.runtime_e)
    into.runtime_tid.extend(later.runtime_tid)
    for corr, row in later.launch_row.items():
        into.launch_row[corr] = row + launches
    for raw, text in later.tid_str.items():
        into.tid_str.setdefault(raw, text)


def _absorb_host(into: _Reducer, later: _Reducer) -> None:
    """Host columns: combinations and shapes renumbered in the later part's order of first
    appearance, which is the order a reducer of the whole file would have met them in."""
    raw_of: list[tuple[int, object, str]] = [(0, None, "")] * len(later.combo_name)
    for code, by_tid in enumerate(later.host_ctx):
        for raw_tid, by_name in by_tid.items():
            for name, key in by_name.items():
                raw_of[key >> _N_BITS] = (code, raw_tid, name)
    combos = np.empty(len(raw_of), dtype=np.int32)
    for i, (code, raw_tid, name) in enumerate(raw_of):
        table = into.host_ctx[code].get(raw_tid)
        if table is None:  # the thread's text is in into.tid_str already (_absorb_device)
            table = into._host_names(code, raw_tid)
        found = table.get(name)
        if found is None:
            found = table[name] = into._host_key(code, raw_tid, name)
        combos[i] = found >> _N_BITS
    shapes = np.empty(len(later.shape_of), dtype=np.int32)
    for raw, ix in later.shape_of.items():
        mine = into.shape_of.get(raw)
        if mine is None:
            mine = into.shape_of[raw] = len(into.shape_of)
        shapes[ix] = mine
    starts, ends, combo_cols, shape_cols = into.host_chunks
    later_starts, later_ends, later_combos, later_shapes = later.host_chunks
    starts.extend(later_starts)
    ends.extend(later_ends)
    combo_cols.extend(combos[c] for c in later_combos)
    for col in later_shapes:  # -1: not an operator; every other value indexes shape_of
        shape_cols.append(np.where(col >= 0, shapes[np.maximum(col, 0)], col).astype(np.int32))
