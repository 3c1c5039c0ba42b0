"""A Lightning run whose ranks a launcher starts (``torchrun``, ``mgprof analyze``/``compare``/
``sweep``): ``devices`` is the launcher's world size (``WORLD_SIZE``, 1 as a plain process) and
the strategy DDP only above one device, so one script runs as ``compare``'s single row and as its
DDP row. A Lightning module of one Linear on synthetic data, with mgprof's callback.

Rank 0 writes ``trainer_state.json`` (the trainer's ``global_step``) beside the run folders.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from mgprof.integrations.lightning import MgprofCallback


class OneLinear(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 4)

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.linear(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--out", default="runs")
    args = parser.parse_args()

    devices = int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(0)
    n = 4096  # more batches than any test asks for, at any batch size it sweeps
    data = TensorDataset(torch.randn(n, 16), torch.randint(0, 4, (n,)))
    loader = DataLoader(data, batch_size=args.batch_size, num_workers=0)
    callback = MgprofCallback(out=args.out, name="lightning_launched", sample=False, quiet=True)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_steps=args.steps,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(OneLinear(), loader)
    if trainer.global_rank == 0:
        state = {"global_step": trainer.global_step, "run_dir": str(callback.run_dir)}
        Path(args.out).mkdir(parents=True, exist_ok=True)  # under mgprof analyze: no run here
        (Path(args.out) / "trainer_state.json").write_text(json.dumps(state))


if __name__ == "__main__":
    main()
