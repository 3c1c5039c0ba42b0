"""Render a :class:`JobTraceSummary`: a rich terminal summary, or the ``--json`` document.

Rendering only: every number comes from :mod:`mgprof.analyze.trace.summary`; a figure that does
not apply is printed as "n/a" and its reason is listed under the tables, once per reason, the
figures it covers named in words (``--json`` keeps the figures' keys): a CPU-only trace's many
device figures are one line. C++ kernel names are shown short (``mgprof.report.kernel_names``;
``--json`` has them whole). Names from the trace (kernels, ops, collective types, paths, notes)
enter rich as ``Text`` through ``safe_text``: never markup (``[/x]`` would raise, ``[link=...]``
would plant a hyperlink), no control characters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from mgprof.analyze.trace.job import JobTraceSummary
from mgprof.analyze.trace.summary import RankTraceSummary, TraceTotals
from mgprof.report.kernel_names import short_kernel_names
from mgprof.report.safe_text import rich_text

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

__all__ = [
    "JSON_SCHEMA_VERSION",
    "job_to_json",
    "jobs_to_json",
    "not_applicable_lines",
    "render_job",
]

JSON_SCHEMA_VERSION = 1
_TOTAL_KEYS = (
    "window_us",
    "busy_pct",
    "idle_pct",
    "compute_pct",
    "comm_pct",
    "comm_overlap_pct",
    "exposed_comm_pct",
)


def _rank_json(r: RankTraceSummary) -> dict[str, Any]:
    """One rank: the contract's totals at the top level, then the details.

    ``collective_calls`` (one entry per call, used for cross-rank matching) is left out: it can
    hold thousands of entries and the per-type ``collectives`` already sum it.
    """
    totals = msgspec.to_builtins(r.totals)
    out: dict[str, Any] = {"rank": r.rank, "source": r.source, "kind": r.kind}
    out.update({k: totals[k] for k in _TOTAL_KEYS})
    out.update({k: v for k, v in totals.items() if k not in _TOTAL_KEYS})
    body = msgspec.to_builtins(r)
    for key in ("rank", "source", "kind", "totals", "collective_calls"):
        body.pop(key, None)
    out.update(body)
    return out


def job_to_json(job: JobTraceSummary) -> dict[str, Any]:
    """The JSON object of one job (folder): ranks, cross-rank result, reasons and definitions."""
    return {
        "directory": job.directory,
        "ranks": [_rank_json(r) for r in job.ranks],
        "cross_rank": msgspec.to_builtins(job.cross_rank),
        "slowest_rank": job.slowest_rank,
        "not_applicable": dict(job.not_applicable),
        "definitions": dict(job.definitions),
    }


def jobs_to_json(jobs: Sequence[JobTraceSummary]) -> dict[str, Any]:
    """The whole ``mgprof trace --json`` document (always a list of jobs, one per folder)."""
    return {"schema_version": JSON_SCHEMA_VERSION, "jobs": [job_to_json(j) for j in jobs]}


CPU_ONLY = "CPU-only trace"
"""How the trace engine starts the reasons of a CPU trace's device figures (no kernels, no
device events, no device copies): said once, as one line."""


def not_applicable_lines(job: JobTraceSummary) -> list[str]:
    """The figures that do not apply, one line per reason: the figures in words and the ranks
    it holds for (``data loader (ranks 0, 1): no enumerate(DataLoader)#* spans in the trace``);
    every ``CPU-only trace: …`` reason is the one line ``CPU-only trace: device figures do not
    apply`` (with the ranks when not every rank's trace is CPU-only)."""
    # here, not at the top: the run report's model imports the run analysis' schema, which
    # ``mgprof trace --json`` never needs (a quarter of a second)
    from mgprof.report.run.section_model import figure_words, who_words, words_list

    cpu_ranks: list[str] = []
    figures: dict[str, list[str]] = {}
    who: dict[str, list[str]] = {}
    for r in job.ranks:
        rank = f"rank {r.rank if r.rank is not None else '?'}"
        for key, why in r.not_applicable.items():
            if why.startswith(CPU_ONLY):
                cpu_ranks.append(rank)
                continue
            figures.setdefault(why, []).append(figure_words(key))
            who.setdefault(why, []).append(rank)
    for key, why in job.not_applicable.items():
        figures.setdefault(why, []).append(figure_words(key))
        who.setdefault(why, [])
    lines = []
    if cpu_ranks:
        every = len(set(cpu_ranks)) == len(job.ranks)
        where = "" if every else f" ({who_words(cpu_ranks)})"
        lines.append(f"{CPU_ONLY}{where}: device figures do not apply")
    for why, names in figures.items():
        ranks = who_words(who[why])
        several = len(job.ranks) > 1 and ranks
        lines.append(f"{words_list(names)}" + (f" ({ranks})" if several else "") + f": {why}")
    return lines


def _fmt(v: float | None, unit: str = "%") -> str:
    if v is None:
        return "n/a"
    if unit == "ms":
        return f"{v / 1000:.2f}"
    return f"{v:.1f}"


def _totals_row(label: str, kind: str, t: TraceTotals) -> list[str | Text]:
    return [
        label,
        rich_text(kind),
        _fmt(t.window_us, "ms"),
        _fmt(t.busy_pct),
        _fmt(t.idle_pct),
        _fmt(t.compute_pct),
        _fmt(t.comm_pct),
        _fmt(t.comm_overlap_pct),
        _fmt(t.exposed_comm_pct),
        _fmt(t.memcpy_pct),
        _fmt(t.dataloader_pct),
    ]


def _render_fsdp(job: JobTraceSummary, console: Console) -> None:
    """FSDP2 communication by unit and phase: the table of the first rank that has it, a line
    per other rank (FSDP ranks run the same units; ``--json`` holds every rank's rows)."""
    from mgprof.report.run import fsdp as fsdp_view
    from mgprof.report.term_table import Col, print_fitted

    ranks = [r for r in job.ranks if r.fsdp is not None]
    if not ranks:
        return
    first, f = ranks[0], ranks[0].fsdp
    assert f is not None
    headers = fsdp_view.GROUP_COLUMNS if fsdp_view.several_groups(f) else fsdp_view.COLUMNS
    labels = 3 if fsdp_view.several_groups(f) else 2
    cols = [Col(h, numeric=i >= labels) for i, h in enumerate(headers)]
    cells = fsdp_view.rows(f, lambda _figure, _why: "n/a")
    table_rows: list[list[str | Text]] = [
        [rich_text(c) if i < labels else c for i, c in enumerate(row)] for row in cells
    ]
    print_fitted(
        console,
        cols,
        table_rows,
        labels=labels,
        title=f"FSDP communication by unit and phase, rank {first.rank}",
    )
    for line in fsdp_view.lines(f):
        console.print(rich_text(line, multiline=True))
    for r in ranks[1:]:
        g = r.fsdp
        assert g is not None
        console.print(
            rich_text(
                f"rank {r.rank}: FSDP collectives {_fmt(g.comm_us, 'ms')} ms, "
                f"{_fmt(g.exposed_us, 'ms')} ms exposed",
                multiline=True,
            )
        )


def _render_compiled(job: JobTraceSummary, console: Console) -> None:
    """torch.compile's regions per rank (the run report's table), when any rank has them."""
    from mgprof.report.run import compiled as compiled_view
    from mgprof.report.term_table import Col, print_fitted

    found = [(str(r.rank), r.compiled) for r in job.ranks if r.compiled is not None]
    if not found:
        return
    cols = [Col(h, numeric=i >= 1) for i, h in enumerate(compiled_view.COLUMNS)]
    cells: list[list[str | Text]] = [list(r) for r in compiled_view.rank_rows(found)]
    print_fitted(console, cols, cells, title="torch.compile in the traced steps")
    console.print(rich_text(compiled_view.NOTE, style="dim", multiline=True))


def _bullets(notes: Sequence[str], console: Console) -> None:
    """``  • note``, one per note, a wrapped note indented under its text."""
    from rich.table import Table

    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for note in notes:
        grid.add_row("  •", rich_text(note, multiline=True))
    console.print(grid)


def render_job(job: JobTraceSummary, console: Console, top: int = 10) -> None:
    """Print the per-rank totals, collectives, top kernels and the not-applicable notes."""
    # rich is imported here, not at the top: ``mgprof trace --json`` never draws a table.
    from rich.text import Text

    from mgprof.report.term_table import Col, print_fitted
    from mgprof.report.term_title import rule_with_path

    rule_with_path(console, "mgprof trace", job.directory)
    totals_cols = [
        Col("rank"),
        Col("kind", numeric=False),
        *(
            Col(h)
            for h in (
                "window ms",
                "busy",
                "idle",
                "compute",
                "comm",
                "comm overlap",
                "exposed comm",
                "memcpy",
                "data loader",
            )
        ),
    ]
    totals = [
        _totals_row(str(r.rank if r.rank is not None else "?"), r.kind, r.totals) for r in job.ranks
    ]
    print_fitted(
        console, totals_cols, totals, labels=2, title="Trace-window totals (percent of window)"
    )

    idle_rows: list[list[str | Text]] = [
        [
            str(r.rank),
            _fmt(r.idle.host_wait_us, "ms"),
            _fmt(r.idle.kernel_wait_us, "ms"),
            _fmt(r.idle.other_us, "ms"),
            _fmt(r.launch_delay.p50_us, "ms") if r.launch_delay is not None else "n/a",
            _fmt(r.launch_delay.p95_us, "ms") if r.launch_delay is not None else "n/a",
        ]
        for r in job.ranks
        if r.idle is not None
    ]
    if idle_rows:
        print_fitted(
            console,
            [
                Col("rank"),
                *(
                    Col(h)
                    for h in (
                        "host wait ms",
                        "kernel wait ms",
                        "other ms",
                        "launch delay p50 ms",
                        "launch delay p95 ms",
                    )
                ),
            ],
            idle_rows,
            title="GPU idle by cause (summed over streams) and launch delay",
        )

    coll_cols = [
        Col("rank"),
        Col("type", numeric=False, wrap=False),
        *(
            Col(h)
            for h in ("count", "total ms", "exposed ms", "MB", "n", "algbw GB/s", "busbw GB/s")
        ),
    ]
    coll_rows: list[list[str | Text]] = [
        [
            str(r.rank),
            rich_text(c.type),
            str(c.count),
            _fmt(c.total_us, "ms"),
            _fmt(c.exposed_us, "ms"),
            f"{c.bytes / 1e6:.1f}" if c.bytes is not None else "n/a",
            str(c.group_size) if c.group_size is not None else "n/a",
            f"{c.algbw_gbps:.2f}" if c.algbw_gbps is not None else "n/a",
            f"{c.busbw_gbps:.2f}" if c.busbw_gbps is not None else "n/a",
        ]
        for r in job.ranks
        for c in r.collectives
    ]
    if coll_rows:
        print_fitted(console, coll_cols, coll_rows, labels=2, title="Collectives")
    _render_fsdp(job, console)
    _render_compiled(job, console)
    vs = [(r.rank, a) for r in job.ranks for a in (r.attainable or [])]
    if vs:
        att_cols = [
            Col("rank"),
            Col("type", numeric=False, wrap=False),
            *(Col(h) for h in ("call MB", "busbw GB/s", "attainable", "% of attainable")),
        ]
        att_rows: list[list[str | Text]] = [
            [
                str(rank),
                rich_text(a.type + (" *" if a.note else "")),
                f"{a.mean_call_bytes / 1e6:.2f}",
                f"{a.busbw_gbps:.2f}",
                f"{a.attainable_busbw_gbps:.2f}",
                f"{a.pct_of_attainable:.0f} %",
            ]
            for rank, a in vs
        ]
        print_fitted(
            console,
            att_cols,
            att_rows,
            labels=2,
            title="Bus bandwidth against this machine's baseline",
        )
        if any(a.note for _, a in vs):
            console.print("* message size outside the baseline's sizes: nearest size used")

    if job.cross_rank is not None:
        match_key = job.cross_rank.match_key
        wait_rows = [
            [str(w.rank), _fmt(w.wait_us, "ms"), str(w.last_arrivals)]
            for w in job.cross_rank.per_rank
        ]
        print_fitted(
            console,
            [Col("rank"), Col("wait ms"), Col("arrived last")],
            wait_rows,
            title=rich_text(f"Cross-rank waiting (matched by {match_key})", "table.title"),
        )
        if job.slowest_rank is not None:
            console.print(
                Text.assemble(
                    "Slowest rank: ",
                    rich_text(job.slowest_rank, "bold"),
                    " (arrives last most often)",
                )
            )

    for r in job.ranks:
        if not r.top_kernels:
            continue
        # the name last, in its short form: it takes the room the figures leave
        kernels = r.top_kernels[:top]
        kernel_rows: list[list[str | Text]] = [
            [
                str(k.count),
                _fmt(k.total_us, "ms"),
                _fmt(k.pct_of_compute),
                rich_text(k.kind),
                rich_text(short),
            ]
            for k, short in zip(kernels, short_kernel_names([k.name for k in kernels]))
        ]
        print_fitted(
            console,
            [
                Col("calls"),
                Col("total ms"),
                Col("% of compute"),
                Col("class", numeric=False),
                Col("kernel", numeric=False),
            ],
            kernel_rows,
            labels=0,
            title=f"Top kernels, rank {r.rank}",
        )

    health = [
        f"rank {r.rank}: {note}"
        for r in job.ranks
        if r.health is not None
        for note in r.health.notes
    ]
    health += [
        f"rank {r.rank}: {r.health.device_events_without_launch} device events without a CPU "
        "launch (not given to any step)"
        for r in job.ranks
        if r.health is not None and r.health.device_events_without_launch and r.steps
    ]
    if health:
        console.print("[bold]Trace health[/]")
        _bullets(health, console)
    notes = not_applicable_lines(job)
    if notes:
        console.print("[bold]Not applicable[/]")
        _bullets(notes, console)
