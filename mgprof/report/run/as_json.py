"""JSON rendering of a run report: the run.json schema with ``analysis`` filled in.

Same schema as run.json, so ``mgprof report --format json`` output can be read back with
``read_run``/``decode_run`` and re-rendered, diffed or fed to other tools. The analysis is
written as the dict it is stored as (``mgprof report`` passes the dict it analysed, so a block
of another version's run.json is kept as written); a ``RunAnalysis`` is written in its schema's
layout. Control, bidi and line-separator characters in strings are written as ``\\u`` escapes
(``safe_text.json_text``), so the document prints safely on a terminal and decodes to the same
values.

The document's second key (after ``schema_version``) is ``summary``: the figures the text
reports open with, as they show them (``mgprof.report.run.summary``; null for a failed run
with too few steps for figures). ``read_run`` ignores it, as it ignores any key it does not
know.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from mgprof.analyze.run.schema import RunAnalysis, decode_analysis
from mgprof.records import RunRecord, encode_run
from mgprof.report.run.summary import report_summary
from mgprof.report.safe_text import json_text


def run_to_json(run: RunRecord, analysis: RunAnalysis | Mapping[str, Any]) -> str:
    """The RunRecord with ``analysis`` replaced by the given one and ``summary`` after its
    ``schema_version``, as indented JSON text."""
    plain = msgspec.to_builtins(analysis) if isinstance(analysis, RunAnalysis) else dict(analysis)
    filled = msgspec.structs.replace(run, analysis=plain)
    summary = report_summary(run, decode_analysis(analysis))
    record = msgspec.json.decode(encode_run(filled))
    doc = {"schema_version": record.pop("schema_version")}
    doc["summary"] = summary.as_json() if summary is not None else None
    doc.update(record)
    text = msgspec.json.format(msgspec.json.encode(doc), indent=1)
    return json_text(text.decode("utf-8")) + "\n"
