"""What a view of report.html is made of: HTML blocks in order, and the figures and tables they
name, which travel once as JSON and are drawn by the page's script when the view is shown.

A figure spec is ``{"all": figure, "by_rank": {"0": figure, ...}}``: the page draws the selected
rank's figure, or ``all`` (whose per-rank traces carry ``meta: {"rank": N}`` and are filtered to
the selected rank). A table spec holds typed columns and raw rows (cells are set with
``textContent``, so they are not HTML-escaped; ``html_text.cell`` shows control characters).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from mgprof.analyze.run.results import JobAnalysis, RankAnalysis
from mgprof.analyze.run.schema import RunAnalysis
from mgprof.analyze.trace.cross_rank import CrossRankSummary
from mgprof.analyze.trace.summary import RankTraceSummary
from mgprof.records import RunRecord
from mgprof.report.html.palette import rank_color
from mgprof.report.html.text import esc, prose

__all__ = ["Col", "Context", "View", "figure_spec", "ms", "rank_color", "rounded"]

T = TypeVar("T")


@dataclass(frozen=True)
class Col:
    """A table column: its header, whether it holds numbers (sorted as numbers, right-aligned)
    and how many decimals those are shown with."""

    label: str
    num: bool = True
    digits: int = 2

    def spec(self) -> dict[str, Any]:
        return {"label": self.label, "num": self.num, "digits": self.digits}


def figure_spec(
    all_ranks: dict[str, Any] | None, by_rank: Mapping[int, dict[str, Any]] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if all_ranks is not None:
        spec["all"] = all_ranks
    if by_rank:
        spec["by_rank"] = {str(r): fig for r, fig in by_rank.items()}
    return spec


def _number(value: Any) -> float | None:
    """A real number as float; None for anything else (None, bool)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def rounded(value: float | None, digits: int = 3) -> float | None:
    """A number rounded for the page's data (ms to the µs by default: the JSON stays small and
    loses nothing the page shows); None stays None."""
    num = _number(value)
    return None if num is None else round(num, digits)


def ms(us: float | None) -> float | None:
    """Microseconds as milliseconds; None stays None."""
    value = _number(us)
    return None if value is None else value / 1000.0


@dataclass
class View:
    """One tab of the report: ``key`` is its name in the URL (``#view=key``)."""

    key: str
    title: str
    blocks: list[str] = field(default_factory=list)
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)

    def heading(self, text: str) -> None:
        self.blocks.append(f"<h3>{esc(text)}</h3>")

    def note(self, text: str, css: str = "note") -> None:
        """A paragraph of prose: `code` spans become ``<code>``."""
        self.blocks.append(f'<p class="{css}">{prose(text)}</p>')

    def html(self, markup: str) -> None:
        """Markup built by the caller (every data string in it already escaped)."""
        self.blocks.append(markup)

    def chart(self, chart_id: str, spec: dict[str, Any]) -> None:
        """A chart, when ``spec`` has a figure."""
        if spec:
            self.figures[chart_id] = spec
            self.blocks.append(f'<div class="chart vchart" id="{chart_id}"></div>')

    def table(
        self,
        table_id: str,
        columns: Sequence[Col],
        rows: list[list[Any]],
        *,
        rank_col: int | None = 0,
        sort: tuple[int, str] | None = None,
        depth: list[int] | None = None,
        note: str = "",
        group: str = "",
        hidden: bool = False,
    ) -> None:
        """A sortable, filterable table; ``rank_col`` is the column the rank selector filters
        on, ``depth`` indents the second column (a tree), ``group``/``hidden`` make it one of
        the tables a ``switch`` chooses between."""
        spec: dict[str, Any] = {
            "columns": [c.spec() for c in columns],
            "rows": rows,
            "rank_col": rank_col,
        }
        if sort is not None:
            spec["sort"] = list(sort)
        if depth is not None:
            spec["depth"] = depth
        if note:
            spec["note"] = note
        self.tables[table_id] = spec
        attrs = f' data-group="{esc(group)}"' if group else ""
        attrs += " hidden" if hidden else ""
        self.blocks.append(f'<div class="vtable" data-table="{table_id}"{attrs}></div>')

    def switch(self, group: str, label: str, options: Sequence[tuple[str, str]]) -> None:
        """A selector showing one of the tables of ``group``: options are (table id, text)."""
        opts = "".join(f'<option value="{esc(t)}">{esc(text)}</option>' for t, text in options)
        self.blocks.append(
            f'<label class="switch">{esc(label)} '
            f'<select data-switch="{esc(group)}">{opts}</select></label>'
        )


@dataclass
class Context:
    """The run, its analysis and the per-rank trace summaries, read once for every view."""

    run: RunRecord
    analysis: RunAnalysis
    ranks: list[int]
    summaries: dict[int, list[RankTraceSummary]]

    @classmethod
    def of(cls, run: RunRecord, analysis: RunAnalysis) -> Context:
        summaries: dict[int, list[RankTraceSummary]] = {}
        for key, items in analysis.traces.ranks.items():
            rank = _int(key)
            if rank is not None and items:
                summaries[rank] = items
        ranks = {r.rank for r in run.ranks} | set(summaries)
        ranks |= {d.rank for d in analysis.ranks}
        return cls(run, analysis, sorted(ranks), summaries)

    def rank_figures(self) -> list[RankAnalysis]:
        """The analysis' per-rank entries, in rank order."""
        return sorted(self.analysis.ranks, key=lambda d: d.rank)

    def job(self) -> JobAnalysis | None:
        return self.analysis.job

    def cross_rank(self) -> CrossRankSummary | None:
        job = self.analysis.traces.job
        return job.cross_rank if job is not None else None

    def items(self, pick: Callable[[RankTraceSummary], Sequence[T]]) -> dict[int, list[T]]:
        """Rank -> the entries ``pick`` takes from each of its trace summaries (files in
        order); ranks with none left out."""
        out: dict[int, list[T]] = {}
        for rank, summaries in self.summaries.items():
            rows = [row for s in summaries for row in pick(s)]
            if rows:
                out[rank] = rows
        return out


def _int(value: str) -> int | None:
    if value.strip().lstrip("-").isdigit():
        return int(value)
    return None
