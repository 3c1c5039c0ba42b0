"""Section, Table, n/a footnotes and number formats: the parts every run-report section shares.

A figure's name in the analysis (``dataloader_share_pct``, ``operators.device_self_us``) is a
JSON key, not something to show a reader: text that says why a figure is missing names it in
words (:func:`figure_words`), here for the run report's footnotes and in ``mgprof trace``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from mgprof.analyze.run.results import RankAnalysis
from mgprof.analyze.run.schema import Finding, RunAnalysis
from mgprof.report.kernel_names import short_kernel_names

Fmt = Callable[[float], str]


def fixed(digits: int) -> Fmt:
    return lambda v: f"{v:,.{digits}f}"


def ms_from_us(v: float) -> str:
    return f"{v / 1000.0:,.2f}"


FIGURE_WORDS: dict[str, str] = {
    "step_time_ms": "step time",
    "samples_per_s": "samples/s",
    "nvml_gpu_util_pct": "NVML GPU util",
    "trace_busy_pct": "trace busy",
    "mfu_pct": "MFU",
    "achieved_tflops": "achieved TFLOP/s",
    "peak_tflops": "peak TFLOP/s",
    "cpu_pct": "CPU %",
    "energy_j": "energy",
    "energy_per_sample_j": "energy per sample",
    "comm": "communication",
    "comm_us": "comm",
    "comm_pct": "comm",
    "busbw_gbps": "bus bandwidth",
    "algbw_gbps": "algorithm bandwidth",
    "memory": "memory",
    "peak_allocated_mib": "peak allocated",
    "peak_reserved_mib": "peak reserved",
    "total_mib": "device total",
    "headroom_mib": "headroom",
    "headroom_pct": "headroom",
    "peak_rss_mib": "peak RSS",
    "dataloader_share_pct": "DataLoader wait",
    "slowest_rank": "slowest rank",
    "fastest_rank": "fastest rank",
    "step_time_spread_pct": "step-time spread",
    "identical_batches": "identical batches",
    "cross_rank": "cross-rank waiting",
    "top_kernels": "top kernels",
    "tensor_cores": "tensor-core share",
    "flops": "FLOPs",
    "flops.partial": "FLOP estimate",
    "rank": "rank number",
    "fsdp": "FSDP communication",
    "operators_by_name": "operators by name",
    "operators_device_unattributed_us": "device time outside operators",
    "skipped_files": "skipped files",
    "skipped_device_events": "skipped device events",
    "window_us": "window",
    "overlap_us": "comm overlap",
    "memcpy": "memcpy",
    "dataloader": "data loader",
    "comm_overlap": "comm overlap",
    "exposed_comm": "exposed comm",
}
"""Figure names as a reader says them; a trace total's ``_us``/``_pct`` pair shares the words of
its column in ``mgprof trace`` (``memcpy_us`` and ``memcpy_pct``: memcpy)."""

_NAME = re.compile(r"[a-z][a-z0-9_.]*")
_UNITS = ("_us", "_ms", "_pct", "_mib", "_gbps", "_j", "_s")


def figure_words(name: str) -> str:
    """``dataloader_share_pct`` -> ``DataLoader wait``: a figure's name (a JSON key) in words.
    Names not listed lose their unit suffix and their underscores (``operators.device_self_us``
    -> ``operator device self time``); text that is already words is returned as it is."""
    if name in FIGURE_WORDS:
        return FIGURE_WORDS[name]
    if not _NAME.fullmatch(name):
        return name
    if name.startswith(("operators.", "operators_by_name.")):
        return "operator device times" if ".device_" in name else "operators"
    for unit in _UNITS:
        if name.endswith(unit) and name[: -len(unit)] in FIGURE_WORDS:
            return FIGURE_WORDS[name[: -len(unit)]]
    stem = name
    for unit in _UNITS:
        if stem.endswith(unit):
            stem = stem[: -len(unit)] + (" time" if unit in ("_us", "_ms") else "")
            break
    return stem.replace(".", " ").replace("_", " ")


def words_list(items: Iterable[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``: distinct items in their order."""
    seen = list(dict.fromkeys(items))
    if len(seen) < 2:
        return "".join(seen)
    return ", ".join(seen[:-1]) + " and " + seen[-1]


def _runs(numbers: list[str]) -> str:
    """``0, 1, 2, 5`` -> ``0-2, 5``: three or more consecutive ranks joined (names that are
    not numbers kept as they are)."""
    if not all(n.isdigit() for n in numbers):
        return ", ".join(numbers)
    ordered = sorted({int(n) for n in numbers})
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ordered[i]}-{ordered[j]}")
        else:
            parts.extend(str(n) for n in ordered[i : j + 1])
        i = j + 1
    return ", ".join(parts)


def who_words(who: Iterable[str]) -> str:
    """``rank 0``, ``rank 1``, ``rank 2``, ``job`` -> ``ranks 0-2; job``: the ranks a reason
    applies to, said once."""
    ranks: list[str] = []
    others: list[str] = []
    for w in dict.fromkeys(who):
        if w.startswith("rank "):
            ranks.append(w[len("rank ") :])
        elif w:
            others.append(w)
    parts = []
    if ranks:
        parts.append(("rank " if len(ranks) == 1 else "ranks ") + _runs(ranks))
    return "; ".join(parts + others)


@dataclass
class Table:
    """Column headers and rows of already formatted cells."""

    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    numeric_from: int = 1
    """Columns from this index on hold numbers (right-aligned); before it, labels."""
    text_last: bool = False
    """The last column is text (a kernel name): left-aligned and wrapping, after the numbers,
    so a long name takes the room the figures leave instead of pushing them apart."""
    kernel_names: int | None = None
    """The column holding kernel names as the trace recorded them: the terminal and Markdown
    reports show their short form (``mgprof.report.kernel_names``), JSON the full name."""

    def is_text(self, i: int) -> bool:
        return i < self.numeric_from or (self.text_last and i == len(self.columns) - 1)

    def shown_rows(self) -> list[list[str]]:
        """The rows as the terminal and Markdown reports show them: kernel names in their
        short form (``kernel_names``), told apart where two share one."""
        col = self.kernel_names
        if col is None:
            return self.rows
        shorts = short_kernel_names([row[col] for row in self.rows])
        return [[*row[:col], short, *row[col + 1 :]] for row, short in zip(self.rows, shorts)]


@dataclass
class Section:
    """One report section: key/value facts, tables, a highlighted notice, plain notes."""

    title: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    notice: str | None = None
    """Must not be missed (CPU fallback): renderers show it as a panel or a callout."""
    notes: list[str] = field(default_factory=list)
    footnotes: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    brief: str | None = None
    """The whole section in one line (a GPU-only section of a CPU run says why it is empty);
    renderers show it in place of the rest."""


class Footnotes:
    """Numbers each distinct reason once per section and lists, in words, the figures it
    explains and who it applies to: ``[1] energy and energy per sample (ranks 0, 1; job): no
    NVML on this rank``."""

    def __init__(self) -> None:
        self._index: dict[str, int] = {}
        self._figures: dict[str, list[str]] = {}
        self._who: dict[str, list[str]] = {}

    def mark(self, figure: str, reason: str, who: str) -> str:
        if reason not in self._index:
            self._index[reason] = len(self._index) + 1
            self._figures[reason] = []
            self._who[reason] = []
        words = figure_words(figure)
        if words and words not in self._figures[reason]:
            self._figures[reason].append(words)
        if who and who not in self._who[reason]:
            self._who[reason].append(who)
        return f"n/a [{self._index[reason]}]"

    def lines(self) -> list[str]:
        out = []
        for reason, k in self._index.items():
            who = who_words(self._who[reason])
            what = words_list(self._figures[reason])
            out.append(f"[{k}] {what}" + (f" ({who})" if who else "") + f": {reason}")
        return out


class Cells:
    """Formats the figures of one record (a rank or the job), n/a with a footnote when None.

    ``not_applicable`` is the record's reasons (``RankAnalysis.not_applicable``...)."""

    def __init__(self, notes: Footnotes, not_applicable: Mapping[str, str], who: str) -> None:
        self._notes = notes
        self._na = not_applicable
        self._who = who

    def reason(self, *keys: str) -> str:
        for key in keys:
            if key in self._na:
                return self._na[key]
        return "not computed by this analysis"

    def get(
        self,
        value: float | None,
        fmt: Fmt,
        figure: str,
        *reason_keys: str,
        label: str | None = None,
    ) -> str:
        if value is None:
            return self._notes.mark(label or figure, self.reason(figure, *reason_keys), self._who)
        return fmt(float(value))


def cpu_only(analysis: RunAnalysis) -> bool:
    """Every rank ran on the CPU: GPU-only sections shrink to one line."""
    ranks = analysis.ranks
    return bool(ranks) and all(r.device.startswith("cpu") for r in ranks)


def job_reasons(analysis: RunAnalysis) -> Mapping[str, str]:
    """The job's ``not_applicable`` (empty when the analysis has no job block)."""
    return analysis.job.not_applicable if analysis.job is not None else {}


def who_of(rank: RankAnalysis) -> str:
    return f"rank {rank.rank}"
