"""The run report as a list of titled sections of plain-text tables, shared by every renderer.

Building the content once keeps the terminal, Markdown (and HTML) reports saying the same thing;
each renderer only styles and escapes. A figure the analysis could not compute is the cell
``n/a [k]`` with footnote ``k`` giving the reason, never a number. Cells hold raw text (kernel
and device names straight from traces): escaping is the renderer's job.

The builders live in ``setup`` (Setup) and ``figures`` (the rest), the parts they share
in ``section_model``; this module orders them and keeps the names renderers import.
"""

from __future__ import annotations

from collections.abc import Sequence

from mgprof.analyze.run.schema import RunAnalysis
from mgprof.records import RunRecord
from mgprof.report.run.compiled import compiled_section
from mgprof.report.run.figures import (
    TOP_KERNELS,
    communication_section,
    data_loading_section,
    energy_section,
    findings_section,
    memory_section,
    slowest_section,
    step_time_section,
    top_kernels_section,
    utilisation_section,
)
from mgprof.report.run.idle import idle_section
from mgprof.report.run.memory_profile import memory_profile_section
from mgprof.report.run.noise_scale import noise_scale_section
from mgprof.report.run.regions import regions_section
from mgprof.report.run.section_model import Section, Table
from mgprof.report.run.setup import setup_section

__all__ = ["TOP_KERNELS", "Section", "Table", "build_sections", "definitions"]


def build_sections(run: RunRecord, analysis: RunAnalysis) -> list[Section]:
    """Every section of the run report, in reading order; Regions, GPU idle and Top kernels
    only when the run has what they show (regions, GPU traces), Gradient noise scale when the
    analysis has its figures (measured, or n/a with the reason)."""
    optional: list[Section | None] = [
        setup_section(run, analysis),
        step_time_section(analysis),
        regions_section(analysis),
        compiled_section(run, analysis),
        utilisation_section(analysis),
        idle_section(analysis),
        energy_section(analysis),
        communication_section(analysis),
        noise_scale_section(analysis),
        memory_section(analysis),
        memory_profile_section(analysis),
        data_loading_section(analysis),
        slowest_section(analysis),
        top_kernels_section(analysis),
    ]
    sections = [s for s in optional if s is not None]
    sections.append(findings_section(analysis))
    return sections


def definitions(analysis: RunAnalysis) -> Sequence[tuple[str, str]]:
    """(figure, definition) pairs the analysis stated, for the report's closing glossary."""
    return list(analysis.definitions.items())
