"""The run analysis' one schema: ``RunAnalysis``, what ``run.json`` stores under ``analysis``.

``analyze_run`` (and the blocks added beside it: findings, ``mgprof compare``'s table) write the
analysis as a plain JSON-ready dict; every renderer and every finding rule reads it back as a
``RunAnalysis``, decoded once where the dict meets them (:func:`decode_analysis`). The Structs
are the producers' own where one describes the JSON (``RankAnalysis``, ``JobAnalysis``,
``GradSync``, the trace engine's ``RankTraceSummary``, the compare ``Row``...), and written here
for the blocks the producers build as dicts (noise scale, precision, memory). A key a producer
sometimes leaves out is ``UNSET`` when absent (``given`` reads it as None), a key written as
null is None, and fields are in the order the producers write their keys, so
``msgspec.to_builtins(decode_analysis(d))`` is ``d`` again (``tests/test_analysis_schema.py``).

Stored analyses are untrusted (old, hand-edited, from another version): fields this version does
not know are ignored, fields it added since have defaults, and a block that does not validate
is left out with one line in ``warnings`` saying which and why, never an exception.

``python -m mgprof.analyze.run.schema`` prints the schema as Markdown: the "The analysis" section
of docs/reports.md is that output (a test holds the two equal; ``--write docs/reports.md``
updates it after a record changed).
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from mgprof.analyze.compare.scaling import NotApplicable, Row
from mgprof.analyze.run.noise_scale import SweepNoiseScale
from mgprof.analyze.run.results import DEFINITIONS as FIGURE_DEFINITIONS
from mgprof.analyze.run.results import JobAnalysis, RankAnalysis
from mgprof.analyze.trace.cross_rank import CrossRankSummary
from mgprof.analyze.trace.summary import RankTraceSummary

__all__ = [
    "ANALYSIS_VERSION",
    "ComparisonRow",
    "ComparisonTable",
    "Finding",
    "MemoryAnalysis",
    "MemoryProfile",
    "NoiseScale",
    "PrecisionAnalysis",
    "RunAnalysis",
    "Severity",
    "Sweep",
    "TraceJob",
    "Traces",
    "decode_analysis",
    "given",
    "schema_markdown",
]

ANALYSIS_VERSION = 1
"""Version of the analysis layout (``RunAnalysis.version``); fields added keep it."""

T = TypeVar("T")


def given(value: T | UnsetType | None) -> T | None:
    """``value``, or None for a key the producer left out (``UNSET``)."""
    return None if isinstance(value, UnsetType) else value


class Struct(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """Base of the blocks written here: keyword-only, tolerant of fields of newer versions."""


# --------------------------------------------------------------------------------------------
# traces


class TraceJob(Struct):
    """The trace engine's job summary (``mgprof trace``) without its per-rank list."""

    directory: str = ""
    """The folder the traces were read from."""
    cross_rank: CrossRankSummary | None = None
    """Collective calls matched across ranks: each call's transfer time and each rank's wait."""
    slowest_rank: int | None = None
    """The rank that arrived last in the most matched calls."""
    not_applicable: dict[str, str] = msgspec.field(default_factory=dict)
    definitions: dict[str, str] = msgspec.field(default_factory=dict)


class Traces(Struct):
    """What the trace engine said about the run's trace files."""

    ranks: dict[str, list[RankTraceSummary]] = msgspec.field(default_factory=dict)
    """Rank (as a string) -> one summary per trace file: ``mgprof trace --json``'s per-rank
    output without ``collective_calls`` (raw per-call data; run ``mgprof trace`` for it)."""
    job: TraceJob | None = None
    """Across ranks; null with one trace file."""


# --------------------------------------------------------------------------------------------
# noise scale, precision


class NoiseScale(Struct):
    """The gradient noise scale B_simple (docs/noise-scale.md). Measured: the estimate's
    fields follow ``measured``; not measured: only ``reason`` does."""

    version: int = 1
    source: str | None = None
    """``ddp`` (each rank's gradient vs the all-reduced one), ``accumulation`` (the first
    micro-batch vs the accumulated update), or null when nothing was measured."""
    ranks: int = 1
    dropped: dict[str, int] = msgspec.field(default_factory=dict)
    """Steps left out of the estimate, by reason."""
    measured: bool = False
    b_simple: float | UnsetType | None = UNSET
    """tr(Σ)/|G|² over the window; null when the |G|² estimate is not positive."""
    band_low: float | UnsetType | None = UNSET
    band_high: float | UnsetType | None = UNSET
    """Null with ``band_unbounded``: the bootstrap could not bound B_simple from above."""
    band_unbounded: bool | UnsetType = UNSET
    confidence: float | UnsetType = UNSET
    steps: int | UnsetType = UNSET
    first_step: int | UnsetType | None = UNSET
    last_step: int | UnsetType | None = UNSET
    g2_mean: float | UnsetType | None = UNSET
    trace_mean: float | UnsetType | None = UNSET
    b_small: float | UnsetType | None = UNSET
    b_big: float | UnsetType | None = UNSET
    global_batch: float | UnsetType | None = UNSET
    latest_b_simple: float | UnsetType | None = UNSET
    """Exponential moving average at the window's last step (about the last 20 updates)."""
    first_half: float | UnsetType | None = UNSET
    second_half: float | UnsetType | None = UNSET
    reason: str | UnsetType | None = UNSET
    """Why there is no estimate (or no B_simple)."""
    ratio: float | UnsetType | None = UNSET
    """global batch / B_simple (with a positive B_simple)."""
    sample_efficiency: float | UnsetType = UNSET
    step_efficiency: float | UnsetType = UNSET
    doubling_steps_saved_pct: float | UnsetType = UNSET


class PrecisionAnalysis(Struct):
    """What ``--precision`` did in the run (``mgprof.analyze.run.precision``)."""

    requested: str
    """``fp32``, ``bf16`` or ``fp16``."""
    applied_ranks: list[int] = msgspec.field(default_factory=list)
    ranks: int = 0
    device_type: str | None = None
    module_class: str | None = None
    not_applied_reason: str | None = None
    script_autocast: str | None = None
    """The script's own autocast dtype, which mgprof's setting replaced at the model."""
    script_grad_scaler: bool = False
    loss_scaling: str | None = None
    """fp16: ``inserted`` (mgprof's GradScaler), ``script`` (the script's) or ``none``."""
    loss_scaling_note: str | None = None
    skipped_updates: int = 0
    losses: list[float | None] = msgspec.field(default_factory=list)
    """Per optimizer update, the loss averaged over ranks; null where a rank had none."""
    losses_truncated: bool = False
    nonfinite_updates: list[int] = msgspec.field(default_factory=list)
    first_loss: float | None = None
    last_loss: float | None = None


# --------------------------------------------------------------------------------------------
# memory (--memory)


class MemorySite(Struct):
    """Allocations live at the peak, grouped by where they were made."""

    site: str
    mib: float | None = None
    count: int | None = None
    largest_mib: float | None = None


class MemoryOom(Struct):
    """The rank ran out of memory."""

    text: str
    requested_mib: float | UnsetType = UNSET
    """From the allocator snapshot of the failure."""
    top_sites: list[MemorySite] | UnsetType = UNSET


class MemoryCurve(Struct):
    """Allocated memory over the traced steps (profiler memory events)."""

    basis: str
    time_ms: list[float] = msgspec.field(default_factory=list)
    allocated_mib: list[float] = msgspec.field(default_factory=list)
    downsampled: bool = False


class MemoryProfile(Struct):
    """One tracked rank's memory profile. Without a source (no snapshot, no memory events)
    only ``rank``, ``oom``, ``snapshots``, ``source`` and ``not_applicable`` are present."""

    rank: int
    oom: MemoryOom | None = None
    snapshots: list[str] = msgspec.field(default_factory=list)
    """Allocator snapshot files, relative to the run directory."""
    source: str | None = None
    """``allocator snapshot`` (CUDA) or ``profiler memory events``."""
    peak_allocated_mib: float | UnsetType | None = UNSET
    peak_reserved_mib: float | UnsetType | None = UNSET
    peak_step: int | UnsetType | None = UNSET
    peak_phase: str | UnsetType | None = UNSET
    """The innermost region or annotation around the peak."""
    fragmentation_mib: float | UnsetType | None = UNSET
    fragmentation_pct: float | UnsetType | None = UNSET
    largest_free_block_mib: float | UnsetType | None = UNSET
    """Allocator snapshots only."""
    top_sites: list[MemorySite] | UnsetType = UNSET
    curve: MemoryCurve | UnsetType | None = UNSET
    growth_mib: float | UnsetType | None = UNSET
    notes: list[str] | UnsetType = UNSET
    """Allocator snapshots only."""
    not_applicable: dict[str, str] = msgspec.field(default_factory=dict)


class MemoryDiffers(Struct):
    """The rank whose peak stands out from the others'."""

    rank: int
    delta_mib: float
    delta_pct: float | None = None
    median_others_mib: float | None = None


class MemoryComparison(Struct):
    """The ranks' peaks against each other."""

    basis: str = ""
    """``peak reserved`` when every rank has it, else ``peak allocated``."""
    peaks_mib: dict[str, float] = msgspec.field(default_factory=dict)
    threshold_pct: float | None = None
    threshold_mib: float | None = None
    differs: MemoryDiffers | None = None
    text: str | None = None
    dp_imbalance: str | None = None
    """DataParallel's device 0 against its other devices, in words."""


class MemoryAnalysis(Struct):
    """What ``--memory`` tracking shows (docs/memory.md)."""

    ranks: list[MemoryProfile] = msgspec.field(default_factory=list)
    comparison: MemoryComparison | None = None
    definitions: dict[str, str] = msgspec.field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# findings

Severity = Literal["high", "medium", "low", "info"]


class Finding(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """One piece of advice: what was measured, why it matters, what to change, what it may save.

    ``id`` is stable: the rule, plus ``:rankN`` when the finding names one rank the rule itself
    established (see ``finding_id``); two identical runs give the same ids. ``figures`` holds
    every number ``evidence`` cites, under keys that carry their unit (``_ms``, ``_pct``...).
    """

    id: str
    rule: str
    severity: Severity
    title: str
    evidence: str
    """The measured figures, with units, that made the rule fire, and the thresholds."""
    cause: str
    change: str
    """The concrete change: code or a flag the user can apply."""
    fix: list[str]
    """The change as short code fragments, flags or commands, one per item, for tools."""
    saving: str | None = None
    """Estimated gain with its basis, when the figures allow an estimate."""
    figures: dict[str, Any] = msgspec.field(default_factory=dict)
    """Every number behind ``evidence`` (unit in the key name), for JSON consumers."""


# --------------------------------------------------------------------------------------------
# comparison and sweep


class ComparisonRow(Row, kw_only=True, forbid_unknown_fields=False):
    """One strategy's row of ``mgprof compare`` (``mgprof.analyze.compare.scaling.Row``)."""

    efficiency: float | None = None
    """Scaling efficiency as a fraction (``efficiency_pct`` / 100)."""
    comm_share_pct: float | None = None
    """The A/B share of step time spent syncing when measured, else the exposed share."""


class ComparisonTable(Struct):
    """The ``mgprof compare`` table this run belongs to."""

    comparison_id: str = ""
    mode: str = ""
    verdict: str = ""
    rows: list[ComparisonRow] = msgspec.field(default_factory=list)
    not_applicable: list[NotApplicable] = msgspec.field(default_factory=list)


class SweepPoint(Struct):
    """One batch size of a sweep series."""

    batch_size: float | None = None
    samples_per_s: float | None = None
    peak_mem_mib: float | list[float | None] | dict[str, float | None] | None = None
    """One number, or one per device."""
    comm_share_pct: float | None = None
    global_batch: float | None = None


class SweepSeries(Struct):
    name: str = "sweep"
    points: list[SweepPoint] = msgspec.field(default_factory=list)


class Sweep(Struct):
    """A batch-size sweep to chart beside the run. Read from any of the shapes accepted so far
    (a list of points, ``{"series": points}``, ``{"series": [{"name", "points"}]}``, columns,
    a sweep.json result), held in this one."""

    series: list[SweepSeries] = msgspec.field(default_factory=list)
    noise_scale: SweepNoiseScale | None = None


# --------------------------------------------------------------------------------------------
# the analysis


class RunAnalysis(Struct):
    """Everything ``mgprof report`` shows about a run: ``run.json``'s ``analysis``."""

    version: int = ANALYSIS_VERSION
    """Layout version (1)."""
    ranks: list[RankAnalysis] = msgspec.field(default_factory=list)
    """Per rank, in rank order."""
    job: JobAnalysis | None = None
    """Across ranks."""
    traces: Traces = msgspec.field(default_factory=Traces)
    definitions: dict[str, str] = msgspec.field(default_factory=dict)
    """Figure name -> its definition (the report's glossary)."""
    warnings: list[str] = msgspec.field(default_factory=list)
    """Trace files that could not be analysed, blocks of a stored analysis that could not be
    read; the other figures are still reported."""
    noise_scale: NoiseScale | UnsetType = UNSET
    """Absent in analyses made before mgprof measured it."""
    precision: PrecisionAnalysis | UnsetType = UNSET
    """Only with ``--precision``."""
    memory: MemoryAnalysis | UnsetType = UNSET
    """Only with ``--memory``."""
    findings: list[Finding] | UnsetType = UNSET
    """The advice (docs/findings.md), most severe first."""
    comparison: ComparisonTable | UnsetType = UNSET
    """Runs made by ``mgprof compare``."""
    sweep: Sweep | UnsetType = UNSET
    """A batch-size sweep, when one was stored with the run."""


# --------------------------------------------------------------------------------------------
# decoding


def _sweep_shape(raw: Any) -> Any:
    """Any accepted sweep shape as ``Sweep``'s (``{"series": [{name, points}], noise_scale}``);
    anything else unchanged, for the decoder to reject."""
    noise = raw.get("noise_scale") if isinstance(raw, Mapping) else None
    keys = ("batch_size", "samples_per_s", "peak_mem_mib", "comm_share_pct")
    items = raw
    if isinstance(items, Mapping) and "series" in items:
        items = items["series"]
    if isinstance(items, Mapping):
        cols: dict[str, list[Any]] = {}
        for k in keys:
            column = items.get(k)
            cols[k] = column if isinstance(column, list) else []
        items = [
            {k: (cols[k][i] if i < len(cols[k]) else None) for k in keys}
            for i in range(len(cols["batch_size"]))
        ]
    if not isinstance(items, list):
        return raw
    points = [p for p in items if isinstance(p, Mapping)]
    if points and all(isinstance(p.get("points"), list) for p in points):
        series = [
            {
                "name": str(p.get("name", p.get("strategy", f"series {i + 1}"))),
                "points": [q for q in p["points"] if isinstance(q, Mapping)],
            }
            for i, p in enumerate(points)
        ]
    else:
        series = [{"name": "sweep", "points": points}] if points else []
    return {"series": series, "noise_scale": noise}


_FIELDS = {f.name: f.type for f in msgspec.structs.fields(RunAnalysis)}


def decode_analysis(data: RunAnalysis | Mapping[str, Any] | None) -> RunAnalysis:
    """The analysis dict as a ``RunAnalysis`` (a ``RunAnalysis`` is returned as it is).

    Block by block: a top-level block that does not match the schema is left out (its default,
    or absent) with a line in ``warnings`` naming it and why; unknown keys are ignored. Never
    raises on bad data.
    """
    if isinstance(data, RunAnalysis):
        return data
    if data is None:
        return RunAnalysis()
    if not isinstance(data, Mapping):
        return RunAnalysis(warnings=[f"the analysis is a {type(data).__name__}, not read"])
    values: dict[str, Any] = {}
    notes: list[str] = []
    for name, kind in _FIELDS.items():
        if name not in data:
            continue
        raw = _sweep_shape(data[name]) if name == "sweep" else data[name]
        try:
            values[name] = msgspec.convert(raw, kind)
        except (msgspec.ValidationError, RecursionError) as exc:
            where = str(exc).replace("`$", f"`analysis.{name}")
            notes.append(
                f"analysis block {name!r} left out: it does not match the schema ({where})"
            )
    analysis = RunAnalysis(**values)
    if analysis.version > ANALYSIS_VERSION:
        notes.append(
            f"analysis version {analysis.version} is newer than this mgprof reads "
            f"({ANALYSIS_VERSION}); figures it changed may be missing"
        )
    if notes:
        analysis.warnings = [*analysis.warnings, *notes]
    return analysis


# --------------------------------------------------------------------------------------------
# the schema as Markdown (docs/reports.md)


def _type_text(tp: Any) -> str:
    """A field's type as the JSON it holds: ``float | null``, ``list[RankAnalysis]``..."""
    if tp is type(None):
        return "null"
    if tp is UnsetType:
        return "absent"
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp.__name__
    simple = {int: "int", float: "float", str: "str", bool: "bool", object: "any"}
    if tp in simple:
        return simple[tp]
    if tp is Any:
        return "any"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        parts = [_type_text(a) for a in args if a is not UnsetType]
        text = " | ".join(parts)
        return f"absent or {text}" if UnsetType in args else text
    if origin is Literal:
        return " | ".join(f"`{a!r}`" for a in args)
    if origin in (list, tuple):
        inner = ", ".join(_type_text(a) for a in args if a is not Ellipsis)
        return f"list[{inner}]"
    if origin is dict:
        return f"dict[{_type_text(args[0])}, {_type_text(args[1])}]"
    return getattr(tp, "__name__", str(tp))


def _structs(tp: Any, seen: list[type]) -> None:
    """Every Struct reachable from ``tp``, in the order first met (depth first)."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        if tp in seen:
            return
        seen.append(tp)
        for f in msgspec.structs.fields(tp):
            _structs(f.type, seen)
        return
    for arg in typing.get_args(tp):
        _structs(arg, seen)


def _field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring written under it, through the class's bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, msgspec.Struct)):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef)
        for node, after in zip(body.body, [*body.body[1:], None]):
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            if (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


START_MARK = (
    "<!-- generated by `python -m mgprof.analyze.run.schema` from "
    "mgprof/analyze/run/schema.py; do not edit by hand -->"
)
END_MARK = "<!-- end of the generated schema -->"


_RESULTS = JobAnalysis.__module__
"""The run figures' module: their fields' definitions are in ``definitions`` by name."""


def schema_markdown() -> str:
    """The analysis schema as Markdown: one table per record, from ``RunAnalysis`` down."""
    seen: list[type] = []
    _structs(RunAnalysis, seen)
    lines = [
        START_MARK,
        "",
        "`run.json`'s `analysis` (and `mgprof report --format json`'s) is a `RunAnalysis`, in "
        f"this layout (version {ANALYSIS_VERSION}). *absent or* marks a key that is left out "
        "when it does not apply; *null* a key written as null. Readers ignore keys they do "
        "not know, and a stored block that does not match is left out of the report with a "
        "line in `warnings`. From Python: "
        "`mgprof.analyze.run.schema.decode_analysis(run.analysis) -> RunAnalysis`.",
        "",
    ]
    for i, cls in enumerate(seen):
        if i == 1:
            lines += ["<details><summary>The records inside it, key by key</summary>", ""]
        doc = " ".join(inspect.cleandoc(cls.__doc__ or "").split())
        lines += [f"#### `{cls.__name__}`", ""]
        if doc:
            lines += [doc, ""]
        docs = _field_docs(cls)
        lines += ["| key | type | meaning |", "| --- | --- | --- |"]
        for f in msgspec.structs.fields(cls):
            defined = f.name in FIGURE_DEFINITIONS and cls.__module__ == _RESULTS
            meaning = docs.get(f.name) or (f'see `definitions["{f.name}"]`' if defined else "")
            lines.append(f"| `{f.encode_name}` | {_cell(_type_text(f.type))} | {_cell(meaning)} |")
        lines.append("")
    lines += ["</details>", "", END_MARK, ""]
    return "\n".join(lines)


def write_section(path: str) -> None:
    """Replace the generated section of the Markdown file ``path`` (from ``START_MARK`` to
    ``END_MARK``) with :func:`schema_markdown`'s output."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    start = text.index(START_MARK)
    end = text.index(END_MARK, start) + len(END_MARK) + 1
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text[:start] + schema_markdown() + text[end:])


def main(argv: list[str] | None = None) -> int:
    """Print the schema as Markdown; ``--write FILE`` updates FILE's generated section instead
    (``python -m mgprof.analyze.run.schema --write docs/reports.md``)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--write":
        write_section(args[1])
        return 0
    if args:
        print("usage: python -m mgprof.analyze.run.schema [--write FILE]", file=sys.stderr)
        return 2
    sys.stdout.write(schema_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
