"""``mgprof sweep SCRIPT --gpus N``: find the batch-size sweet spot, one launch per trial."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mgprof.commands import help_formatter
from mgprof.commands.analyze import add_launch_arguments
from mgprof.errors import UsageError

EPILOG = """\
examples:
  mgprof sweep train.py --batch-sizes 8,32 --steps 3
                                     one device at batch 8 and 32, 3 measured steps each
  mgprof sweep train.py --gpus 8 --range 16:1024 --until-oom
                                     8 GPUs: grow the batch from 16 until memory runs out

Each trial's run directory and sweep.json go into one folder under --out;
'mgprof report' renders that folder again."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sweep",
        usage="mgprof sweep SCRIPT --gpus N [--batch-sizes 8,16,32 | --range LO:HI] [options] "
        "[-- SCRIPT_ARGS]",
        help="find the batch-size sweet spot (throughput vs memory vs communication)",
        description="Run SCRIPT at several batch sizes (each trial its own processes), growing "
        "the batch geometrically until it runs out of memory or stops paying, then bisecting. "
        "The batch is set on the script's DataLoader, so the script runs unmodified (a script "
        "may also read it with mgprof.batch_size()).",
        epilog=EPILOG,
        formatter_class=help_formatter(),
    )
    add_launch_arguments(p, steps_default="8", one_node=True)
    p.set_defaults(steps=8)  # 3 traced + 1 writing the trace: 4 untraced steps measure it
    p.add_argument(
        "--strategy", choices=["single", "dp", "ddp", "fsdp", "fsdp-noreshard"], default=None,
        help="default: ddp when --gpus > 1, else single",
    )  # fmt: skip
    p.add_argument("--batch-sizes", metavar="B1,B2,...", help="try exactly these sizes")
    p.add_argument("--range", metavar="LO:HI", help="search LO..HI (default 8:4096)")
    p.add_argument(
        "--margin", type=float, default=0.1,
        help="memory headroom kept free, fraction of capacity (default: 0.1)",
    )  # fmt: skip
    p.add_argument(
        "--resolution", type=float, default=0.1,
        help="bisect until the boundary is within this fraction of the size (default: 0.1)",
    )  # fmt: skip
    p.add_argument(
        "--memory-budget-mib", type=int, default=None, metavar="M",
        help="CPU only: cap each rank's address space at its size after importing torch + M "
        "MiB, so a too-large batch really fails to allocate; M is then the capacity",
    )  # fmt: skip
    p.add_argument(
        "--global-batch", type=int, default=None, metavar="G",
        help="fixed global batch: each trial accumulates G / (batch x devices) micro-batches "
        "per update; the script must read that count with mgprof.accumulation_steps()",
    )  # fmt: skip
    p.add_argument(
        "--until-oom", action="store_true",
        help="keep growing after throughput plateaus, to locate the memory boundary",
    )  # fmt: skip
    p.add_argument(
        "--format", choices=["term", "json", "md"], default="term",
        help="result printed at the end (default: term)",
    )  # fmt: skip
    p.set_defaults(func=run)


def parse_sizes(text: str) -> list[int]:
    """``"8,16,32"`` -> [8, 16, 32]; anything else is a one-line UsageError."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--batch-sizes {text!r}: give integers separated by commas") from None
    if not sizes:
        raise UsageError("--batch-sizes is empty: give e.g. 8,16,32")
    bad = [s for s in sizes if s < 1]
    if bad:
        raise UsageError(f"--batch-sizes: every size must be at least 1, got {bad[0]}")
    return sizes


def parse_range(text: str) -> tuple[int, int]:
    """``"8:4096"`` -> (8, 4096), LO <= HI, both at least 1."""
    lo_text, sep, hi_text = text.partition(":")
    try:
        if not sep:
            raise ValueError
        lo, hi = int(lo_text), int(hi_text)
    except ValueError:
        raise UsageError(f"--range {text!r}: give LO:HI, e.g. 8:4096") from None
    if lo < 1:
        raise UsageError(f"--range {text}: LO must be at least 1")
    if hi < lo:
        raise UsageError(f"--range {text} is backwards: LO must not exceed HI (try {hi}:{lo})")
    return lo, hi


def sweep_config(args: argparse.Namespace) -> Any:
    from mgprof.studies.sweep import SweepConfig

    if args.nnodes > 1:
        raise UsageError("mgprof sweep runs on one node; drop --nnodes (or sweep on one node)")
    if args.steps is None or args.steps < 1:
        raise UsageError(f"--steps must be at least 1, got {args.steps}")
    if args.range is not None and args.batch_sizes is not None:
        raise UsageError("give either --batch-sizes or --range, not both")
    lo, hi = parse_range(args.range) if args.range else (8, 4096)
    return SweepConfig(
        script=Path(args.script),
        script_args=list(args.script_args),
        gpus=args.gpus,
        strategy=args.strategy,
        batch_sizes=parse_sizes(args.batch_sizes) if args.batch_sizes is not None else None,
        lo=lo,
        hi=hi,
        steps=args.steps,
        warmup=args.warmup,
        active=args.active,
        margin=args.margin,
        resolution=args.resolution,
        memory_budget_mib=args.memory_budget_mib,
        global_batch=args.global_batch,
        until_oom=args.until_oom,
        auto_wrap=args.auto_wrap,
        memory=args.memory,
        noise_scale=args.noise_scale,
        out=Path(args.out),
        quiet=args.quiet,
    )


def run(args: argparse.Namespace) -> int:
    from mgprof.commands.analyze import script_output_for
    from mgprof.report.progress import LaunchDisplay, study_line
    from mgprof.run.launcher import devices_in_words
    from mgprof.run.relay import observing

    config = sweep_config(args)
    if config.batch_sizes is not None:
        sizes = f"at batch sizes {','.join(map(str, config.batch_sizes))}"
    else:
        sizes = f"at batch sizes from {config.lo} up to {config.hi} (grown, then bisected)"

    def first_line(facts: Any) -> str:
        """At the first trial's launch: the sweep has checked its arguments."""
        return study_line(
            "sweep",
            args.script,
            sizes,
            devices_in_words(args.gpus),
            f"{args.warmup} warm-up + {args.steps} measured steps per trial",
            str(Path(facts.run_dir).parent),
        )

    display = LaunchDisplay("sweep", enabled=not args.quiet, first_line=first_line)

    def progress(trial: Any) -> None:
        from mgprof.report.sweep_view import trial_line

        display.line(f"mgprof sweep: {trial_line(trial)}")

    with script_output_for(args.format), observing(display), display:
        from mgprof.studies.sweep import run_sweep

        result = run_sweep(config, on_trial=progress)
    from mgprof.report.sweep_view import render_sweep, sweep_to_json, sweep_to_markdown

    if args.format == "json":
        sys.stdout.write(sweep_to_json(result))
    elif args.format == "md":
        sys.stdout.write(sweep_to_markdown(result))
    else:
        from rich.console import Console

        render_sweep(result, Console())
    return 0 if result.trial_count > 0 else 1
