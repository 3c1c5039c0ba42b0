"""``mgprof compare SCRIPT --gpus N``: single vs DataParallel vs DDP, measured, in one table."""

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
  mgprof compare train.py --gpus 2 --strategies single,ddp --rounds 1
                                     one device against 2 DDP ranks, one round each
  mgprof compare train.py --gpus 4 --strategies ddp,fsdp --precision fp32,bf16
                                     on 4 GPUs: DDP against FSDP, each in fp32 and bf16

Each row's run directory, comparison.json and report.md go into one folder under --out,
whose path ends the table; 'mgprof report' renders that folder again."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "compare",
        usage="mgprof compare SCRIPT --gpus N [--strategies single,dp,ddp,fsdp] [--steps K] "
        "[--rounds R] [--batch-size B [--global-batch]] [--precision fp32,bf16] [--out DIR] "
        "[-- SCRIPT_ARGS]",
        help="run a script as single device, DataParallel, DDP (and FSDP) and compare them",
        description="Run SCRIPT, unmodified (mgprof wraps or shards its model for each "
        "strategy), under each strategy with the same warm-up, measured steps and CPU threads "
        "per process, in interleaved rounds, and print step time, speedup with its 95 % "
        "interval, scaling efficiency, communication share and peak memory per device, with a "
        "verdict that names a winner only when the intervals say so.",
        epilog=EPILOG,
        formatter_class=help_formatter(),
    )
    add_launch_arguments(p, steps_default="10", one_node=True)
    p.set_defaults(steps=10)
    p.add_argument(
        "--strategies",
        default="single,dp,ddp",
        help="comma-separated subset of single,dp,ddp,fsdp,fsdp-noreshard (default: "
        "single,dp,ddp); the fsdp rows shard the script's model with fully_shard and add "
        "memory per rank to the choice",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        metavar="B",
        help="per-device batch (weak scaling), or the global batch with --global-batch; set "
        "on the script's DataLoader (and returned by mgprof.batch_size() in a script that "
        "asks) (default: the script's own)",
    )
    p.add_argument(
        "--global-batch",
        action="store_true",
        help="keep the global batch fixed (strong scaling): DDP ranks get B/N each",
    )
    p.add_argument(
        "--precision",
        default=None,
        metavar="LIST",
        help="also compare precisions: each strategy runs once per entry of fp32,bf16,fp16 "
        "(autocast around the trained module's forward; fp16 with a GradScaler where mgprof "
        "can insert one), seeded alike, with speedup, memory and the loss against the fp32 "
        "row (docs/precision.md)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        metavar="R",
        help="run every row R times, interleaved (single, ddp, single, ddp...): the first "
        "round traced, the others not; the speedup intervals come from all of them "
        "(default: 2)",
    )
    p.add_argument(
        "--nosync-steps",
        type=int,
        default=6,
        metavar="M",
        help="DDP A/B: M steps with and M without gradient sync after the measured steps; "
        "0 turns it off (default: 6)",
    )
    p.add_argument(
        "--format",
        choices=["term", "json", "md"],
        default="term",
        help="output printed at the end (default: term)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mgprof.commands.analyze import script_output_for
    from mgprof.report.progress import LaunchDisplay, study_line
    from mgprof.run.launcher import devices_in_words
    from mgprof.run.relay import observing

    if args.nnodes != 1 or args.rdzv_endpoint:
        raise UsageError("compare runs on one node; drop --nnodes/--rdzv-endpoint")
    rows = ", ".join(s.strip() for s in args.strategies.split(",") if s.strip())
    precisions = f" at {args.precision}" if args.precision else ""

    def first_line(facts: Any) -> str:
        """At the first row's launch: the comparison has checked its arguments."""
        return study_line(
            "compare",
            args.script,
            f"as {rows}{precisions}",
            devices_in_words(args.gpus),
            f"{args.rounds} round{'s' if args.rounds != 1 else ''} of {args.warmup} warm-up "
            f"+ {args.steps} measured steps per row",
            str(Path(facts.run_dir).parent),
        )

    display = LaunchDisplay("compare", enabled=not args.quiet, first_line=first_line)
    seen: set[str] = set()

    def progress(row: str, counts: dict[int, int]) -> None:
        """One line when each row starts: the table comes at the end."""
        if row not in seen:
            seen.add(row)
            display.line(f"mgprof compare: running {row} ...")

    with script_output_for(args.format), observing(display), display:
        from mgprof.studies.compare import compare

        comp = compare(
            Path(args.script),
            gpus=args.gpus,
            strategies=args.strategies,
            steps=args.steps,
            warmup=args.warmup,
            batch_size=args.batch_size,
            global_batch=args.global_batch,
            out=Path(args.out),
            script_args=list(args.script_args),
            nosync_steps=args.nosync_steps,
            trace_steps=args.active,
            on_progress=progress,
            auto_wrap=args.auto_wrap,
            memory=args.memory,
            noise_scale=args.noise_scale,
            precisions=args.precision,
            rounds=args.rounds,
        )
    where = Path(args.out) / comp.comparison_id
    if args.format == "json":
        from mgprof.report.compare_view import comparison_to_json

        sys.stdout.write(comparison_to_json(comp))
    elif args.format == "md":
        from mgprof.report.compare_view import comparison_to_markdown

        sys.stdout.write(comparison_to_markdown(comp))
    else:
        from rich.console import Console

        from mgprof.report.compare_view import render_comparison

        render_comparison(comp, Console(), str(where))
    return 0 if comp.rows and all(r.status == "complete" for r in comp.rows) else 1
