"""A name of many MB in a trace costs its reading, not a terminal layout that grows faster than
the name: the short kernel form and every terminal cell are cut before any layout work (an
adversarial probe's 200 MB kernel name ran past 600 s; 20 MB took 28 s, 1.8 s now)."""

from __future__ import annotations

import gzip
import io
import json
import time
from pathlib import Path

from rich.console import Console

from mgprof.cli import main
from mgprof.report.kernel_names import short_kernel_name, short_kernel_names
from mgprof.report.safe_text import DISPLAY_CHARS, rich_text

DATA = Path(__file__).parent / "data" / "traces" / "gpu-nccl-a100-rank0of2" / "rank-0.json.gz"
LONG = 20_000_000


def _long_trace(folder: Path) -> Path:
    trace = json.loads(gzip.decompress(DATA.read_bytes()))
    kernel = next(e for e in trace["traceEvents"] if e.get("cat") == "kernel")
    kernel["name"] = "void at::native::kern<" + "A" * LONG + ">(int)"
    kernel["dur"] = 50_000  # the heaviest kernel: first in Top kernels
    path = folder / "rank-0.json"
    path.write_text(json.dumps(trace))
    return path


def test_short_kernel_forms_of_a_huge_name_are_bounded_and_quick() -> None:
    name = "void at::native::kern<" + "A" * LONG + ">(int)"
    began = time.perf_counter()
    short = short_kernel_name(name)
    both = short_kernel_names([name, name.replace("kern<", "kern<B")])
    took = time.perf_counter() - began
    assert short.startswith("kern<…AAAA") and len(short) <= 48
    assert all(len(s) <= 48 for s in both)
    assert took < 2.0, took  # 4.3 s for one such name before the cut, here


def test_a_terminal_cell_is_cut_before_layout() -> None:
    text = rich_text("x" * (10 * DISPLAY_CHARS))
    assert len(text.plain) == DISPLAY_CHARS and text.plain.endswith("…")
    buf = io.StringIO()
    Console(file=buf, width=80).print(rich_text("y" * 5_000_000))
    assert len(buf.getvalue()) < 2 * DISPLAY_CHARS


def test_trace_with_a_20_mb_kernel_name_renders_in_seconds(tmp_path: Path, capsys: object) -> None:
    path = _long_trace(tmp_path)
    began = time.perf_counter()
    code = main(["trace", str(path), "--no-cache"])
    took = time.perf_counter() - began
    out = capsys.readouterr().out  # type: ignore[attr-defined]
    assert code == 0
    assert "Top kernels" in out and "kern<…AAAA" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert len(out) < 20_000  # the name is not printed whole
    assert took < 15.0, took  # 28 s before (the scans of the whole name), 1.8 s here
