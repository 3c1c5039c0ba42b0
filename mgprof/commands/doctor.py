"""``mgprof doctor``: what this machine offers mgprof, and what mgprof will fall back to."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check Python, torch, CUDA, NCCL, NVML and GPUs; say what mgprof falls back to",
        description=__doc__,
    )
    parser.add_argument("--json", action="store_true", help="print the facts as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from mgprof.collect.environment import collect_environment

    env = collect_environment()
    if args.json:
        print(json.dumps(env, indent=1, default=str))
    else:
        from mgprof.report.doctor_view import render_doctor

        render_doctor(env)
    return 0
