"""A Lightning run with mgprof's callback: a tiny MLP on synthetic data, two CPU ranks that
Lightning starts itself (``Trainer(devices=2, accelerator="cpu", strategy="ddp")``). Under
``torchrun`` or ``mgprof analyze`` Lightning joins the ranks it was started in instead.

Rank 0 writes ``trainer_state.json`` (the trainer's ``global_step``) beside the run folders.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from mgprof.integrations.lightning import MgprofCallback


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--out", default="runs")
    args = parser.parse_args()

    torch.manual_seed(0)
    n = args.batch_size * args.accum * args.steps * args.devices * 2
    data = TensorDataset(torch.randn(n, 16), torch.randint(0, 4, (n,)))
    loader = DataLoader(data, batch_size=args.batch_size, num_workers=0)
    callback = MgprofCallback(out=args.out, name="lightning_tiny", sample=False, quiet=True)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp",
        max_steps=args.steps,
        accumulate_grad_batches=args.accum,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Tiny(), loader)
    if trainer.global_rank == 0:
        state = {"global_step": trainer.global_step, "run_dir": str(callback.run_dir)}
        Path(args.out).mkdir(parents=True, exist_ok=True)  # under mgprof analyze: no run here
        (Path(args.out) / "trainer_state.json").write_text(json.dumps(state))


if __name__ == "__main__":
    main()
