"""A Hugging Face Trainer run with mgprof's callback: a one-layer GPT-2 built from a config (no
download) on synthetic tokens. Run under ``torchrun --nproc-per-node 2`` or ``mgprof analyze``.

Rank 0 writes ``trainer_state.json`` (the trainer's ``global_step``) beside the run folders.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from mgprof.integrations.hf import MgprofCallback


class Tokens(Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--out", default="runs")
    args = parser.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=1,
        n_embd=32,
        n_head=2,
        vocab_size=64,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=str(Path(args.out) / "hf-output"),
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.accum,
        max_steps=args.steps,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    callback = MgprofCallback(out=args.out, name="hf_tiny", sample=False, quiet=True)
    data = Tokens(n=args.batch_size * args.accum * args.steps * 2 * 2, length=16, vocab=64)
    trainer = Trainer(model=model, args=training, train_dataset=data, callbacks=[callback])
    trainer.train()
    if int(os.environ.get("RANK", "0")) == 0:
        state = {"global_step": trainer.state.global_step, "run_dir": str(callback.run_dir)}
        Path(args.out).mkdir(parents=True, exist_ok=True)  # under mgprof analyze: no run here
        (Path(args.out) / "trainer_state.json").write_text(json.dumps(state))


if __name__ == "__main__":
    main()
