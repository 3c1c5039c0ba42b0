"""``mgprof diff BASE NEW``: what changed between two runs, how sure that is, and where it went.

Order of work, because a diff of unlike runs is noise dressed as a result:

1. Comparability: every setup fact of both sides (world size, strategy, device, backend, batch,
   script, versions) is compared; differences are listed with what they mean. A changed batch
   size switches the time figures to per-sample ones (time per sample, samples/s), since a step
   of a bigger batch is expected to take longer.
2. Figures with their uncertainty: the step time (or time per sample) from each run's
   steady-state steps, with a bootstrap interval of the ratio of means and a Mann-Whitney
   p-value (``diff_stats``); throughput from the same draws. Figures that are one number per run
   (trace busy share, exposed communication, bus bandwidth, peak memory) are compared as they
   are, and say that they carry no interval.
3. Attribution: parts of the step whose changes add up to the change in step time (where a
   traced step's time went: operators or kernels by name, exposed communication, other device
   work, GPU idle, host time outside operators (a ``time.sleep`` lands there), data loading;
   and the rest of the change, which the traced steps do not show). The largest part in the
   direction of the change makes the headline, "mostly" only when it is more than half. The
   named components (leaf regions, kernels or host operators, exposed collectives, the
   DataLoader wait) are listed too; they overlap, so they are not summed.
4. Findings added and removed (by their stable ids).
5. ``--fail-on`` limits: a limit fails when the change is significant (interval excludes no
   change) and its point estimate is beyond the limit; a figure with no interval fails on the
   point estimate alone; a limit that cannot be checked (the figure is missing) fails too, with
   the reason, so a CI gate never passes on a number it did not have.

Everything here is pure (no torch): the inputs are :class:`~mgprof.analyze.diff.inputs.Side`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mgprof.analyze.diff.inputs import Component, Side
from mgprof.analyze.diff.stats import CONFIDENCE, bootstrap_ratio, mann_whitney

SCHEMA = "mgprof.diff/1"

FAIL_METRICS = {
    "time": "time",
    "step_time": "time",
    "throughput": "throughput",
    "memory": "peak_memory_mib",
    "comm": "exposed_comm_ms_per_step",
    "exposed_comm": "exposed_comm_ms_per_step",
}
"""``--fail-on METRIC:LIMIT`` names and the figure each checks (``time`` is the step time, or
the time per sample when the batch changed)."""

_SETUP = {
    "world size": "the jobs differ in size: step time and bandwidth compare different jobs",
    "strategy": "a different parallel strategy: the figures compare different jobs",
    "device": "different hardware",
    "backend": "a different communication backend",
    "nodes": "a different number of nodes",
    "CPU fallback": "one ran on the CPU: its figures say nothing about GPUs",
    "trace kind": "GPU and CPU-only traces: the figures mean different things",
    "rank files": "a different number of rank files",
    "memory figure": "the memory figures measure different things",
    "gradient sync": "one side's ranks did not synchronise gradients: its speed is not that "
    "of the same job",
}
_PRECISION = (
    "a different numeric precision (--precision): expected if it is the change under test; "
    "diff compares speed, not the loss (mgprof compare --precision checks the loss)"
)
_BATCH = {
    "global batch": "the batch changed: time and throughput are compared per sample",
    "per-rank batch": "the per-rank batch changed",
}


@dataclass(frozen=True)
class FailSpec:
    """One ``--fail-on`` limit: fail when ``metric`` changes by ``limit_pct`` or more in the
    limit's direction (a positive limit fails on a rise, a negative one on a fall). Written
    without a sign, a throughput limit is a fall (``throughput:5%`` = ``throughput:-5%``): nobody
    gates a build on getting faster."""

    text: str
    metric: str
    limit_pct: float


_FAIL_RE = re.compile(r"^(?:(?P<metric>[a-z_]+):)?(?P<sign>[+-]?)(?P<value>\d+(?:\.\d+)?)%?$")


def parse_fail_on(text: str) -> FailSpec:
    """``5%`` (step time +5 %), ``throughput:-5%``, ``memory:10%``, ``comm:20%``; ValueError
    with the accepted forms otherwise."""
    match = _FAIL_RE.match(text.strip().lower())
    metric_name = match.group("metric") if match else None
    if match is None or (metric_name is not None and metric_name not in FAIL_METRICS):
        raise ValueError(
            f"--fail-on {text!r}: expected LIMIT% or METRIC:LIMIT% with METRIC one of "
            f"{', '.join(sorted(FAIL_METRICS))} (e.g. 5%, throughput:-5%)"
        )
    value = float(match.group("value"))
    if value == 0.0:
        raise ValueError(f"--fail-on {text!r}: a limit of 0 % fails on noise; give a limit > 0")
    metric = FAIL_METRICS[metric_name or "time"]
    if match.group("sign") == "-":
        value = -value
    elif match.group("sign") == "" and metric == "throughput":
        value = -value  # "throughput:5%" means a 5 % drop: what anyone gating on it means
    return FailSpec(text=text, metric=metric, limit_pct=value)


def _pct(new: float | None, base: float | None) -> float | None:
    if new is None or base is None or base <= 0.0:
        return None
    return 100.0 * (new / base - 1.0)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _per_sample(side: Side) -> list[float]:
    """µs per sample of each step whose whole-job batch is known."""
    return [
        1000.0 * ms / b for ms, b in zip(side.step_ms, side.step_batch) if b is not None and b > 0
    ]


def _sampled_metric(
    name: str, label: str, unit: str, base: list[float], new: list[float], definition: str
) -> dict[str, Any]:
    """A figure with a distribution on both sides: means, change, interval, p-value."""
    out: dict[str, Any] = {
        "name": name,
        "label": label,
        "unit": unit,
        "better": "lower",
        "base": _mean(base),
        "new": _mean(new),
        "change_pct": None,
        "ci_pct": None,
        "p_value": None,
        "significant": None,
        "n": [len(base), len(new)],
        "reason": None,
        "definition": definition,
    }
    if not base or not new:
        out["reason"] = "no steps on " + (
            "either side"
            if not base and not new
            else ("the base side" if not base else "the new side")
        )
        return out
    out["change_pct"] = _pct(out["new"], out["base"])
    if len(base) < 2 or len(new) < 2:
        out["reason"] = "fewer than two steps on a side: no interval"
        return out
    interval = bootstrap_ratio(base, new)
    out["ci_pct"] = [100.0 * (interval.low - 1.0), 100.0 * (interval.high - 1.0)]
    out["p_value"] = interval.p_value
    out["significant"] = interval.significant
    out["rank_test_p"] = mann_whitney(base, new)
    out["resamples"] = interval.resamples
    return out


def _throughput(per_sample: dict[str, Any]) -> dict[str, Any]:
    """Samples/s from the time per sample: the same draws, the interval inverted."""
    out = dict(per_sample)
    out.update(name="throughput", label="throughput", unit="samples/s", better="higher")
    out["definition"] = "1e6 / mean µs per sample: the job's samples per second"
    out["base"] = None if not per_sample["base"] else 1e6 / per_sample["base"]
    out["new"] = None if not per_sample["new"] else 1e6 / per_sample["new"]
    out["change_pct"] = _pct(out["new"], out["base"])
    if per_sample["ci_pct"] is not None:
        lo, hi = per_sample["ci_pct"]
        out["ci_pct"] = [
            100.0 * (1.0 / (1.0 + hi / 100.0) - 1.0),
            100.0 * (1.0 / (1.0 + lo / 100.0) - 1.0),
        ]
    return out


_FIGURES = (
    # name, label, unit, better, kind of change
    ("trace_busy_pct", "trace busy", "%", "higher", "pp"),
    ("nvml_gpu_util_pct", "NVML GPU util", "%", "higher", "pp"),
    ("mfu_pct", "MFU", "%", "higher", "pp"),
    ("exposed_comm_pct", "exposed comm", "% of window", "lower", "pp"),
    ("comm_ms_per_step", "comm per step", "ms", "lower", "pct"),
    ("exposed_comm_ms_per_step", "exposed comm per step", "ms", "lower", "pct"),
    ("busbw_gbps", "bus bandwidth", "GB/s", "higher", "pct"),
    ("peak_memory_mib", "peak memory", "MiB", "lower", "pct"),
    ("dataloader_share_pct", "DataLoader wait", "% of step", "lower", "pp"),
)


def _figure(name: str, label: str, unit: str, better: str, base: Side, new: Side) -> dict[str, Any]:
    b, n = base.figures.get(name), new.figures.get(name)
    return {
        "name": name,
        "label": label,
        "unit": unit,
        "better": better,
        "base": b,
        "new": n,
        "change": None if b is None or n is None else n - b,
        "change_pct": _pct(n, b),
        "ci_pct": None,
        "p_value": None,
        "significant": None,
        "reason": (
            "one figure per run: no interval"
            if b is not None and n is not None
            else "not measured on "
            + (
                "either side"
                if b is None and n is None
                else ("the base side" if b is None else "the new side")
            )
        ),
    }


def _differences(base: Side, new: Side) -> list[dict[str, str]]:
    out = []
    for key in sorted(set(base.facts) | set(new.facts)):
        b, n = base.facts.get(key, ""), new.facts.get(key, "")
        if b == n:
            continue
        if key in _SETUP:
            kind, effect = "setup", _SETUP[key]
        elif key in _BATCH:
            kind, effect = "batch", _BATCH[key]
        elif key == "precision":
            kind, effect = "precision", _PRECISION
        elif key.endswith(" version"):
            kind, effect = "software", "software changed (expected if it is the change under test)"
        else:
            kind, effect = "script", "a different script or arguments"
        out.append(
            {
                "field": key,
                "base": b or "(none)",
                "new": n or "(none)",
                "kind": kind,
                "effect": effect,
            }
        )
    return out


def _component_rows(base: Side, new: Side, step_delta_ms: float | None) -> list[dict[str, Any]]:
    """Every component on either side, with its change per step, largest change first."""

    def keyed(side: Side) -> dict[tuple[str, str], Component]:
        return {(c.kind, c.name): c for c in side.components}

    b, n = keyed(base), keyed(new)
    rows: list[dict[str, Any]] = []
    for key in set(b) | set(n):
        bc, nc = b.get(key), n.get(key)
        b_ms = bc.ms_per_step if bc else 0.0
        n_ms = nc.ms_per_step if nc else 0.0
        delta = n_ms - b_ms
        rows.append(
            {
                "kind": key[0],
                "name": key[1],
                "leaf": (bc.leaf if bc else nc.leaf if nc else True),
                "base_ms": b_ms if bc else None,
                "new_ms": n_ms if nc else None,
                "delta_ms": delta,
                "share_of_change_pct": (100.0 * delta / step_delta_ms if step_delta_ms else None),
            }
        )
    rows.sort(key=lambda r: (-abs(r["delta_ms"]), r["kind"], r["name"]))
    return rows


_ATTRIBUTION_MIN_SHARE = 0.05
"""A part enters the headline when it moved by ≥ 5 % of the step's change, same sign."""
MOSTLY = 0.5
""""mostly X" only when X moved by more than half of the step's change."""
OUTSIDE_TRACE = "not in the traced steps (the step timer's steps against the traced ones)"
UNNAMED = "not in any named part"


def _parts(base: Side, new: Side, step_delta_ms: float | None) -> list[dict[str, Any]]:
    """Parts whose changes add up to the change in step time: where a traced step's time went
    (``inputs.trace_buckets``) and the rest of the change, which the traced steps do not show.
    Without traces on both sides: the leaf regions and the DataLoader wait, and the rest."""
    if step_delta_ms is None:
        return []
    if base.buckets and new.buckets:
        b = {c.name: c.ms_per_step for c in base.buckets}
        n = {c.name: c.ms_per_step for c in new.buckets}
        rest_name = OUTSIDE_TRACE
    else:

        def named(side: Side) -> dict[str, float]:
            return {
                (f"region {c.name}" if c.kind == "region" else c.name): c.ms_per_step
                for c in side.components
                if c.leaf and c.kind in ("region", "dataloader")
            }

        b, n = named(base), named(new)
        rest_name = UNNAMED
    rows: list[dict[str, Any]] = []
    for name in sorted(set(b) | set(n)):
        delta = n.get(name, 0.0) - b.get(name, 0.0)
        rows.append(
            {
                "kind": "part",
                "name": name,
                "leaf": True,
                "base_ms": b.get(name),
                "new_ms": n.get(name),
                "delta_ms": delta,
                "share_of_change_pct": 100.0 * delta / step_delta_ms if step_delta_ms else None,
            }
        )
    rest = step_delta_ms - sum(r["delta_ms"] for r in rows)
    rows.append(
        {
            "kind": "part",
            "name": rest_name,
            "leaf": True,
            "base_ms": None,
            "new_ms": None,
            "delta_ms": rest,
            "share_of_change_pct": 100.0 * rest / step_delta_ms if step_delta_ms else None,
        }
    )
    rows.sort(key=lambda r: (-abs(r["delta_ms"]), r["name"]))
    return rows


def _attribution(rows: list[dict[str, Any]], step_delta_ms: float) -> list[dict[str, Any]]:
    sign = 1.0 if step_delta_ms >= 0 else -1.0
    floor = max(_ATTRIBUTION_MIN_SHARE * abs(step_delta_ms), 1e-3)
    picked = [r for r in rows if r["leaf"] and r["delta_ms"] * sign >= floor]
    picked.sort(key=lambda r: -r["delta_ms"] * sign)
    return picked[:3]


_KIND_WORD = {
    "region": "region",
    "kernel": "kernel",
    "operator": "",
    "comm": "",
    "dataloader": "",
    "part": "",
}


def component_label(row: dict[str, Any]) -> str:
    if row["kind"] == "part":
        kind, _, rest = row["name"].partition(" ")
        if kind in ("kernel", "operator", "region") and rest:
            return f"{kind} `{rest}`"
        return str(row["name"])
    word = _KIND_WORD.get(row["kind"], "")
    name = row["name"] if row["kind"] in ("comm", "dataloader") else f"`{row['name']}`"
    return f"{word} {name}".strip()


def _signed(value: float, digits: int = 1, unit: str = "") -> str:
    text = f"{value:+,.{digits}f}"
    return text.replace("-", "−") + unit


def _headline(time: dict[str, Any], attribution: list[dict[str, Any]]) -> str:
    label = time["label"]
    if time["change_pct"] is None:
        return f"{label}: cannot compare ({time['reason']})"
    ci = time["ci_pct"]
    interval = f" ({round(CONFIDENCE * 100)} % CI {_signed(ci[0])}…{_signed(ci[1])})" if ci else ""
    change = f"{_signed(time['change_pct'])} % {label}{interval}"
    if time["significant"] is None:
        return f"{change}; too few steps to tell whether it is real"
    if not time["significant"]:
        return f"no significant change in {label}: {_signed(time['change_pct'])} %{interval}"
    if not attribution:
        return f"{change}; no single part explains it"
    top = attribution[0]
    delta_ms = top["delta_ms"]
    share = top.get("share_of_change_pct")
    what = f"{component_label(top)} ({_signed(delta_ms, 2)} ms/step"
    if share is not None:
        what += f", {share:.0f} % of the change"
    what += ")"
    if share is not None and share > 100.0 * MOSTLY:
        return f"{change}, mostly {what}"
    others = [
        f"{component_label(r)} ({_signed(r['delta_ms'], 2)} ms/step)" for r in attribution[1:]
    ]
    tail = f"; then {', '.join(others)}" if others else ""
    return f"{change}; the largest part: {what}{tail}"


def _findings(base: Side, new: Side) -> dict[str, list[dict[str, str]]]:
    added = [{"id": k, **new.findings[k]} for k in sorted(set(new.findings) - set(base.findings))]
    removed = [
        {"id": k, **base.findings[k]} for k in sorted(set(base.findings) - set(new.findings))
    ]
    changed = [
        {
            "id": k,
            "title": new.findings[k]["title"],
            "base_severity": base.findings[k]["severity"],
            "new_severity": new.findings[k]["severity"],
        }
        for k in sorted(set(base.findings) & set(new.findings))
        if base.findings[k]["severity"] != new.findings[k]["severity"]
    ]
    return {"added": added, "removed": removed, "severity_changed": changed}


def _check(spec: FailSpec, metrics: dict[str, dict[str, Any]]) -> dict[str, Any]:
    metric = metrics.get(spec.metric)
    out: dict[str, Any] = {
        "spec": spec.text,
        "metric": spec.metric,
        "limit_pct": spec.limit_pct,
        "change_pct": None,
        "significant": None,
        "failed": True,
        "reason": "",
    }
    if metric is None or metric.get("change_pct") is None:
        why = (metric or {}).get("reason") or "not measured"
        out["reason"] = f"cannot check: {why}"
        return out
    change = float(metric["change_pct"])
    out["change_pct"] = change
    out["significant"] = metric.get("significant")
    beyond = change >= spec.limit_pct if spec.limit_pct > 0 else change <= spec.limit_pct
    has_interval = metric.get("ci_pct") is not None
    if not beyond:
        out["failed"] = False
        out["reason"] = f"{_signed(change)} % is within the limit"
    elif has_interval and not metric.get("significant"):
        out["failed"] = False
        out["reason"] = f"{_signed(change)} % is beyond the limit but not significant"
    elif metric.get("significant") is None and metric.get("n") and min(metric["n"]) < 2:
        out["reason"] = f"{_signed(change)} % is beyond the limit; too few steps to test it"
    else:
        out["reason"] = f"{_signed(change)} % is beyond the limit" + (
            " and significant" if has_interval else " (one figure per run, no interval)"
        )
    return out


def diff_sides(base: Side, new: Side, fail_on: Sequence[FailSpec] = ()) -> dict[str, Any]:
    """The whole diff as plain data (the ``--json`` verdict object; see the module docstring)."""
    differences = _differences(base, new)
    per_sample_base, per_sample_new = _per_sample(base), _per_sample(new)
    batch_changed = (
        base.global_batch is not None
        and new.global_batch is not None
        and base.global_batch != new.global_batch
    )
    step = _sampled_metric(
        "step_time",
        "step time",
        "ms",
        base.step_ms,
        new.step_ms,
        f"mean job step time; base: {base.step_source}; new: {new.step_source}",
    )
    if base.not_applicable.get("step_time") or new.not_applicable.get("step_time"):
        step["reason"] = base.not_applicable.get("step_time") or new.not_applicable["step_time"]
    per_sample: dict[str, Any] | None = None
    if per_sample_base and per_sample_new:
        per_sample = _sampled_metric(
            "time_per_sample",
            "time per sample",
            "µs",
            per_sample_base,
            per_sample_new,
            "job step time / samples of the whole job in that step, mean over steps",
        )
    time = dict(per_sample if batch_changed and per_sample is not None else step)
    time["name"] = "time"
    metrics: dict[str, dict[str, Any]] = {"time": time, "step_time": step}
    if per_sample is not None:
        metrics["time_per_sample"] = per_sample
        metrics["throughput"] = _throughput(per_sample)
    else:
        reason = base.not_applicable.get("throughput") or new.not_applicable.get(
            "throughput", "no batch size on a side"
        )
        metrics["throughput"] = {
            "name": "throughput",
            "label": "throughput",
            "unit": "samples/s",
            "better": "higher",
            "base": None,
            "new": None,
            "change_pct": None,
            "ci_pct": None,
            "p_value": None,
            "significant": None,
            "reason": reason,
        }
    for name, label, unit, better, _kind in _FIGURES:
        metrics[name] = _figure(name, label, unit, better, base, new)
    base_ms = _mean(base.step_ms)
    new_ms = _mean(new.step_ms)
    step_delta = None if base_ms is None or new_ms is None else new_ms - base_ms
    rows = _component_rows(base, new, step_delta)
    parts = _parts(base, new, step_delta)
    attribution = (
        _attribution(parts, step_delta)
        if step_delta is not None and step.get("significant")
        else []
    )
    checks = [_check(spec, metrics) for spec in fail_on]
    failed = any(c["failed"] for c in checks)
    significant = time.get("significant")
    if significant and time["change_pct"] is not None:
        direction = "slower" if time["change_pct"] > 0 else "faster"
    elif significant is None:
        direction = "unknown"
    else:
        direction = "no_significant_change"
    return {
        "schema": SCHEMA,
        "base": {"path": base.path, "kind": base.kind, "label": base.label},
        "new": {"path": new.path, "kind": new.kind, "label": new.label},
        "comparable": not any(d["kind"] == "setup" for d in differences),
        "differences": differences,
        "basis": "sample" if batch_changed and per_sample is not None else "step",
        "headline": _headline(time, attribution),
        "change": direction,
        "metrics": metrics,
        "metric_order": [
            "time",
            "step_time",
            "time_per_sample",
            "throughput",
            *[f[0] for f in _FIGURES],
        ],
        "attribution": attribution,
        "parts": parts,
        "components": rows,
        "findings": _findings(base, new),
        "steps": {
            "base": {"index": base.step_indices, "ms": base.step_ms},
            "new": {"index": new.step_indices, "ms": new.step_ms},
        },
        "fail_on": checks,
        "verdict": "fail" if failed else "pass",
        "exit_code": 1 if failed else 0,
        "confidence": CONFIDENCE,
        "definitions": {
            "step_time": step["definition"],
            "ci_pct": (
                f"{round(CONFIDENCE * 100)} % percentile bootstrap interval of "
                "mean(new)/mean(base) - 1, resampling each run's steps (seeded)"
            ),
            "p_value": (
                "two-sided bootstrap p-value from the interval's own draws: 2 x the share of "
                "resampled ratios on the far side of no change"
            ),
            "significant": "p_value ≤ 0.05, which is the interval excluding 0 (no change)",
            "rank_test_p": (
                "two-sided Mann-Whitney U test on the step samples (a shift of the whole "
                "distribution; reported beside, never used for significant)"
            ),
            "parts": (
                "ms per step that add up to the change in step time: where a traced step's "
                "time went (operators or kernels by name, exposed communication, other device "
                "work, GPU idle, host time outside operators, data loading; mean over ranks), "
                "and the rest of the change, which the traced steps do not show"
            ),
            "components": (
                "ms per step: regions (total over the rank's steps / steps), kernels "
                "(GPU traces) or host operators by self time (CPU traces) and each "
                "collective type's exposed time (per traced step), DataLoader wait; mean "
                "over ranks"
            ),
        },
    }


def finite_or_none(value: Any) -> Any:
    """JSON cannot hold inf/NaN: such a figure becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_or_none(v) for v in value]
    return value
