"""Cross-rank waiting: match each collective call across ranks, split it into transfer and wait.

Split out of :mod:`mgprof.analyze.trace.comm`, which re-exports every public name here. Calls are
matched by (process group, Seq) when every call has them, else by order within each type;
``transfer_us`` = the shortest duration over the ranks, ``wait_us`` on a rank = its duration −
transfer_us; the *slowest rank* is the one that arrives last (least wait) most often (ties: the
least total wait). Durations are used, not start times, so host clocks that disagree across
machines do not matter.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from mgprof.analyze.trace.comm_types import CollectiveCall

__all__ = [
    "CrossRankCollective",
    "CrossRankSummary",
    "RankWait",
    "cross_rank",
]


class RankWait(msgspec.Struct):
    """One rank's share of cross-rank waiting."""

    rank: int
    wait_us: float
    last_arrivals: int


class CrossRankCollective(msgspec.Struct):
    """Matched calls of one type across ranks."""

    type: str
    matched: int
    transfer_us: float
    wait_us_by_rank: dict[str, float]


class CrossRankSummary(msgspec.Struct):
    """Cross-rank matching result (see :mod:`mgprof.analyze.trace.comm` for each definition)."""

    ranks: list[int]
    match_key: str
    matched_calls: int
    unmatched_calls: int
    per_type: list[CrossRankCollective]
    per_rank: list[RankWait]
    slowest_rank: int | None


def _keys(calls: Sequence[CollectiveCall], by_seq: bool) -> dict[tuple[str, str, str], int]:
    out: dict[tuple[str, str, str], int] = {}
    counters: dict[str, int] = {}
    for i, c in enumerate(calls):
        if by_seq:
            out[(c.type, c.pg or "", c.seq or "")] = i
        else:
            k = counters.get(c.type, 0)
            counters[c.type] = k + 1
            out[(c.type, "", str(k))] = i
    return out


def cross_rank(per_rank: dict[int, Sequence[CollectiveCall]]) -> CrossRankSummary | None:
    """Match calls across ranks and split each into transfer and waiting (module docstring)."""
    # launch-only calls (nccl:* ops without device events) have no transfer to split
    per_rank = {r: [c for c in calls if not c.launch_only] for r, calls in per_rank.items()}
    ranks = sorted(per_rank)
    if len(ranks) < 2:
        return None
    by_seq = all(c.seq is not None for r in ranks for c in per_rank[r]) and any(
        per_rank[r] for r in ranks
    )
    keyed = {r: _keys(sorted(per_rank[r], key=lambda c: c.start_us), by_seq) for r in ranks}
    ordered = {r: sorted(per_rank[r], key=lambda c: c.start_us) for r in ranks}
    common = set.intersection(*(set(k) for k in keyed.values()))
    total_calls = sum(len(v) for v in per_rank.values())
    wait = {r: 0.0 for r in ranks}
    last = {r: 0 for r in ranks}
    per_type: dict[str, tuple[int, float, dict[int, float]]] = {}
    for key in sorted(common):
        durs = {r: ordered[r][keyed[r][key]].dur_us for r in ranks}
        transfer = min(durs.values())
        waits = {r: durs[r] - transfer for r in ranks}
        if max(waits.values()) > 0:
            last[min(ranks, key=lambda r: waits[r])] += 1
        n, t, w = per_type.get(key[0], (0, 0.0, {r: 0.0 for r in ranks}))
        for r in ranks:
            wait[r] += waits[r]
            w[r] += waits[r]
        per_type[key[0]] = (n + 1, t + transfer, w)
    slowest = None
    if common and any(last.values()):
        slowest = max(ranks, key=lambda r: (last[r], -wait[r]))
    return CrossRankSummary(
        ranks=ranks,
        match_key="process group + Seq" if by_seq else "order within each collective type",
        matched_calls=len(common),
        unmatched_calls=total_calls - len(common) * len(ranks),
        per_type=[
            CrossRankCollective(
                type=k, matched=n, transfer_us=t, wait_us_by_rank={str(r): w[r] for r in ranks}
            )
            for k, (n, t, w) in sorted(per_type.items())
        ],
        per_rank=[RankWait(rank=r, wait_us=wait[r], last_arrivals=last[r]) for r in ranks],
        slowest_rank=slowest,
    )
