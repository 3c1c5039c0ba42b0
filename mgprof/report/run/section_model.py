"""Section, Table, n/a footnotes and number formats: the parts every run-report section shares."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from mgprof.analyze.run.results import RankAnalysis
from mgprof.analyze.run.schema import Finding, RunAnalysis

Fmt = Callable[[float], str]


def fixed(digits: int) -> Fmt:
    return lambda v: f"{v:,.{digits}f}"


def ms_from_us(v: float) -> str:
    return f"{v / 1000.0:,.2f}"


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

    def is_text(self, i: int) -> bool:
        return i < self.numeric_from or (self.text_last and i == len(self.columns) - 1)


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
    """Numbers each distinct (figure, reason) once per section and lists who it applies to."""

    def __init__(self) -> None:
        self._index: dict[tuple[str, str], int] = {}
        self._who: dict[tuple[str, str], list[str]] = {}

    def mark(self, figure: str, reason: str, who: str) -> str:
        key = (figure, reason)
        if key not in self._index:
            self._index[key] = len(self._index) + 1
            self._who[key] = []
        if who and who not in self._who[key]:
            self._who[key].append(who)
        return f"n/a [{self._index[key]}]"

    def lines(self) -> list[str]:
        out = []
        for (figure, reason), k in self._index.items():
            who = ", ".join(self._who[(figure, reason)])
            out.append(f"[{k}] {figure}" + (f" ({who})" if who else "") + f": {reason}")
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
