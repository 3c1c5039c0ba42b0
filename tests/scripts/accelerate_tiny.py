"""An ``accelerate`` training loop: ``Accelerator().prepare(model, optimizer, loader)``,
``accelerator.backward(loss)``, optionally ``accelerator.accumulate(model)``. Unmodified under
``mgprof analyze`` (the automatic session); with ``--profile`` it opens its own session through
``mgprof.integrations.accelerate.profile`` (for ``accelerate launch`` or torchrun).

Rank 0 writes ``accelerate_state.json`` (the script's own count of optimizer updates) beside the
run folders.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6, help="optimizer updates")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="open an mgprof session in code")
    parser.add_argument("--out", default="runs")
    args = parser.parse_args()

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.accum)
    torch.manual_seed(0)
    n = args.batch_size * args.accum * args.steps * accelerator.num_processes * 2
    data = TensorDataset(torch.randn(n, 16), torch.randint(0, 4, (n,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    prof: Any = contextlib.nullcontext()
    if args.profile:
        from mgprof.integrations.accelerate import profile

        prof = profile(accelerator, out=args.out, name="accelerate_tiny", sample=False, quiet=True)
    updates = 0
    with prof:
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            if args.profile:
                prof.step(x)
            if accelerator.sync_gradients:
                updates += 1
                if updates == args.steps:
                    break
    if accelerator.is_main_process:
        state = {
            "updates": updates,
            "model": type(model).__name__,
            "run_dir": str(getattr(prof, "run_dir", None)),
        }
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "accelerate_state.json").write_text(json.dumps(state))
    accelerator.end_training()


if __name__ == "__main__":
    main()
