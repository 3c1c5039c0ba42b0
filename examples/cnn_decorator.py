"""A small CNN on synthetic images, profiled with ``@mgprof.profile_step`` (the decorator).

Runs as a plain script on CPU in seconds, under ``torchrun``, or under
``mgprof analyze examples/cnn_decorator.py --gpus 2``.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn

import mgprof


class SmallCNN(nn.Module):
    """Two conv blocks and a linear head: enough kernels to make a readable trace."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Linear(32 * 16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=10, help="training steps")
    parser.add_argument("--batch-size", type=int, default=32, help="per-device batch size")
    parser.add_argument("--image-size", type=int, default=32)
    args = parser.parse_args()

    mgprof.seed_everything(0)
    model = mgprof.wrap(SmallCNN())
    device = mgprof.device()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    batch_size = mgprof.batch_size(args.batch_size)

    @mgprof.profile_step
    def train_step(images: torch.Tensor, labels: torch.Tensor) -> float:
        with mgprof.region("forward"):
            loss = loss_fn(model(images), labels)
        with mgprof.region("backward"):
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
        optimizer.step()
        return float(loss.detach())

    for _ in range(args.steps):
        # each rank draws its own batch: seed_everything gave every rank a distinct seed
        images = torch.randn(batch_size, 3, args.image_size, args.image_size, device=device)
        labels = torch.randint(0, 10, (batch_size,), device=device)
        train_step(images, labels)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
