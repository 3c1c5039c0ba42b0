"""An identity of the trace engine: the code and libraries that turn a trace into a summary.

A cached summary is only valid for the engine that computed it, and a Dask worker running other
code than the client would give other figures. The version number alone does not change with
every edit of a working tree, so the identity hashes the engine's source files themselves.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path

import msgspec
import numpy as np

__all__ = ["engine_id"]

import mgprof

_PACKAGE = Path(mgprof.__file__).resolve().parent
_SHARED = ("errors.py", "safe_read.py")
"""Root modules the loader uses for its messages and limits."""


def _source_files() -> list[Path]:
    """Every module of ``analyze/`` (subpackages too: an edit anywhere may change a figure)
    and the root modules the loader uses, in a stable order."""
    here = sorted(p for p in (_PACKAGE / "analyze").rglob("*.py") if "__pycache__" not in p.parts)
    return here + [_PACKAGE / name for name in _SHARED]


@functools.lru_cache(maxsize=1)
def engine_id() -> str:
    """A hex digest of the engine's source files and of the library versions it depends on.

    Computed once per process (a few milliseconds). Where a source file cannot be read (a build
    that ships only bytecode), its name stands in, so such builds rely on the version numbers.
    """
    from mgprof import __version__

    h = hashlib.blake2b(digest_size=16)
    # the package's own version string: importlib.metadata would cost ~20 ms of every start
    h.update(f"mgprof {__version__}\n".encode())
    h.update(
        f"py{sys.version_info[0]}.{sys.version_info[1]} numpy {np.__version__} "
        f"msgspec {msgspec.__version__}\n".encode()
    )
    for path in _source_files():
        h.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\0")
        try:
            h.update(path.read_bytes())
        except OSError:
            h.update(b"unreadable")
    return h.hexdigest()
