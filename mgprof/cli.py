"""The ``mgprof`` command line: parse arguments, call the library, map errors to exit codes.

Each subcommand lives in ``mgprof/commands/<name>.py`` with ``register(subparsers)`` and
``run(args) -> int``; this module holds no logic of its own.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence

from mgprof import __version__
from mgprof.errors import Interrupted, UsageError

COMMANDS = (
    "analyze",
    "compare",
    "sweep",
    "trace",
    "report",
    "diff",
    "timeline",
    "view",
    "doctor",
)
LAUNCHING = ("analyze", "compare", "sweep")
"""Commands that run a script: everything after ``--`` belongs to the script."""
NO_BLAS = ("trace", "report", "diff", "timeline")
"""Commands that only analyse files: numpy's BLAS is never called, so its thread pool (which
OpenBLAS starts when numpy loads, one thread per core: ~60 ms of a ~0.2 s ``mgprof trace`` on a
2-core machine, more on a larger one) is pure start-up cost. Their processes start with one."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad flags in one line with exit code 2 (its default code)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"mgprof: error: {message} (see '{self.prog} --help')\n")


DESCRIPTION = """\
Profile multi-GPU PyTorch training: how busy each GPU is, what communication
costs and how much of it hides behind compute, where memory goes, DP vs DDP,
and the batch-size sweet spot. Without CUDA, ranks run on the CPU over gloo
(the report says so)."""

EPILOG = """\
examples:
  mgprof analyze train.py --gpus 2   2 DDP ranks: trace a few steps, report
  mgprof analyze train.py --steps 3 --format md -- --lr 3e-4
                                     arguments after -- go to the script
  mgprof compare train.py --gpus 2 --strategies single,ddp --rounds 1
                                     one device against DDP (also dp, fsdp)
  mgprof sweep train.py --batch-sizes 8,32 --steps 3
                                     where a bigger batch stops paying
  mgprof report mgprof-runs/RUN      re-render a run (--format md|json|html)
  mgprof diff BASE NEW --fail-on 5%  did a change make training slower, and why
  mgprof timeline mgprof-runs/RUN --steps 3:4 --out two.json.gz
                                     two steps of every rank on one clock
  mgprof trace ./traces              analyse torch.profiler traces you have
  mgprof view mgprof-runs/RUN        open the traces in TensorBoard
  mgprof doctor                      check torch, CUDA, NCCL, NVML, GPUs

'mgprof COMMAND --help' shows a command's options."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``mgprof`` parser with every command, or only ``command`` when it is given.

    Registering a command imports its module, and some pull in much of the package (the report
    renderers, the TensorBoard viewer): a run of one command registers that command alone, so
    ``mgprof trace`` does not pay for the others' imports. The full parser (help, an unknown
    command) still registers them all.
    """
    parser = _Parser(
        prog="mgprof",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mgprof {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS if command is None else (command,):
        try:
            module = importlib.import_module(f"mgprof.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"mgprof.commands.{name}":
                if command is not None:
                    return build_parser()  # not built into this version: list what is
                continue  # command not built into this version
            raise
        module.register(sub)
    return parser


def _one_blas_thread() -> None:
    """``OPENBLAS_NUM_THREADS=1`` unless the user chose a value, or numpy is already loaded
    (then the pool exists, and the variable would only reach child processes)."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in NO_BLAS:
        _one_blas_thread()
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    passthrough: list[str] = []
    if argv and argv[0] in LAUNCHING and "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    if passthrough:
        args.script_args = passthrough
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except UsageError as exc:
        from mgprof.commands import error_line

        print(error_line(args.command, exc), file=sys.stderr)
        return 2
    except Interrupted as stop:
        print(f"mgprof {args.command}: interrupted ({stop.label})", file=sys.stderr)
        return 128 + stop.signum
    except KeyboardInterrupt:
        print(f"mgprof {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (``mgprof trace T --json | head``): what it wanted it has; stop
        # quietly as a shell tool does, with stdout pointed at /dev/null so the interpreter's
        # own flush at exit cannot raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
