"""Replay of one device's allocator trace ring: allocated and reserved bytes over the ring,
their peaks, and the blocks live after any entry.

``torch.cuda.memory._record_memory_history(max_entries=N)`` keeps the allocator's last N
actions in a ring, and ``_snapshot()`` returns the ring with the state of every segment and
block at the moment of the snapshot. The ring rarely starts from an empty device (the model's
parameters were allocated before recording began, or the ring overflowed), so the totals at
its first entry are reconstructed from its end:

- blocks live at the start are the blocks freed in the ring whose allocation is not in it
  (their ``free_completed`` gives address and size), plus the blocks active in the snapshot
  (``active_allocated`` or ``active_pending_free``) at an address with no allocation left live
  by the replay (allocated before the ring and never freed in it);
- reserved at the start is the snapshot's segments (``total_size``) minus the ring's net
  ``segment_alloc``/``segment_map`` less ``segment_free``/``segment_unmap`` bytes.

A block counts from its ``alloc`` to its ``free_completed``: a ``free_requested`` block waiting
for another stream (``record_stream``) still holds its memory. Sizes are the trace's, the
bytes requested (PyTorch's ``CUDACachingAllocator.cpp`` records ``orig_size`` for ``alloc``
and ``block->requested_size`` for ``free_completed``), as in memory_viz's Active Memory
Timeline; the allocator's rounding shows in reserved − allocated.

Limits: the reconstruction assumes the ring is complete from its first entry to the snapshot
(recording stayed on). A free missing from the ring leaves its block live in the replay (it
ends where its address is allocated again; ``stale_blocks`` counts those the snapshot does not
hold); a block allocated before the ring and freed in it has the stack of its free, not of its
allocation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["Block", "Replay", "replay"]

Block = tuple[int, Any, bool]
"""A live block: (bytes, its frames, whether the frames are those of its free, not its
allocation: it was allocated before the ring)."""

_GROW = frozenset(("segment_alloc", "segment_map"))
_SHRINK = frozenset(("segment_free", "segment_unmap"))


def snapshot_int(v: Any) -> int | None:
    """An int field of a snapshot entry (bool and float-with-fraction are not), else None;
    shared with ``memory_snapshot``."""
    if type(v) is int:
        return v
    if type(v) is float and v.is_integer():
        return int(v)
    return None


class Replay:
    """One device's ring replayed; byte totals are absolute (the baseline added).

    Positions are entry indices; −1 is the start of the ring, before its first entry.
    """

    def __init__(self, entries: Sequence[Mapping[str, Any]]) -> None:
        self.entries = entries
        self.n = len(entries)
        # allocations in the ring: entry index, end index (n: live at the end), bytes
        self.alloc_at: list[int] = []
        self.alloc_end: list[int] = []
        self.alloc_size: list[int] = []
        # blocks allocated before the ring and freed in it: the index of their free
        self.freed_at: list[int] = []
        self.freed_bytes = 0
        # blocks allocated before the ring and live at the snapshot
        self.kept: list[Block] = []
        self.baseline_allocated = 0
        self.baseline_reserved = 0
        self.peak_allocated = 0
        self.peak_index = -1
        self.reserved_at_peak = 0
        self.pending_at_peak = 0
        self.peak_reserved = 0
        self.peak_reserved_index = -1
        self.oom_index: int | None = None
        self.oom_count = 0
        self.allocated_at_oom = 0
        self.reserved_at_oom = 0
        self.skipped = 0
        """Entries without a usable action, address or size."""
        self.stale_blocks = 0
        """Blocks the replay leaves live that the snapshot does not hold (a free missing)."""
        self.reserved_mismatch = 0
        """Bytes by which the ring frees more segments than it and the snapshot hold (the
        baseline reserved would be negative; it is 0 instead)."""

    def live_at(self, index: int) -> list[Block]:
        """The blocks live after entry ``index`` (−1: at the start of the ring)."""
        blocks: list[Block] = list(self.kept)
        entries = self.entries
        for f in self.freed_at:
            if index < f:
                e = entries[f]
                blocks.append((snapshot_int(e.get("size")) or 0, e.get("frames"), True))
        at, end, size = self.alloc_at, self.alloc_end, self.alloc_size
        for j in range(len(at)):
            if at[j] <= index < end[j]:
                blocks.append((size[j], entries[at[j]].get("frames"), False))
        return blocks


def replay(
    entries: Sequence[Mapping[str, Any]],
    live_end: Mapping[int, Block],
    reserved_end: int,
) -> Replay:
    """Replay ``entries`` (one device's trace, in order) against the snapshot's end state:
    ``live_end`` maps each active block's address to (requested bytes, frames, False) and
    ``reserved_end`` is the bytes of the device's segments. Linear in the entries."""
    r = Replay(entries)
    n = r.n
    at, end, sizes = r.alloc_at, r.alloc_end, r.alloc_size
    live: dict[int, int] = {}  # address -> allocation number
    pending: dict[int, int] = {}  # address -> bytes freed but not yet completed
    cur = resv = pend = 0  # relative to the start of the ring
    best = rbest = 0
    for i, e in enumerate(entries):
        action = e.get("action")
        if action == "alloc":
            addr, size = snapshot_int(e.get("addr")), snapshot_int(e.get("size"))
            if addr is None or size is None:
                r.skipped += 1
                continue
            j = live.get(addr)
            if j is not None:  # its free is missing: it ended when the address was reused
                end[j] = i
                cur -= sizes[j]
            live[addr] = len(at)
            at.append(i)
            end.append(n)
            sizes.append(size)
            cur += size
            if cur > best:
                best, r.peak_index = cur, i
                r.reserved_at_peak, r.pending_at_peak = resv, pend
        elif action == "free_completed":
            addr = snapshot_int(e.get("addr"))
            if addr is None:
                r.skipped += 1
                continue
            j = live.pop(addr, None)
            if j is None:
                size = snapshot_int(e.get("size"))
                if size is None:
                    r.skipped += 1
                    continue
                r.freed_at.append(i)
                r.freed_bytes += size
                cur -= size
            else:
                end[j] = i
                cur -= sizes[j]
            held = pending.pop(addr, None)
            if held is not None:
                pend -= held
        elif action == "free_requested":
            addr = snapshot_int(e.get("addr"))
            if addr is None or addr in pending:
                continue
            j = live.get(addr)
            size = sizes[j] if j is not None else snapshot_int(e.get("size"))
            if size is not None:
                pending[addr] = size
                pend += size
        elif action in _GROW or action in _SHRINK:
            size = snapshot_int(e.get("size"))
            if size is None:
                r.skipped += 1
                continue
            resv += size if action in _GROW else -size
            if resv > rbest:
                rbest, r.peak_reserved_index = resv, i
        elif action == "oom":
            r.oom_count += 1
            if r.oom_index is None:
                r.oom_index = i
                r.allocated_at_oom, r.reserved_at_oom = cur, resv
    _baseline(r, live, live_end, reserved_end - resv)
    base, rbase = r.baseline_allocated, r.baseline_reserved
    r.peak_allocated = base + best
    r.reserved_at_peak += rbase
    r.peak_reserved = rbase + rbest
    r.allocated_at_oom += base
    r.reserved_at_oom += rbase
    return r


def _baseline(r: Replay, live: dict[int, int], live_end: Mapping[int, Block], rbase: int) -> None:
    """What was live and reserved at the start of the ring."""
    r.kept = [b for addr, b in live_end.items() if addr not in live]
    r.stale_blocks = sum(1 for addr in live if addr not in live_end)
    r.baseline_allocated = r.freed_bytes + sum(b[0] for b in r.kept)
    if rbase < 0:
        r.reserved_mismatch, rbase = -rbase, 0
    r.baseline_reserved = rbase
