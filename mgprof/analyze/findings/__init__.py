"""Findings: advice drawn from a run's analysed figures, each backed by the numbers it rests on.

Each rule is a small function ``(run, figures) -> Finding | None`` over the ``RunRecord`` and
the typed analysis (``mgprof.analyze.run.schema.RunAnalysis``). A rule fires only on figures
that were measured: a missing or None figure means "do not know", never "looks bad", so a CPU
run or a run without traces gets no GPU advice. The rules live in one module per family
(``learning``, ``strategy``, ``fsdp``, ``compiled``, ``straggler``, ``data``, ``compute``,
``memory``), each with its thresholds as named constants and the reason for their values;
``core`` holds the ``Finding`` type (defined with the analysis schema) and the shared readers,
``fit`` what advice may assume about the device and the machine (CPU or GPU, cores per rank, DDP
buckets, gradient sync). This module fixes the order the rules run in and evaluates them. The
rule list and the advice are documented in ``docs/findings.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from mgprof.analyze.findings.compiled import ddp_around_compiled, mostly_uncompiled
from mgprof.analyze.findings.compute import FP32_GEMM_PCT as FP32_GEMM_PCT
from mgprof.analyze.findings.compute import HARDWARE_THROTTLE as HARDWARE_THROTTLE
from mgprof.analyze.findings.compute import LOW_UTIL_PCT as LOW_UTIL_PCT
from mgprof.analyze.findings.compute import THROTTLE_REASON_BITS as THROTTLE_REASON_BITS
from mgprof.analyze.findings.compute import VERY_LOW_UTIL_PCT as VERY_LOW_UTIL_PCT
from mgprof.analyze.findings.compute import clock_throttling, fp32_gemms, low_utilisation
from mgprof.analyze.findings.core import SEVERITY_ORDER, Finding, Rule, sort_key
from mgprof.analyze.findings.core import Severity as Severity
from mgprof.analyze.findings.data import DATALOADER_HIGH_PCT as DATALOADER_HIGH_PCT
from mgprof.analyze.findings.data import DATALOADER_SHARE_PCT as DATALOADER_SHARE_PCT
from mgprof.analyze.findings.data import dataloader_stall, identical_batches, set_epoch_missing
from mgprof.analyze.findings.fsdp import fsdp_slower_than_ddp, fsdp_unit_layout
from mgprof.analyze.findings.learning import zero_gradients
from mgprof.analyze.findings.memory import HEADROOM_CRITICAL_PCT as HEADROOM_CRITICAL_PCT
from mgprof.analyze.findings.memory import HEADROOM_HIGH_PCT as HEADROOM_HIGH_PCT
from mgprof.analyze.findings.memory import HEADROOM_LOW_PCT as HEADROOM_LOW_PCT
from mgprof.analyze.findings.memory import memory_headroom, memory_near_limit
from mgprof.analyze.findings.memory_profile import memory_fragmentation, memory_imbalance
from mgprof.analyze.findings.straggler import MIN_STEPS_COMPARED as MIN_STEPS_COMPARED
from mgprof.analyze.findings.straggler import SLOWEST_STEPS_PCT as SLOWEST_STEPS_PCT
from mgprof.analyze.findings.straggler import SPREAD_HIGH_PCT as SPREAD_HIGH_PCT
from mgprof.analyze.findings.straggler import SPREAD_PCT as SPREAD_PCT
from mgprof.analyze.findings.straggler import rank_imbalance
from mgprof.analyze.findings.strategy import EXPOSED_COMM_HIGH_PCT as EXPOSED_COMM_HIGH_PCT
from mgprof.analyze.findings.strategy import EXPOSED_COMM_PCT as EXPOSED_COMM_PCT
from mgprof.analyze.findings.strategy import (
    dataparallel_in_use,
    exposed_communication,
    find_unused_parameters,
)
from mgprof.analyze.run.schema import RunAnalysis, decode_analysis
from mgprof.records import RunRecord

__all__ = [
    "RULES",
    "SEVERITY_ORDER",
    "Finding",
    "evaluate_findings",
    "findings_of",
    "with_findings",
]

RULES: tuple[Rule, ...] = (
    zero_gradients,
    dataparallel_in_use,
    identical_batches,
    exposed_communication,
    fsdp_slower_than_ddp,
    fsdp_unit_layout,
    ddp_around_compiled,
    mostly_uncompiled,
    low_utilisation,
    dataloader_stall,
    fp32_gemms,
    memory_near_limit,
    memory_fragmentation,
    memory_imbalance,
    rank_imbalance,
    clock_throttling,
    set_epoch_missing,
    find_unused_parameters,
    memory_headroom,
)
"""Every rule, in the order they are evaluated (the report orders findings by severity, then id)."""


def findings_of(run: RunRecord, analysis: RunAnalysis) -> list[Finding]:
    """Every finding that fires: most severe first, then by id, so two evaluations of the same
    run give the same list in the same order.

    A rule that raises on malformed figures is skipped: findings are advice, and one bad figure
    in a run.json must not hide the report or the other findings.
    """
    found: list[Finding] = []
    for rule in RULES:
        try:
            finding = rule(run, analysis)
        except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError):
            continue
        if finding is not None:
            found.append(finding)
    found.sort(key=sort_key)
    return found


def evaluate_findings(
    run: RunRecord, analysis: RunAnalysis | Mapping[str, Any]
) -> list[dict[str, Any]]:
    """:func:`findings_of` as JSON-ready dicts (what ``analysis["findings"]`` stores); a dict
    analysis is decoded first (``decode_analysis``)."""
    return [msgspec.to_builtins(f) for f in findings_of(run, decode_analysis(analysis))]


def with_findings(run: RunRecord, data: Mapping[str, Any]) -> tuple[dict[str, Any], RunAnalysis]:
    """The analysis decoded once (``decode_analysis``) with its findings evaluated on it: the
    dict as stored in run.json (``data`` with ``"findings"`` set, in place when it had them) and
    the typed analysis the renderers read."""
    analysis = decode_analysis(data)
    analysis.findings = findings_of(run, analysis)
    out = dict(data)
    out["findings"] = [msgspec.to_builtins(f) for f in analysis.findings]
    return out, analysis
