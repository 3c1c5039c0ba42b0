"""Why a launched run failed, in words: which ranks died, of which signal, in which collective.

torchrun prints a failure summary on stderr (``rank : 1 (local_rank: 1)`` / ``exitcode : -9``
blocks under ``Failures:`` and ``Root Cause``, and ``failed (exitcode: -9) local_rank: 1`` log
lines); the launcher keeps those lines and this module turns them into ``RankExit`` records and
one sentence. Importable without torch.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable
from pathlib import Path

import msgspec

from mgprof.records import RankExit

_BLOCK_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_BLOCK_CODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_LOG_LINE = re.compile(r"failed \(exitcode:\s*(-?\d+)\)\s*local_rank:\s*(\d+)")
_ROOT = re.compile(r"^\s*Root Cause")
_C10D_FRAME = re.compile(r"distributed_c10d\.py\", line \d+, in (\w+)")


def is_torchrun_line(line: str) -> bool:
    """Whether a stderr line belongs to torchrun's failure summary (kept apart from the tail)."""
    return bool(
        _BLOCK_RANK.match(line)
        or _BLOCK_CODE.match(line)
        or _ROOT.match(line)
        or _LOG_LINE.search(line)
    )


def shell_code(code: int) -> int:
    """A ``Popen`` return code as a shell reports it: killed by signal N (``-N``) is 128+N."""
    return 128 - code if code < 0 else code


def signal_name(exit_code: int) -> str | None:
    """``SIGKILL`` for -9 (killed) or 137 (128 + 9, a handler's exit); None for other codes."""
    number = -exit_code if exit_code < 0 else exit_code - 128 if exit_code > 128 else 0
    try:
        return signal.Signals(number).name if number > 0 else None
    except ValueError:
        return None


def parse_torchrun_failures(lines: Iterable[str], single_node: bool = True) -> list[RankExit]:
    """Failed workers from torchrun's summary lines, root cause first, one entry per rank.

    The ``Failures``/``Root Cause`` blocks name global ranks; the log lines only local ranks,
    which equal global ranks on one node and are used when no block survived.
    """
    by_rank: dict[int, RankExit] = {}
    by_local: dict[int, RankExit] = {}
    root = False
    pending: tuple[int, int] | None = None
    for line in lines:
        if _ROOT.match(line):
            root = True
            continue
        m = _BLOCK_RANK.match(line)
        if m:
            pending = (int(m.group(1)), int(m.group(2)))
            continue
        m = _BLOCK_CODE.match(line)
        if m and pending is not None:
            code = int(m.group(1))
            rank, local = pending
            pending = None
            previous = by_rank.get(rank)
            by_rank[rank] = RankExit(
                rank=rank,
                local_rank=local,
                exit_code=code,
                signal=signal_name(code),
                root_cause=root or (previous is not None and previous.root_cause),
            )
            continue
        m = _LOG_LINE.search(line)
        if m:
            code, local = int(m.group(1)), int(m.group(2))
            by_local.setdefault(
                local,
                RankExit(
                    rank=local if single_node else None,
                    local_rank=local,
                    exit_code=code,
                    signal=signal_name(code),
                ),
            )
    exits = list(by_rank.values())
    if not exits:
        exits = list(by_local.values())
        if exits:  # torchrun logs the first failure it observes first
            exits[0] = msgspec.structs.replace(exits[0], root_cause=True)
    return sorted(exits, key=lambda e: (not e.root_cause, e.rank if e.rank is not None else -1))


def describe_exit(e: RankExit) -> str:
    who = f"rank {e.rank}" if e.rank is not None else f"local rank {e.local_rank}"
    if e.exit_code < 0 and e.signal:
        return f"{who} was killed by {e.signal} (exit code {e.exit_code})"
    if e.signal:
        return f"{who} exited with code {e.exit_code} ({e.signal})"
    return f"{who} exited with code {e.exit_code}"


def describe_exits(exits: list[RankExit]) -> str:
    """E.g. ``rank 1 was killed by SIGKILL (exit code -9); then rank 0 exited with code 143
    (SIGTERM)``: the root cause first, then the ranks torchrun stopped because of it."""
    first = [describe_exit(e) for e in exits if e.root_cause]
    rest = [describe_exit(e) for e in exits if not e.root_cause]
    if not first:
        return ", ".join(rest)
    return ", ".join(first) + (f"; then {', '.join(rest)}" if rest else "")


def collective_of(error: str) -> str | None:
    """The ``torch.distributed`` call a rank's traceback failed in (``all_reduce``...), if any."""
    frames = _C10D_FRAME.findall(error)
    return frames[0] if frames else None


def last_meaningful(lines: list[str]) -> str:
    """The last stderr line that says something (not a ``=====`` rule)."""
    for line in reversed(lines):
        text = line.strip()
        if text and text.strip("=-_* ") and not text.startswith("USDT:"):
            return text
    return ""


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_LIBRARY = ("/site-packages/", "/dist-packages/", "/mgprof/", "<frozen ", "/lib/python")


def stack_site(text: str) -> str | None:
    """Where a rank's main thread was, from its ``faulthandler`` dump (``logs/rank<N>.stack``,
    written when mgprof stopped it): the innermost frame of the script's own code, with the
    innermost torch function it was in (``all_reduce`` ...), or None when the dump has none."""
    current: list[tuple[str, int, str]] = []
    block: list[tuple[str, int, str]] | None = None
    for line in text.splitlines():
        if line.startswith("Current thread") or line.startswith("Thread"):
            block = [] if line.startswith("Current thread") else None
            continue
        m = _FRAME.match(line)
        if m and block is not None:
            block.append((m["file"], int(m["line"]), m["func"]))
            current = block
    if not current:
        return None
    own = next(((f, n, fn) for f, n, fn in current if not any(lib in f for lib in _LIBRARY)), None)
    if own is None:
        return None
    inner = current[: current.index(own)]
    torch_fn = next((fn for f, _, fn in reversed(inner) if "/torch/" in f), None)
    where = f"{Path(own[0]).name}:{own[1]} in {own[2]}"
    return f"in {torch_fn} at {where}" if torch_fn else f"at {where}"


TORCHRUN_LOG_TAIL = 256 * 1024


def torchrun_log_lines(run_dir: Path) -> list[str]:
    """torchrun's failure-summary lines from ``logs/torchrun.log`` (``mgprof.run.entry`` keeps
    its traceback there, off the terminal), from the last ``TORCHRUN_LOG_TAIL`` bytes."""
    try:
        with open(run_dir / "logs" / "torchrun.log", "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - TORCHRUN_LOG_TAIL))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if is_torchrun_line(line)]


def stack_sites(run_dir: Path) -> dict[int, str]:
    """rank -> where its main thread was when stopped, for the ranks that left a stack."""
    found: dict[int, str] = {}
    for path in sorted((run_dir / "logs").glob("rank*.stack")):
        try:
            rank = int(path.stem.removeprefix("rank"))
            text = path.read_text(encoding="utf-8", errors="replace")[:200_000]
        except (ValueError, OSError):
            continue
        site = stack_site(text)
        if site is not None:
            found[rank] = site
    return found


FLIGHT_RECORD_BYTES = 32 * 1024 * 1024
"""A flight-recorder dump read at most (2,000 entries are about 1.5 MB)."""


def _last_collectives(path: Path) -> dict[str, tuple[int, str]]:
    """process group -> (sequence number, name) of the last collective a rank's flight
    recorder holds; empty for a file that is not a dump."""
    import json

    try:
        with open(path, "rb") as fh:
            doc = json.loads(fh.read(FLIGHT_RECORD_BYTES))
    except (OSError, ValueError):
        return {}
    entries = doc.get("entries") if isinstance(doc, dict) else None
    last: dict[str, tuple[int, str]] = {}
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        seq, name, group = e.get("collective_seq_id"), e.get("profiling_name"), e.get("pg_id")
        if not isinstance(seq, int) or not isinstance(name, str):
            continue
        key = str(group)
        if key not in last or seq > last[key][0]:
            last[key] = (seq, name.split(":", 1)[-1])
    return last


def collective_sites(run_dir: Path) -> str:
    """``rank 0 entered all_reduce #4; rank 1 never arrived (its last: all_reduce #3)``: from
    the ranks' flight-recorder dumps (``logs/rank<N>.fr.json``), per process group where the
    ranks' last collectives differ, the furthest one and the ranks that did not reach it;
    empty when fewer than two ranks left a dump or they all stopped at the same collective."""
    ranks: dict[int, dict[str, tuple[int, str]]] = {}
    for path in sorted((run_dir / "logs").glob("rank*.fr.json")):
        try:
            rank = int(path.name.removeprefix("rank").removesuffix(".fr.json"))
        except ValueError:
            continue
        found = _last_collectives(path)
        if found:
            ranks[rank] = found
    if len(ranks) < 2:
        return ""
    parts = []
    for group in sorted({g for found in ranks.values() for g in found}):
        seen = {r: found[group] for r, found in ranks.items() if group in found}
        if len({seq for seq, _ in seen.values()}) < 2:
            continue
        top = max(seq for seq, _ in seen.values())
        ahead = sorted(r for r, (seq, _) in seen.items() if seq == top)
        name = seen[ahead[0]][1]
        behind = sorted(r for r in seen if r not in ahead)
        last = "; ".join(f"rank {r} last entered {seen[r][1]} #{seen[r][0]}" for r in behind)
        where = "" if group in ("0", "None") else f" (process group {group})"
        parts.append(
            f"rank(s) {', '.join(map(str, ahead))} entered {name} #{top}{where}, which "
            f"rank(s) {', '.join(map(str, behind))} never reached ({last})"
        )
    return "; ".join(parts)
