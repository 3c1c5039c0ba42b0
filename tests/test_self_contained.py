"""A clone runs its own suite: no test reads anything outside the repository.

The recorded traces used to be read from a folder beside the checkout, which a user's clone never
has; the suite then stopped at collection. These checks keep it from coming back: no test or
benchmark climbs out of the repository, and every recorded input the README lists is present
(a missing one fails here, once, by name, instead of skipping a real-data test quietly).
"""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import pytest
from _data import TRACES

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [
    p
    for p in sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py"))
    if p != Path(__file__).resolve()  # this file holds the patterns as data
]


def _escapes(text: str, rel: Path) -> list[str]:
    """Where a module builds a path that leaves the repository: a ``.parent`` of the repository
    root, ``parents[k]`` past it, a literal naming the folder beside it, or a ``..`` path
    handed to ``Path``/``open`` or joined with ``/``."""
    tree = ast.parse(text, filename=str(rel))
    depth = len(rel.parts) - 1  # Path(__file__).parents[depth] is the repository root
    found: list[str] = []
    for node in ast.walk(tree):
        line = f"{rel}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            # test data in a folder beside the checkout, whatever its name ('../x/fixtures/...')
            beside = node.value.startswith("../")
            if beside and any(f"/{d}" in node.value for d in ("fixtures", "traces", "data")):
                found.append(f"{line}: {node.value!r}")
        elif isinstance(node, ast.Attribute) and node.attr == "parent":
            base = node.value
            if isinstance(base, ast.Name) and base.id == "ROOT":
                found.append(f"{line}: ROOT.parent")
            subscript = isinstance(base, ast.Subscript) and isinstance(base.value, ast.Attribute)
            if subscript and base.value.attr == "parents":  # type: ignore[attr-defined]
                found.append(f"{line}: parents[...].parent")
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
            k = node.slice.value if isinstance(node.slice, ast.Constant) else None
            if node.value.attr == "parents" and isinstance(k, int) and k > depth:
                found.append(f"{line}: parents[{k}]")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name in {"Path", "open"} and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and str(arg.value).startswith(".."):
                    found.append(f"{line}: {name}({arg.value!r})")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            right = node.right
            if isinstance(right, ast.Constant) and right.value == "..":
                found.append(f"{line}: / {right.value!r}")
    return found


def test_no_test_or_benchmark_reads_outside_the_repository() -> None:
    found = [hit for p in SOURCES for hit in _escapes(p.read_text(), p.relative_to(ROOT))]
    assert not found, "paths that leave the repository:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        'FIXTURES = ROOT.parent / "beside" / "fixtures" / "traces"\n',
        'T = Path(__file__).parents[1].parent / "x"\n',
        'T = Path(__file__).resolve().parents[1] / "../beside/fixtures/traces/a"\n',
        'T = Path("../elsewhere/trace.json")\n',
    ],
)
def test_the_check_sees_each_way_out(source: str) -> None:
    assert _escapes(source, Path("tests/test_probe.py"))
    assert not _escapes('T = Path(__file__).parents[1] / "tests" / "data"\n', Path("tests/x.py"))


def _listed_patterns() -> list[str]:
    """The ``path`` column of the README's table, with ``{a,b}`` expanded."""
    text = (TRACES / "README.md").read_text()
    patterns = []
    for row in re.findall(r"^\| `([^`]+)` \|", text, flags=re.M):
        brace = re.search(r"\{([^}]*)\}", row)
        options = brace.group(1).split(",") if brace else [""]
        for opt in options:
            pat = row[: brace.start()] + opt + row[brace.end() :] if brace else row
            patterns.append(pat + "*" if pat.endswith("/") else pat)
    return patterns


def test_every_recorded_trace_is_listed_with_its_origin_and_present() -> None:
    files = sorted(
        p.relative_to(TRACES).as_posix()
        for p in TRACES.rglob("*")
        if p.is_file() and p.name != "README.md"
    )
    patterns = _listed_patterns()
    assert patterns, "tests/data/traces/README.md lists no file"
    unlisted = [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    absent = [p for p in patterns if not any(fnmatch.fnmatch(f, p) for f in files)]
    assert not unlisted, f"traces without an origin in the README: {unlisted}"
    assert not absent, f"traces the README lists but the checkout lacks: {absent}"
