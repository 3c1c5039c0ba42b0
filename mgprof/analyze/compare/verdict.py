"""The verdict of ``mgprof compare``: which strategy is measurably fastest, or "no measurable
difference" with the interval, what the memory costs, and the caveats that go with it.

Pure: the rows and the intervals between them in, words out. The verdict names a winner only
when the 95 % interval of its throughput ratio to every other row lies above 1. The answer and
its caveats are kept apart (``VerdictParts``) so every report can put the answer first; joined,
they are ``comparison.json``'s one-line ``verdict``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from mgprof.analyze.compare.scaling import SUPERLINEAR_PCT, Row, row_name
from mgprof.analyze.step_samples import Interval


class VerdictParts(NamedTuple):
    """The answer in one sentence and, apart, what could have moved the figures."""

    answer: str
    caveats: tuple[str, ...] = ()

    def line(self) -> str:
        return "; ".join([self.answer, *self.caveats])


SCALE_WORDS = {
    "weak": "per-device batch fixed",
    "strong": "global batch fixed",
    "mixed": "batches differ between rows: throughput ratio",
    "unknown": "batch per step not seen in every row",
}


def ratio_between(intervals: Sequence[Interval], a: str, b: str) -> Interval | None:
    """rate(a) / rate(b) with its interval, from either direction."""
    for i in intervals:
        if (i.a, i.b) == (a, b):
            return i
        if (i.a, i.b) == (b, a) and i.ratio > 0 and i.low > 0 and i.high > 0:
            return Interval(a=a, b=b, ratio=1.0 / i.ratio, low=1.0 / i.high, high=1.0 / i.low)
    return None


def _x(i: Interval) -> str:
    return f"{i.ratio:.2f}x (95 % interval {i.low:.2f}–{i.high:.2f}x)"


def verdict_parts(
    rows: Sequence[Row],
    cpu_fallback: bool,
    mode: str,
    intervals: Sequence[Interval] = (),
    busy: Sequence[str] = (),
    diffs: Sequence[str] = (),
    rounds: int = 1,
) -> VerdictParts:
    """The answer — the measurably fastest strategy and the figure that makes it so, or "no
    measurable difference" with the interval — and apart from it, what could have moved the
    figures (so a report can put the answer first and the caveats beside it)."""
    measured = [r for r in rows if r.samples_per_s is not None]
    if not measured:
        return VerdictParts("no verdict: no strategy produced a throughput figure (see the notes)")
    best = max(measured, key=lambda r: r.samples_per_s or 0.0)
    name = row_name(best)
    scale = SCALE_WORDS.get(mode, mode)
    others = [r for r in measured if r is not best]
    ratios = {row_name(r): ratio_between(intervals, name, row_name(r)) for r in others}
    tied = [k for k, i in ratios.items() if i is None or not i.above]
    behind = {k: i for k, i in ratios.items() if i is not None and i.above}
    if tied:
        parts = []
        for k in tied:
            i = ratios[k]
            parts.append(
                f"{name} vs {k}: {_x(i)}" if i is not None else f"{name} vs {k}: no interval"
            )
        text = "no measurable difference: " + "; ".join(parts)
        if behind:
            text += "; measurably slower: " + ", ".join(
                f"{k} ({1.0 / i.ratio:.2f}x {name})" for k, i in behind.items()
            )
        text += f" ({scale})"
    elif best.strategy == "single":
        text = f"best: {name} ({best.samples_per_s:.1f} samples/s)"
        if others:
            reached = []
            for r in others:
                i = ratio_between(intervals, row_name(r), name)
                reached.append(
                    f"{row_name(r)} on {r.devices} devices reached {_x(i) if i else '?'}"
                )
            worst = ", ".join(reached)
            text += f": {worst} ({scale}), so more devices did not pay off"
    elif best.speedup is None:  # no single-device row to measure a speedup against
        faster = ", ".join(f"{_x(i)} {k}'s" for k, i in behind.items())
        text = f"best: {name} ({best.samples_per_s:.1f} samples/s"
        text += f"; {faster} throughput" if faster else ""
        text += f"; no single-device baseline, so no speedup; {scale})"
    else:
        interval = (
            f" (95 % interval {best.speedup_low:.2f}–{best.speedup_high:.2f}x)"
            if best.speedup_low is not None and best.speedup_high is not None
            else ""
        )
        text = (
            f"best: {name} — {best.speedup:.2f}x single's throughput{interval} on "
            f"{best.devices} devices ({best.efficiency_pct:.0f}% scaling efficiency, {scale})"
        )
        comm = best.ab_comm_pct if best.ab_comm_pct is not None else best.exposed_comm_pct
        if comm is not None:
            source = "sync A/B" if best.ab_comm_pct is not None else "exposed, from traces"
            text += f"; communication costs {comm:.0f}% of a step ({source})"
        if best.efficiency_pct is not None and best.efficiency_pct < 70.0:
            text += "; efficiency below 70%: communication or input loading limits scaling"
        if best.efficiency_pct is not None and best.efficiency_pct > SUPERLINEAR_PCT:
            text += (
                "; efficiency above 100%: the single-device row ran slower per device than "
                "these ranks (see its notes), so treat the speedup with care"
            )
    caveats: list[str] = []
    if rounds < 2 and intervals:
        caveats.append(
            "one round per row: the interval holds step-to-step noise, not run-to-run drift"
        )
    if diffs:
        caveats.append("the rows differ in more than the strategy: " + "; ".join(diffs))
    if busy:
        load = _busy_words(busy)
        caveats.append(f"the machine was busy: {load} (rerun on a quiet machine)")
    if cpu_fallback:
        caveats.append(
            "measured on CPU ranks over gloo sharing this machine's cores, which says "
            "nothing about GPUs"
        )
    return VerdictParts(text, tuple(caveats))


_CORES = re.compile(r"other processes used (\d+(?:\.\d+)?) cores")
_STEAL = re.compile(r"(\d+(?:\.\d+)?) % of the CPU time was stolen")


def _busy_words(busy: Sequence[str]) -> str:
    """Each busy row in words, or for more than two, how many and the range of the load (six
    rows' loads listed one by one buried the answer). ``busy`` holds ``row: load`` texts as
    ``MachineLoad.busy`` words them."""
    if len(busy) <= 2:
        return "; ".join(busy)
    cores = [float(m.group(1)) for text in busy if (m := _CORES.search(text))]
    steal = [float(m.group(1)) for text in busy if (m := _STEAL.search(text))]
    load = []
    if cores:
        low, high = f"{min(cores):.1f}", f"{max(cores):.1f}"
        load.append(f"other processes used {low if low == high else f'{low}–{high}'} cores")
    if steal:
        load.append(f"up to {max(steal):.0f} % of the CPU time was stolen by the hypervisor")
    if not load:
        return "; ".join(busy)
    return f"{len(busy)} rows ran while {' and '.join(load)}"


def verdict(*args: Any, **kwargs: Any) -> str:
    """``verdict_parts`` (same arguments) as one line: the answer, then its caveats
    (``comparison.json``'s ``verdict``)."""
    return verdict_parts(*args, **kwargs).line()


def state_mib(row: Row) -> float | None:
    """Parameters + gradients + optimizer state per rank (None: not measured)."""
    parts = (row.params_mib, row.grads_mib, row.optimizer_mib)
    return None if any(p is None for p in parts) else sum(p or 0.0 for p in parts)


def _mib(value: float) -> str:
    return f"{value / 1024:.2f} GiB" if value >= 1024 else f"{value:.3g} MiB"


def _base_row(rows: Sequence[Row], strategy: str) -> Row | None:
    """The strategy's row at its baseline precision: the only one without ``--precision``,
    else the script's own setting, else fp32 (the rows the strategy verdict compares)."""
    mine = [r for r in rows if r.strategy == strategy]
    for wanted in (None, "script", "fp32"):
        found = next((r for r in mine if r.precision == wanted), None)
        if found is not None:
            return found
    return None


def memory_tradeoff(rows: Sequence[Row], intervals: Sequence[Interval]) -> str | None:
    """What each FSDP row buys against the DDP row (each at its baseline precision): the model
    state it saves per rank, and what that costs in throughput (with the interval), in one
    sentence; None without both."""
    ddp = _base_row(rows, "ddp")
    theirs = state_mib(ddp) if ddp is not None else None
    if ddp is None or theirs is None:
        return None
    parts = []
    for strategy in ("fsdp", "fsdp-noreshard"):
        row = _base_row(rows, strategy)
        mine = state_mib(row) if row is not None else None
        if row is None or mine is None:
            continue
        text = (
            f"{row_name(row)} holds {_mib(mine)} of parameters, gradients and optimizer state "
            f"per rank against {row_name(ddp)}'s {_mib(theirs)} ({_mib(theirs - mine)} less)"
        )
        cost = ratio_between(intervals, row_name(ddp), row_name(row))
        if cost is not None and cost.above:
            text += f" for {_x(cost)} lower throughput than ddp"
        elif cost is not None and cost.high < 1.0:
            text += f" and is faster: ddp reached {_x(cost)} of its throughput"
        elif cost is not None:
            text += f" at no measurable throughput cost (ddp vs {row.strategy}: {_x(cost)})"
        parts.append(text)
    if not parts:
        return None
    return "memory: " + "; ".join(parts)
