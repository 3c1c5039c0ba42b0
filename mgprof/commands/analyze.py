"""``mgprof analyze SCRIPT --gpus N``: run a script under mgprof and print its report."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from mgprof.commands import help_formatter


def add_launch_arguments(
    p: argparse.ArgumentParser,
    steps_default: str = "run the script to its end",
    one_node: bool = False,
) -> None:
    """Flags shared by the commands that launch a script (analyze, compare, sweep).

    ``steps_default``: what ``--steps`` does when not given, in the command's own words.
    ``one_node``: the command runs on one node (compare, sweep): the multi-node flags are still
    parsed (so giving one is refused with a reason) but left out of the help."""
    p.add_argument("script", metavar="SCRIPT", help="training script to run, unmodified")
    p.set_defaults(script_args=[])  # filled by the CLI from everything after "--"
    p.add_argument(
        "--gpus",
        type=int,
        default=1,
        metavar="N",
        help="GPUs per node; without CUDA, N CPU ranks over gloo stand in (default: 1)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        metavar="K",
        help=f"measure K steps after warm-up, then stop the script (default: {steps_default})",
    )
    p.add_argument(
        "--warmup", type=int, default=2, metavar="N", help="steps before measuring (default: 2)"
    )
    p.add_argument(
        "--trace-steps",
        type=int,
        default=3,
        dest="active",
        metavar="N",
        help="steps traced by torch.profiler after warm-up; 0 traces none (default: 3)",
    )
    p.add_argument(
        "--out",
        default="mgprof-runs",
        metavar="DIR",
        help="parent folder of the run directories (default: mgprof-runs)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="print neither mgprof's start line nor its progress (the script's own output, "
        "warnings and the result still print)",
    )
    p.add_argument(
        "--no-auto-wrap",
        dest="auto_wrap",
        action="store_false",
        help="under dp, ddp or fsdp, do not wrap (or shard) a model the script leaves as it is "
        "(its ranks then train independent copies, and the report says so)",
    )
    p.add_argument(
        "--max-cpu-ranks",
        type=int,
        default=None,
        metavar="N",
        help="without CUDA, refuse more than N CPU ranks (default: 4 per core)",
    )
    p.add_argument(
        "--memory",
        action="store_true",
        help="track memory per rank: the profiler's memory events in the traced steps, and on "
        "CUDA the allocator's history with a snapshot (memory/rank<N>.*.json) at the end of "
        "the traced steps and at an out-of-memory error",
    )
    noise = p.add_mutually_exclusive_group()
    noise.add_argument(
        "--noise-scale",
        dest="noise_scale",
        action="store_const",
        const=True,
        default=None,
        help="measure DDP's local and averaged gradient norms at every sync for the gradient "
        "noise scale B_simple (the batch past which more samples per step buy little; "
        "docs/noise-scale.md): 3-16 %% of a CPU DDP step. By default they are read on one DDP "
        "sync in 16, without a comm hook (under 1 %% of a step)",
    )
    noise.add_argument(
        "--no-noise-scale",
        dest="noise_scale",
        action="store_const",
        const=False,
        help="do not read the gradient norms at all",
    )
    if one_node:
        hidden = argparse.SUPPRESS
        p.add_argument("--nnodes", type=int, default=1, help=hidden)
        p.add_argument("--node-rank", type=int, default=0, help=hidden)
        p.add_argument("--rdzv-endpoint", default=None, help=hidden)
        p.add_argument("--rdzv-backend", default="c10d", help=hidden)
        return
    multi = p.add_argument_group(
        "multi-node (passed to torchrun; run the same command on each node)"
    )
    multi.add_argument(
        "--nnodes", type=int, default=1, metavar="N", help="nodes in the job (default: 1)"
    )
    multi.add_argument(
        "--node-rank",
        type=int,
        default=0,
        metavar="I",
        help="this node's place, 0 to N-1 (default: 0)",
    )
    multi.add_argument(
        "--rdzv-endpoint",
        default=None,
        metavar="HOST:PORT",
        help="where the nodes meet (needed with --nnodes > 1)",
    )
    multi.add_argument(
        "--rdzv-backend",
        default="c10d",
        metavar="NAME",
        help="torchrun's rendezvous backend: c10d or static (default: c10d)",
    )


def add_definitions_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--definitions",
        action="store_true",
        help="end the terminal report with what each figure means (Markdown and HTML reports "
        "always carry it, folded)",
    )


def script_output_for(fmt: str) -> contextlib.AbstractContextManager[Any]:
    """Where the launched script's stdout goes: with a machine-read report (``--format json``
    or ``md``) stdout is the report's alone, so the script's lines go to stderr."""
    if fmt in ("json", "md"):
        return contextlib.redirect_stdout(sys.stderr)
    return contextlib.nullcontext()


ANALYZE_EPILOG = """\
examples:
  mgprof analyze train.py --gpus 2   2 DDP ranks: trace a few steps, print the report
  mgprof analyze train.py --steps 3 --format md -- --lr 3e-4
                                     one device, stopped after 2 warm-up + 3 measured steps,
                                     the report as Markdown; arguments after -- go to the script
  mgprof analyze train.py --gpus 4 --strategy dp
                                     DataParallel over 4 GPUs in one process (needs CUDA)

The run directory (--out/<time>-<script>) keeps run.json, the traces, report.md,
report.html, timeline.json.gz and logs/rank<N>.log; 'mgprof report' renders it again."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "analyze",
        usage="mgprof analyze SCRIPT --gpus N [options] [-- SCRIPT_ARGS]",
        help="run a training script under mgprof (single, DataParallel, DDP or FSDP) and report",
        description="Run SCRIPT, unmodified, under mgprof with N GPUs (N CPU ranks over gloo "
        "without CUDA): trace a few steps, sample the devices, and print the report. The first "
        "line says what runs where and the run directory; on a terminal a status line shows "
        "the steps done and the time left, with the script's output above it. Each rank's "
        "output is also kept in the run directory's logs/rank<N>.log.",
        epilog=ANALYZE_EPILOG,
        formatter_class=help_formatter(),
    )
    add_launch_arguments(p)
    p.add_argument(
        "--strategy",
        choices=["single", "dp", "ddp", "fsdp", "fsdp-noreshard"],
        default=None,
        help="default: ddp when --gpus > 1, else single; fsdp shards the script's model with "
        "fully_shard per repeated block and on the root (fsdp-noreshard: "
        "reshard_after_forward=False)",
    )
    p.add_argument(
        "--format",
        choices=["term", "json", "md"],
        default="term",
        help="report printed at the end (default: term)",
    )
    add_definitions_flag(p)
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16", "fp16", "script"],
        default=None,
        help="run the trained module's forward under this autocast setting (fp16 with a "
        "GradScaler where mgprof can insert one) and record the loss per step; 'script' keeps "
        "the script's own setting and records its loss (docs/precision.md)",
    )
    p.add_argument(
        "--collective-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="a collective waiting longer than this for its peers fails the run, naming the "
        "collective and the ranks, instead of hanging (default: 600; 1 to 604800, 7 days)",
    )
    p.set_defaults(func=run)


def launch_config(args: argparse.Namespace, strategy: str | None) -> Any:
    from mgprof.run.launcher import LaunchConfig

    return LaunchConfig(
        script=Path(args.script),
        script_args=list(args.script_args),
        gpus=args.gpus,
        strategy=strategy,
        steps=args.steps,
        warmup=args.warmup,
        active=args.active,
        out=Path(args.out),
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_backend=args.rdzv_backend,
        collective_timeout_s=getattr(args, "collective_timeout", 600.0),
        auto_wrap=getattr(args, "auto_wrap", True),
        max_cpu_ranks=getattr(args, "max_cpu_ranks", None),
        memory=getattr(args, "memory", False),
        noise_scale=getattr(args, "noise_scale", None),
        precision=getattr(args, "precision", None),
        # a machine-read report owns stdout: the script's own output goes to stderr
        script_stdout_to_stderr=getattr(args, "format", "term") in ("json", "md"),
    )


def run(args: argparse.Namespace) -> int:
    from mgprof.report.progress import LaunchDisplay
    from mgprof.report.safe_text import printable
    from mgprof.run.launcher import launch

    config = launch_config(args, args.strategy)
    with LaunchDisplay("analyze", enabled=not args.quiet) as display:
        result = launch(config, observer=display)
    from mgprof.run.finish import finish_run, print_report

    if config.nnodes > 1 and not any(r.rank == 0 for r in result.run.ranks):
        print(
            f"mgprof: this node ({config.node_rank}) sent its records to rank 0 on another node; "
            "the report is written there",
            file=sys.stderr,
        )
        return result.exit_code
    try:
        run_record, analysis = finish_run(result.run_dir, result.run)
    except OSError as exc:
        # The output folder became unwritable (or vanished) during the run: say so in one line
        # and keep the script's exit code, which is the training's result.
        print(
            printable(
                f"mgprof analyze: error: cannot write the report into {result.run_dir}: "
                f"{exc.strerror or exc}; check the --out folder (the script exited with code "
                f"{result.exit_code})"
            ),
            file=sys.stderr,
        )
        return result.exit_code
    print_report(run_record, analysis, result.run_dir, args.format, definitions=args.definitions)
    return result.exit_code
