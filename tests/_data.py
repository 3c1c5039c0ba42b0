"""Where the tests' recorded inputs live: ``tests/data/``, inside the repository.

A clone carries everything its suite reads, so nothing here looks beside the repository. A file
that is missing is a failing test (``need`` raises), never a skip: a suite that silently skips
its real-data checks passes on a broken checkout.
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
TRACES = DATA / "traces"
PEERS = TRACES / "peers"
GPU = DATA / "gpu"


def need(path: Path, pattern: str | None = None) -> Path:
    """``path`` itself, or the one file in folder ``path`` matching ``pattern``; a clear error
    (not a skip) when it is absent, naming the README that lists where each file comes from."""
    if pattern is not None:
        found = sorted(path.glob(pattern))
        if len(found) != 1:
            raise FileNotFoundError(
                f"expected one {pattern!r} in {path}, found {len(found)} "
                "(tests/data/traces/README.md lists every recorded input)"
            )
        return found[0]
    if not path.exists():
        raise FileNotFoundError(
            f"{path} is missing (tests/data/traces/README.md lists every recorded input)"
        )
    return path
