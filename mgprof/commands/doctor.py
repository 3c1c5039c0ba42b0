"""``mgprof doctor``: what this machine offers mgprof, and what mgprof will fall back to."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from mgprof.commands import help_formatter

EPILOG = """\
examples:
  mgprof doctor                      check torch, CUDA, NCCL, NVML, GPUs
  mgprof doctor --bandwidth --gpus 2 --out bw.json
                                     measure collectives' bus bandwidth over 2 ranks and
                                     keep it as a baseline for 'mgprof trace --bandwidth'"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check Python, torch, CUDA, NCCL, NVML and GPUs; say what mgprof falls back to",
        description="What this machine offers mgprof (Python, torch, CUDA, NCCL, NVML, the "
        "GPUs), and what mgprof falls back to where something is missing.",
        epilog=EPILOG,
        formatter_class=help_formatter(),
    )
    parser.add_argument("--json", action="store_true", help="print the facts as JSON")
    parser.add_argument(
        "--bandwidth",
        action="store_true",
        help="measure all-reduce / all-gather / reduce-scatter bus bandwidth on this machine "
        "(nccl-tests' formulas; NCCL on GPUs, gloo on CPU ranks)",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=2,
        metavar="N",
        help="ranks for --bandwidth (GPUs, or CPU ranks without CUDA; default 2)",
    )
    parser.add_argument(
        "--sizes",
        default="64K,1M,16M",
        metavar="LIST",
        help="message sizes for --bandwidth, bytes with K/M/G suffixes (default 64K,1M,16M)",
    )
    parser.add_argument(
        "--iters", type=int, default=10, metavar="N", help="timed calls per size (default 10)"
    )
    parser.add_argument(
        "--out",
        metavar="FILE",
        help="with --bandwidth: also save the result as JSON (the baseline that "
        "'mgprof trace --bandwidth FILE' sets a job's bus bandwidth beside)",
    )
    parser.set_defaults(func=run)


def parse_sizes(text: str) -> list[int]:
    """``64K,1M`` → bytes (``safe_read.parse_size`` per item); UsageError naming the bad item."""
    from mgprof.errors import UsageError
    from mgprof.safe_read import parse_size

    sizes = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        try:
            sizes.append(parse_size(item))
        except ValueError as exc:
            raise UsageError(
                f"--sizes: {exc}; give e.g. 64K,1M,16M (nothing was measured)"
            ) from None
    if not sizes:
        raise UsageError("--sizes is empty; give e.g. 64K,1M,16M")
    return sizes


def run(args: argparse.Namespace) -> int:
    if args.bandwidth:
        return _bandwidth(args)
    from mgprof.collect.environment import collect_environment

    env = collect_environment()
    if args.json:
        print(json.dumps(env, indent=1, default=str))
    else:
        from mgprof.report.doctor_view import render_doctor

        render_doctor(env)
    return 0


def _bandwidth(args: argparse.Namespace) -> int:
    from mgprof.errors import UsageError
    from mgprof.run.bandwidth_probe import run_probe

    sizes = parse_sizes(args.sizes)
    out = Path(args.out) if args.out else None
    if out is not None:
        _check_out(out)
    result = run_probe(args.gpus, sizes, iters=args.iters)
    # saved first (the folder was checked before measuring), shown next: a stdout that is
    # gone (`| head`) does not lose the file, and a write that fails all the same is said
    # after the figures, so they are not lost either
    unsaved = _save(out, result) if out is not None else None
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        from mgprof.report.doctor_view import render_bandwidth

        render_bandwidth(result)
    if unsaved is not None:
        raise UsageError(
            f"cannot write --out {out}: {unsaved}; the figures above were measured but not saved"
        )
    return 0


def _check_out(out: Path) -> None:
    """``--out`` refused in one line before anything is measured: an existing file (a
    baseline is never replaced), a folder, a folder that cannot be written."""
    from mgprof.errors import UsageError
    from mgprof.safe_read import check_out_path

    if os.path.lexists(out) and not out.is_dir():
        raise UsageError(f"{out} exists; choose another --out (nothing was measured)")
    try:
        check_out_path(out, force=False)
    except UsageError as exc:
        raise UsageError(f"{exc} (nothing was measured)") from None
    folder = Path(os.path.abspath(out)).parent
    if folder.is_dir():  # the folder's mode can say yes where the file system says no
        import tempfile

        try:
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".mgprof-bw-check-"):
                pass
        except OSError as exc:
            raise UsageError(
                f"--out {out}: cannot write into {folder} ({exc.strerror or exc}); choose "
                "another --out (nothing was measured)"
            ) from None


def _save(out: Path, result: dict[str, Any]) -> str | None:
    """Write the baseline; why it could not be written, or None."""
    from mgprof.atomic import write_text_atomic

    try:
        write_text_atomic(out, json.dumps(result, indent=1) + "\n")
    except OSError as exc:
        return str(exc.strerror or exc)
    return None
