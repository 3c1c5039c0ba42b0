"""Run directories: naming, atomic writes of run.json, per-rank partial records and merging.

Importable without torch: the launcher and ``mgprof report`` use it on any machine.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from pathlib import Path

import msgspec

from mgprof.atomic import write_bytes_atomic
from mgprof.errors import UsageError
from mgprof.records import RankRecord, RunRecord, encode_run

RUN_DIR_ENV = "MGPROF_RUN_DIR"
DEFAULT_ROOT = "mgprof-runs"
RUN_JSON = "run.json"
TRACES = "traces"
SAMPLES = "samples"
MEMORY = "memory"
PARTIALS = "ranks"
FINISHED = ".finished"
"""``rank<N>`` files: that rank's script returned and mgprof's record was written
(``mark_finished``); the launcher reads and removes them (``take_finished``)."""

_rank_encoder = msgspec.json.Encoder()
_rank_decoder = msgspec.json.Decoder(RankRecord)


def utc_stamp(now: _dt.datetime | None = None) -> str:
    """Sortable UTC timestamp used in run directory names."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return now.strftime("%Y%m%dT%H%M%SZ")


def utc_iso(now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return now.isoformat(timespec="seconds")


def safe_stem(name: str) -> str:
    """A script name reduced to characters that are safe in a folder name."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(name).stem).strip("-.")
    return stem or "run"


def new_run_dir(root: str | os.PathLike[str], stem: str, stamp: str | None = None) -> Path:
    """Create ``<root>/<UTC stamp>-<stem>``; never reuses an existing folder (adds ``-2``...)."""
    root_path = Path(root)
    try:
        root_path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"cannot create output folder {root_path}: {exc.strerror}; pass a writable --out"
        ) from None
    base = f"{stamp or utc_stamp()}-{safe_stem(stem)}"
    for n in range(1, 1000):
        candidate = root_path / (base if n == 1 else f"{base}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
        except OSError as exc:
            raise UsageError(
                f"cannot create run folder {candidate}: {exc.strerror}; pass a writable --out"
            ) from None
    raise UsageError(f"too many runs named {base} in {root_path}; pick another --out")


def write_run(run_dir: Path, run: RunRecord) -> Path:
    """Write run.json atomically (temp file + rename)."""
    return write_bytes_atomic(run_dir / RUN_JSON, encode_run(run))


def write_partial(run_dir: Path, record: RankRecord) -> Path:
    """One rank's record on its own, for when no process group could carry it to rank 0."""
    return write_bytes_atomic(
        run_dir / PARTIALS / f"rank{record.rank}.json", _rank_encoder.encode(record)
    )


def read_partials(run_dir: Path) -> list[RankRecord]:
    """Every readable per-rank partial record in the run directory, by rank."""
    found: list[RankRecord] = []
    folder = run_dir / PARTIALS
    if not folder.is_dir():
        return found
    for path in sorted(folder.glob("rank*.json")):
        try:
            found.append(_rank_decoder.decode(path.read_bytes()))
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            continue  # a rank killed mid-write leaves no partial: it is reported missing
    return sorted(found, key=lambda r: r.rank)


def mark_finished(run_dir: Path, rank: int) -> None:
    folder = run_dir / FINISHED
    folder.mkdir(exist_ok=True)
    (folder / f"rank{rank}").write_bytes(b"")


def take_finished(run_dir: Path) -> set[int]:
    """The ranks marked finished, the marks removed (they are the launcher's, not the user's)."""
    folder = run_dir / FINISHED
    found: set[int] = set()
    if not folder.is_dir():
        return found
    for path in folder.glob("rank*"):
        match = re.fullmatch(r"rank(\d+)", path.name)
        if match:
            found.add(int(match.group(1)))
        try:
            path.unlink()
        except OSError:
            pass
    try:
        folder.rmdir()
    except OSError:
        pass
    return found


def merge_ranks(run: RunRecord, extra: list[RankRecord]) -> RunRecord:
    """Add ranks not yet in ``run`` and recompute which ranks are missing."""
    have = {r.rank for r in run.ranks}
    ranks = list(run.ranks) + [r for r in extra if r.rank not in have]
    ranks.sort(key=lambda r: r.rank)
    got = {r.rank for r in ranks}
    missing = [r for r in range(run.world_size) if r not in got]
    return msgspec.structs.replace(run, ranks=ranks, missing_ranks=missing)
