"""How mgprof starts its child processes: nothing outlives mgprof, nothing shadows Python.

Children run ``python -c STUB`` rather than ``python -m``. ``-m`` puts the working directory
first on ``sys.path``, so a ``./inspect.py`` or ``./random.py`` next to the user shadows the
standard library inside torchrun and the workers, though plain ``python script.py`` (whose
``sys.path[0]`` is the script's folder) never sees it. The stub drops that entry before
importing anything, appends mgprof's own location (last, so it shadows nothing), and then:

- asks Linux to send SIGTERM to the process when its parent ends (``PR_SET_PDEATHSIG``): a
  worker whose torchrun died, or a torchrun whose mgprof was SIGKILLed, stops instead of
  training on as an orphan; SIGTERM, not SIGKILL, so a rank still writes what it measured;
- in torchrun, hosts the rendezvous store on loopback when the run is on one node (torchrun's
  c10d store otherwise listens on every interface, unauthenticated);
- runs ``mgprof.run.bootstrap`` (a worker) or ``torch.distributed.run`` (torchrun).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

from mgprof.parent_death import parent_death_signal

LOOPBACK_ENV = "MGPROF_LOOPBACK_RENDEZVOUS"
"""Set to 1 by the launcher for single-node DDP: torchrun's store listens on 127.0.0.1 only."""

TARGETS = ("bootstrap", "torchrun")
_STUB = (
    "import os,sys;_p=os.getppid();"
    "getattr(sys.flags,'safe_path',False) or sys.path.pop(0);"
    "sys.path.append({root!r});"
    "from mgprof.run.entry import start;start({target!r},_p)"
)


def python_command(target: str) -> list[str]:
    """``[python, -c, STUB]`` that starts ``target`` (``bootstrap`` or ``torchrun``); the
    target's own arguments follow."""
    if target not in TARGETS:
        raise ValueError(f"unknown entry target {target!r}")
    root = str(Path(__file__).resolve().parent.parent.parent)
    return [sys.executable, "-c", _STUB.format(root=root, target=target)]


def start(target: str, parent: int) -> NoReturn:
    """The stub's body: parent-death signal, then the target with ``sys.argv[1:]``."""
    if parent_death_signal(signal.SIGTERM) and os.getppid() != parent:
        # the parent ended between our start and the prctl call: it will never signal us
        sys.exit(128 + signal.SIGTERM)
    if target == "torchrun":
        if os.environ.get(LOOPBACK_ENV) == "1":
            loopback_store()
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.run import main as torchrun_main

        sys.argv[0] = "torchrun"
        try:
            torchrun_main()
        except SignalException as exc:  # mgprof stopped the run; its workers are stopped
            sys.exit(128 + int(exc.sigval))
        except Exception as exc:
            torchrun_failed(exc)
        sys.exit(0)
    from mgprof.run.bootstrap import main as bootstrap_main

    sys.exit(bootstrap_main(sys.argv[1:]))  # sys.argv[0] is "-c"


TORCHRUN_LOG = "torchrun.log"
"""torchrun's own traceback and failure summary, in the run's ``logs`` folder."""


def torchrun_failed(exc: BaseException) -> NoReturn:
    """torchrun raised (``ChildFailedError`` when a rank failed, anything else when it could
    not start them): its traceback goes into ``logs/torchrun.log``, where the launcher reads the
    failure summary, instead of under mgprof's own last line on the terminal. A failure of its
    own gets one line on stderr (the run's error quotes it). Exit 1, as torchrun would; where the
    log cannot be written, the traceback is printed as before (fail open)."""
    import traceback

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    kept = _keep_in_log(text)
    if not kept:
        sys.stderr.write(text)
    if not isinstance(exc, ChildFailedError):
        first = (str(exc).strip().splitlines() or [""])[0]
        where = f" (traceback in logs/{TORCHRUN_LOG})" if kept else ""
        print(f"torchrun failed: {type(exc).__name__}: {first}{where}", file=sys.stderr)
    sys.stderr.flush()
    sys.exit(1)


def _keep_in_log(text: str) -> bool:
    run_dir = os.environ.get("MGPROF_RUN_DIR")
    if not run_dir:
        return False
    try:
        folder = Path(run_dir) / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / TORCHRUN_LOG, "a", encoding="utf-8") as fh:
            fh.write(text)
        return True
    except OSError:
        return False


def loopback_store() -> None:
    """Make every TCPStore server this process creates listen on 127.0.0.1 only.

    torch binds a TCPStore server to all interfaces and has no option to choose one; it does
    take an already-listening socket (``master_listen_fd``, libuv backend), which is bound to
    loopback here. Applies to the stores torchrun itself hosts (the rendezvous, which the
    workers reuse as their store); nothing changes when ``USE_LIBUV=0`` asks for the old
    backend, which does not serve a given socket.
    """
    import socket

    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

    if os.environ.get("USE_LIBUV", "1") == "0":
        return
    base: Any = dist.TCPStore

    class LoopbackTCPStore(base):  # type: ignore[misc, valid-type]
        """A TCPStore whose server socket is bound to loopback."""

        def __init__(self, host_name: str, port: int = 0, *args: Any, **kwargs: Any) -> None:
            # positional after (host_name, port): world_size, is_master, timeout,
            # wait_for_workers, multi_tenant, master_listen_fd, use_libuv
            is_master = bool(kwargs.get("is_master", args[1] if len(args) > 1 else False))
            fd_given = len(args) > 5 or kwargs.get("master_listen_fd") is not None
            sock = None
            if is_master and not fd_given:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", port or 0))
                sock.listen(1024)
                port = sock.getsockname()[1]
                kwargs["master_listen_fd"] = sock.fileno()
                kwargs["use_libuv"] = True
            super().__init__(host_name, port, *args, **kwargs)
            self._mgprof_listen_socket = sock  # the server uses its fd: keep it open

    setattr(dist, "TCPStore", LoopbackTCPStore)  # noqa: B010 - torch's own name is replaced
    setattr(c10d_rendezvous_backend, "TCPStore", LoopbackTCPStore)  # noqa: B010
