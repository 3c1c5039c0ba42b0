"""The one connection mgprof holds to a Dask scheduler, and what it keeps off the terminal.

``distributed.Client`` takes a malformed address ("not an address", an unknown scheme) only to
fail inside its constructor, and the half-made client then blocks the interpreter's exit for a
minute in ``Client.__del__`` before printing a traceback: the address is checked here first,
with distributed's own parser, so a typo is one line at once. While the client is open,
distributed's log (reconnect attempts, its tracebacks when the scheduler goes away) is kept in
memory rather than printed: what it means for the job is mgprof's own line, a lost rank.
"""

from __future__ import annotations

import logging
import re
import socket
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mgprof.errors import UsageError

HOST_SCHEMES = ("tcp", "tls", "ws", "wss")
"""Schemes whose location is ``host:port``."""
LOGGERS = ("distributed", "distributed.client", "distributed.gc", "tornado", "tornado.application",
           "bokeh", "asyncio")  # fmt: skip
"""The loggers distributed configures to print on stderr (and asyncio's, whose unretrieved-task
warnings reach the terminal through logging's last-resort handler)."""
KEPT_LINES = 200
_HOST = re.compile(r"[A-Za-z0-9_.:%-]+")
_WHERE = "--dask (or $MGPROF_DASK_SCHEDULER)"
_EXAMPLE = f"give {_WHERE} as tcp://HOST:PORT, e.g. tcp://10.0.0.5:8786"


def check_address(address: str) -> str:
    """The scheduler ``address`` as distributed reads it, or UsageError naming what is wrong:
    no port, an unknown scheme, a port outside 1..65535, a host that does not resolve."""
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import backends

    text = address.strip()
    shown = f"the Dask scheduler address {_shown(address)}"
    if not text or any(c.isspace() for c in text):
        raise UsageError(f"{shown} is not an address; {_EXAMPLE}")
    try:
        scheme, location = parse_address(text)
    except (ValueError, TypeError):
        raise UsageError(f"{shown} is not an address; {_EXAMPLE}") from None
    if scheme not in backends:
        known = ", ".join(sorted(backends))
        raise UsageError(f"{shown}: unknown scheme {scheme!r} (known: {known}); {_EXAMPLE}")
    if scheme not in HOST_SCHEMES:
        return text
    try:
        host, port = parse_host_port(location)
    except (ValueError, TypeError):
        raise UsageError(f"{shown} has no port number; {_EXAMPLE}") from None
    if not host or not _HOST.fullmatch(host):
        raise UsageError(f"{shown} names no host; {_EXAMPLE}")
    if not 1 <= int(port) <= 65535:
        raise UsageError(f"{shown}: port {port} is outside 1..65535; {_EXAMPLE}")
    try:
        socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise UsageError(f"{shown}: host {host!r} not found; check {_WHERE}") from None
    return text


def _shown(address: str) -> str:
    """The address as quoted in a message, cut when it is long (the CLI's error line makes
    it printable)."""
    return repr(address if len(address) <= 80 else address[:60] + "…" + address[-12:])


class KeptLog(logging.Handler):
    """The last :data:`KEPT_LINES` records, one line each (a traceback's last line)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: deque[str] = deque(maxlen=KEPT_LINES)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage().strip().splitlines()
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                text.append(f"{type(exc).__name__}: {exc}")
            line = " ".join(t.strip() for t in text if t.strip())[:500]
            self.lines.append(f"{record.name} {record.levelname}: {line}")
        except Exception:  # a record that cannot be read is dropped, never printed
            pass


@contextmanager
def kept_off_the_terminal(handler: KeptLog) -> Iterator[None]:
    """While the block runs, records of :data:`LOGGERS` go to ``handler`` alone; each
    logger's handlers and propagation are restored after."""
    try:
        import distributed  # noqa: F401 - its import sets up the handlers to move aside
    except ImportError:
        pass
    saved: list[tuple[logging.Logger, list[logging.Handler], bool]] = []
    for name in LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, list(logger.handlers), logger.propagate))
        logger.handlers = [handler]
        logger.propagate = False
    try:
        yield
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers = handlers
            logger.propagate = propagate


def connect(address: str, timeout_s: float) -> Any:
    """A ``distributed.Client`` for ``address`` (checked first), not set as the default
    client; UsageError when distributed is missing or the scheduler cannot be reached."""
    try:
        from distributed import Client
    except ImportError:
        raise UsageError("the Dask executor needs Dask: pip install 'mgprof[dask]'") from None
    checked = check_address(address)
    try:
        return Client(checked, timeout=timeout_s, set_as_default=False)
    except (OSError, TimeoutError, ValueError) as exc:
        raise UsageError(
            f"cannot reach the Dask scheduler at {address} ({exc}); check the address "
            f"(e.g. tcp://host:8786) and that the scheduler is running"
        ) from None
