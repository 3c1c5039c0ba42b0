"""The Gradient noise scale section: B_simple with its band and window, the global batch set
against it, and the caveats that go with the figure; one n/a line with the reason when the run
could not measure it.

Built from ``analysis.noise_scale`` (``mgprof.analyze.run.noise_scale``); absent for an analysis
made before mgprof measured the noise scale.
"""

from __future__ import annotations

from mgprof.analyze.run.schema import NoiseScale, RunAnalysis, given
from mgprof.report.run.section_model import Section

TITLE = "Gradient noise scale"

CAVEATS = (
    "B_simple changes during training (it usually grows as the loss falls): the figure holds "
    "for the window measured. Measure more than a few steps, and compare windows.",
    "It depends on the optimizer: McCandlish et al. derive the model for SGD; under Adam-type "
    "optimizers the critical batch follows B_simple less closely.",
    "B_simple estimates the critical batch size B_crit, it does not guarantee it: the model "
    "assumes the learning rate is tuned for each batch size.",
    "The estimators take gradients as batch means (a mean-reduced loss); a sum-reduced loss "
    "with equal per-rank batches gives the same B_simple.",
)


def _n(value: float) -> str:
    """A batch-sized figure: whole numbers from 10 on, three significant digits below."""
    if value >= 10.0:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def band_text(ns: NoiseScale) -> str:
    """``95 % band 14–20`` (``… –∞`` when the bootstrap could not bound it from above)."""
    low = given(ns.band_low)
    high = given(ns.band_high)
    pct = round(100 * (given(ns.confidence) or 0.95))
    if low is None:
        return ""
    top = "∞" if ns.band_unbounded or high is None else _n(high)
    return f"{pct} % band {_n(low)}–{top}"


def batch_sentence(global_batch: float, b_simple: float, ns: NoiseScale) -> str:
    """What the global batch means against B_simple, in the paper's terms (progress per sample
    against a small batch, steps saved by doubling the batch)."""
    ratio = global_batch / b_simple
    per_sample = 1.0 / (1.0 + ratio)
    saved = given(ns.doubling_steps_saved_pct)
    saved_text = f"~{saved:.0f} %" if saved is not None else "a share"
    g, bs = _n(global_batch), _n(b_simple)
    if ratio >= 1.5:
        head = (
            f"global batch {g} is {ratio:.1f}x B_simple ≈ {bs}: each sample buys ~1/"
            f"{1.0 + ratio:.0f} of the progress it buys in a small batch ({2 * per_sample:.2g} "
            f"of what it buys at B_simple); doubling the batch would save only {saved_text} of "
            "the steps for twice the samples"
        )
        if ratio >= 4.0:
            return head + ", so more data-parallel ranks will mostly add cost."
        return head + ": past B_simple each doubling pays less."
    if ratio > 0.5:
        return (
            f"global batch {g} is near B_simple ≈ {bs} ({ratio:.2g}x), the balance of the "
            f"model: a sample buys {per_sample:.2g} of its small-batch progress, and doubling "
            f"the batch would save {saved_text} of the steps."
        )
    return (
        f"global batch {g} is {1.0 / ratio:.1f}x below B_simple ≈ {bs}: samples keep nearly all "
        f"their value ({per_sample:.2g} of a small batch's), and doubling the batch (more "
        f"ranks, or more per rank) would save {saved_text} of the steps: a larger batch still "
        "pays."
    )


def noise_scale_section(analysis: RunAnalysis) -> Section | None:
    """None for an analysis without noise-scale figures (made by an older mgprof)."""
    ns = given(analysis.noise_scale)
    if ns is None:
        return None
    sec = Section(TITLE)
    if not ns.measured:
        sec.brief = f"n/a: {given(ns.reason) or 'not measured'}"
        return sec
    bs = given(ns.b_simple)
    steps = given(ns.steps) or 0
    band = band_text(ns)
    if bs is None:
        sec.facts.append(("B_simple", f"n/a: {given(ns.reason) or 'not computed'}"))
        low = given(ns.band_low)
        if band and low is not None:
            sec.facts.append(("lower bound", f"B_simple > {_n(low)}"))
    else:
        sec.facts.append(("B_simple", f"{_n(bs)}" + (f" ({band})" if band else "")))
    sec.facts.append(("measured over", _window(ns, steps)))
    gb = given(ns.global_batch)
    if bs is not None and bs > 0 and gb is not None:
        sec.facts.append(("global batch", batch_sentence(gb, bs, ns)))
    latest = given(ns.latest_b_simple)
    if latest is not None:
        sec.facts.append(("latest (EMA, ~20 updates)", _n(latest)))
    first, second = given(ns.first_half), given(ns.second_half)
    if first is not None or second is not None:
        halves = [_n(v) if v is not None else "n/a" for v in (first, second)]
        sec.facts.append(("first half / second half", " / ".join(halves)))
    if ns.dropped:
        text = "; ".join(f"{v}: {k}" for k, v in ns.dropped.items())
        sec.facts.append(("steps left out", text))
    sec.notes.extend(CAVEATS)
    return sec


def _window(ns: NoiseScale, steps: int) -> str:
    first, last = given(ns.first_step), given(ns.last_step)
    where = f"steps {first}–{last}" if first is not None and last is not None else ""
    b, big = given(ns.b_small), given(ns.b_big)
    if ns.source == "accumulation":
        how = "one process, first micro-batch vs the accumulated update"
        sizes = f"b = {_n(b)}, B = {_n(big)}" if b is not None and big is not None else ""
    else:
        how = f"{ns.ranks} ranks, each rank's gradient vs the all-reduced one"
        sizes = f"b = {_n(b)} per rank, B = {_n(big)}" if b is not None and big is not None else ""
    parts = [f"{steps} steps" + (f" ({where})" if where else ""), how, sizes]
    return "; ".join(p for p in parts if p)
